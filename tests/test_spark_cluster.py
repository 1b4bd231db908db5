"""spark-replay on a real Spark standalone cluster: a master and two workers on loopback.

The cluster is started from the pyspark installation itself (``spark-class``
Master and Worker, ``spark.standalone``); spark-replay runs against it with
``--master spark://127.0.0.1:PORT`` over captures of the shared run read from
moto's S3 (``s3://``, moto_s3.py): one or more of every protocol's, the damaged
one and the u64 one (every stage pays a task's start per capture, so not all
22). It writes every table as Parquet, and each table's rows of those captures
must equal the ones the shared ``local[2]`` run wrote from disk. Its console is
the rich view (tables, the damaged capture named, exit 1). The cluster is
started once for the module and stopped whatever happens.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from moto_s3 import serve
from replay_everything import JOB, PREFIX
from support import COMMAND

from wallaroo_proto.spark.standalone import StandaloneCluster

pytestmark = pytest.mark.e2e

#: The shared run's captures the cluster reads: every protocol's, RESTARTs, 2PC rounds, u64 ids
#: and the damaged capture.
ON_THE_CLUSTER = ("source", "sink", "damaged", "big", "kinesis", "restart-reconnect.pcap")
ON_THE_CLUSTER += ("dcp-stream.pcap", "ambrosia-recovery.pcap", "tremor-session.pcap")


def rows_of(directory: Path, captures: set[str]) -> list[dict]:
    """A written table's rows of ``captures`` (file names: a path and a URL compare equal),
    each capture named by its file name."""
    rows = pq.read_table(directory).to_pylist()
    for row in rows:
        row["capture"] = row["capture"].rsplit("/", 1)[-1]
    return [row for row in rows if row["capture"] in captures]


def table_rows(directory: Path, captures: set[str]) -> list[str]:
    """``rows_of``, order-free (Spark may write its parts in any order)."""
    return sorted(repr(row) for row in rows_of(directory, captures))


@pytest.fixture(scope="module")
def s3(replayed_everything, tmp_path_factory):
    """moto's S3 holding the cluster's captures under everything/ (moto_s3.py)."""
    local = replayed_everything.ok()
    objects = {
        f"everything/{local.paths[name].name}": local.paths[name].read_bytes() for name in ON_THE_CLUSTER
    }
    with serve(tmp_path_factory.mktemp("s3"), objects) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    """A master and two workers for the module; its nodes have the bucket's endpoint and key."""
    workdir = tmp_path_factory.mktemp("cluster")
    with StandaloneCluster(workers=2, cores=1, memory="512m", workdir=workdir, env=s3.env) as started:
        assert started.master_url.startswith("spark://127.0.0.1:")
        yield started


def on_cluster(cluster, out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [*COMMAND, "spark-replay", *args, "--master", cluster.master_url, "--output", str(out)]
    for key, value in cluster.driver_conf():
        args += ["--conf", f"{key}={value}"]
    return subprocess.run(
        args, capture_output=True, text=True, timeout=1200, env={**os.environ, **(env or {})}
    )


def both_workers_ran_executors(cluster) -> None:
    logs = cluster.logs()
    for worker in ("worker1", "worker2"):
        assert "Asked to launch executor" in logs[worker], logs[worker][-2000:]


@pytest.mark.timeout(1500)
def test_spark_replay_on_a_standalone_cluster_reading_s3_equals_local(
    replayed_everything, s3, cluster, tmp_path
):
    """The shared run's captures, from a bucket, through spark-replay on a cluster of two workers:
    every table's rows of them equal the local run's. The executors read the bucket with their
    nodes' settings; the driver's come from its environment. The example --job's table counts
    keys over every capture's messages, so it is left to the local run."""
    local = replayed_everything.ok()
    out = tmp_path / "s3-out"
    options = local.args[len(local.paths) :]  # --sql, --job, --port ...
    at = options.index("--job")
    assert options[at + 1] == JOB
    options = options[:at] + options[at + 2 :]
    ran = on_cluster(cluster, out, "s3://caps/everything/", *options, env=s3.env)
    assert ran.returncode == 1, ran.stderr[-3000:]  # the damaged capture is a problem found
    assert f"on {cluster.master_url}" in ran.stderr and "Traceback" not in ran.stderr
    for title in ("Delivery audit per stream", "Flow control", "RESTARTs and reconnects", "2PC rounds"):
        assert title in ran.stdout
    assert "sink:c_id=2" in ran.stdout and "--sql SELECT" in ran.stdout
    named = [line for line in ran.stderr.splitlines() if line.startswith(f"{PREFIX}capture ")]
    assert named and all(
        line.startswith(f"{PREFIX}capture s3://caps/everything/damaged.pcap: ") for line in named
    )
    both_workers_ran_executors(cluster)
    tables = sorted(p.name for p in out.iterdir() if p.is_dir())
    expected = {"frames", "audit", "twopc", "problems", "sql"}
    expected |= {"kinesis_shards", "dcp_vbuckets", "ambrosia_pairs", "tremor_sessions", "dcp_frames"}
    assert expected <= set(tables)
    assert tables == sorted(p.name for p in local.output.iterdir() if p.is_dir() and p.name != "job")
    captures = {local.paths[name].name for name in ON_THE_CLUSTER}
    for name in tables:
        if name != "sql":
            assert table_rows(out / name, captures) == table_rows(local.output / name, captures), name
    # The --sql answer counts frames by type over what was read: the local frames of those captures.
    frames = rows_of(local.output / "frames", captures)
    by_type = {row["type"]: row["n"] for row in pq.read_table(out / "sql").to_pylist()}
    assert by_type == Counter(row["type"] for row in frames)
    assert len(frames) > 100 and {row["protocol"] for row in frames} >= {
        "wallaroo",
        "kinesis",
        "dcp",
        "ambrosia",
        "tremor",
    }


def test_cluster_start_failure_is_reported_and_cleaned_up(tmp_path):
    """A worker that cannot start (a memory size Spark refuses) is named, and nothing is left running."""
    cluster = StandaloneCluster(workers=1, memory="lots", workdir=tmp_path / "cluster", timeout=240)
    from wallaroo_proto.spark.standalone import ClusterError

    with pytest.raises(ClusterError, match="worker1"):
        cluster.start()
    assert cluster._processes == []  # stop() ran: every process it started has been waited for
