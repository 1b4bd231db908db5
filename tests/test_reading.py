"""``capture.reading.run``: dissect's choice among its read paths, in the library.

Each path must show the same frames: the blocks' lines (unfiltered ``-T jsonl`` and
``-T fields``) against the record-by-record path that any filter takes, on every sample
capture, with and without a count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wallaroo_proto.capture.reading import FrameFilter, Reading, run
from wallaroo_proto.capture.views import FieldRows, TimeFormat, check_fields, parse_options
from wallaroo_proto.records import to_json

SAMPLES = Path(__file__).parent.parent / "captures"
CAPTURES = sorted(p for p in SAMPLES.iterdir() if p.suffix in {".pcap", ".pcapng"})


class Lines:
    """A view that keeps the lines and the notes, and renders nothing."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.notes: list[str] = []

    def emit(self, lines: list[str]) -> None:
        self.lines += lines
        lines.clear()

    def flush(self) -> None: ...
    def capture_start(self, path: str, frames: object) -> None: ...
    def frames(self) -> None:
        raise AssertionError("lines were asked for, not the rich table")

    def capture_failed(self, path: str, err: Exception) -> None:
        self.notes.append(str(err))

    def problem(self, path: str, message: str) -> None:
        self.notes.append(message)

    def stats(self, result: dict, path: str) -> None: ...
    def summary(self, kept: list[dict], path: str) -> None: ...
    def note(self, line: str, markup: bool = False) -> None:
        self.notes.append(line)

    def strict_failure(self, violations: int) -> None: ...
    def close(self) -> None: ...


def _run(capture: Path, fmt: str, every_record: bool, count: int | None) -> tuple[int, list[str], list[str]]:
    keep = FrameFilter((), (), (), None, None)
    clock = TimeFormat("r")
    rows = FieldRows(check_fields(["packet", "type", "conn_index"]), parse_options([]), clock)
    reading = Reading(
        files=[str(capture)],
        keep=keep,
        # A filter that keeps everything: the record-by-record path, with the same frames to show.
        accept=lambda r: True,
        filtering=every_record,
        clock=clock,
        fmt=fmt,
        count=count,
        field_rows=rows if fmt == "fields" else None,
        line_of=rows.record if fmt == "fields" else to_json,
    )
    view = Lines()
    return run(reading, view), view.lines, view.notes


@pytest.mark.parametrize("count", [None, 7])
@pytest.mark.parametrize("fmt", ["jsonl", "fields"])
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_the_block_path_and_the_record_path_show_the_same_frames(capture: Path, fmt: str, count) -> None:
    code, fast, _ = _run(capture, fmt, every_record=False, count=count)
    slow_code, slow, notes = _run(capture, fmt, every_record=True, count=count)
    assert fast == slow
    assert code == slow_code
    assert fast or notes  # a capture with no frame says why
    if count is not None:
        assert len(fast) <= count
