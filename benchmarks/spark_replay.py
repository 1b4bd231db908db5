"""spark-replay's ingest against the dissector, per CPU second, on every protocol's captures.

Generates ``--mb`` MB of captures of each protocol (``--files`` files each) with
``dissect.py``'s workload generators (the mock peers' ``--record``; Wallaroo by
its own generator), into a temporary directory or ``--keep DIR`` (reused when
there). Then, in one Spark session (``--master``, default ``local[2]``), after a
warm-up job (the smallest capture persisted as three tables), each the best of
``--runs`` runs (the least CPU):

* the dissector in this one process: ``capture.dissector.iter_records(blocks=True)`` over
  the files, as the data source reads them (the baseline), the data source's
  Python side alone (``read_part`` to Arrow batches of the ``all`` table), and
  the dissector making a dict a record (issue 37's 1x) for reference;
* for Wallaroo and DCP, each of the tables ``all`` (what spark-replay reads and
  caches), ``frames`` and ``<protocol>_frames``: ``count()`` with nothing cached,
  and ``persist()`` + ``count()`` (the ingest), timed apart;
* the JVM's floor: the same tables written to Parquet once, read back with
  ``count()`` and ``persist()`` + ``count()``;
* a query on one protocol's table (``<protocol>_frames`` rows grouped and
  counted) over the captures of every protocol, over that protocol's only, and
  over the others' only (no row kept: what recognising and skipping them costs).

CPU seconds are the whole process tree's (this driver, the JVM, its Python
workers; psutil if installed, else /proc), and the JVM's own apart from the
Python's (the rest). Each line ends with the 1-minute load average.

Targets (issue 37): the ingest into ``frames`` plus the protocol's table (the
``all`` table persisted) at least 0.6x the dissector per CPU second, for
Wallaroo and DCP; the query on one protocol's table over mixed captures within
10% of the same over captures of that protocol only. A target missed prints the floor
reached, the JVM's CPU and the Python's apart.

    python benchmarks/spark_replay.py [--mb 1000] [--files 2] [--runs 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from dissect import WORKLOADS

#: MB a workload makes at scale 1 (dissect.py's "samples" case), to scale it to ``--mb``.
MB_PER_SCALE = {"wallaroo": 8.0, "kinesis": 5.5, "dcp": 3.6, "ambrosia": 1.0, "tremor": 1.1}
INGESTED = ("wallaroo", "dcp")  # the protocols whose ingest the targets name
QUERY_COLUMN = {"wallaroo": "stream_id", "dcp": "vbucket"}
TARGET_INGEST, TARGET_QUERY = 0.6, 1.10


class Run(NamedTuple):
    """One measured piece of work."""

    rows: int
    wall: float
    cpu: float  # the whole process tree
    jvm: float  # the driver JVM's own (in local mode, the executors' too)
    load: float  # 1-minute load average as it ended

    @property
    def python(self) -> float:
        return max(0.0, self.cpu - self.jvm)  # /proc counts in ticks: 0.01 s either way is noise

    def describe(self) -> str:
        jvm = f" (JVM {self.jvm:6.2f}, Python {self.python:6.2f})" if self.jvm else " " * 30
        per_row = self.cpu / self.rows * 1e6 if self.rows else 0.0
        return (
            f"{self.rows:>10,} rows {self.wall:7.2f} s {self.cpu:7.2f} CPU s{jvm} "
            f"{per_row:6.1f} µs a row; load {self.load:.1f}"
        )


def cpu_times() -> dict[int, tuple[int, float, float]]:
    """Every process: pid to (parent, CPU s of itself and its reaped children, CPU s of itself)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    out = {}
    if psutil is not None:
        for p in psutil.process_iter(["ppid", "cpu_times"]):
            t = p.info["cpu_times"]
            if t is not None:
                own = t.user + t.system
                out[p.pid] = (p.info["ppid"], own + t.children_user + t.children_system, own)
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 1-based from state
            own = (int(fields[11]) + int(fields[12])) / tick
            out[int(entry)] = (int(fields[1]), own + (int(fields[13]) + int(fields[14])) / tick, own)
    return out


def tree_cpu(root: int, jvm: int | None) -> tuple[float, float]:
    """CPU seconds so far of ``root`` and its descendants, and of the ``jvm`` process alone."""
    stats = cpu_times()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0, 0.0))[1]
        todo.extend(children.get(pid, ()))
    return total, stats.get(jvm, (0, 0.0, 0.0))[2] if jvm is not None else 0.0


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


