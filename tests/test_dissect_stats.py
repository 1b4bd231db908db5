"""dissect --stats io,SECONDS and --stats conv: counts checked by hand and against the frames' own records.

source-session.pcap (captures/make_samples.py) has 18 frames on one connection, their
times from the first frame (HELLO) in ms, the pcap's microseconds cutting a few just
short of the millisecond: HELLO 0, OK 1, NOTIFY 2 (two), NOTIFY_ACK 3 (two), MESSAGE
4.999 6.999 8.999 10.999 12.999 14.999 16.999 18.998, ACK 19.998, EOS_MESSAGE 20.998,
ACK 21.998, MESSAGE 23.998. Lengths (prefix included): HELLO 39, OK 9, NOTIFY 29 and 31,
NOTIFY_ACK 22, MESSAGE 44 (the one at 16.999 carries '{"amount": 12}': 45), ACK 45 (two
stream pairs) and 29 (one), EOS_MESSAGE 21.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import run_cli

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import COLUMN, SHARED, FrameBlock
from wallaroo_proto.capture.stats import ConvStats, IoStats, StatsError, feed, make, parse_spec

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SOURCE = str(CAPTURES / "source-session.pcap")
#: Its producer's stream comes out in FrameBlocks (50 of its 97 frames).
DCP = str(CAPTURES / "dcp-rollback.pcap")


def dissect(*args: str) -> list[dict]:
    proc = run_cli("dissect", "--format", "jsonl", *args)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def stats_of(lines: list[dict]) -> dict[str, dict]:
    return {line["stats"]: line for line in lines if "stats" in line}


def io_row(start: float, end: float, frames: int, size: int, types: dict) -> dict:
    return {"start": start, "end": end, "frames": frames, "bytes": size, "types": types}


# --- by hand ---------------------------------------------------------------------------


def test_io_by_hand_and_the_frames_still_shown():
    lines = dissect("--stats", "io,0.0125", SOURCE)
    assert sum("stats" not in line for line in lines) == 18  # the frames first
    io = lines[-1]
    assert io["stats"] == "io" and io["capture"] == SOURCE and io["interval"] == 0.0125
    first = {"HELLO": 1, "MESSAGE": 4, "NOTIFY": 2, "NOTIFY_ACK": 2, "OK": 1}
    second = {"ACK": 2, "EOS_MESSAGE": 1, "MESSAGE": 5}
    assert io["rows"] == [
        io_row(0.0, 0.0125, 10, 39 + 9 + 29 + 31 + 22 + 22 + 4 * 44, first),
        io_row(0.0125, 0.025, 8, 44 + 44 + 45 + 44 + 45 + 21 + 29 + 44, second),
    ]


def test_conv_by_hand():
    (conv,) = [line for line in dissect("-q", "--stats", "conv", SOURCE)]
    assert conv == {
        "stats": "conv",
        "capture": SOURCE,
        "rows": [
            {
                "conn_index": 1,
                "protocol": "wallaroo",
                "a": "127.0.0.1:51000",
                "b": "127.0.0.1:7100",
                "frames_ab": 13,
                "bytes_ab": 39 + 29 + 31 + 8 * 44 + 45 + 21,
                "frames_ba": 5,
                "bytes_ba": 9 + 22 + 22 + 45 + 29,
                "frames": 18,
                "bytes": 644,
                "start": 0.0,
                "duration": 0.023998,
                "violations": 0,
            }
        ],
    }


def test_a_filter_keeps_empty_intervals_and_the_capture_start():
    """Two ACKs, 19.998 and 21.998 ms after the first frame: the rows start at the capture's
    first frame, not the first ACK, and the millisecond between them is an empty row."""
    io = stats_of(dissect("-q", "--type", "ack", "--stats", "io,0.001", SOURCE))["io"]
    rows = io["rows"]
    assert len(rows) == 22
    assert [(r["frames"], r["bytes"]) for r in rows[19:]] == [(1, 45), (0, 0), (1, 29)]
    assert rows[20] == io_row(0.02, 0.021, 0, 0, {})
    assert all(r["frames"] == 0 for r in rows[:19])
    conv = stats_of(dissect("-q", "--type", "message", "--stats", "conv", SOURCE))["conv"]
    (row,) = conv["rows"]
    assert (row["frames_ab"], row["bytes_ab"], row["frames_ba"]) == (9, 8 * 44 + 45, 0)
    assert (row["start"], row["duration"]) == (0.004999, 0.023998 - 0.004999)


def test_count_limits_the_stats_with_and_without_frames():
    """-c 10: the first ten frames, 328 bytes, shown or not (-q reads the FrameBlocks directly)."""
    for quiet in ((), ("-q",)):
        io = stats_of(dissect(*quiet, "-c", "10", "--stats", "io,0", SOURCE))["io"]
        assert [(r["frames"], r["bytes"]) for r in io["rows"]] == [(10, 328)]
        assert io["rows"][0]["end"] == 0.010999
    conv = stats_of(dissect("-c", "4", "--stats", "conv", SOURCE))["conv"]["rows"][0]
    assert (conv["frames_ab"], conv["bytes_ab"], conv["frames_ba"], conv["bytes_ba"]) == (3, 99, 1, 9)


# --- against the records ---------------------------------------------------------------


def plain_io(records: list[dict], step_ns: int) -> list[tuple[int, int]]:
    origin = records[0]["ts_ns"]
    counts: dict[int, list[int]] = {}
    for r in records:
        row = counts.setdefault((r["ts_ns"] - origin) // step_ns, [0, 0])
        row[0] += 1
        row[1] += r["length"]
    return [tuple(counts.get(i, (0, 0))) for i in range(min(counts), max(counts) + 1)]


@pytest.mark.parametrize("capture", ["dcp-rollback.pcap", "tremor-session.pcap", "restart-reconnect.pcap"])
def test_stats_agree_with_the_records_shown(capture):
    path = str(CAPTURES / capture)
    lines = dissect("--stats", "io,0.002", "--stats", "conv", path)
    records = [line for line in lines if "stats" not in line]
    stats = stats_of(lines)
    assert [(r["frames"], r["bytes"]) for r in stats["io"]["rows"]] == plain_io(records, 2_000_000)
    for row in stats["conv"]["rows"]:
        mine = [r for r in records if r["conn_index"] == row["conn_index"]]
        ab = [r for r in mine if r["direction"] == "initiator>responder"]
        ba = [r for r in mine if r["direction"] == "responder>initiator"]
        assert (row["frames_ab"], row["frames_ba"]) == (len(ab), len(ba))
        assert (row["bytes_ab"], row["bytes_ba"]) == (
            sum(r["length"] for r in ab),
            sum(r["length"] for r in ba),
        )
        assert row["violations"] == sum(bool(r.get("violations")) for r in mine)
        assert row["a"] == f"{mine[0]['initiator_addr']}:{mine[0]['initiator_port']}"
    assert sum(row["frames"] for row in stats["conv"]["rows"]) == len(records)


def test_blocks_count_as_their_records():
    """The -q path feeds FrameBlocks without records; it must give what the records give."""
    items = list(Dissector(DCP).frames(DCP))
    assert any(type(item) is FrameBlock for item in items)
    records = list(Dissector(DCP).run(DCP))
    for limit in (None, 40, 45, 97):
        from_blocks = [make("io,0.001"), make("conv")]
        from_records = [make("io,0.001"), make("conv")]
        assert feed(from_blocks, iter(items), limit) == (limit or 97)
        feed(from_records, iter(records), limit)
        assert [acc.result() for acc in from_blocks] == [acc.result() for acc in from_records]


def test_violations_are_counted():
    rows = stats_of(dissect("-q", "--stats", "conv", str(CAPTURES / "tremor-framing.pcap")))["conv"]["rows"]
    assert [row["violations"] for row in rows] == [0, 1]


# --- the command line ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("io", "give the interval"),
        ("io,x", "'x' is not a number"),
        ("io,-1", "0 or more"),
        ("io,nan", "finite"),
        ("io,1e-12", "shorter than a nanosecond"),
        ("conv,2", "conv takes no argument"),
        ("flows", "give io,SECONDS, conv or expert"),
    ],
)
def test_bad_values_are_usage_errors(value, said):
    proc = run_cli("dissect", "--stats", value, SOURCE)
    assert proc.returncode == 2
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_stats_and_summary_exclude_each_other():
    proc = run_cli("dissect", "--summary", "--stats", "conv", SOURCE)
    assert proc.returncode == 2 and "--stats and --summary" in proc.stderr


def test_an_io_table_too_long_is_refused_with_the_interval_to_give():
    proc = run_cli("dissect", "-q", "--stats", "io,0.0000001", "--stats", "conv", SOURCE)
    assert proc.returncode == 2
    assert "239,981 intervals of 1e-07 s, more than the 100,000" in proc.stderr
    assert "at least 2.4e-07 s" in proc.stderr
    assert "conversations" in proc.stdout  # the other statistic is still given


def test_tables_for_people():
    proc = run_cli("dissect", "-q", "--stats", "io,0.0125", "--stats", "conv", SOURCE)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"io, 0.0125 s intervals: {SOURCE}"
    assert lines[2].split()[:4] == ["0", "0.0125", "10", "328"]
    conv = lines[lines.index(f"conversations: {SOURCE}") + 2].split()
    assert conv == [
        "#1",
        "wallaroo",
        "127.0.0.1:51000",
        "127.0.0.1:7100",
        "13",
        "517",
        "5",
        "127",
        "18",
        "644",
        "0",
        "0.023998",
        "0",
    ]
    assert all(line == line.rstrip() for line in lines)
    assert "HELLO" not in proc.stdout.split("types")[0]  # -q: no frames before the tables


# --- the accumulator against a plain evaluation -----------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 70_000), st.sampled_from("ABC")), min_size=1),
    st.integers(1, 10**11),
    st.sampled_from([None, 0, 5 * 10**11]),
    st.integers(0, 40),
)
def test_io_matches_a_plain_evaluation(frames, step_ns, origin, block_from):
    """Any times (in any order), lengths, interval and origin: the same rows as counting by hand,
    whether fed as records or (from ``block_from`` on) as one FrameBlock."""
    io = IoStats(step_ns / 1e9, max_intervals=1_000)
    io.origin_ns = origin
    layout = (("type", SHARED), ("ts_ns", COLUMN), ("length", COLUMN))
    for ts, length, name in frames[:block_from]:
        io.add({"ts_ns": ts, "length": length, "type": name})
    for name in "ABC":
        rows = [(ts, length) for ts, length, kind in frames[block_from:] if kind == name]
        io.add_block(FrameBlock(layout, {"type": name}, rows))
    fed = frames[:block_from] + [f for name in "ABC" for f in frames[block_from:] if f[2] == name]
    base = fed[0][0] if origin is None else origin
    counts: dict[int, list] = {}
    for ts, length, name in frames:
        row = counts.setdefault((ts - base) // step_ns, [0, 0, {}])
        row[0] += 1
        row[1] += length
        row[2][name] = row[2].get(name, 0) + 1
    low, high = min(min(counts), 0), max(max(counts), 0)
    if high - low + 1 > 1_000:
        with pytest.raises(StatsError, match="give an interval of at least"):
            io.result()
        return
    expected = [
        io_row(
            i * step_ns / 1e9,
            (i + 1) * step_ns / 1e9,
            *(counts[i][:2] if i in counts else (0, 0)),
            dict(sorted(counts[i][2].items())) if i in counts else {},
        )
        for i in range(low, high + 1)
    ]
    assert io.result() == {"stats": "io", "interval": step_ns / 1e9, "rows": expected}


@given(st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 9999)), min_size=1))
def test_io_whole_capture_is_one_row(frames):
    io = IoStats(0)
    for ts, length in frames:
        io.add({"ts_ns": ts, "length": length, "type": "X"})
    times = [ts for ts, _ in frames]
    first = frames[0][0]
    assert io.result()["rows"] == [
        io_row(
            (min(times) - first) / 1e9,
            (max(times) - first) / 1e9,
            len(frames),
            sum(n for _, n in frames),
            {"X": len(frames)},
        )
    ]


def test_parse_spec():
    assert parse_spec("io,1") == ("io", 1.0)
    assert parse_spec(" IO,0.5 ") == ("io", 0.5)
    assert parse_spec("io,0") == ("io", 0.0)
    assert parse_spec("conv") == ("conv", None)
    assert isinstance(make("conv"), ConvStats)
