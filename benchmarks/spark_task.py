"""Where one spark-replay ingest task's time goes, stage by stage, on one capture.

``spark_replay.py`` measures whole runs; this splits a single ``local[1]`` task into
what each stage adds, in one process and one run, on a capture from its generator:

* the dissector alone: record dicts, then blocks (what the data source reads);
* the data source's Python side alone: ``read_part`` to Arrow batches of every column;
* Spark: a ``count()``, every column to rows (the ``noop`` sink), and ``persist`` plus
  ``count()`` (the benchmark's ingest);
* the same persisted ingest with the common columns only, then with their u64 columns
  as ``long`` instead of ``decimal(20,0)``: what the table's width and its decimals cost.

Wall and CPU seconds (this process and its children: the JVM and Python workers), and of
those the JVM's own.

    python benchmarks/spark_task.py [--mb 30] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

from spark_replay import generate, load, tree_cpu

COMMON = (
    "capture",
    "connection",
    "conn_index",
    "packet",
    "ts",
    "ts_ns",
    "sender",
    "type",
    "length",
    "stream_id",
    "message_id",
    "protocol",
    "_problem",
)


def own_cpu(pid: int | None) -> float:
    """CPU seconds of ``pid`` itself, children left out (0 for None or a process gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jvm_pid() -> int | None:
    """The Spark driver's JVM: this process's child running java."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                java = b"java" in f.read().split(b"\0", 1)[0]
        except OSError:
            continue
        if ppid == os.getpid() and java:
            return int(entry)
    return None


def stage(label: str, megabytes: float, work: Callable[[], int], jvm: int | None = None) -> None:
    wall, cpu, in_jvm = time.perf_counter(), tree_cpu(os.getpid()), own_cpu(jvm)
    rows = work()
    wall, cpu, in_jvm = time.perf_counter() - wall, tree_cpu(os.getpid()) - cpu, own_cpu(jvm) - in_jvm
    jvm_part = f" (JVM {in_jvm:5.2f})" if jvm is not None else ""
    print(
        f"{label:58s} {rows:>7} rows {wall:6.2f} s {cpu:6.2f} CPU s{jvm_part} {megabytes / wall:5.1f} MB/s",
        flush=True,
    )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--mb", type=float, default=30.0, help="size of the capture in MB (10^6 bytes)")
    parser.add_argument("--keep", help="generate into (or reuse) this directory and keep it")
    args = parser.parse_args()
    directory = args.keep or tempfile.mkdtemp(prefix="wallaroo-bench-")
    path = os.path.join(directory, "task.pcap")
    if not os.path.exists(path):
        generate(path, int(args.mb * 1e6), seed=1, connections=4, payload=200)
    try:
        run(path)
    finally:
        if not args.keep:
            os.remove(path)
            os.rmdir(directory)


def run(path: str) -> None:
    from pyspark import StorageLevel
    from pyspark.sql import types as T  # noqa: N812

    from wallaroo_proto import records
    from wallaroo_proto.spark import datasource
    from wallaroo_proto.spark.session import build_session, stop_session

    mb = os.path.getsize(path) / 1e6
    print(f"capture: {mb:.1f} MB; {load()}")
    stage("dissector: record dicts", mb, lambda: sum(1 for _ in records.iter_records(path)))
    stage(
        "dissector: blocks",
        mb,
        lambda: sum(1 if type(x) is dict else len(x) for x in records.iter_records(path, blocks=True)),
    )
    schema = datasource.frame_schema()
    options = datasource.ReadOptions.parse({})
    part = datasource.CapturePart(path, os.path.basename(path), 0, 1)
    stage(
        f"Python side: read_part to Arrow, {len(schema.fields)} columns",
        mb,
        lambda: sum(b.num_rows for b in datasource.read_part(part, options, schema)),
    )

    spark = build_session("local[1]")
    datasource.register(spark)
    jvm = jvm_pid()

    def frames(with_schema: T.StructType | None = None):
        reader = spark.read.format(datasource.NAME)
        return (reader.schema(with_schema) if with_schema is not None else reader).load(path)

    def persisted(with_schema: T.StructType | None = None) -> int:
        df = frames(with_schema).persist(StorageLevel.MEMORY_AND_DISK)
        count = df.count()
        df.unpersist(blocking=True)
        return count

    def to_rows() -> int:
        frames().write.format("noop").mode("overwrite").save()
        return 0

    frames().limit(10).collect()  # the JVM's first task (class loading, the Python worker) apart
    stage("Spark: count(), nothing cached", mb, lambda: frames().count(), jvm)
    stage("Spark: every column to rows (noop sink)", mb, to_rows, jvm)
    stage("Spark: persist + count (spark_replay.py's ingest)", mb, persisted, jvm)
    narrow = T.StructType([f for f in schema.fields if f.name in COMMON])
    stage(f"Spark: persist + count, {len(narrow.fields)} common columns", mb, lambda: persisted(narrow), jvm)
    longs = T.StructType(
        [
            T.StructField(f.name, T.LongType() if isinstance(f.dataType, T.DecimalType) else f.dataType, True)
            for f in narrow.fields
        ]
    )
    stage("Spark: the same, u64 as long (values of this capture fit)", mb, lambda: persisted(longs), jvm)
    stop_session(spark)


if __name__ == "__main__":
    main()
