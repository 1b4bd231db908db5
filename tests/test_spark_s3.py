"""Captures on object storage: spark-replay and the data source read ``s3://`` URLs (moto's S3 server).

The repo's sample captures sit in the local folder and in a bucket of moto's S3
server (moto_s3.py), reached over loopback with the AWS SDK's own settings
(``AWS_ENDPOINT_URL_S3`` and a key in the environment, nothing on the command
line). A missing bucket, a read that S3 refuses and a cut object are each one line
naming the URL while the other captures are still read. That the same captures from
a bucket and from disk give the same tables is test_spark_cluster.py's comparison.
"""

from __future__ import annotations

import json
import os

import pytest
from moto_s3 import serve
from replay_everything import CAPTURES, DEFAULT_PORTS
from support import run_cli
from test_dcp_dissect import server_port

from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.spark import datasource, remote
from wallaroo_proto.spark import plan as spark_plan

SAMPLES = sorted(p for p in CAPTURES.iterdir() if p.name.endswith(spark_plan.CAPTURE_SUFFIXES))
PORTS = sorted(
    {*DEFAULT_PORTS, *(server_port(CAPTURES / n) for n in ("dcp-stream.pcap", "dcp-rollback.pcap"))}
)
PORT_ARGS = [arg for port in PORTS for arg in ("--port", str(port))]
PREFIX = "wallaroo-proto spark-replay: "
BIG = 24 * 1024 * 1024  # an object much larger than a read block


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 with the samples under run/, and under bad/ one sample, a refused object and a cut one."""
    good = (CAPTURES / "sink-2pc.pcap").read_bytes()
    cut = (CAPTURES / "source-session.pcap").read_bytes()
    objects = {f"run/{p.name}": p.read_bytes() for p in SAMPLES}
    objects |= {"bad/ok.pcap": good, "bad/denied.pcap": good, "bad/cut.pcap": cut[: len(cut) * 3 // 5]}
    objects["big/blob.pcap"] = bytes(BIG)
    with serve(tmp_path_factory.mktemp("s3"), objects, denied=("bad/denied.pcap",)) as server:
        yield server


@pytest.fixture
def s3_env(s3, monkeypatch):
    """This process reads the bucket as the reader (fsspec's file systems are cached per process)."""
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    return s3.env


def test_urls_are_listed_as_paths_are(s3_env):
    sizes = {p.name: p.stat().st_size for p in SAMPLES}
    found, problems = spark_plan.list_captures(["s3://caps/run/"])
    assert problems == []
    assert [(c.name, c.size) for c in found] == [(f"s3://caps/run/{n}", sizes[n]) for n in sorted(sizes)]
    assert all(c.path == c.name for c in found)
    globbed, _ = spark_plan.list_captures(["s3://caps/run/*.pcapng", "s3://caps/run/dcp-stream.pcap"])
    assert [c.name for c in globbed] == ["s3://caps/run/sink-2pc-ns.pcapng", "s3://caps/run/dcp-stream.pcap"]
    _, problems = spark_plan.list_captures(["s3://nobucket/run/", "s3://caps/none/", "s3://caps/run/*.cap"])
    assert [(p.capture, p.error) for p in problems] == [
        ("s3://nobucket/run/", "The specified bucket does not exist"),
        ("s3://caps/none/", "no such object or prefix"),
        ("s3://caps/run/*.cap", "no object matches this pattern"),
    ]


def test_a_task_reads_a_large_object_in_blocks_not_whole(s3_env):
    with remote.open_url("s3://caps/big/blob.pcap") as f:
        assert len(f.read(1 << 20)) == 1 << 20  # what the pcap reader asks for at a time
        assert f.cache.total_requested_bytes == (1 << 20) + remote.BLOCK_SIZE < BIG
        f.seek(BIG - 10)
        assert f.read(100) == bytes(10)


def test_split_parts_of_an_object_give_the_dissectors_frames(s3_env):
    """The executor's side without Spark: every planned part of every URL, read as a task reads it."""
    options = datasource.ReadOptions(
        paths=("s3://caps/run/",), ports=tuple(PORTS), parallelism=3, split_bytes=4096
    )
    parts = datasource.plan_partitions(options)
    assert any(p.nparts > 1 for p in parts) and all(p.problem is None for p in parts)
    schema = datasource.frame_schema()
    got = []
    for part in parts:
        for batch in datasource.read_part(part, options, schema):
            got += batch.to_pylist()
    assert all(row[datasource.PROBLEM_COLUMN] is None for row in got)
    expected = []
    for path in SAMPLES:
        expected += iter_records(str(path), ports=PORTS, capture_name=f"s3://caps/run/{path.name}")
    key = ("capture", "conn_index", "packet", "offset", "type")
    assert sorted(tuple(r.get(k) for k in key) for r in got) == sorted(
        tuple(r.get(k) for k in key) for r in expected
    )
    assert len(got) > 100


@pytest.mark.timeout(900)
def test_a_missing_bucket_a_refused_read_and_a_cut_object_are_one_line_each(s3):
    per_capture_sql = "SELECT capture, count(*) AS n FROM frames GROUP BY capture"
    got = run_cli(
        "spark-replay", "s3://caps/bad/", "s3://nobucket/run/", *PORT_ARGS, "--master", "local[*]",
        "--sql", per_capture_sql, "--format", "jsonl", env={**os.environ, **s3.env}, timeout=900,
    )  # fmt: skip
    assert got.returncode == 1, got.stderr[-3000:]
    assert "Traceback" not in got.stderr
    named = sorted(line for line in got.stderr.splitlines() if line.startswith(f"{PREFIX}capture "))
    assert named == [
        # source-session.pcap cut at 3/5 of its 2,208 bytes, 1,324: inside packet 13 (at 1,236: 16 + 98 bytes)
        f"{PREFIX}capture s3://caps/bad/cut.pcap: packet 13, byte offset 1236: truncated packet: 98 bytes "
        "captured, only 72 left in the file (frames before it are kept)",
        f"{PREFIX}capture s3://caps/bad/denied.pcap: cannot read: access denied (frames before it are kept)",
        f"{PREFIX}capture s3://nobucket/run/: The specified bucket does not exist",
    ]
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    per_capture = {row["capture"]: row["n"] for row in rows if row["table"] == "sql"}
    ok = sum(1 for _ in iter_records(str(CAPTURES / "sink-2pc.pcap"), ports=PORTS))
    assert per_capture["s3://caps/bad/ok.pcap"] == ok  # the other captures are read in full
    assert per_capture["s3://caps/bad/cut.pcap"] > 0  # and the cut one up to the cut
    assert "s3://caps/bad/denied.pcap" not in per_capture

    stopped = run_cli("spark-replay", "s3://nobucket/run/", "--fail-fast", env={**os.environ, **s3.env})
    assert stopped.returncode == 2
    assert (
        stopped.stderr.strip() == f"{PREFIX}capture s3://nobucket/run/: The specified bucket does not exist"
    )
