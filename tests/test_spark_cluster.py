"""spark-replay on a real Spark standalone cluster: a master and two workers on loopback.

The cluster is started from the pyspark installation itself (``spark-class``
Master and Worker, ``spark.standalone``); spark-replay runs against it with
``--master spark://127.0.0.1:PORT`` over the captures of the shared run (every
protocol's; replay_everything.py) and writes every table as Parquet, and each
table must equal the one the shared ``local[2]`` run wrote. Its console is
the rich view (tables, the damaged capture named, exit 1). The same captures
read from moto's S3 (``s3://``, moto_s3.py) by the same cluster give the same
tables. The cluster is started once for the module and stopped whatever happens.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from moto_s3 import serve
from replay_everything import PREFIX
from support import COMMAND

from wallaroo_proto.spark.standalone import StandaloneCluster

pytestmark = pytest.mark.e2e


def table_rows(directory: Path, by_file_name: bool = False) -> list[str]:
    """A written table's rows, order-free (Spark may write its parts in any order); with
    ``by_file_name``, each capture named by its file name alone (a path and a URL compare equal)."""
    rows = pq.read_table(directory).to_pylist()
    for row in rows if by_file_name else ():
        if row.get("capture"):
            row["capture"] = row["capture"].rsplit("/", 1)[-1]
    return sorted(repr(row) for row in rows)


@pytest.fixture(scope="module")
def s3(replayed_everything, tmp_path_factory):
    """moto's S3 holding the shared run's captures under everything/ (moto_s3.py)."""
    local = replayed_everything.ok()
    objects = {f"everything/{path.name}": path.read_bytes() for path in local.paths.values()}
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
    every table equals the local run's. The executors read the bucket with their nodes' settings;
    the driver's come from its environment. (One cluster run serves both: it is the suite's longest.)"""
    local = replayed_everything.ok()
    out = tmp_path / "s3-out"
    options = local.args[len(local.paths) :]  # --sql, --job, --port ...
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
    tables = sorted(p.name for p in local.output.iterdir() if p.is_dir())
    expected = {"frames", "audit", "twopc", "problems", "sql", "job"}
    expected |= {"kinesis_shards", "dcp_vbuckets", "ambrosia_pairs", "tremor_sessions", "dcp_frames"}
    assert expected <= set(tables)
    assert tables == sorted(p.name for p in out.iterdir() if p.is_dir())
    for name in tables:
        assert table_rows(out / name, by_file_name=True) == table_rows(
            local.output / name, by_file_name=True
        ), name
    assert len(table_rows(local.output / "frames")) > 100


def test_cluster_start_failure_is_reported_and_cleaned_up(tmp_path):
    """A worker that cannot start (a memory size Spark refuses) is named, and nothing is left running."""
    cluster = StandaloneCluster(workers=1, memory="lots", workdir=tmp_path / "cluster", timeout=240)
    from wallaroo_proto.spark.standalone import ClusterError

    with pytest.raises(ClusterError, match="worker1"):
        cluster.start()
    assert cluster._processes == []  # stop() ran: every process it started has been waited for
