"""``capture.reading.run``: dissect's choice among its read paths, in the library.

Each path must show the same frames: the blocks' lines (unfiltered ``-T jsonl`` and
``-T fields``) against the record-by-record path that any filter takes, on every sample
capture, with and without a count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wallaroo_proto.capture.reading import FrameFilter, Reading, run
from wallaroo_proto.capture.views import FieldRows, TimeFormat, UsageError, check_fields, parse_options
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


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (None, None),
        ("2.5", 2.5),  # from the first frame
        ("1700000000", 1700000000.0),
        ("2023-11-14T22:13:20", 1700000000.0),  # no zone: UTC
        ("2023-11-14T23:13:20+01:00", 1700000000.0),
    ],
)
def test_since_and_until_take_seconds_or_an_iso_time_in_utc_unless_it_says(text, seconds) -> None:
    assert FrameFilter.parse_time(text) == seconds


def test_a_time_neither_seconds_nor_iso_is_refused_in_words() -> None:
    with pytest.raises(ValueError, match=r"^'yesterday': give seconds or an ISO 8601 time$"):
        FrameFilter.parse_time("yesterday")


def test_an_expression_alone_or_with_the_options_filter_keeps_the_frames_both_match() -> None:
    frames = [
        {"ts": 10.0, "type": "MESSAGE", "stream_id": 1, "conn_index": 0, "connection": "a"},
        {"ts": 11.0, "type": "ACK", "stream_id": 1, "conn_index": 0, "connection": "a"},
        {"ts": 12.0, "type": "MESSAGE", "stream_id": 2, "conn_index": 1, "connection": "b"},
    ]
    alone = FrameFilter((), (), (), None, None).with_expression("stream_id == 1")
    assert [alone(r) for r in frames] == [True, True, False]
    both = FrameFilter((), ("message",), (), None, None).with_expression("stream_id == 1")
    assert [both(r) for r in frames] == [True, False, False]


@pytest.mark.parametrize(
    ("fmt", "fields", "options", "summary", "write", "why"),
    [
        ("text", ("type",), (), False, None, "-e needs -T fields"),
        ("jsonl", (), ("header=y",), False, None, "-E needs -T fields"),
        ("text", (), (), True, "out.pcap", "-w writes frames: not with --summary"),
        (
            "jsonl",
            (),
            (),
            False,
            "out.pcap",
            "-w writes packets instead of showing frames: not with -T jsonl",
        ),
        ("fields", ("type",), (), True, None, "-T fields writes frames: not with --summary"),
        ("fields", ("type",), (), False, "-", "-T fields writes frames: not with -w"),
        ("fields", (), (), False, None, "-T fields needs at least one -e FIELD"),
    ],
)
def test_the_field_options_go_with_t_fields_only_as_tshark_has_them(
    fmt, fields, options, summary, write, why
):
    with pytest.raises(UsageError) as refused:
        FieldRows.for_options(fmt, fields, options, summary, write, TimeFormat("u"))
    assert str(refused.value) == why


def test_t_fields_gets_its_writer_and_the_other_formats_none() -> None:
    rows = FieldRows.for_options("fields", ("type",), ("header=y",), False, None, TimeFormat("u"))
    assert rows is not None and rows.names == ["type"] and rows.header
    assert FieldRows.for_options("text", (), (), True, None, TimeFormat("u")) is None
    assert FieldRows.for_options("text", (), (), False, "out.pcap", TimeFormat("u")) is None
