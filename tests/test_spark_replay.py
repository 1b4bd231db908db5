"""spark-replay: the frames and reports equal the dissector's on the same captures.

Captures are built by hand here (pcap_writer + the codec) with known content:
a source session with a gap, an out-of-order id, a replay, a stall at zero
credits and a RESTART followed by a reconnect that resends; a sink session with
a committed and an aborted 2PC round; keyed messages with known event times for
the example job. One Spark session (local[2]) serves the whole module.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import socket
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from support import run_cli

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import CaptureError
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.schema import field_names
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import (
    Ack,
    EosMessage,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)
from wallaroo_proto.protocols.wallaroo.twopc import (
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    twopc_frame,
)
from wallaroo_proto.spark import frames as spark_frames
from wallaroo_proto.spark import jobs, reports
from wallaroo_proto.spark import plan as spark_plan
from wallaroo_proto.spark.example_job import key_counts
from wallaroo_proto.spark.session import build_session

pytestmark = pytest.mark.e2e

EPOCH_MS = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC, a multiple of 10 s


class Clock:
    """Sends frames into one recorded TCP session, each a given time after the last."""

    def __init__(self, writer: PcapWriter, client_port: int, server_port: int, t: float) -> None:
        self.session = writer.tcp_session(("127.0.0.1", client_port), ("127.0.0.1", server_port), timestamp=t)
        self.t = t

    def client(self, frame, dt: float = 0.01) -> None:
        self.t += dt
        self.session.send(True, encode(frame), self.t)

    def server(self, frame, dt: float = 0.01) -> None:
        self.t += dt
        self.session.send(False, encode(frame), self.t)


def write_source(path: Path) -> None:
    """Connection 1: ids 1, 2, (0.5 s at zero credits), 5 (gap of 2), 4 (out of order), 5 (replay),
    RESTART. Connection 2, one second later: resumes at 3 and resends 3, 4, 5, then 6 and EOS."""
    with PcapWriter(path) as writer:
        c = Clock(writer, 40001, 7100, 1_700_000_000.0)
        c.client(Hello("0.0.1", b"", "prog", "inst"))
        c.server(Ok(3))
        c.client(Notify(11, "s11", 0))
        c.server(NotifyAck(True, 11, 0))
        c.client(Message(11, 1, EPOCH_MS + 1000, b"a", b"p1"))
        c.client(Message(11, 2, EPOCH_MS + 2000, b"b", b"p2"))  # the last credit
        c.server(Ack(10, ((11, 3),)), dt=0.5)
        c.client(Message(11, 5, EPOCH_MS + 12000, b"a", b"p5"))
        c.client(Message(11, 4, EPOCH_MS + 13000, b"a", b"p4"))
        c.client(Message(11, 5, EPOCH_MS + 14000, b"a", b"p5"))
        c.server(Restart("127.0.0.1:7100"))
        c.session.close(False, c.t + 0.01)
        c2 = Clock(writer, 40002, 7100, c.t + 1)
        c2.client(Hello("0.0.1", b"", "prog", "inst"))
        c2.server(Ok(10))
        c2.client(Notify(11, "s11", 3))
        c2.server(NotifyAck(True, 11, 3))
        c2.client(Message(11, 3, EPOCH_MS + 3000, b"b", b"p3"))
        c2.client(Message(11, 4, EPOCH_MS + 13000, b"a", b"p4"))
        c2.client(Message(11, 5, EPOCH_MS + 12000, b"a", b"p5"))
        c2.client(Message(11, 6, EPOCH_MS + 21000, b"", b"p6"))
        c2.client(EosMessage(11, 6))
        c2.session.close(True, c2.t + 0.01)


def write_sink(path: Path) -> None:
    """A worker driving a sink: txn 1 commits bytes 0..11, txn 2 aborts 11..14, then a gap."""
    with PcapWriter(path) as writer:
        w = Clock(writer, 40010, 7200, 1_700_000_100.0)
        w.client(Hello("v0.0.1", b"", "w", "worker1"))
        w.client(Notify(1, "sink", 0))
        w.client(twopc_frame(ListUncommitted(1)))
        w.server(Ok(500))
        w.server(NotifyAck(True, 1, 0))
        w.server(twopc_frame(ReplyUncommitted(1, ())))
        w.client(Message(1, 0, 5, b"", b"hello"))
        w.client(Message(1, 5, 6, b"", b"world!"))
        w.client(twopc_frame(Phase1("sink:c_id=1", ((1, 0, 11),))))
        w.server(twopc_frame(Reply("sink:c_id=1", True)), dt=0.02)
        w.client(twopc_frame(Phase2("sink:c_id=1", True)), dt=0.03)
        w.client(Message(1, 11, 7, b"", b"xyz"))
        w.client(twopc_frame(Phase1("sink:c_id=2", ((1, 11, 14),))))
        w.server(twopc_frame(Reply("sink:c_id=2", False)))
        w.client(twopc_frame(Phase2("sink:c_id=2", False)))
        w.client(Message(1, 20, 8, b"", b"late"))
        w.session.close(True, w.t + 0.01)


#: (message id, event time offset from EPOCH_MS in ms, key) of the keyed capture, in send order.
KEYED = [
    (1, 0, b"red"),
    (2, 4_000, b"blue"),
    (3, 9_999, b"red"),
    (4, 10_000, b"red"),
    (5, 15_000, b""),
    (6, 19_000, b"blue"),
    (6, 19_500, b"blue"),  # a replay of id 6: dropped by the worker, not counted
    (7, 31_000, b"red"),
]
#: Worked out by hand from KEYED with 10-second windows from EPOCH_MS.
KEYED_COUNTS = {
    (0, "blue"): 1,
    (0, "red"): 2,
    (10, None): 1,
    (10, "blue"): 1,
    (10, "red"): 1,
    (30, "red"): 1,
}


def write_keyed(path: Path) -> None:
    with PcapWriter(path) as writer:
        c = Clock(writer, 40020, 7100, 1_700_000_200.0)
        c.client(Hello("0.0.1", b"", "prog", "keyed"))
        c.server(Ok(100))
        c.client(Notify(21, "keyed", 0))
        c.server(NotifyAck(True, 21, 0))
        for message_id, offset, key in KEYED:
            c.client(Message(21, message_id, EPOCH_MS + offset, key, b"v%d" % message_id))
        c.session.close(True, c.t + 0.01)


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("captures")
    paths = {name: root / f"{name}.pcap" for name in ("source", "sink", "keyed")}
    write_source(paths["source"])
    write_sink(paths["sink"])
    write_keyed(paths["keyed"])
    data = paths["source"].read_bytes()
    damaged = root / "bad" / "damaged.pcap"
    damaged.parent.mkdir()
    damaged.write_bytes(data[: len(data) * 3 // 5])  # ends inside a packet record
    paths["damaged"] = damaged
    garbage = root / "bad" / "notes.pcap"
    garbage.write_bytes(b"this is not a capture file\n")
    paths["garbage"] = garbage
    return paths


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_session("local[2]", log_dir=tmp_path_factory.mktemp("spark"))
    yield session
    session.stop()


def dissector_view(path: Path) -> tuple[int, list[dict], str | None]:
    """What the dissector library reports: record count, connection summaries, capture error."""
    dissector = Dissector(str(path))
    count = 0
    error = None
    try:
        for _ in dissector.run(path):
            count += 1
    except CaptureError as err:  # raised after every record before the damage
        error = str(err)
    return count, dissector.summaries(), error


def rows_by(frame, *key: str) -> dict:
    return {tuple(row[k] for k in key): row.asDict() for row in frame.collect()}


#: The project's sample captures (pcapng, a kernel capture, a lost segment...), compared too.
SAMPLES = sorted(str(p) for p in (Path(__file__).resolve().parent.parent / "captures").glob("*.pcap*"))


@pytest.fixture(scope="module")
def replayed(spark, captures):
    """Our captures and the samples through spark-replay, each capture split into two tasks."""
    names = [str(captures["source"]), str(captures["sink"]), *SAMPLES]
    loaded = spark_frames.load_frames(spark, names, split_bytes=1)
    assert loaded.tasks == 2 * len(names)  # connections of one capture are reassembled in parallel
    return names, loaded, reports.build_tables(loaded.frames, loaded.problems)


@pytest.mark.timeout(480)
def test_frames_and_audit_equal_the_dissector(captures, replayed):
    names, loaded, tables = replayed
    connections = rows_by(tables["connections"], "capture", "connection")
    audit = rows_by(tables["audit"], "capture", "connection", "stream_id")
    flow = rows_by(tables["flow_control"], "capture", "connection")
    rounds = rows_by(tables["twopc"], "capture", "connection", "txn_id")
    violations = tables["violations"].where("protocol = 'wallaroo'").count()
    total = loaded.frames.count()
    expected_total = 0
    expected_violations = 0
    seen_streams = 0
    for path in names:
        count, summaries, error = dissector_view(Path(path))
        assert error is None
        expected_total += count
        for s in summaries:
            if s["protocol"] != "wallaroo":
                continue  # other protocols' samples have their own tables, tested with their plug-ins
            key = (path, s["connection"])
            assert connections[key]["conn_index"] == s["conn_index"]  # numbered alike in every task
            assert connections[key]["frames"] == s["frames"]
            assert connections[key]["use"] == s["use"]
            assert flow[key]["credits_granted"] == s["credits_granted"]
            assert flow[key]["credits_spent"] == s["credits_spent"]
            assert flow[key]["credits_left"] == s["credits_left"]
            expected_violations += s["violations"]
            for st in s["streams"]:
                row = audit[(*key, st["stream_id"])]
                seen_streams += 1
                assert (row["messages"], row["bytes"]) == (st["messages"], st["payload_bytes"])
                assert (row["first_id"], row["last_id"]) == (st["first_id"], st["last_id"])
                assert (row["gaps"], row["missing_ids"], row["replays"]) == (
                    st["gaps"],
                    st["missing_ids"],
                    st["replays"],
                )
                assert (row["eos"], row["checkpoints"]) == (st["eos"], st["checkpoints"])
                if s["use"] == "source":
                    assert row["last_checkpoint"] == st["last_acked"]
            for r in s["twopc_rounds"]:
                row = rounds[(*key, r["txn_id"])]
                assert [w.asDict() for w in row["where"]] == r["where"]
                assert row["vote"] == (r["vote"] == "commit")
                assert row["decision"] == (r["decision"] == "commit")
    assert total == expected_total
    assert violations == expected_violations
    assert seen_streams == len(audit) >= 3


@pytest.mark.timeout(480)
def test_reports_beyond_the_summary(captures, replayed):
    """Out-of-order ids, zero-credit time, replays after the RESTART, 2PC timings: by hand."""
    _, _, tables = replayed
    source, sink = str(captures["source"]), str(captures["sink"])
    audit = rows_by(tables["audit"], "capture", "conn_index")
    assert audit[(source, 1)]["out_of_order"] == 1  # id 4 after 5: never delivered before
    assert audit[(source, 1)]["replays"] == 2
    assert audit[(sink, 1)]["last_checkpoint"] == 11  # end of the committed range
    flow = rows_by(tables["flow_control"], "capture", "connection")
    first = flow[(source, "127.0.0.1:40001 > 127.0.0.1:7100")]
    assert first["zero_credit_s"] == pytest.approx(0.5, abs=1e-5)
    assert first["zero_credit_spells"] == 1
    # A sink's worker ignores its credits: no zero-credit time is claimed for it.
    (sink_flow,) = [row for key, row in flow.items() if key[0] == sink]
    assert sink_flow["use"] == "sink" and sink_flow["credits_granted"] > 0
    assert sink_flow["zero_credit_s"] is None and sink_flow["zero_credit_spells"] is None
    (restart,) = tables["restarts"].where(f"capture = '{source}'").collect()
    assert restart["connection"] == "127.0.0.1:40001 > 127.0.0.1:7100"
    assert restart["address"] == "127.0.0.1:7100"
    assert restart["reconnect"] == "127.0.0.1:40002 > 127.0.0.1:7100"
    assert (restart["replayed"], restart["replayed_first_id"], restart["replayed_last_id"]) == (3, 3, 5)
    rounds = {r["txn_id"]: r for r in tables["twopc"].where(f"capture = '{sink}'").collect()}
    assert rounds["sink:c_id=1"]["bytes_committed"] == 11
    assert rounds["sink:c_id=2"]["bytes_committed"] == 0
    assert rounds["sink:c_id=1"]["phase1_to_reply_s"] == pytest.approx(0.02, abs=1e-5)
    assert rounds["sink:c_id=1"]["reply_to_phase2_s"] == pytest.approx(0.03, abs=1e-5)
    messages = tables["messages"].where(f"capture = '{source}' and message_id = 1").collect()
    assert [(m["key"], bytes(m["payload"]), m["event_time"]) for m in messages] == [
        ("a", b"p1", EPOCH_MS + 1000)
    ]


@pytest.mark.timeout(480)
def test_example_job_counts_keys_per_window(spark, captures):
    loaded = spark_frames.load_frames(spark, [str(captures["keyed"])])
    result = key_counts(reports.build_tables(loaded.frames)["messages"]).collect()
    counts = {}
    for row in result:
        start_ms = int(row["window_start"].timestamp() * 1000) - EPOCH_MS
        assert int(row["window_end"].timestamp() * 1000) - EPOCH_MS == start_ms + 10_000
        counts[(start_ms // 1000, row["key"])] = row["messages"]
    assert counts == KEYED_COUNTS


@pytest.mark.timeout(480)
def test_example_job_puts_times_that_are_not_milliseconds_in_a_null_window(spark):
    """captures/source-session.pcap sends nanoseconds (1.76e18): past Spark's timestamps as ms."""
    sample = str(Path(__file__).resolve().parent.parent / "captures" / "source-session.pcap")
    loaded = spark_frames.load_frames(spark, [sample])
    result = key_counts(reports.build_tables(loaded.frames)["messages"]).collect()
    assert result and all(row["window_start"] is None for row in result)
    # stream 11: ids 1-7 keyed user-(id % 3); stream 12: two messages without a key
    assert {row["key"]: row["messages"] for row in result} == {"user-0": 2, "user-1": 3, "user-2": 2, None: 2}


