"""spark-replay on a real Spark standalone cluster: a master and two workers on loopback.

The cluster is started from the pyspark installation itself (``spark-class``
Master and Worker, ``spark.standalone``); spark-replay runs against it with
``--master spark://127.0.0.1:PORT`` over the captures of the shared run (every
protocol's; replay_everything.py) and writes every table as Parquet, and each
table must equal the one the shared ``local[2]`` run wrote. Its console is
the rich view (tables, the damaged capture named, exit 1). The cluster is
stopped whatever happens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import COMMAND

from wallaroo_proto.spark.standalone import StandaloneCluster

pytestmark = pytest.mark.e2e


def table_rows(directory: Path) -> list[str]:
    """A written table's rows, order-free (Spark may write its parts in any order)."""
    return sorted(repr(row) for row in pq.read_table(directory).to_pylist())


@pytest.mark.timeout(600)
def test_spark_replay_on_a_standalone_cluster_equals_local(replayed_everything, tmp_path):
    local = replayed_everything.ok()
    out = tmp_path / "cluster-out"
    with StandaloneCluster(workers=2, cores=1, memory="512m", workdir=tmp_path / "cluster") as cluster:
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        args = [*COMMAND, "spark-replay", *local.args, "--master", cluster.master_url]
        args += ["--output", str(out)]
        for key, value in cluster.driver_conf():
            args += ["--conf", f"{key}={value}"]
        on_cluster = subprocess.run(args, capture_output=True, text=True, timeout=420)
        logs = cluster.logs()
    assert on_cluster.returncode == 1, on_cluster.stderr[-3000:]  # the damaged capture is a problem found
    assert f"on {cluster.master_url}" in on_cluster.stderr and "Traceback" not in on_cluster.stderr
    assert f"capture {local.paths['damaged']}" in on_cluster.stderr
    for title in ("Delivery audit per stream", "Flow control", "RESTARTs and reconnects", "2PC rounds"):
        assert title in on_cluster.stdout
    assert "sink:c_id=2" in on_cluster.stdout and "--sql SELECT" in on_cluster.stdout
    # Both workers ran executors of the job.
    for worker in ("worker1", "worker2"):
        assert "Asked to launch executor" in logs[worker], logs[worker][-2000:]
    tables = sorted(p.name for p in local.output.iterdir() if p.is_dir())
    expected = {"frames", "audit", "twopc", "problems", "sql", "job"}
    expected |= {"kinesis_shards", "dcp_vbuckets", "ambrosia_pairs", "tremor_sessions"}
    assert expected <= set(tables)
    assert tables == sorted(p.name for p in out.iterdir() if p.is_dir())
    for name in tables:
        assert table_rows(out / name) == table_rows(local.output / name), name
    assert len(table_rows(local.output / "frames")) > 100


def test_cluster_start_failure_is_reported_and_cleaned_up(tmp_path):
    """A worker that cannot start (a memory size Spark refuses) is named, and nothing is left running."""
    cluster = StandaloneCluster(workers=1, memory="lots", workdir=tmp_path / "cluster", timeout=240)
    from wallaroo_proto.spark.standalone import ClusterError

    with pytest.raises(ClusterError, match="worker1"):
        cluster.start()
    assert cluster._processes == []  # stop() ran: every process it started has been waited for
