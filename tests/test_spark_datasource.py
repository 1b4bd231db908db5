"""The ``wallaroo-capture`` Spark data source from a plain PySpark session, and u64 values kept exact.

The session here is made with ``SparkSession.builder`` as any PySpark program
makes one (not ``session.build_session``): ``register`` is all it needs. The
big-id capture carries stream ids, message ids and points of reference on both
sides of 2**63 (a Spark long's limit); the values and their order are written
here by hand, and the dissector, the data source, SQL, Parquet and spark-replay's
JSON lines must all give them back digit for digit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import run_cli
from test_spark_replay import Clock, write_sink, write_source

from wallaroo_proto import records
from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.frames import Ack, Hello, Message, Notify, NotifyAck, Ok
from wallaroo_proto.protocols.wallaroo.twopc import Phase1, Phase2, Reply, twopc_frame
from wallaroo_proto.spark import datasource

pytestmark = pytest.mark.e2e

TOP = 2**64 - 1
#: Stream ids in the order they are sent; sorted as numbers they are LOW, EDGE, ABOVE, TOP.
LOW, EDGE, ABOVE = 5, 2**63 - 1, 2**63 + 1
SENT = (TOP, ABOVE, EDGE, LOW)
POR = 2**63 + 7


def write_big_ids(path: Path) -> None:
    """A source session on streams SENT (NOTIFY at POR, two MESSAGEs each, one ACK) and a sink's 2PC
    round over a range above 2**63."""
    with PcapWriter(path) as writer:
        c = Clock(writer, 40030, 7100, 1_700_000_300.0)
        c.client(Hello("0.0.1", b"", "prog", "big"))
        c.server(Ok(100))
        for stream in SENT:
            c.client(Notify(stream, f"s{stream}", POR))
            c.server(NotifyAck(True, stream, POR))
        for stream in SENT:
            c.client(Message(stream, TOP - 1, 1, b"k", b"a"))
            c.client(Message(stream, TOP, 2, b"k", b"b"))
        c.server(Ack(10, ((TOP, TOP), (ABOVE, POR + 1))))
        c.session.close(True, c.t + 0.01)
        w = Clock(writer, 40031, 7200, 1_700_000_400.0)
        w.client(Hello("v0.0.1", b"", "w", "worker1"))
        w.server(Ok(500))
        w.client(twopc_frame(Phase1("big:c_id=1", ((TOP, 2**63, 2**63 + 11),))))
        w.server(twopc_frame(Reply("big:c_id=1", True)))
        w.client(twopc_frame(Phase2("big:c_id=1", True)))
        w.session.close(True, w.t + 0.01)


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ds-captures")
    paths = {name: root / f"{name}.pcap" for name in ("source", "sink", "big")}
    write_source(paths["source"])
    write_sink(paths["sink"])
    write_big_ids(paths["big"])
    data = paths["source"].read_bytes()
    paths["damaged"] = root / "damaged.pcap"
    paths["damaged"].write_bytes(data[: len(data) * 3 // 5])  # ends inside a packet record
    return paths


@pytest.fixture(scope="module")
def spark():
    """A plain PySpark session; its Python workers run this interpreter (it has pyarrow)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("data source test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    datasource.register(session)
    yield session
    session.stop()


KEY = ("capture", "packet", "frame_index", "type", "verdict", "stream_id", "message_id", "length")


def dissector_rows(path: Path, **options) -> list[tuple]:
    return sorted(tuple(r.get(k) for k in KEY) for r in iter_records(path, capture_name=str(path), **options))


def spark_rows(frame) -> list[tuple]:
    """The KEY fields of a read of the ``all`` table, as records hold them (u64 exact)."""
    from wallaroo_proto.spark.reports import flat_frames

    return sorted(
        tuple(int(v) if isinstance(v, Decimal) else v for v in row)
        for row in flat_frames(frame).select(*KEY).collect()
    )


@pytest.mark.timeout(480)
def test_plain_session_reads_the_format_with_its_options(spark, captures):
    source, sink = str(captures["source"]), str(captures["sink"])
    reader = spark.read.format("wallaroo-capture").option("table", "all")
    both = reader.load([source, sink])
    assert both.schema.names[-1] == "_problem" and both.where("_problem IS NOT NULL").count() == 0
    assert spark_rows(both) == sorted(dissector_rows(captures["source"]) + dissector_rows(captures["sink"]))
    # The default table: what every frame has; a protocol's table: the frame key and its fields.
    frames = spark.read.format("wallaroo-capture").load([source, sink])
    assert frames.columns == [name for name, _, _ in records.COMMON_FIELDS] + ["_problem"]
    own = spark.read.format("wallaroo-capture").option("table", "wallaroo_frames").load([source, sink])
    assert own.columns[:3] == list(records.FRAME_KEY) and "stream_id" in own.columns
    assert own.count() == frames.count() == both.count()
    assert spark.read.format("wallaroo-capture").option("table", "dcp_frames").load(source).count() == 0
    # Options reach the executors' dissector: the frame-size limit and a forced protocol.
    small = reader.option("maxFrameSize", "16").load(source)
    assert spark_rows(small) == dissector_rows(captures["source"], max_frame_size=16)
    assert spark_rows(small) != dissector_rows(captures["source"])
    forced = (
        spark.read.format("wallaroo-capture").option("table", "all").option("protocol", "kinesis").load(sink)
    )
    assert spark_rows(forced) == dissector_rows(captures["sink"], protocol="kinesis")
    assert spark_rows(forced) != dissector_rows(captures["sink"])
    # Split by connection into many tasks, the rows are the same.
    split = (
        spark.read.format("wallaroo-capture")
        .option("table", "all")
        .option("splitBytes", "1")
        .option("parallelism", "2")
        .load(source)
    )
    assert split.rdd.getNumPartitions() == 2
    assert spark_rows(split) == dissector_rows(captures["source"])


AMBROSIA_FIRST_START = Path(__file__).resolve().parent.parent / "captures" / "ambrosia-first-start.pcap"


def present(fields: dict) -> dict:
    """A record's or a row's fields that hold a value, u64 decimals as ints (``ts`` left out: a
    timestamp to microseconds in Spark; ``ts_ns`` is compared whole)."""
    return {
        k: int(v) if isinstance(v, Decimal) else v
        for k, v in fields.items()
        if v is not None and not k.startswith("_") and k != "ts"
    }


@pytest.mark.timeout(480)
def test_split_ambrosia_capture_frames_equal_the_dissector(spark):
    """An LB's receive and send sockets, judged together, stay so when the capture is split in tasks."""
    name = str(AMBROSIA_FIRST_START)
    from wallaroo_proto.spark.reports import flat_frames

    reader = spark.read.format("wallaroo-capture").option("table", "all")
    split = reader.option("splitBytes", "1").option("parallelism", "2").load(name)
    assert split.rdd.getNumPartitions() == 2
    rows = [present(row.asDict(recursive=True)) for row in flat_frames(split).collect()]
    expected = [present(r) for r in iter_records(name, capture_name=name)]
    key = lambda r: (r["packet"], r["conn_index"], r["frame_index"])  # noqa: E731
    assert sorted(rows, key=key) == sorted(expected, key=key)
    assert not [r for r in rows if r.get("violations")]


@pytest.mark.timeout(480)
def test_damaged_and_missing_captures_by_mode(spark, captures):
    damaged, missing = str(captures["damaged"]), str(captures["damaged"].with_name("missing.pcap"))
    reader = spark.read.format("wallaroo-capture")
    permissive = reader.load([damaged, missing])
    problems = {r.capture: r._problem for r in permissive.where("_problem IS NOT NULL").collect()}
    assert problems[missing] == "no such file or directory"
    assert "truncated" in problems[damaged] or "packet" in problems[damaged]
    kept = permissive.where("_problem IS NULL").count()
    assert kept > 0  # the frames before the damage are kept
    dropped = spark.read.format("wallaroo-capture").option("mode", "DROPMALFORMED").load(damaged)
    assert "_problem" not in dropped.columns and dropped.count() == kept
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((Py4JJavaError, PySparkException)) as failed:
        spark.read.format("wallaroo-capture").option("mode", "failfast").load(damaged).count()
    assert f"{damaged}:" in str(failed.value)
    with pytest.raises((Py4JJavaError, PySparkException)) as bad:
        spark.read.format("wallaroo-capture").option("mode", "LOOSE").load(damaged).count()
    assert "option mode='LOOSE'" in str(bad.value)


@pytest.mark.timeout(480)
def test_u64_ids_exact_in_spark_and_sql(spark, captures):
    """u64 values are longs of their 64 bits: the same bits come back, and the unsigned value is
    one documented expression away, for ordering and arithmetic past 2**63 (docs/spark.md)."""
    frames = (
        spark.read.format("wallaroo-capture")
        .option("table", "wallaroo_frames")
        .option("mode", "DROPMALFORMED")
        .load(str(captures["big"]))
    )
    assert dict(frames.dtypes)["stream_id"] == "bigint"
    frames.join(
        spark.read.format("wallaroo-capture").option("mode", "DROPMALFORMED").load(str(captures["big"])),
        list(records.FRAME_KEY),
    ).createOrReplaceTempView("big_frames")
    u64 = "IF({0} < 0, CAST({0} AS DECIMAL(20,0)) + 18446744073709551616, {0})"
    ordered = spark.sql(
        f"SELECT DISTINCT {u64.format('stream_id')} AS id FROM big_frames WHERE type = 'NOTIFY' ORDER BY id"
    ).collect()
    assert [int(r.id) for r in ordered] == [LOW, EDGE, ABOVE, TOP]
    bits = lambda v: int(v) % 2**64  # noqa: E731 - a long's bits as the unsigned value
    messages = spark.sql(
        "SELECT stream_id, message_id FROM big_frames WHERE type = 'MESSAGE' AND twopc IS NULL"
    ).collect()
    assert sorted((bits(r.stream_id), bits(r.message_id)) for r in messages) == sorted(
        (s, m) for s in SENT for m in (TOP - 1, TOP)
    )
    assert {
        bits(r.point_of_ref)
        for r in spark.sql("SELECT * FROM big_frames WHERE type = 'NOTIFY_ACK'").collect()
    } == {POR}
    (ack,) = spark.sql("SELECT acks FROM big_frames WHERE type = 'ACK'").collect()
    assert [(bits(a.stream_id), bits(a.point_of_ref)) for a in ack.acks] == [(TOP, TOP), (ABOVE, POR + 1)]
    (phase1,) = spark.sql("SELECT `where` FROM big_frames WHERE twopc = 'PHASE1'").collect()
    assert [(bits(w.stream_id), bits(w.start_por), bits(w.end_por)) for w in phase1.where] == [
        (TOP, 2**63, 2**63 + 11)
    ]
    # Arithmetic stays exact past 2**63 on the unsigned value: the largest id minus one.
    (row,) = spark.sql(f"SELECT max({u64.format('message_id')}) - 1 AS below FROM big_frames").collect()
    assert int(row.below) == TOP - 1


@pytest.mark.timeout(600)
def test_u64_ids_exact_in_dissect_jsonl_parquet_and_reports(replayed_everything):
    """The big-id capture (write_big_ids) dissected, and in the shared spark-replay run."""
    replay = replayed_everything.ok()
    big = str(replay.paths["big"])
    dissected = run_cli("dissect", big, "--format", "jsonl", timeout=120)
    assert dissected.returncode == 0, dissected.stderr
    lines = [json.loads(line) for line in dissected.stdout.splitlines()]
    assert [r["stream_id"] for r in lines if r["type"] == "NOTIFY"] == list(SENT)
    assert f'"message_id":{TOP}' in dissected.stdout

    audit = [r for r in replay.table("audit", "big") if r["use"] == "source"]
    assert [r["stream_id"] for r in audit] == [LOW, EDGE, ABOVE, TOP]  # the report's order: numeric
    assert {(r["first_id"], r["last_id"], r["messages"], r["gaps"]) for r in audit} == {(TOP - 1, TOP, 2, 0)}
    assert {r["stream_id"]: r["last_checkpoint"] for r in audit}[TOP] == TOP
    (twopc,) = replay.table("twopc", "big")
    assert twopc["bytes_committed"] == 11 and twopc["where"][0]["end_por"] == 2**63 + 11

    table = pq.read_table(replay.output / "wallaroo_frames")
    frames = pq.read_table(replay.output / "frames").select([*records.FRAME_KEY, "type"])
    types = {tuple(r[k] for k in records.FRAME_KEY): r["type"] for r in frames.to_pylist()}
    notified = [
        r["stream_id"] % 2**64  # a long of the u64's bits (docs/spark.md)
        for r in table.select([*records.FRAME_KEY, "stream_id"]).to_pylist()
        if types[tuple(r[k] for k in records.FRAME_KEY)] == "NOTIFY"
        and r["capture"] == str(replay.paths["big"])
    ]
    assert sorted(notified) == sorted(SENT)
    assert str(table.schema.field("stream_id").type) == "int64"


def test_the_shipped_zip_is_removed_when_the_driver_exits(tmp_path):
    """register() on a session it did not build ships the package from a temporary directory."""
    script = (
        "import sys\n"
        "from wallaroo_proto.spark.session import ship_package\n"
        "class Context:\n"
        "    def addPyFile(self, path):\n"
        "        print(path, flush=True)\n"
        "ship_package(Context())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shipped = Path(done.stdout.strip())
    assert shipped.name.endswith(".zip") and shipped.parent.name.startswith("wallaroo-spark-")
    assert not shipped.parent.exists()