@pytest.mark.timeout(480)
def test_sql_over_the_views(spark, captures, replayed, capfd):
    _, _, tables = replayed
    jobs.register_views(tables)
    query = (
        f"SELECT count(*) AS n FROM messages WHERE verdict = 'replayed' AND capture = '{captures['source']}'"
    )
    row = jobs.run_sql(spark, query).collect()[0]
    assert row["n"] == 2
    capfd.readouterr()
    with pytest.raises(jobs.JobError, match="--sql failed"):
        jobs.run_sql(spark, "SELECT nope FROM frames")
    # The error is reported once, by the caller: PySpark's own JSON log of it, with the Java stack, is off.
    assert "UNRESOLVED_COLUMN" not in capfd.readouterr().err
    with pytest.raises(jobs.JobError, match="MODULE:FUNCTION"):
        jobs.load_job("no_colon_here")


@pytest.mark.timeout(480)
def test_damaged_capture_is_named_and_the_others_processed(spark, captures):
    names = [str(captures["sink"]), str(captures["damaged"]), str(captures["garbage"])]
    loaded = spark_frames.load_frames(spark, names)
    problems = {r["capture"]: r["error"] for r in loaded.problems.collect()}
    assert set(problems) == {str(captures["damaged"]), str(captures["garbage"])}
    assert "truncated" in problems[str(captures["damaged"])]
    assert "not a pcap or pcapng capture" in problems[str(captures["garbage"])]
    per_capture = {r["capture"]: r["count"] for r in loaded.frames.groupBy("capture").count().collect()}
    sink_count, _, _ = dissector_view(captures["sink"])
    damaged_count, _, damaged_error = dissector_view(captures["damaged"])
    assert damaged_error is not None and damaged_count > 0  # frames before the damage
    assert per_capture == {str(captures["sink"]): sink_count, str(captures["damaged"]): damaged_count}

    failing = spark_frames.load_frames(spark, names, fail_fast=True)
    with pytest.raises((Py4JJavaError, PySparkException)) as raised:
        failing.frames.count()
    message = spark_frames.fail_fast_message(raised.value)
    assert message is not None
    assert message.split(":")[0] in (str(captures["damaged"]), str(captures["garbage"]))


