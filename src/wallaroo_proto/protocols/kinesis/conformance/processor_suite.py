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
    Result,
    SuiteUnavailable,
    Target,
    Trace,
)

from ..codec import (
    CURRENT,
    Checkpoint,
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
    is_sequence_number,
)
from ..core import DAEMON, PROCESSOR, SHARD_END, Conversation, Kind, checkpoint_error, seq_key
from ..records import sequence_number

SHARD = "shardId-000000000000"
OUTPUT_LINES = 10
STDERR_HEADER = "\nprocessor stderr:\n"


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
            out += STDERR_HEADER + "\n".join(f"  | {line}" for line in self.errors)
        return out

    async def request(self, trace: Trace, conv: Conversation, lines: LineSplitter, msg: Message) -> int:
        """Send one request; answer its checkpoints until its status: how many checkpoints it made."""
        verdict = conv.feed(DAEMON, msg)
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
                    closed = conv.end(PROCESSOR)
                    trace("<- end of output")
                    reason = closed.describe() if closed is not None else "closed its output"
                    if not pending:
                        raise CaseFailed(reason, self.seen(trace))
                    break
                pending.extend(lines.feed(data))
            verdict = conv.feed(PROCESSOR, pending.popleft())
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
            last=seq_key(*last) if last is not None and is_sequence_number(last[0]) else None,
            largest=conv.largest,
            reason=conv.pending_reason,
        )
        at = request.sequence_number
        if at is None and error is None and conv.pending == "shardEnded":
            at = SHARD_END
        reply = Checkpoint(at, request.sub_sequence_number, error)
        trace(f"<- checkpoint {request.sequence_number or '(no sequence number)'}; -> {error or 'done'}")
        conv.feed(DAEMON, reply)
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
        await self.stop()  # first: its stderr is read to the end
        if result.status == FAIL and self.errors:
            head = result.seen.split(STDERR_HEADER)[0]
            result.seen = head + STDERR_HEADER + "\n".join(f"  | {line}" for line in self.errors)
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


CASES = _cases()
