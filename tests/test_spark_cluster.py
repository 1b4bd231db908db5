"""spark-replay on a real Spark standalone cluster: a master and two workers on loopback.

The cluster is started from the pyspark installation itself (``spark-class``
Master and Worker, ``spark.standalone``); spark-replay runs against it with
``--master spark://127.0.0.1:PORT`` and writes every table as Parquet, and each
table must equal the one a ``local[*]`` run writes from the same captures. The
local run goes while the cluster starts; the cluster is stopped whatever happens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import COMMAND
from test_spark_datasource import write_big_ids
from test_spark_replay import SAMPLES, write_sink, write_source

from wallaroo_proto.spark.standalone import StandaloneCluster

pytestmark = pytest.mark.slow


def table_rows(directory: Path) -> list[str]:
    """A written table's rows, order-free (Spark may write its parts in any order)."""
    return sorted(repr(row) for row in pq.read_table(directory).to_pylist())


def replay(paths: list[str], out: Path, master: str, conf: list[tuple[str, str]] = ()) -> list[str]:
    args = [*COMMAND, "spark-replay", *paths, "--master", master, "--output", str(out), "--rows", "1"]
    for key, value in conf:
        args += ["--conf", f"{key}={value}"]
    return args


@pytest.mark.timeout(600)
def test_spark_replay_on_a_standalone_cluster_equals_local(tmp_path):
    paths = [tmp_path / "source.pcap", tmp_path / "sink.pcap", tmp_path / "big.pcap"]
    write_source(paths[0])
    write_sink(paths[1])
    write_big_ids(paths[2])
    names = [*map(str, paths), *SAMPLES]
    local_args = replay(names, tmp_path / "local", "local[*]")
    local = subprocess.Popen(local_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with StandaloneCluster(workers=2, cores=1, memory="512m", workdir=tmp_path / "cluster") as cluster:
            assert cluster.master_url.startswith("spark://127.0.0.1:")
            on_cluster = subprocess.run(
                replay(names, tmp_path / "cluster-out", cluster.master_url, cluster.driver_conf()),
                capture_output=True,
                text=True,
                timeout=420,
            )
            logs = cluster.logs()
    finally:
        local_out, local_err = local.communicate(timeout=420)
    assert on_cluster.returncode == 0, on_cluster.stderr[-3000:]
    assert f"on {cluster.master_url}" in on_cluster.stderr
    assert local.returncode == 0, local_err[-3000:]
    # Both workers ran executors of the job.
    for worker in ("worker1", "worker2"):
        assert "Asked to launch executor" in logs[worker], logs[worker][-2000:]
    tables = sorted(p.name for p in (tmp_path / "local").iterdir() if p.is_dir())
    assert {"frames", "messages", "audit", "flow_control", "restarts", "twopc", "violations"} <= set(tables)
    assert tables == sorted(p.name for p in (tmp_path / "cluster-out").iterdir() if p.is_dir())
    for name in tables:
        assert table_rows(tmp_path / "cluster-out" / name) == table_rows(tmp_path / "local" / name), name
    assert len(table_rows(tmp_path / "local" / "frames")) > 100


def test_cluster_start_failure_is_reported_and_cleaned_up(tmp_path):
    """A worker that cannot start (a memory size Spark refuses) is named, and nothing is left running."""
    cluster = StandaloneCluster(workers=1, memory="lots", workdir=tmp_path / "cluster", timeout=240)
    from wallaroo_proto.spark.standalone import ClusterError

    with pytest.raises(ClusterError, match="worker1"):
        cluster.start()
    assert cluster._processes == []  # stop() ran: every process it started has been waited for
