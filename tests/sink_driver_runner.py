"""Run a SinkDriver from --input in its own process, for end-to-end tests (prints stats as JSON).

With ``--state FILE`` it behaves like a worker that ties the sink's commits to its own
checkpoints: rounds happen only at its checkpoints (every ``--every`` input lines), the
checkpoint (input lines covered, sink offset, txn id) is written durably between the commit
vote and PHASE2, and a restarted runner resumes from it and settles a listed txn by it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from wallaroo_proto.protocols.wallaroo.sink_driver import (
    SinkDriver,
    SinkRefused,
    SinkUnavailable,
    drive,
    input_payloads,
)


def _write_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _as_worker(driver: SinkDriver, state: dict, path: str, source: str, every: int) -> None:
    ends: dict[int, int] = {}  # sink offset at a checkpoint -> input lines it covers

    async def record(txn: str, end: int) -> None:
        new = {"lines": ends[end], "sink_offset": end, "txn": txn, "next_cid": int(txn.rsplit("=", 1)[1]) + 1}
        _write_atomic(path, new)
        state.update(new)

    driver.on_commit_vote = record
    runner = asyncio.create_task(driver.run())
    offset, lines = state["sink_offset"], 0
    for payload in input_payloads(source):
        lines += 1
        if lines <= state["lines"]:
            continue  # covered by the last checkpoint: the sink has it
        await driver.put(payload)
        offset += len(payload)
        if lines % every == 0:
            ends[offset] = lines
            while not await driver.checkpoint() and not runner.done():
                pass  # aborted: the checkpoint is taken again (the data stays buffered until it commits)
        if runner.done():
            break
    ends[offset] = lines
    await driver.close()
    await runner


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink", required=True, help="HOST:PORT")
    parser.add_argument("--input", required=True, help='a file, "-" or gen:N')
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--every-ms", type=float, default=200)
    parser.add_argument("--reply-timeout", type=float, default=2.0)
    parser.add_argument("--instance", default="w1")
    parser.add_argument("--cookie", default="")
    parser.add_argument("--give-up", type=float, default=20.0)
    parser.add_argument("--first-cid", type=int, default=1)
    parser.add_argument("--record", default=None)
    parser.add_argument("--state", default=None, help="checkpoint file: act as a restartable worker")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    host, _, port = args.sink.rpartition(":")
    state = {"lines": 0, "sink_offset": 0, "txn": None, "next_cid": args.first_cid}
    if args.state and os.path.exists(args.state):
        with open(args.state) as f:
            state = json.load(f)
    driver = SinkDriver(
        host,
        int(port),
        checkpoint_every_messages=args.every,
        checkpoint_every_ms=args.every_ms,
        reply_timeout=args.reply_timeout,
        instance_name=args.instance,
        cookie=args.cookie.encode(),
        give_up_after=args.give_up,
        first_checkpoint_id=state["next_cid"],
        record=args.record,
        auto_checkpoint=args.state is None,
        resolve_listed=lambda txn: txn == state["txn"],
        start_offset=state["sink_offset"],
        log=(lambda line: print(f"driver: {line}", file=sys.stderr, flush=True)) if args.verbose else None,
    )
    try:
        if args.state:
            asyncio.run(_as_worker(driver, state, args.state, args.input, args.every))
            stats = driver.stats
        else:
            stats = asyncio.run(drive(driver, input_payloads(args.input)))
    except (SinkRefused, SinkUnavailable) as err:
        print(f"driver failed: {err}", file=sys.stderr)
        print(json.dumps({"error": str(err), **driver.stats.as_dict()}))
        return 1
    print(json.dumps(stats.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