def test_listing_and_task_planning(tmp_path):
    (tmp_path / "a.pcap").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.pcapng").write_bytes(b"x" * 30)
    (tmp_path / "readme.txt").write_text("not listed")
    found, problems = spark_plan.list_captures([str(tmp_path), str(tmp_path / "missing.pcap")])
    assert [c.name for c in found] == [str(tmp_path / "a.pcap"), str(tmp_path / "sub" / "b.pcapng")]
    assert problems == [spark_plan.Problem(str(tmp_path / "missing.pcap"), "no such file or directory")]
    globbed, _ = spark_plan.list_captures([str(tmp_path / "**" / "*.pcap*")])
    assert len(globbed) == 2
    tasks = spark_plan.plan_tasks(found, parallelism=2, split_bytes=10)
    assert [(t[1], t[2], t[3]) for t in tasks] == [
        (str(tmp_path / "sub" / "b.pcapng"), 0, 2),
        (str(tmp_path / "sub" / "b.pcapng"), 1, 2),
        (str(tmp_path / "a.pcap"), 0, 1),
    ]


@pytest.mark.timeout(480)
def test_tables_written_as_json_and_csv(replayed, tmp_path):
    """--format json and csv: JSON lines per part file; CSV with a header and nested columns as JSON."""
    _, _, tables = replayed
    chosen = {name: tables[name] for name in ("twopc", "audit")}
    written = jobs.write_tables(chosen, str(tmp_path / "json"), "json")
    lines = [
        json.loads(line) for f in sorted(Path(written["twopc"]).glob("part-*.json")) for line in f.open()
    ]
    sinks = {r["txn_id"] for r in lines if r["capture"].endswith("sink.pcap")}
    assert {"sink:c_id=1", "sink:c_id=2"} <= sinks
    written = jobs.write_tables(chosen, str(tmp_path / "csv"), "csv")
    parts = sorted(Path(written["twopc"]).glob("part-*.csv"))
    rows = [row for f in parts for row in csv.DictReader(f.open(newline=""))]
    where = {r["txn_id"]: json.loads(r["where"]) for r in rows}  # an array column, as JSON text
    assert where["sink:c_id=1"] == [{"stream_id": 1, "start_por": 0, "end_por": 11}]
    with pytest.raises(jobs.JobError, match="unknown output format 'xml'"):
        jobs.write_tables(chosen, str(tmp_path / "xml"), "xml")