def measure(work: Callable[[], int], jvm: int | None) -> Run:
    wall, (cpu, in_jvm) = time.perf_counter(), tree_cpu(os.getpid(), jvm)
    rows = work()
    cpu1, jvm1 = tree_cpu(os.getpid(), jvm)
    return Run(rows, time.perf_counter() - wall, cpu1 - cpu, jvm1 - in_jvm, os.getloadavg()[0])


def best(label: str, runs: int, work: Callable[[], int], jvm: int | None = None) -> Run:
    """The run with the least CPU of ``runs``, printed."""
    run = min((measure(work, jvm) for _ in range(runs)), key=lambda r: r.cpu)
    print(f"{label:52s} {run.describe()}", flush=True)
    return run


def generate(directory: Path, mb: float, files: int) -> dict[str, list[str]]:
    """``files`` captures of each protocol, ``mb`` MB in all per protocol (kept ones reused)."""
    paths = {}
    for protocol, workload in WORKLOADS.items():
        paths[protocol] = []
        for i in range(files):
            path = directory / f"{protocol}-{i}.pcap"
            if not path.exists():
                workload(path, mb / files / MB_PER_SCALE[protocol])
            paths[protocol].append(str(path))
    return paths


def megabytes(paths: list[str]) -> float:
    return sum(os.path.getsize(p) for p in paths) / 1e6


def dissector_rows(paths: list[str], blocks: bool = True) -> int:
    from wallaroo_proto.capture.dissector import iter_records

    return sum(1 if type(x) is dict else len(x) for path in paths for x in iter_records(path, blocks=blocks))


