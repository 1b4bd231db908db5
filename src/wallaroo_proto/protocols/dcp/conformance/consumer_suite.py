"""``conformance consumer -- COMMAND``: play a DCP producer for a consumer under test.

Each case serves the consumer with a producer of its own (``producer.MockProducer``
on a free loopback port, with the bucket and the fault the case needs) and starts
COMMAND with ``{host}``, ``{port}`` and ``{state}`` (a file the consumer may keep
its copy in, the same for both runs of a case) filled in and
``DCP_PRODUCER=HOST:PORT`` in its environment. The producer judges every packet
the consumer sends with the DCP core (``core.Connection``): a stream request whose
snapshot range does not hold its start, a BUFFER_ACK of more than was sent, a NOOP
reply with the wrong opaque, a command before DCP_OPEN all fail the case with the
core's reason. A case is over when every stream it waits for ended ``ok``, or when
the consumer exits. The consumer must stream to the high seqnos it asks for (as
``dcp mock-consumer`` does without ``--follow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wallaroo_proto.conformance import process
from wallaroo_proto.conformance.runner import (
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    SuiteUnavailable,
    Target,
    Trace,
)

from .. import codec
from ..producer import Faults, MockProducer, ProducerConfig
from ..store import Bucket, new_uuid

DOCS = "kv_engine docs"
START_TIME = 5.0


@dataclass
class ConsumerUnderTest:
    command: tuple[str, ...]
    state_dir: Path
    host: str = "127.0.0.1"
    runs: list[process.Started] = field(default_factory=list)
    producers: list[MockProducer] = field(default_factory=list)
    addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    cases: int = 0

    def state_file(self) -> str:
        self.cases += 1
        return str(self.state_dir / f"consumer-{self.cases}.json")

    async def producer(self, trace: Trace, bucket: Bucket, faults: Faults | None = None) -> MockProducer:
        config = ProducerConfig(self.host, 0, 8, None, faults or Faults())
        producer = MockProducer(config, bucket, lambda line: trace(f"   producer: {line}"))
        host, port = await producer.start()
        self.addresses[id(producer)] = (host, port)
        self.producers.append(producer)
        trace(f"producer listening on {host}:{port}: {len(bucket.vbuckets)} vbuckets")
        return producer

    async def consume(
        self, trace: Trace, producer: MockProducer, state: str, done: Callable[[], bool]
    ) -> process.Started:
        """Run the consumer against ``producer`` until ``done()`` or its exit; the core's verdicts judged."""
        host, port = self.addresses[id(producer)]
        fill = {"host": host, "port": str(port), "state": state}
        run = await process.start(self.command, fill, {"DCP_PRODUCER": f"{host}:{port}"})
        self.runs.append(run)
        trace(f"started the consumer (pid {run.proc.pid})")
        trace("   waiting for its streams to end, or for it to exit")
        while not done() and run.proc.returncode is None and not producer.stats.violations:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await run.proc.wait()
        if producer.stats.violations:
            raise CaseFailed(_reason(producer.stats.violations[0]), self.seen(trace, run))
        if run.proc.returncode is not None:
            trace(f"the consumer exited with code {run.proc.returncode}")
            await run.exited()
        return run

    def seen(self, trace: Trace, run: process.Started) -> str:
        output = run.tail()
        return trace.tail() + (f"\nthe consumer's last output:\n{output}" if output else "")

    async def stop_all(self) -> None:
        runs, self.runs = self.runs, []
        for run in runs:
            await run.stop()
        producers, self.producers = self.producers, []
        for producer in producers:
            await producer.stop()

    async def after_case(self, case: Case, result: Result) -> Result:
        await self.stop_all()
        return result


def _reason(violation: str) -> str:
    """A producer violation line without its connection prefix: the core's reason."""
    head, sep, reason = violation.partition(": ")
    return reason if sep and head.startswith("connection") else violation


