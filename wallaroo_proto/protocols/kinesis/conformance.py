"""``conformance processor -- COMMAND``: play the MultiLangDaemon for a record processor under test.

Per case the processor is started as the MLD starts it (its stdin and stdout
are the protocol; stderr is kept for the report), then stopped. Each case sends
one shard's requests; every line the processor writes goes through the same
``Conversation`` core the mock peers and the dissector use, so a broken rule is
reported with the core's reason. Checkpoints are answered as the KCL
checkpointer answers them (``checkpoint_error``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.conformance.runner import (
    FAIL,
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    Suite,
    SuiteOption,
    SuiteUnavailable,
    Target,
    Trace,
)

from .codec import (
    CURRENT,
    Checkpoint,
    Fatal,
    Initialize,
    LeaseLost,
    LineSplitter,
    Message,
    ProcessRecords,
    Record,
    ShardEnded,
    ShutdownRequested,
    Status,
    encode,
    encode_kclpy,
)
from .core import SHARD_END, Conversation, Kind, checkpoint_error, seq_key
from .records import sequence_number

SHARD = "shardId-000000000000"
OUTPUT_LINES = 10


def _records(first: int, count: int) -> tuple[Record, ...]:
    return tuple(
        Record(
            base64.b64encode(b"record %d" % n).decode(),
            f"key-{n}",
            sequence_number(0, n),
            1_700_000_000_000,
            0,
        )
        for n in range(first, first + count)
    )


@dataclass
class ProcessorUnderTest:
    command: tuple[str, ...]
    window: float
    process: asyncio.subprocess.Process | None = None
    errors: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    _stderr: asyncio.Task | None = None
    _lines: deque = field(default_factory=deque)

    async def start(self, trace: Trace) -> tuple[Conversation, LineSplitter]:
        trace(f"   starting {' '.join(self.command)}")
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.errors.clear()
        self._lines.clear()
        self._stderr = asyncio.create_task(self._keep_stderr(self.process))
        return Conversation(CURRENT), LineSplitter()

    async def _keep_stderr(self, process: asyncio.subprocess.Process) -> None:
        async for line in process.stderr:
            self.errors.append(line.decode(errors="replace").rstrip())

    def seen(self, trace: Trace) -> str:
        out = trace.tail()
        if self.errors:
            out += "\nprocessor stderr:\n" + "\n".join(f"  | {line}" for line in self.errors)
        return out

    async def request(self, trace: Trace, conv: Conversation, lines: LineSplitter, msg: Message) -> int:
        """Send one request; answer its checkpoints until its status: how many checkpoints it made."""
        verdict = conv.daemon_sent(msg)
        trace(
            f"-> {msg.action}" + (f" ({len(msg.records)} records)" if msg.action == "processRecords" else "")
        )
        if not verdict.ok:
            raise CaseFailed(f"the suite broke a rule: {verdict.describe()}", self.seen(trace))
        self.process.stdin.write(encode(msg))
        await self.process.stdin.drain()
        checkpoints = 0
        pending = self._lines  # lines read past a status wait for the next request
        while True:
            while not pending:
                data = await self.process.stdout.read(64 * 1024)
                if not data:
                    pending.extend(lines.end())
                    closed = conv.close("processor")
                    trace("<- end of output")
                    reason = closed.describe() if closed is not None else "closed its output"
                    if not pending:
                        raise CaseFailed(reason, self.seen(trace))
                    break
                pending.extend(lines.feed(data))
            verdict = conv.from_processor(pending.popleft())
            if verdict.kind is Kind.VIOLATION:
                trace(f"<- {verdict.describe()}")
                raise CaseFailed(verdict.reason or verdict.describe(), self.seen(trace))
            if verdict.kind is not Kind.ACCEPTED:
                continue  # a debug line the MLD skips
            got = verdict.message
            if type(got) is Checkpoint:
                checkpoints += 1
                await self._answer(trace, conv, got)
            elif type(got) is Status:
                trace(f"<- status for {got.response_for}")
                return checkpoints

    async def _answer(self, trace: Trace, conv: Conversation, request: Checkpoint) -> None:
        last = conv.last_checkpoint
        error = checkpoint_error(
            request,
            action=conv.pending,
            last=seq_key(*last) if last is not None and last[0].isdigit() else None,
            largest=conv.largest,
            reason=conv.pending_reason,
        )
        at = request.sequence_number
        if at is None and error is None and conv.pending == "shardEnded":
            at = SHARD_END
        reply = Checkpoint(at, request.sub_sequence_number, error)
        trace(f"<- checkpoint {request.sequence_number or '(no sequence number)'}; -> {error or 'done'}")
        conv.daemon_sent(reply)
        self.process.stdin.write(encode(reply, reply=True))
        await self.process.stdin.drain()

    async def stop(self) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        with contextlib.suppress(Exception):
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), self.window)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stderr, 5)
        return process.returncode

    async def after_case(self, case: Case, result: Result) -> Result:
        if result.status == FAIL and self.errors and "processor stderr" not in result.seen:
            result.seen += "\nprocessor stderr:\n" + "\n".join(f"  | {line}" for line in self.errors)
        await self.stop()
        return result


async def _session(ctx: ProcessorUnderTest, trace: Trace, *requests: Message) -> list[int]:
    conv, lines = await ctx.start(trace)
    return [await ctx.request(trace, conv, lines, msg) for msg in requests]


INIT = Initialize(SHARD, "TRIM_HORIZON", None)


async def initialize_status(ctx: ProcessorUnderTest, trace: Trace) -> str:
    await _session(ctx, trace, INIT)
    return "status for initialize"


async def records_status(ctx: ProcessorUnderTest, trace: Trace) -> str:
    counts = await _session(
        ctx, trace, INIT, ProcessRecords(_records(0, 3), 0), ProcessRecords(_records(3, 2), 0)
    )
    return f"status for each processRecords ({sum(counts)} checkpoint(s) answered)"


async def shard_ended(ctx: ProcessorUnderTest, trace: Trace) -> str:
    counts = await _session(ctx, trace, INIT, ProcessRecords(_records(0, 3), 0), ShardEnded())
    code = await ctx.stop()
    exited = f"; exited {code} when its input ended" if code is not None else ""
    return f"checkpoint at the end of the shard, then its status ({counts[-1]} checkpoint(s)){exited}"


async def lease_lost(ctx: ProcessorUnderTest, trace: Trace) -> str:
    await _session(ctx, trace, INIT, ProcessRecords(_records(0, 2), 0), LeaseLost())
    return "status for leaseLost"


async def shutdown_requested(ctx: ProcessorUnderTest, trace: Trace) -> str:
    counts = await _session(
        ctx, trace, INIT, ProcessRecords(_records(0, 2), 0), ShutdownRequested(), LeaseLost()
    )
    return f"status for shutdownRequested ({counts[2]} checkpoint(s)), then for leaseLost"


async def exits_after_final(ctx: ProcessorUnderTest, trace: Trace) -> str:
    await _session(ctx, trace, INIT, LeaseLost())
    ctx.process.stdin.close()
    try:
        code = await asyncio.wait_for(ctx.process.wait(), max(ctx.window * 4, 2))
    except TimeoutError:
        raise CaseFailed(
            "still running after leaseLost's status and the end of its input", ctx.seen(trace)
        ) from None
    if code != 0:
        raise CaseFailed(f"exited with {code} after a clean end", ctx.seen(trace))
    return "exited 0 once its input ended after the final status"


def _cases() -> tuple[Case, ...]:
    mld = "MultiLangDaemon protocol"
    return (
        Case(
            "initialize.status",
            f"{mld}: initialize",
            "initialize is answered with status responseFor initialize",
            initialize_status,
        ),
        Case(
            "records.status",
            f"{mld}: processRecords",
            "each processRecords gets its status; checkpoints one at a time, only while a request is pending",
            records_status,
        ),
        Case(
            "shard-ended.checkpoint",
            f"{mld}: shardEnded",
            "at shardEnded it checkpoints with no sequence number before its status",
            shard_ended,
        ),
        Case(
            "lease-lost.status",
            f"{mld}: leaseLost",
            "leaseLost is answered with status (no checkpointer there)",
            lease_lost,
        ),
        Case(
            "shutdown-requested.status",
            f"{mld}: shutdownRequested",
            "shutdownRequested is answered with status, and the shard goes on to its end",
            shutdown_requested,
        ),
        Case(
            "exit.after-final",
            f"{mld}: leaseLost",
            "after the final status and the end of its input it exits 0",
            exits_after_final,
        ),
    )


@contextlib.asynccontextmanager
async def open_processor(target: Target, options: Mapping[str, Any]) -> AsyncIterator[ProcessorUnderTest]:
    if not target.command:
        raise SuiteUnavailable("give the processor's command after --")
    if shutil.which(target.command[0]) is None:
        raise SuiteUnavailable(f"cannot run {target.command[0]!r}: not found or not executable")
    ctx = ProcessorUnderTest(target.command, float(options.get("window_ms") or 500) / 1000)
    try:
        yield ctx
    finally:
        await ctx.stop()


# --- conformance daemon HOST:PORT: play record processors against a daemon ------------------------


@dataclass
class DaemonUnderTest:
    """A daemon listening for processors, one connection per shard (as erlmld's bridge connects)."""

    host: str
    port: int
    shards: list = field(default_factory=list)

    async def shard(self, trace: Trace) -> ShardPeer:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        peer = ShardPeer(reader, writer, trace)
        self.shards.append(peer)
        trace(f"connected to {self.host}:{self.port}")
        return peer

    def close_all(self) -> None:
        shards, self.shards = self.shards, []
        for peer in shards:
            peer.writer.transport.abort()

    async def after_case(self, case: Case, result: Result) -> Result:
        self.close_all()
        return result


class ShardPeer:
    """One shard's conversation from the processor's end; the daemon's lines judged by the core."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trace: Trace) -> None:
        self.reader, self.writer, self.trace = reader, writer, trace
        self.conv = Conversation(None)
        self.lines = LineSplitter()
        self._pending: deque = deque()
        self.records: list[Record] = []
        self.requests: list[str] = []

    async def _next(self) -> Message:
        """The daemon's next message (request or checkpoint reply); a broken rule fails the case."""
        while True:
            while not self._pending:
                data = await self.reader.read(64 * 1024)
                if not data:
                    raise CaseFailed(
                        f"the daemon closed the connection; expecting {self.conv.expecting()}",
                        self.trace.tail(),
                    )
                self._pending.extend(self.lines.feed(data))
            try:
                verdict = self.conv.from_daemon(self._pending.popleft())
            except Fatal as err:
                raise CaseFailed(f"a line the processor cannot read: {err}", self.trace.tail()) from None
            if verdict.kind is Kind.VIOLATION:
                self.trace(f"<- {verdict.describe()}")
                raise CaseFailed(verdict.reason or verdict.describe(), self.trace.tail())
            if verdict.kind is Kind.ACCEPTED and verdict.message is not None:
                msg = verdict.message
                if type(msg) is ProcessRecords:
                    self.records.extend(msg.records)
                    self.trace(f"<- processRecords ({len(msg.records)} records)")
                elif type(msg) is not Checkpoint:
                    self.trace(f"<- {msg.action}")
                    self.requests.append(msg.action)
                return msg

    def send(self, msg: Message) -> None:
        self.conv.processor_sent(msg)
        self.writer.write(encode_kclpy(msg))

    async def request(self) -> Message:
        msg = await self._next()
        if type(msg) is Checkpoint:
            raise CaseFailed("a checkpoint reply nobody asked for", self.trace.tail())
        return msg

    async def checkpoint(self, sequence_number: str | None, sub: int | None = None) -> Checkpoint:
        self.trace(f"-> checkpoint {sequence_number or '(no sequence number)'}")
        self.send(Checkpoint(sequence_number, sub))
        reply = await self._next()
        if type(reply) is not Checkpoint:
            raise CaseFailed(f"{reply.action} instead of the checkpoint reply", self.trace.tail())
        self.trace(f"<- checkpoint reply: {reply.error or 'done'}")
        return reply

    async def answer(self, msg: Message) -> None:
        if msg.action == "shardEnded" or (
            msg.action == "shutdown" and getattr(msg, "reason", "") == "TERMINATE"
        ):
            reply = await self.checkpoint(None)
            if reply.error:
                raise CaseFailed(f"the end-of-shard checkpoint got {reply.error}", self.trace.tail())
        self.send(Status(msg.action))

    async def finish(self, first: Message | None = None) -> str:
        """Answer every request to the end of the lease: how it ended."""
        msg = first if first is not None else await self.request()
        while True:
            await self.answer(msg)
            if self.conv.done:
                return msg.action
            msg = await self.request()

    async def until_records(self) -> ProcessRecords:
        """Answer requests until a processRecords with records comes (skip if the lease ends first)."""
        while True:
            msg = await self.request()
            if type(msg) is ProcessRecords and msg.records:
                return msg
            if msg.action in ("leaseLost", "shardEnded", "shutdown", "shutdownRequested"):
                await self.finish(msg)
                raise CaseSkipped("the daemon sent this shard no records")
            await self.answer(msg)


async def initialize_first(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    first = await peer.request()
    if type(first) is not Initialize:
        raise CaseFailed(f"the first request is {first.action}", trace.tail())
    ended = await peer.finish(first)
    return f"initialize of {first.shard_id} at {first.sequence_number}; the lease ended with {ended}"


async def records_ordered(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    ended = await peer.finish()
    keys = [seq_key(r.sequence_number, r.sub_sequence_number) for r in peer.records]
    if any(b <= a for a, b in zip(keys, keys[1:], strict=False)):
        raise CaseFailed("sequence numbers do not grow within the shard", trace.tail())
    return f"{len(keys)} records in growing sequence order; the lease ended with {ended}"


async def checkpoint_in_initialize(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    first = await peer.request()
    reply = await peer.checkpoint(None)
    if reply.error != "InvalidStateException":
        raise CaseFailed(f"a checkpoint during initialize got {reply.error or 'success'}", trace.tail())
    await peer.finish(first)
    return "InvalidStateException for a checkpoint during initialize"


async def checkpoint_last_record(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    last = batch.records[-1]
    reply = await peer.checkpoint(last.sequence_number, last.sub_sequence_number)
    if reply.error:
        raise CaseFailed(f"a checkpoint at the last record delivered got {reply.error}", trace.tail())
    await peer.finish(batch)
    return f"checkpoint at {last.sequence_number} succeeded"


async def checkpoint_beyond(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    beyond = str(int(batch.records[-1].sequence_number) + 1)
    reply = await peer.checkpoint(beyond)
    if reply.error != "IllegalArgumentException":
        raise CaseFailed(
            f"a checkpoint beyond the largest record got {reply.error or 'success'}", trace.tail()
        )
    await peer.finish(batch)
    return "IllegalArgumentException for a checkpoint beyond the largest record delivered"


async def checkpoint_backwards(ctx: DaemonUnderTest, trace: Trace) -> str:
    peer = await ctx.shard(trace)
    batch = await peer.until_records()
    if len(batch.records) < 2:
        await peer.finish(batch)
        raise CaseSkipped("the first batch has one record: nothing below it to go back to")
    first, last = batch.records[0], batch.records[-1]
    if (await peer.checkpoint(last.sequence_number)).error:
        raise CaseFailed("a checkpoint at the last record delivered failed", trace.tail())
    reply = await peer.checkpoint(first.sequence_number)
    if reply.error != "IllegalArgumentException":
        raise CaseFailed(f"a checkpoint below the last one got {reply.error or 'success'}", trace.tail())
    await peer.finish(batch)
    return "IllegalArgumentException for a checkpoint below the lease's checkpoint"


def _daemon_cases() -> tuple[Case, ...]:
    mld = "MultiLangDaemon protocol"
    kcl = "KCL checkpointer"
    return (
        Case(
            "initialize.first",
            f"{mld}: initialize",
            "each shard opens with initialize and its lease ends with a final request",
            initialize_first,
        ),
        Case(
            "records.ordered",
            f"{mld}: processRecords",
            "sequence numbers grow within a shard",
            records_ordered,
        ),
        Case(
            "checkpoint.in-initialize",
            kcl,
            "a checkpoint during initialize gets InvalidStateException",
            checkpoint_in_initialize,
        ),
        Case(
            "checkpoint.last-record",
            kcl,
            "a checkpoint at the last record delivered succeeds",
            checkpoint_last_record,
        ),
        Case(
            "checkpoint.beyond",
            kcl,
            "a checkpoint beyond the largest record delivered gets IllegalArgumentException",
            checkpoint_beyond,
        ),
        Case(
            "checkpoint.backwards",
            kcl,
            "a checkpoint below the lease's checkpoint gets IllegalArgumentException",
            checkpoint_backwards,
        ),
    )


@contextlib.asynccontextmanager
async def open_daemon(target: Target, options: Mapping[str, Any]) -> AsyncIterator[DaemonUnderTest]:
    host, sep, port = (target.address or "").rpartition(":")
    if not sep or not port.isdigit():
        raise SuiteUnavailable(f"{target.address!r} is not HOST:PORT")
    ctx = DaemonUnderTest(host or "127.0.0.1", int(port))
    try:
        yield ctx
    finally:
        ctx.close_all()


SUITES = (
    Suite(
        "processor",
        "kinesis",
        "Play the Kinesis MultiLangDaemon for a record processor: -- COMMAND (on its stdin and stdout).",
        "command",
        _cases(),
        open_processor,
        (SuiteOption("window-ms", "How long a processor may take to exit once its input ends.", 500),),
    ),
    Suite(
        "daemon",
        "kinesis",
        "Play Kinesis record processors against a daemon listening at HOST:PORT (one connection a shard).",
        "address",
        _daemon_cases(),
        open_daemon,
    ),
)
