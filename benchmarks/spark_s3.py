"""Reading captures from S3 against reading the same files from local disk, in one Spark session.

Generates ``--captures`` pcap files (``spark_replay.py``'s generator), puts them in a
bucket of moto's S3 server (in this process, on a free loopback port, reached with
``AWS_ENDPOINT_URL_S3`` as a user would reach MinIO), then in one ``--master`` session:
a warm-up read of each, then ``--runs`` reads of the local files and of the ``s3://``
prefix, alternated, each a ``count()`` of the data source's frames (nothing cached).
Prints the best of each and their ratio (target: S3 at most 1.2x local). moto keeps
the objects in memory and serves them from this process: S3 itself adds the network.

    python benchmarks/spark_s3.py [--captures 2] [--mb 30] [--master local[2]] [--runs 3]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time

from spark_replay import generate, load


def timed(spark, paths: list[str]) -> tuple[float, int]:
    from wallaroo_proto.spark.frames import load_frames

    start = time.perf_counter()
    count = load_frames(spark, paths, persist=False).frames.count()
    return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--captures", type=int, default=2)
    parser.add_argument("--mb", type=float, default=30.0, help="size of each capture in MB (10^6 bytes)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    from wallaroo_proto.spark.session import build_session, stop_session

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    directory = tempfile.mkdtemp(prefix="wallaroo-bench-s3-")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update(
            AWS_ENDPOINT_URL_S3=f"http://{host}:{port}",
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
        )
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        paths = []
        for i in range(args.captures):
            path = os.path.join(directory, f"bench-{i}.pcap")
            generate(path, int(args.mb * 1e6), seed=i, connections=4, payload=200)
            s3.upload_file(path, "bench", f"run/bench-{i}.pcap")
            paths.append(path)
        total = sum(os.path.getsize(p) for p in paths)
        print(f"captures: {len(paths)} files, {total / 1e6:.0f} MB, local and in moto's S3; {load()}")

        spark = build_session(args.master)  # local executors inherit this environment
        try:
            sources = {"local": paths, "s3": ["s3://bench/run/"]}
            counts = {name: timed(spark, where)[1] for name, where in sources.items()}  # warm-up
            assert counts["local"] == counts["s3"], counts
            best = {name: float("inf") for name in sources}
            for _ in range(args.runs):
                for name, where in sources.items():
                    best[name] = min(best[name], timed(spark, where)[0])
        finally:
            stop_session(spark)
        for name, seconds in best.items():
            print(
                f"{name}: {counts[name]:,} frames, best of {args.runs} {seconds:.2f} s = "
                f"{total / 1e6 / seconds:.1f} MB/s"
            )
        print(f"s3 / local: {best['s3'] / best['local']:.2f}x (target at most 1.2x); {load()}")
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