def bucket(vbuckets: int, items: int, value_size: int = 64, seed: int | None = None) -> Bucket:
    rng = random.Random(seed)
    made = Bucket.new(vbuckets, rng)
    made.generate(items, rng, max(1, items // 2), value_size)
    return made


def ended_ok(producer: MockProducer, streams: int) -> Callable[[], bool]:
    return lambda: producer.stats.stream_ends.get("ok", 0) >= streams


def expect_ended(
    ctx: ConsumerUnderTest, trace: Trace, run: process.Started, producer: MockProducer, n: int
) -> None:
    ok = producer.stats.stream_ends.get("ok", 0)
    if ok < n:
        raise CaseFailed(
            f"{ok} of {n} streams ended ok before the consumer stopped (stream ends: "
            f"{producer.stats.stream_ends or 'none'}, NOT_MY_VBUCKET {producer.stats.not_my_vbucket})",
            ctx.seen(trace, run),
        )


# --- the cases ----------------------------------------------------------------------------------------


async def stream_all(ctx: ConsumerUnderTest, trace: Trace) -> str:
    producer = await ctx.producer(trace, bucket(2, 20))
    run = await ctx.consume(trace, producer, ctx.state_file(), ended_ok(producer, 2))
    expect_ended(ctx, trace, run, producer, 2)
    return f"{producer.stats.items} items over 2 vbuckets streamed to their end; every packet kept the rules"


async def flow_acks(ctx: ConsumerUnderTest, trace: Trace) -> str:
    producer = await ctx.producer(trace, bucket(1, 400, 200))
    run = await ctx.consume(trace, producer, ctx.state_file(), ended_ok(producer, 1))
    expect_ended(ctx, trace, run, producer, 1)
    if not producer.stats.stalls:
        raise CaseSkipped(
            "the consumer set no connection_buffer_size, or one larger than the stream (~100 KB)"
        )
    return (
        f"the buffer filled and emptied ({producer.stats.stalls} stalls); "
        "no BUFFER_ACK acknowledged more than was sent"
    )


async def stream_end_reopened(ctx: ConsumerUnderTest, trace: Trace) -> str:
    faults = Faults(end_after=5, end_reason=codec.END_TOO_SLOW)
    producer = await ctx.producer(trace, bucket(2, 20), faults)
    run = await ctx.consume(trace, producer, ctx.state_file(), ended_ok(producer, 2))
    expect_ended(ctx, trace, run, producer, 2)
    return "each stream ended too_slow after 5 items was asked for again and reached its end"


async def not_my_vbucket(ctx: ConsumerUnderTest, trace: Trace) -> str:
    producer = await ctx.producer(trace, bucket(3, 10), Faults(not_my_vbucket=frozenset({1})))
    run = await ctx.consume(trace, producer, ctx.state_file(), ended_ok(producer, 2))
    expect_ended(ctx, trace, run, producer, 2)
    return "NOT_MY_VBUCKET for vbucket 1; vbuckets 0 and 2 streamed to their end"


async def rollback_obeyed(ctx: ConsumerUnderTest, trace: Trace) -> str:
    state = ctx.state_file()
    history = bucket(1, 30)
    first = await ctx.producer(trace, history)
    run = await ctx.consume(trace, first, state, ended_ok(first, 1))
    expect_ended(ctx, trace, run, first, 1)
    await ctx.stop_all()
    trace("   the producer fails over: the newest 10 items are lost, a new uuid, 5 new items")
    diverged = Bucket.from_json(history.to_json())
    for vb in diverged.vbuckets.values():
        vb.fail_over(new_uuid(random.Random()), 10)
    diverged.generate(5, random.Random(), 15, 64)
    second = await ctx.producer(trace, diverged)
    run = await ctx.consume(trace, second, state, ended_ok(second, 1))
    if not second.stats.rollbacks and second.stats.stream_ends.get("ok"):
        raise CaseSkipped("the consumer asked again from the start: it keeps no copy between runs ({state})")
    expect_ended(ctx, trace, run, second, 1)
    return f"ROLLBACK answered ({second.stats.rollbacks}); the stream asked again from there reached its end"


CASES = (
    Case(
        "stream.all",
        f"{DOCS}: building-a-simple-client.md",
        "it opens, asks every vbucket's stream and reads each to its end, every packet within the rules",
        stream_all,
        START_TIME,
    ),
    Case(
        "flow.acks",
        f"{DOCS}: flow-control.md",
        "with its connection_buffer_size filled it sends BUFFER_ACKs (never more than was sent) and goes on",
        flow_acks,
        START_TIME,
    ),
    Case(
        "stream-end.reopened",
        f"{DOCS}: stream-end.md",
        "a stream ended too_slow is asked for again from where it was, and reaches its end",
        stream_end_reopened,
        START_TIME,
    ),
    Case(
        "stream.not-my-vbucket",
        f"{DOCS}: stream-request.md",
        "NOT_MY_VBUCKET for one vbucket does not stop the others",
        not_my_vbucket,
        START_TIME,
    ),
    Case(
        "rollback.obeyed",
        f"{DOCS}: rollback.md",
        "after a failover the consumer gets ROLLBACK, asks again from there and reaches the end",
        rollback_obeyed,
        2 * START_TIME,
    ),
)


@contextlib.asynccontextmanager
async def open_consumer(target: Target, options: Mapping[str, Any]) -> AsyncIterator[ConsumerUnderTest]:
    if not target.command:
        raise SuiteUnavailable("give the consumer's command: -- COMMAND ARGS... ({host} {port} {state})")
    state_dir = Path(tempfile.mkdtemp(prefix="wallaroo-proto-consumer-"))
    ctx = ConsumerUnderTest(tuple(target.command), state_dir)
    try:
        yield ctx
    finally:
        await ctx.stop_all()
        shutil.rmtree(state_dir, ignore_errors=True)
