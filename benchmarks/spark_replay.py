"""spark-replay throughput: local[1] and local[2] beside the single-process dissector.

Generates ``--captures`` pcap files (default 8 x 136 MB, over 1 GB in all) with
``pcap_writer`` and the codec: each holds ``--connections`` source sessions on
port 7100 streaming MESSAGE frames (``--payload`` bytes, 8-byte keys) in
batches that the worker's credits allow, with ACKs that refill them. Then, on
the same files in the same run:

* baseline: ``records.iter_records`` over every file in this one process (what
  ``dissect --format jsonl`` does before JSON encoding);
* spark-replay with ``local[1]`` and with ``local[2]``, each in a fresh process:
  Spark's start-up time is reported apart; ``ingest`` is reading every capture
  on the executors into the persisted ``frames`` DataFrame (a count), and
  ``reports`` is computing every report on top of it.

Spark's start-up, and the time to a first result (the first rows of the
smallest capture), are reported apart from ingest. ``--cluster`` runs the same
on a loopback standalone cluster (``wallaroo_proto.spark.standalone``) with one
worker, then two (1 core, 1 GB each). Per-task throughput (local[1]) gives the
task plan and ingest time for 1 TB of captures.

Targets: ingest per core at least half the single-process dissector's speed;
local[2] >= 1.6x local[1] where there are cores to spare. The generated files
are deleted at the end.

    python benchmarks/spark_replay.py [--captures 8] [--mb 136] [--keep DIR] [--cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Ack, Hello, Message, Notify, NotifyAck, Ok
from wallaroo_proto.spark.standalone import StandaloneCluster

CREDITS = 200


def generate(path: str, target_bytes: int, *, seed: int, connections: int, payload: int) -> int:
    """One capture of ``connections`` interleaved source sessions; returns its frame count."""
    t = 1_700_000_000.0 + seed * 10_000
    frames = 0
    with PcapWriter(path) as writer:
        sessions = []
        for c in range(connections):
            s = writer.tcp_session(("127.0.0.1", 40_000 + c), ("127.0.0.1", 7100), timestamp=t)
            stream = seed * 1000 + c + 1
            hello = encode(Hello("0.0.1", b"", "bench", f"conn-{seed}-{c}"))
            s.send(True, hello, t)
            s.send(False, encode(Ok(CREDITS)), t)
            s.send(True, encode(Notify(stream, f"stream-{stream}", 0)), t)
            s.send(False, encode(NotifyAck(True, stream, 0)), t)
            frames += 4
            sessions.append([s, stream, 1])
        body = b"x" * payload
        batch = CREDITS - 1
        written = 0
        while written < target_bytes:
            for entry in sessions:
                s, stream, n = entry
                t += 0.001
                msgs = b"".join(
                    encode(Message(stream, i, 1_700_000_000_000 + i, b"key-%04d" % (i % 1000), body))
                    for i in range(n, n + batch)
                )
                s.send(True, msgs, t)
                written += len(msgs) + 60 * (len(msgs) // 65_000 + 2)
                s.send(False, encode(Ack(batch, ((stream, n + batch),))), t + 0.0005)
                entry[2] = n + batch
                frames += batch + 1
        for s, _, _ in sessions:
            s.close(True, t + 0.01)
    return frames


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by ``root`` and all its descendants (JVM, Python workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15), 1-based from state
            stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    tree, total, todo = {root}, 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        for child, (ppid, _) in stats.items():
            if ppid == pid and child not in tree:
                tree.add(child)
                todo.append(child)
    return total


def baseline(paths: list[str]) -> dict:
    from wallaroo_proto import records

    start = time.perf_counter()
    cpu = time.process_time()
    count = 0
    for path in paths:
        for _ in records.iter_records(path):
            count += 1
    return {"records": count, "seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu}


def spark_run(master: str, paths: list[str], conf: list[tuple[str, str]] = ()) -> dict:
    """Child process: start Spark, a first result, ingest, reports; timings as one JSON line."""
    from wallaroo_proto.spark.frames import load_frames
    from wallaroo_proto.spark.reports import build_tables
    from wallaroo_proto.spark.session import build_session, stop_session

    start = time.perf_counter()
    spark = build_session(master, conf=conf)
    session = time.perf_counter()
    # Start-up to a first result: the first rows of the smallest capture (planning and one task).
    load_frames(spark, [min(paths, key=os.path.getsize)], persist=False).frames.limit(10).collect()
    started = time.perf_counter()
    cpu0 = tree_cpu(os.getpid())
    loaded = load_frames(spark, paths)
    records = loaded.frames.count()
    ingested = time.perf_counter()
    cpu1 = tree_cpu(os.getpid())
    tables = build_tables(loaded.frames, loaded.problems)
    rows = {name: df.count() for name, df in tables.items() if name not in ("frames", "messages")}
    done = time.perf_counter()
    stop_session(spark)
    return {
        "master": master,
        "startup": session - start,
        "first_result": started - start,
        "ingest": ingested - started,
        "reports": done - ingested,
        "ingest_cpu": cpu1 - cpu0,
        "records": records,
        "tasks": loaded.tasks,
        "rows": rows,
    }


def child(master: str, paths: list[str], conf: list[tuple[str, str]]) -> dict | None:
    """One Spark run in a fresh process; its timings, or None (its error printed)."""
    command = [sys.executable, __file__, "--child", master, "--child-conf", json.dumps(conf), *paths]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(out.stderr[-3000:])
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def plan(total: int, one_task: dict, base_mbs: float) -> None:
    """Per-task throughput (local[1]: one task at a time) and what 1 TB of captures takes with it."""
    from wallaroo_proto.spark.frames import MIN_SPLIT_BYTES, CaptureFile, plan_tasks

    per_task = total / 1e6 / one_task["ingest"]
    print(f"per task: {per_task:.1f} MB/s ingest ({per_task / base_mbs:.2f}x the dissector's one process)")
    terabyte = [CaptureFile(f"c{i}", f"c{i}", 10**12 // 1000) for i in range(1000)]  # 1000 files of 1 GB
    for cores in (16, 64, 256, 1024):
        tasks = plan_tasks(terabyte, cores)
        biggest = max(t[3] for t in tasks)
        waves = -(-len(tasks) // cores)
        hours = 10**12 / 1e6 / per_task / cores / 3600
        print(
            f"1 TB as 1000 x 1 GB on {cores} task slots: {len(tasks)} tasks (parts per file {biggest}, "
            f"split floor {MIN_SPLIT_BYTES // 2**20} MB), {waves} waves, about {hours:.2f} h of ingest"
        )


def load() -> str:
    """The machine's load: the figures are only as clean as the machine is idle."""
    return "load average " + " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--captures", type=int, default=8)
    parser.add_argument("--mb", type=float, default=136.0, help="size of each capture in MB (10^6 bytes)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--payload", type=int, default=200)
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--keep", help="generate into (or reuse) this directory and keep it")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also run on a loopback standalone cluster with 1 worker, then 2 (1 core, 1 GB each)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-conf", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        conf = [tuple(pair) for pair in json.loads(args.child_conf)]
        print(json.dumps(spark_run(args.child, args.paths, conf)), flush=True)
        return

    directory = args.keep or tempfile.mkdtemp(prefix="wallaroo-bench-")
    os.makedirs(directory, exist_ok=True)
    try:
        paths = []
        start = time.perf_counter()
        for i in range(args.captures):
            path = os.path.join(directory, f"bench-{i}.pcap")
            if not os.path.exists(path):
                generate(path, int(args.mb * 1e6), seed=i, connections=args.connections, payload=args.payload)
            paths.append(path)
        total = sum(os.path.getsize(p) for p in paths)
        took = time.perf_counter() - start
        print(f"captures: {len(paths)} files, {total / 1e6:.0f} MB ({took:.0f} s to generate); {load()}")

        base = baseline(paths)
        base_mbs = total / 1e6 / base["seconds"]
        print(
            f"dissector, one process: {base['records']:,} records in {base['seconds']:.1f} s = "
            f"{base_mbs:.1f} MB/s, {base['records'] / base['seconds'] / 1e3:.0f} k records/s; "
            f"{base['cpu']:.1f} CPU s = {total / 1e6 / base['cpu']:.1f} MB per CPU second"
        )
        results = {}
        runs = [(master, master, []) for master in args.masters.split(",")]
        if args.cluster:
            runs += [(f"standalone {n} worker{'s' * (n > 1)}", n, None) for n in (1, 2)]
        for label, master, conf in runs:
            if conf is None:  # a standalone cluster of ``master`` workers, for this run only
                with StandaloneCluster(workers=master, cores=1, memory="1g") as cluster:
                    r = child(cluster.master_url, paths, cluster.driver_conf())
            else:
                r = child(master, paths, conf)
            if r is None:
                print(f"{label}: failed")
                continue
            results[label] = r
            assert r["records"] == base["records"], (r["records"], base["records"])
            ingest_mbs = total / 1e6 / r["ingest"]
            full_mbs = total / 1e6 / (r["ingest"] + r["reports"])
            print(
                f"spark {label}: start-up {r['startup']:.1f} s, first result at {r['first_result']:.1f} s "
                f"(apart); ingest {r['ingest']:.1f} s = "
                f"{ingest_mbs:.1f} MB/s ({r['tasks']} tasks), {r['ingest_cpu']:.1f} CPU s "
                f"({r['ingest_cpu'] / r['ingest']:.1f} cores busy) = "
                f"{total / 1e6 / r['ingest_cpu']:.1f} MB per CPU second; reports {r['reports']:.1f} s; "
                f"ingest+reports {full_mbs:.1f} MB/s; {load()}"
            )
        if "local[1]" in results and "local[2]" in results:
            one, two = results["local[1]"], results["local[2]"]
            speedup = one["ingest"] / two["ingest"]
            full = (one["ingest"] + one["reports"]) / (two["ingest"] + two["reports"])
            per_core = (total / 1e6 / two["ingest"] / 2) / base_mbs
            per_core1 = (total / 1e6 / one["ingest"]) / base_mbs
            print(f"local[2] / local[1], ingest: {speedup:.2f}x (target >= 1.6x); with reports: {full:.2f}x")
            print(
                f"per core vs dissector: local[2] {per_core:.2f}x, local[1] {per_core1:.2f}x (target >= 0.5x)"
            )
            per_cpu = base["cpu"] / two["ingest_cpu"]
            print(f"per CPU second vs dissector (whatever the machine's load): local[2] {per_cpu:.2f}x")
        if "local[1]" in results:
            plan(total, results["local[1]"], base_mbs)
        if "standalone 1 worker" in results and "standalone 2 workers" in results:
            one, two = results["standalone 1 worker"], results["standalone 2 workers"]
            print(
                f"standalone cluster, 2 workers / 1 worker, ingest: {one['ingest'] / two['ingest']:.2f}x; "
                f"with reports: {(one['ingest'] + one['reports']) / (two['ingest'] + two['reports']):.2f}x"
            )
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
