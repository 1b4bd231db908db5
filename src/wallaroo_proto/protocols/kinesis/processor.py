"""The mock record processor: plays a KCL record processor for people who build a daemon.

It answers each request with its ``status`` as kclpy does (the same bytes:
``json.dumps`` wrapped in blank lines), writes the records it gets as JSON
lines, checkpoints every N records and at the end of a shard or a requested
shutdown, and retries a failed checkpoint as the kclpy sample does
(``ShutdownException`` gives up, other errors retry). Each line the daemon
sends runs through ``core.Conversation``, read as kclpy reads it; a daemon that
breaks the protocol is reported with the line and what was expected.
Faults: slow batches, a crash after N records, a wrong ``responseFor``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from wallaroo_proto.runtime import quiet_accept_errors

from .codec import (
    V1,
    Checkpoint,
    Initialize,
    Line,
    LineSplitter,
    Message,
    ProcessRecords,
    Record,
    Shutdown,
    Status,
    doomed_daemon_line,
    encode_kclpy,
)
from .core import DAEMON, PROCESSOR, Conversation, Kind

_READ_SIZE = 256 * 1024


class DaemonFailure(Exception):
    """The daemon broke the protocol or went away: what, where and what was expected."""


class Crash(Exception):
    """The ``--crash-after`` fault: the processor dies on the spot."""


@dataclass
class ProcessorConfig:
    #: JSON lines of every record; ``{shard}`` in the name is the shard id.
    out: str | None = None
    checkpoint_every: int = 100
    retries: int = 5
    retry_sleep: float = 0.05
    slow_ms: float = 0.0
    crash_after: int = 0
    bad_response_after: int = 0


@dataclass
class ProcessorStats:
    shard_id: str | None = None
    dialect: str | None = None
    records: int = 0
    batches: int = 0
    checkpoints: int = 0
    checkpoint_errors: Counter = field(default_factory=Counter)
    gave_up: int = 0
    last_checkpoint: str | None = None
    end: str = "not initialized"
    failure: str | None = None

    def as_dict(self) -> dict:
        return {
            "shard_id": self.shard_id,
            "dialect": self.dialect,
            "records": self.records,
            "batches": self.batches,
            "checkpoints": self.checkpoints,
            "checkpoint_errors": dict(self.checkpoint_errors),
            "gave_up": self.gave_up,
            "last_checkpoint": self.last_checkpoint,
            "end": self.end,
            "failure": self.failure,
        }


class RecordOut:
    """Appends records as JSON lines to one file per shard (``{shard}`` in the name) or a shared one."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._files: dict[str, object] = {}

    def write(self, shard_id: str, records: list[Record]) -> None:
        path = self.template.replace("{shard}", shard_id)
        f = self._files.get(path)
        if f is None:
            # O_APPEND and one write per batch: processors sharing a file never tear each other's lines.
            f = self._files[path] = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        lines = []
        for r in records:
            row = {
                "shard": shard_id,
                "sequenceNumber": r.sequence_number,
                "subSequenceNumber": r.sub_sequence_number,
                "partitionKey": r.partition_key,
                "approximateArrivalTimestamp": r.approximate_arrival_timestamp,
            }
            try:
                raw = base64.b64decode(r.data or "", validate=True)
                row["data"] = raw.decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                row["data_base64"] = r.data
            lines.append(json.dumps(row, ensure_ascii=False))
        f.write(("\n".join(lines) + "\n").encode("utf-8"))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class ShardProcessor:
    """One conversation: reads requests from ``read``, writes answers with ``write``."""

    def __init__(
        self,
        config: ProcessorConfig,
        read: Callable,
        write: Callable,
        *,
        out: RecordOut | None = None,
        log: Callable[[str], None] = lambda line: None,
        name: str = "",
    ) -> None:
        self.config = config
        self._read = read
        self._write = write
        self.out = out
        self.log = log
        self.name = name
        self.conv = Conversation()
        self.splitter = LineSplitter()
        self.lines: deque[Line] = deque()
        self.eof = False
        self.stats = ProcessorStats()
        self._since_checkpoint = 0
        self._last: Record | None = None

    async def run(self) -> ProcessorStats:
        try:
            await self._serve()
        except DaemonFailure as err:
            self.stats.failure = str(err)
            self.stats.end = "failed"
        return self.stats

    async def _serve(self) -> None:
        stats = self.stats
        while True:
            msg = await self._next_message()
            if msg is None:
                self.conv.end(DAEMON)
                if not self.conv.done:
                    # The MLD's stop without a shutdown grace: input closed between requests, no
                    # leaseLost; kclpy's read loop then ends and it exits 0.
                    stats.end = "input closed (daemon stopped)" if self.conv.requests else "input closed"
                return
            await self._handle(msg)
            if self.conv.done:
                stats.end = msg.action if not isinstance(msg, Shutdown) else f"shutdown {msg.reason}"

    async def _next_message(self) -> Message | None:
        while True:
            line = await self._next_line()
            if line is None:
                return None
            verdict = self.conv.feed(DAEMON, line)
            if verdict.kind is Kind.VIOLATION:
                raise DaemonFailure(
                    f"line {line.number} from the daemon: {verdict.reason}: {_show(line.data)}"
                )
            if verdict.kind is Kind.ACCEPTED:
                return verdict.message
            self.log(f"line {line.number} from the daemon {verdict.kind.value}: {verdict.note}")

    async def _next_line(self) -> Line | None:
        while not self.lines:
            if self.eof:
                return None
            try:
                chunk = await self._read()
            except (ConnectionError, OSError):
                chunk = b""
            if chunk:
                self.lines.extend(self.splitter.feed(chunk))
                doomed = None if self.lines else doomed_daemon_line(self.splitter.unfinished())
                if doomed is not None:
                    raise DaemonFailure(
                        f"line {self.splitter.lines + 1} from the daemon ({self.splitter.pending()} bytes, "
                        f"no line end yet): the processor cannot read this line: {doomed}"
                    )
            else:
                self.eof = True
                self.lines.extend(self.splitter.end())
        return self.lines.popleft()

    async def _send(self, msg: Message) -> None:
        verdict = self.conv.feed(PROCESSOR, msg)
        assert verdict.ok or msg.action == "status", verdict.describe()
        try:
            await self._write(encode_kclpy(msg, self.conv.dialect or "current"))
        except (ConnectionError, OSError) as err:
            raise DaemonFailure(f"cannot write {msg.action} to the daemon: {err.strerror or err}") from None

    async def _handle(self, msg: Message) -> None:
        config, stats = self.config, self.stats
        action = msg.action
        if isinstance(msg, Initialize):
            stats.shard_id = msg.shard_id
            stats.dialect = self.conv.dialect
            stats.end = "initialized"
            self.name = msg.shard_id
        elif isinstance(msg, ProcessRecords):
            if config.slow_ms:
                await asyncio.sleep(config.slow_ms / 1000)
            records = msg.records
            if records:
                if self.out is not None:
                    self.out.write(stats.shard_id or "unknown", records)
                stats.records += len(records)
                stats.batches += 1
                self._since_checkpoint += len(records)
                self._last = records[-1]
            if config.crash_after and stats.records >= config.crash_after:
                raise Crash(f"crashed after {stats.records} records (--crash-after)")
            if config.checkpoint_every and self._since_checkpoint >= config.checkpoint_every and self._last:
                last = self._last
                if await self._checkpoint(last.sequence_number, last.sub_sequence_number):
                    self._since_checkpoint = 0
        elif action in ("shardEnded", "shutdownRequested") or getattr(msg, "reason", None) == "TERMINATE":
            await self._checkpoint(None, None)
        if action == "shutdownRequested" and os.environ.get("WALLAROO_PROTO_PLANT") == "shutdown-no-status":
            return  # a planted break for tests/test_fuzz_kinesis.py: the status forgotten
        response_for = action
        if config.bad_response_after and stats.records >= config.bad_response_after:
            response_for = "processRecordz" if action == "processRecords" else f"{action}X"
        await self._send(Status(response_for))

    async def _checkpoint(self, seq: str | None, sub: int | None) -> bool:
        """Checkpoint with retries as the kclpy sample does; True once it succeeded."""
        config, stats = self.config, self.stats
        if self.conv.dialect == V1:
            sub = None
        for attempt in range(1, config.retries + 1):
            await self._send(Checkpoint(seq, sub))
            reply = await self._next_message()
            if reply is None:
                raise DaemonFailure("the daemon closed the conversation while a checkpoint awaited its reply")
            if not isinstance(reply, Checkpoint):
                raise DaemonFailure(f"{reply.action} came where the reply to a checkpoint was expected")
            if reply.error is None:
                stats.checkpoints += 1
                stats.last_checkpoint = seq or "latest"
                return True
            stats.checkpoint_errors[reply.error] += 1
            if reply.error == "ShutdownException":
                self.log(f"{self.name}: checkpoint failed with ShutdownException: giving up")
                break
            self.log(f"{self.name}: checkpoint attempt {attempt} failed with {reply.error}")
            if attempt < config.retries:
                await asyncio.sleep(config.retry_sleep)
        stats.gave_up += 1
        return False