@pytest.mark.timeout(480)
def test_fail_fast_stops_at_the_damaged_capture(captures):
    stopped = run_cli(
        "spark-replay",
        str(captures["damaged"]),
        str(captures["sink"]),
        "--master",
        "local[1]",
        "--fail-fast",
        timeout=360,
    )
    assert stopped.returncode == 2
    assert str(captures["damaged"]) in stopped.stderr
    assert "--fail-fast" in stopped.stderr
    assert "Traceback" not in stopped.stderr


def test_jsonl_rows_of_the_sink_capture(replayed_everything):
    """--jsonl for scripts: the hand-built sink capture's rounds and audit in the shared run."""
    replay = replayed_everything.ok()
    votes = {
        (r["txn_id"], r["vote"], r["decision"], r["bytes_committed"]) for r in replay.table("twopc", "sink")
    }
    assert votes == {("sink:c_id=1", True, True, 11), ("sink:c_id=2", False, False, 0)}
    (audit,) = replay.table("audit", "sink")
    assert (audit["messages"], audit["gaps"], audit["last_checkpoint"]) == (4, 1, 11)
    # --sql and --job results are rows too: frames per type, and the example job's key counts.
    per_type = {r["type"]: r["n"] for r in replay.tables["sql"]}
    assert sum(per_type.values()) == pq.read_table(replay.output / "frames").num_rows
    assert per_type["MESSAGE"] > 0 and {"window_start", "key", "messages"} <= set(replay.tables["job"][0])