def python_side(paths: list[str]) -> int:
    """The data source's executor side alone, in this process: the ``all`` table's Arrow batches."""
    from wallaroo_proto.spark import datasource

    options = datasource.ReadOptions.parse({"table": "all"})
    schema = datasource.frame_schema(table="all")
    rows = 0
    for path in paths:
        part = datasource.CapturePart(path, os.path.basename(path), 0, 1)
        rows += sum(b.num_rows for b in datasource.read_part(part, options, schema))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=1000.0, help="MB (10^6 bytes) of captures per protocol")
    parser.add_argument("--files", type=int, default=2, help="captures per protocol")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measure; the least CPU counts")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", help="generate into (or reuse) this directory and keep it")
    args = parser.parse_args()
    directory = Path(args.keep or tempfile.mkdtemp(prefix="wallaroo-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        run(args, directory)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


def run(args: argparse.Namespace, directory: Path) -> None:
    from pyspark import StorageLevel

    from wallaroo_proto.spark import datasource
    from wallaroo_proto.spark.session import build_session, stop_session

    start = time.perf_counter()
    paths = generate(directory, args.mb, args.files)
    every = [p for ps in paths.values() for p in ps]
    sizes = ", ".join(f"{name} {megabytes(ps):.0f} MB" for name, ps in paths.items())
    print(
        f"captures: {len(every)} files, {megabytes(every):.0f} MB ({sizes}); "
        f"{time.perf_counter() - start:.0f} s to generate; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = args.runs
    base = {}
    for protocol in INGESTED:
        base[protocol] = best(
            f"{protocol}: dissector, blocks", runs, lambda ps=paths[protocol]: dissector_rows(ps)
        )
        best(f"{protocol}: Python side alone, all to Arrow", runs, lambda ps=paths[protocol]: python_side(ps))
        best(
            f"{protocol}: dissector, a dict a record (issue's 1x)",
            runs,
            lambda ps=paths[protocol]: dissector_rows(ps, blocks=False),
        )

    spark = build_session(args.master)
    datasource.register(spark)
    jvm = jvm_pid()
    slots = spark.sparkContext.defaultParallelism

    def read(table: str, files: list[str]):
        reader = spark.read.format(datasource.NAME).option("table", table).option("parallelism", slots)
        return reader.load(files)

    def persisted(df) -> int:
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return df.count()
        finally:
            df.unpersist(blocking=True)

    smallest = [min(every, key=os.path.getsize)]
    warm = measure(lambda: sum(persisted(read(t, smallest)) for t in ("all", "frames", "dcp_frames")), jvm)
    print(f"{'warm-up: the smallest capture, three tables':52s} {warm.describe()}", flush=True)

    floor = directory / "parquet"
    ingest: dict[tuple[str, str, str], Run] = {}
    for protocol in INGESTED:
        files = paths[protocol]
        print(f"-- {protocol}: {megabytes(files):.0f} MB, {len(files)} files, {args.master}", flush=True)
        for table in ("all", "frames", f"{protocol}_frames"):
            ingest[protocol, table, "count"] = best(
                f"{protocol}: {table}, count()", runs, lambda t=table, f=files: read(t, f).count(), jvm
            )
            ingest[protocol, table, "persist"] = best(
                f"{protocol}: {table}, persist + count()",
                runs,
                lambda t=table, f=files: persisted(read(t, f)),
                jvm,
            )
            out = str(floor / protocol / table)
            read(table, files).write.mode("overwrite").parquet(out)
            ingest[protocol, table, "parquet count"] = best(
                f"{protocol}: {table} from Parquet, count()",
                runs,
                lambda o=out: spark.read.parquet(o).count(),
                jvm,
            )
            ingest[protocol, table, "parquet persist"] = best(
                f"{protocol}: {table} from Parquet, persist + count()",
                runs,
                lambda o=out: persisted(spark.read.parquet(o)),
                jvm,
            )

    query: dict[tuple[str, str], Run] = {}
    for protocol in INGESTED:
        column = QUERY_COLUMN[protocol]
        others = [p for p in every if p not in paths[protocol]]
        for label, files in (("mixed", every), ("alone", paths[protocol]), ("others only", others)):

            def work(
                files: list[str] = files, table: str = f"{protocol}_frames", column: str = column
            ) -> int:
                grouped = read(table, files).groupBy(column).count().collect()
                return sum(row["count"] for row in grouped)

            query[protocol, label] = best(
                f"{protocol}_frames GROUP BY {column}, {label} captures ({megabytes(files):.0f} MB)",
                runs,
                work,
                jvm,
            )
    stop_session(spark)

    print(f"== ratios (dissector CPU / Spark CPU, best of {runs}; load {os.getloadavg()[0]:.1f})")
    for protocol in INGESTED:
        dissector = base[protocol]
        for (p, table, what), r in ingest.items():
            if p != protocol:
                continue
            if r.rows != dissector.rows and not what.startswith("parquet"):
                print(f"   ({protocol} {table} {what}: {r.rows:,} rows, the dissector {dissector.rows:,})")
            ratio = dissector.cpu / r.cpu
            target = ""
            if table == "all" and what == "persist":
                target = f"  target >= {TARGET_INGEST}x: {'met' if ratio >= TARGET_INGEST else 'NOT met'}"
            print(f"{protocol}: {table + ', ' + what:36s} {ratio:5.2f}x the dissector{target}")
        all_in = ingest[protocol, "all", "persist"]
        floor_in = ingest[protocol, "all", "parquet persist"]
        if dissector.cpu / all_in.cpu < TARGET_INGEST:
            print(
                f"  profile of the floor reached ({protocol}, all, persist + count): "
                f"JVM {all_in.jvm:.2f} CPU s, Python {all_in.python:.2f} "
                f"(the dissector alone {dissector.cpu:.2f}); the JVM's floor, the same rows from Parquet: "
                f"JVM {floor_in.jvm:.2f}, Python {floor_in.python:.2f}"
            )
    for protocol in INGESTED:
        mixed, alone = query[protocol, "mixed"], query[protocol, "alone"]
        ratio = mixed.cpu / alone.cpu
        verdict = "met" if ratio <= TARGET_QUERY else "NOT met"
        same = "" if mixed.rows == alone.rows else f" (rows differ: {mixed.rows:,} and {alone.rows:,})"
        print(
            f"{protocol}_frames query, mixed / alone: {ratio:.2f}x CPU, {mixed.wall / alone.wall:.2f}x wall "
            f"(target <= {TARGET_QUERY:.2f}x: {verdict}){same}"
        )
        if ratio > TARGET_QUERY:
            others = query[protocol, "others only"]
            print(
                f"  profile: mixed JVM {mixed.jvm:.2f} CPU s, Python {mixed.python:.2f}; "
                f"alone JVM {alone.jvm:.2f}, Python {alone.python:.2f}; the other protocols' captures "
                f"alone (no row kept) JVM {others.jvm:.2f}, Python {others.python:.2f}"
            )


if __name__ == "__main__":
    main()