def _show(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", errors="replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --------------------------------------------------------------------------- transports


async def serve_stdio(config: ProcessorConfig, log: Callable[[str], None]) -> ProcessorStats:
    """One conversation on stdin and stdout, as the MLD spawns a processor.

    Pipes, sockets and terminals are read and written by the event loop; a
    regular file (a recorded conversation replayed, output kept) is read in a
    thread and written directly, since a file never blocks for long.
    """
    loop = asyncio.get_running_loop()
    try:
        reader = asyncio.StreamReader(limit=_READ_SIZE)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", 0, closefd=False)
        )

        def read():
            return reader.read(_READ_SIZE)

    except ValueError:

        async def read() -> bytes:
            return await loop.run_in_executor(None, os.read, 0, _READ_SIZE)

    try:
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", 0, closefd=False)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

    except ValueError:

        async def write(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]

    out = RecordOut(config.out) if config.out else None
    try:
        return await ShardProcessor(config, read, write, out=out, log=log, name="stdio").run()
    finally:
        if out is not None:
            out.close()


class TcpProcessors:
    """Conversations over TCP: accepted (``--listen``, as erlmld's node) or opened (``--connect``)."""

    def __init__(self, config: ProcessorConfig, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.out = RecordOut(config.out) if config.out else None
        self.results: list[ProcessorStats] = []
        self.crashed: str | None = None
        self.server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.crash_event = asyncio.Event()

    async def _conversation(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        proc = ShardProcessor(self.config, lambda: reader.read(_READ_SIZE), write, out=self.out, log=self.log)
        try:
            stats = await proc.run()
            self.results.append(stats)
            if stats.failure:
                self.log(f"{stats.shard_id or 'a connection'}: {stats.failure}")
        except Crash as err:
            self.crashed = str(err)
            proc.stats.end = "crashed"
            self.results.append(proc.stats)
            writer.transport.abort()
            self.crash_event.set()
            return
        except Exception as err:  # a fault of ours: this conversation fails visibly, the others go on
            proc.stats.end = "failed"
            proc.stats.failure = f"internal error: {type(err).__name__}: {err}"
            self.results.append(proc.stats)
            self.log(f"{proc.stats.shard_id or 'a connection'}: {proc.stats.failure}")
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            self._tasks.add(task)
            try:
                await self._conversation(reader, writer)
            finally:
                self._tasks.discard(task)

        quiet_accept_errors("kinesis mock-processor")
        self.server = await asyncio.start_server(accepted, host, port, limit=_READ_SIZE)
        return self.server.sockets[0].getsockname()[:2]

    async def connect(self, host: str, port: int, connections: int) -> None:
        async def one() -> None:
            reader, writer = await asyncio.open_connection(host, port, limit=_READ_SIZE)
            await self._conversation(reader, writer)

        await asyncio.gather(*(one() for _ in range(connections)))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.out is not None:
            self.out.close()


def summary(results: list[ProcessorStats], crashed: str | None = None) -> dict:
    rows = [r.as_dict() for r in results]
    failures = [f"{r['shard_id'] or 'before initialize'}: {r['failure']}" for r in rows if r["failure"]]
    if crashed:
        failures.append(crashed)
    return {
        "ok": not failures,
        "conversations": rows,
        "records": sum(r["records"] for r in rows),
        "checkpoints": sum(r["checkpoints"] for r in rows),
        "checkpoint_errors": sum(sum(r["checkpoint_errors"].values()) for r in rows),
        "failures": failures,
    }