def test_an_unreachable_master_is_one_line_at_once(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli(
        "spark-replay",
        str(Path(__file__).resolve().parent.parent / "captures" / "dcp-stream.pcap"),
        "--master",
        f"spark://127.0.0.1:{port}",
    )
    assert result.returncode == 2, result.stderr
    assert f"cannot reach the Spark master 'spark://127.0.0.1:{port}'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_older_words_are_still_taken(tmp_path):
    """--jsonl and --format parquet|csv|json (now --format jsonl and --output-format) still parse."""
    nowhere = str(tmp_path / "no-captures")
    for old in (["--jsonl"], ["--format", "csv"], ["--format", "parquet"], ["--output-format", "json"]):
        result = run_cli("spark-replay", nowhere, *old)
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"wallaroo-proto spark-replay: capture {nowhere}: no such file or directory\n"


#: Display filters over every kind of field: u64 past 2**63, lists, struct keys, absent fields.
DISPLAY_FILTERS = [
    "type == MESSAGE",
    "stream_id != 11",
    "not stream_id == 11",
    "message_id >= 3 and message_id < 0xFFFFFFFFFFFFFFFF",
    "stream_id > 9223372036854775808 or vbucket in {0, 2..5}",
    "type not in {HELLO OK ACK}",
    'type matches "^dcp_.*_req$" || stream_name contains "ord"',
    "notes or violations",
    'violations matches "connected"',
    "acks.stream_id == 12",
    "acks.stream_id != 12",
    "commit == false",
    "ts > 1.7e9 and !(protocol == wallaroo)",
    'dcp_key >= "d" and length le 64',
    "length < 99999999999999999999 and type == ACK",  # past a long: compared exactly
]


def _plain(value):
    """A Spark value as the dissector's record holds it: u64 as int, structs as dicts."""
    if isinstance(value, Decimal):
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.timeout(480)
def test_spark_predicate_selects_the_frames_the_python_filter_keeps(replayed):
    """Each filter, as a Spark column and as the Python function, on the same rows of the frames table."""
    from wallaroo_proto.display_filter import compile_filter, parse, spark_predicate

    _, loaded, _ = replayed
    tests = [
        spark_predicate(parse(text), reports.field_column).alias(f"_f{i}")
        for i, text in enumerate(DISPLAY_FILTERS)
    ]
    columns = list(field_names())
    rows = [
        row.asDict(recursive=True) for row in loaded.frames.select(*reports.flat_columns(), *tests).collect()
    ]
    records = [{name: _plain(row[name]) for name in columns} for row in rows]
    for i, text in enumerate(DISPLAY_FILTERS):
        keep = compile_filter(text)
        python = [keep(record) for record in records]
        spark = [row[f"_f{i}"] for row in rows]
        assert any(python) and not all(python), text  # each filter keeps some frames and drops some
        assert spark == python, text


@pytest.mark.timeout(480)
def test_spark_replay_filters_the_frames_before_every_table(spark, capsys):
    """spark-replay -Y: a --sql query over frames and the per-stream audit see the matching frames only."""
    from rich.console import Console
    from wallaroo_proto_cli.spark_replay_view import ConsoleShow

    from wallaroo_proto.capture.dissector import iter_records
    from wallaroo_proto.display_filter import compile_filter, parse
    from wallaroo_proto.spark.replay import Replay, run

    sample = str(Path(__file__).resolve().parent.parent / "captures" / "source-session.pcap")
    text = "stream_id == 11 and type != NOTIFY"
    quiet = Console(quiet=True)
    sql = "SELECT connection, frame_index FROM frames"
    replay = Replay([sample], sql=sql, display_filter=parse(text))
    code = run(spark, replay, ConsoleShow(spark, quiet, quiet, quiet, None, "spark-replay"))
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = [r for r in iter_records(sample) if compile_filter(text)(r)]
    got = sorted((r["connection"], r["frame_index"]) for r in rows if r["table"] == "sql")
    assert got == sorted((r["connection"], r["frame_index"]) for r in expected)
    assert len(got) == 8  # stream 11's NOTIFY_ACK and its 7 MESSAGEs
    assert {r["stream_id"] for r in rows if r["table"] == "audit"} == {11}


def test_printed_titles_carry_their_view_names():
    """A title names the view to query (the common views first, then Wallaroo's, then those present)."""
    shown = reports.printed_views({"wallaroo", "dcp"})
    names = [name for name, _ in shown]
    assert names[:3] == ["connections", "violations", "findings"]
    assert ("audit", "Delivery audit per stream (audit)") in shown
    assert ("dcp_vbuckets", "DCP vbucket streams (dcp_vbuckets)") in shown
    assert not [n for n in names if n.startswith(("kinesis_", "tremor_", "ambrosia_"))]
    assert all(title.endswith(f" ({name})") for name, title in shown)


def test_the_plugins_say_whose_reports_print_when_their_protocol_is_absent(monkeypatch):
    """Printing a protocol's reports with none of its connections is its plug-in's declaration,
    not a name in the shared code."""
    swapped = tuple(
        dataclasses.replace(p, reports_always_printed=p.name == "kinesis") for p in reports.plugins()
    )
    monkeypatch.setattr(reports, "plugins", lambda: swapped)
    names = [name for name, _ in reports.printed_views({"dcp"})]
    assert "kinesis_shards" in names and "dcp_vbuckets" in names
    assert "audit" not in names and not [n for n in names if n.startswith(("tremor_", "ambrosia_"))]


@pytest.mark.timeout(480)
def test_the_use_column_is_the_field_a_plugin_declares(replayed, monkeypatch):
    """``connections``' use is each protocol's declared ``use_field``: Wallaroo's use, and here a
    Kinesis shard too."""
    from wallaroo_proto.capture.dissector import iter_records

    names, loaded, _ = replayed
    swapped = tuple(
        dataclasses.replace(p, use_field="shard_id") if p.name == "kinesis" else p for p in reports.plugins()
    )
    monkeypatch.setattr(reports, "plugins", lambda: swapped)
    got = {
        k: r["use"] for k, r in rows_by(reports.connections(loaded.frames), "capture", "conn_index").items()
    }
    expected: dict = {}
    for path in names:
        for r in iter_records(path):
            use = {"kinesis": r.get("shard_id"), "wallaroo": r.get("use")}.get(r["protocol"])
            if expected.get((path, r["conn_index"])) is None:
                expected[(path, r["conn_index"])] = use
    assert got == expected
    assert {"shardId-000000000000", "source", "sink"} <= set(got.values())


def test_the_standard_tables_print_with_a_question_only_when_asked():
    shown = spark_replay_cli().shows_standard_tables
    assert shown(None, None, False, 0) and shown(None, None, False, -1)  # no question: as before
    assert not shown("SELECT 1", None, False, 0) and not shown(None, "m:f", False, -1)
    assert shown("SELECT 1", None, True, 0) and shown(None, "m:f", False, 1)


def spark_replay_cli():
    from wallaroo_proto_cli import spark_replay

    return spark_replay


def _listed_views(text: str) -> set[str]:
    """The view names after 'over the views' up to the sentence's end (help text or a paragraph)."""
    import re

    words = " ".join(text.split()).split("over the views ", 1)[1].split(".", 1)[0]
    return set(re.findall(r"[a-z_]+", words))


@pytest.mark.timeout(480)
def test_every_registered_view_is_in_the_help_and_the_docs(spark, replayed):
    """SHOW TABLES after the views are registered, the help's --sql list and docs/spark.md's table agree."""
    import re

    _, _, tables = replayed
    jobs.register_views(tables)
    registered = {r["tableName"] for r in spark.sql("SHOW TABLES").collect() if r["isTemporary"]}
    assert registered == set(tables) == set(reports.view_names())
    assert {"ambrosia_pairs", "ambrosia_violations", "tremor_sessions", "findings"} <= registered
    docs = (Path(__file__).resolve().parent.parent / "docs" / "spark.md").read_text()
    assert set(re.findall(r"^\| `([a-z_]+)` \|", docs, re.M)) == registered
    helped = run_cli("spark-replay", "--help")
    assert helped.returncode == 0, helped.stderr
    assert _listed_views(helped.stdout) == registered


@pytest.mark.timeout(480)
def test_connections_violations_and_findings_cover_every_protocol(replayed):
    """The common views hold every protocol's rows, each as the dissector's records give them."""
    from wallaroo_proto.capture.dissector import iter_records
    from wallaroo_proto.findings import of_record

    names, _, tables = replayed
    connections = rows_by(tables["connections"], "capture", "conn_index")
    violations = [r.asDict() for r in tables["violations"].collect()]
    findings = [r.asDict() for r in tables["findings"].collect()]
    expected_violations, expected_findings, per_connection = [], [], {}
    for path in names:
        for r in iter_records(path):
            key = (path, r["conn_index"])
            per_connection.setdefault(key, [r["protocol"], 0])
            for reason in r.get("violations") or ():
                expected_violations.append(
                    (*key, r["protocol"], r["packet"], r["frame_index"], r["type"], reason)
                )
                per_connection[key][1] += 1
            for severity, text in of_record(r):
                expected_findings.append((*key, r["protocol"], r["packet"], r["frame_index"], severity, text))
    got = [
        (r["capture"], r["conn_index"], r["protocol"], r["packet"], r["frame_index"], r["type"], r["reason"])
        for r in violations
    ]
    assert sorted(got, key=repr) == sorted(expected_violations, key=repr)
    assert {k: [r["protocol"], r["violations"]] for k, r in connections.items()} == per_connection
    with_violations = {r["protocol"] for r in connections.values() if r["violations"] > 0}
    assert {"ambrosia", "tremor"} <= with_violations  # the question the issue asked: none missed
    got = [
        (
            r["capture"],
            r["conn_index"],
            r["protocol"],
            r["packet"],
            r["frame_index"],
            r["severity"],
            r["finding"],
        )
        for r in findings
    ]
    assert got == sorted(expected_findings, key=lambda f: (f[0], f[1], f[4], f[3]))  # in the view's order
    assert {"error", "warning"} <= {f[5] for f in got}  # the samples have violations and notes


@pytest.mark.timeout(480)
def test_findings_take_a_plug_ins_finding_after_the_frames_violations(replayed):
    """A plug-in's finding (findings.mark) comes with its severity, after the frame's violations."""
    from pyspark.sql import functions as F  # noqa: N812

    _, loaded, _ = replayed
    bad = loaded.frames.where(F.size("violations") > 0).limit(1)
    marked = bad.withColumn("severity", F.lit("note")).withColumn(
        "finding", F.lit("rolled back to 20 (asked 30)")
    )
    (frame,) = marked.collect()
    rows = reports.findings(marked).collect()
    assert [(r["severity"], r["finding"]) for r in rows] == [
        *(("error", v) for v in frame["violations"]),
        *(("warning", n) for n in frame["notes"] or ()),
        ("note", "rolled back to 20 (asked 30)"),
    ]
    assert {r["frame_index"] for r in rows} == {frame["frame_index"]}


def test_a_question_follows_the_standard_tables_or_stands_alone():
    """The run shows the standard tables then --sql's answer, or (standard off) the answer alone."""
    from wallaroo_proto.spark.replay import Replay, shown_tables

    standard = reports.printed_views({"wallaroo": 3})
    tables = {name: f"frame {name}" for name, _ in standard}
    asked = Replay(["x.pcap"], sql="SELECT 1")
    shown = shown_tables(tables, {"sql": "answer"}, {"wallaroo": 3}, asked)
    assert shown[:-1] == [(name, title, f"frame {name}") for name, title in standard]
    assert shown[-1] == ("sql", "--sql SELECT 1", "answer")
    alone = dataclasses.replace(asked, standard=False)
    assert shown_tables(tables, {"sql": "answer"}, {"wallaroo": 3}, alone) == [shown[-1]]


class _WatchedConsole:
    """A terminal console for the tables that notes whether a progress display was live at each print."""

    def __init__(self, progress_console) -> None:
        import io

        from rich.console import Console

        self.progress_console = progress_console
        self.console = Console(file=io.StringIO(), force_terminal=True, width=160)
        self.live_at_print: list[bool] = []

    def __getattr__(self, name):
        return getattr(self.console, name)

    def print(self, *args, **kw) -> None:
        self.live_at_print.append(bool(self.progress_console._live_stack))
        self.console.print(*args, **kw)


@pytest.mark.timeout(480)
def test_the_progress_display_ends_before_a_table_prints(spark, captures):
    """On a terminal a table printed under a live bar lands on the bar's line ('0:00:002PC rounds')."""
    import io

    from rich.console import Console
    from wallaroo_proto_cli.spark_replay_view import ConsoleShow

    from wallaroo_proto.spark.replay import Replay, run

    info = Console(file=io.StringIO(), force_terminal=True, width=160)
    out = _WatchedConsole(info)
    code = run(spark, Replay([str(captures["sink"])]), ConsoleShow(spark, out, info, info, 5, "spark-replay"))
    assert code == 0
    assert len(out.live_at_print) >= 6 and not any(out.live_at_print), out.live_at_print
    assert "2PC rounds (twopc)" in out.console.file.getvalue()


@pytest.mark.timeout(480)
def test_a_question_prints_its_answer_alone_and_no_cell_folds_on_a_pipe(captures):
    """--sql with -q: the answer's title and table only; piped, a 300-character cell stays on one line."""
    long_cell = "abcdefghij" * 30
    sql = f"SELECT '{long_cell}' AS long_cell, protocol, count(*) AS n FROM frames GROUP BY protocol"
    result = run_cli(
        "spark-replay", str(captures["sink"]), "--master", "local[1]", "-q", "--sql", sql, timeout=360
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"--sql {sql}"  # the title, whole, first: no standard table before it
    assert len(lines) == 1 + 5  # the answer's table: borders, header, one row (wallaroo)
    (row,) = [line for line in lines if "wallaroo" in line]
    assert long_cell in row
