"""The mock MultiLangDaemon: plays the KCL's MLD for a record processor being written.

One record processor per shard, as the MLD runs them: a child process
spoken to over its stdin and stdout (its stderr echoed with the shard's name),
or a TCP connection (erlmld's bridge). Each shard gets ``initialize`` from its
lease table checkpoint, its records in ``processRecords`` batches, and at the
end of its records ``shardEnded`` (``--shard-end``) or a worker's graceful
stop, ``shutdownRequested`` then ``leaseLost``. Checkpoints are answered as the
KCL checkpointer answers them and kept durably before the reply.

Every line in both directions runs through ``core.Conversation``; a processor
that breaks the protocol (closes its output early, answers for the wrong
request, asks for a checkpoint when it may not) fails its shard, and, as the
Java MLD exits on any failure, stops every shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.runtime import quiet_accept_errors

from .codec import (
    CURRENT,
    V1,
    Checkpoint,
    Initialize,
    LeaseLost,
    Line,
    LineSplitter,
    Message,
    ProcessRecords,
    ShardEnded,
    Shutdown,
    ShutdownRequested,
    Status,
    encode,
    is_sequence_number,
)
from .core import DAEMON, PROCESSOR, SHARD_END, Conversation, Kind, checkpoint_refusal, seq_key
from .leases import LeaseTable
from .records import ShardRecords

#: Port the processor end gets in a ``--record`` capture of a pipe conversation.
RECORD_PORT = 7300
_READ_SIZE = 256 * 1024


class ShardFailure(Exception):
    """The processor broke the protocol or went away: what, where and what was expected."""


@dataclass
class Faults:
    """Injected by rule; counts are per shard."""

    #: (exception name, first, last): checkpoint requests (from 1) that get this error; last 0: no end.
    checkpoint_errors: list[tuple[str, int, int]] = field(default_factory=list)
    lease_lost_after: int = 0
    shutdown_requested_after: int = 0
    kill_after: int = 0
    shard_end: bool = False

    def checkpoint_error(self, number: int) -> str | None:
        for name, first, last in self.checkpoint_errors:
            if number >= first and (last == 0 or number <= last):
                return name
        return None


def parse_checkpoint_error(spec: str) -> tuple[str, int, int]:
    """``NAME``, ``NAME@3`` or ``NAME@2-4`` (checkpoint requests of a shard, from 1)."""
    name, _, which = spec.partition("@")
    if not name.isidentifier():
        raise ValueError(f"--checkpoint-error {spec!r}: {name!r} is not an exception name")
    if not which:
        return name, 1, 0
    first, dash, last = which.partition("-")
    try:
        lo = int(first)
        hi = (int(last) if last else 0) if dash else lo
    except ValueError:
        raise ValueError(f"--checkpoint-error {spec!r}: expected NAME, NAME@N or NAME@N-M") from None
    if lo < 1 or (hi and hi < lo):
        raise ValueError(f"--checkpoint-error {spec!r}: checkpoint numbers start at 1, N-M with M >= N")
    return name, lo, hi


@dataclass
class DaemonConfig:
    command: list[str] | None = None
    listen: tuple[str, int] | None = None
    connect: tuple[str, int] | None = None
    batch_size: int = 100
    dialect: str = CURRENT
    #: Seconds to wait for the processor's next line (0: forever, as the MLD by default).
    timeout: float = 0.0
    #: Seconds a processor gets to exit once its input is closed.
    exit_grace: float = 10.0
    #: The KCL's ``shutdownGraceMillis``, in seconds: 0 (its default) closes every processor's
    #: input at a stop; more sends shutdownRequested and leaseLost, cut when the grace runs out.
    shutdown_grace: float = 0.0
    #: After the last record, send nothing until stopped (the KCL on an open shard), not end the lease.
    wait_at_end: bool = False
    #: While waiting so: an empty processRecords every this many seconds (the KCL's
    #: ``callProcessRecordsEvenForEmptyRecordList``, one per idle interval); 0: none.
    empty_batches: float = 0.0
    record: str | None = None
    faults: Faults = field(default_factory=Faults)
    #: Seconds without a line from a processor that owes an answer before the daemon says what it waits for.
    wait_note: float = 5.0


@dataclass
class ShardStats:
    shard_id: str
    records: int = 0
    delivered: int = 0
    redelivered: int = 0
    batches: int = 0
    checkpoint_requests: int = 0
    checkpoints: int = 0
    checkpoint_errors: Counter = field(default_factory=Counter)
    #: Exception name -> why its last checkpoint was refused (the sequence number, the range allowed).
    checkpoint_error_reasons: dict = field(default_factory=dict)
    checkpoint: str | None = None
    sub_sequence_number: int | None = None
    checkpointed: int = 0  # records at or before the checkpoint
    end: str = "not started"
    failure: str | None = None
    spawns: int = 0
    kills: int = 0
    skipped_lines: int = 0
    exit_codes: list = field(default_factory=list)
    #: The shard whose failure stopped this one.
    stopped_by: str | None = None
    high_water: int = 0  # records up to this index were delivered at least once

    def as_dict(self) -> dict:
        return {
            "shard_id": self.shard_id,
            "records": self.records,
            "delivered": self.delivered,
            "redelivered": self.redelivered,
            "batches": self.batches,
            "checkpoint_requests": self.checkpoint_requests,
            "checkpoints": self.checkpoints,
            "checkpoint_errors": dict(self.checkpoint_errors),
            "checkpoint_error_reasons": dict(self.checkpoint_error_reasons),
            "checkpoint": self.checkpoint,
            "sub_sequence_number": self.sub_sequence_number,
            "checkpointed": self.checkpointed,
            "end": self.end,
            "failure": self.failure,
            "spawns": self.spawns,
            "kills": self.kills,
            "skipped_lines": self.skipped_lines,
            "exit_codes": self.exit_codes,
        }


# --------------------------------------------------------------------------- channels


class Channel:
    """One processor: bytes to it, bytes from it."""

    #: (daemon address, processor address) for a recording, and whether the daemon opened it.
    ends: tuple[tuple[str, int], tuple[str, int]] = (("127.0.0.1", 0), ("127.0.0.1", RECORD_PORT))
    daemon_is_client = True

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    async def read(self) -> bytes:
        raise NotImplementedError

    async def close_input(self) -> None:
        """The processor's input ends (stdin closed, or the connection half-closed)."""

    async def kill(self) -> None:
        raise NotImplementedError

    async def wait(self, grace: float) -> int | None:
        """Exit code once the processor is gone (None for a connection); kills it after ``grace`` s."""
        return None

    def describe_exit(self) -> str:
        return ""


class ChildChannel(Channel):
    def __init__(self, proc: asyncio.subprocess.Process, shard_id: str, echo: Callable[[str], None]) -> None:
        self.proc = proc
        _flush_on_drain(proc.stdin.transport)
        # Fewer wake-ups for a batch line (Linux); a processor already gone has no pipe left to size.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            fcntl.fcntl(proc.stdin.transport.get_extra_info("pipe").fileno(), fcntl.F_SETPIPE_SZ, _READ_SIZE)
        self._stderr = asyncio.ensure_future(self._echo(shard_id, echo))

    @classmethod
    async def spawn(cls, command: list[str], shard_id: str, echo: Callable[[str], None]) -> ChildChannel:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_READ_SIZE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the daemon, which stops them itself
        )
        return cls(proc, shard_id, echo)

    async def _echo(self, shard_id: str, echo: Callable[[str], None]) -> None:
        stream = self.proc.stderr
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the limit: take what is there
                line = await stream.read(_READ_SIZE)
            if not line:
                return
            echo(f"[{shard_id}] {line.decode('utf-8', errors='replace').rstrip()}")

    async def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def read(self) -> bytes:
        return await self.proc.stdout.read(_READ_SIZE)

    async def close_input(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
            await self.proc.stdin.wait_closed()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what it started too: they share its group
        await self.proc.wait()
        self.proc.stdin.close()  # every pipe closed, so nothing of the process outlives the loop
        await self._drain_stderr()

    async def wait(self, grace: float) -> int | None:
        try:
            async with asyncio.timeout(grace):
                code = await self.proc.wait()
        except TimeoutError:
            await self.kill()
            raise
        await self._drain_stderr()
        return code

    async def _drain_stderr(self) -> None:
        """Its stderr echoed, and what it left on stdout read away: a pipe whose reading is paused
        never sees its end, and a pipe left open is closed at garbage collection, when the event
        loop may be gone (a traceback on stderr)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self._stderr
                while await self.proc.stdout.read(_READ_SIZE):
                    pass

    def describe_exit(self) -> str:
        code = self.proc.returncode
        if code is None:
            return ""
        if code < 0:
            with contextlib.suppress(ValueError):
                return f" (it was killed by {signal.Signals(-code).name})"
        return f" (it exited with code {code})"


class TcpChannel(Channel):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, daemon_is_client: bool):
        self.reader, self.writer = reader, writer
        self.daemon_is_client = daemon_is_client
        _flush_on_drain(writer.transport)
        self.ends = (_v4(writer.get_extra_info("sockname")), _v4(writer.get_extra_info("peername")))

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read(self) -> bytes:
        return await self.reader.read(_READ_SIZE)

    async def close_input(self) -> None:
        with contextlib.suppress(OSError):
            if self.writer.can_write_eof():
                self.writer.write_eof()

    async def kill(self) -> None:
        self.writer.transport.abort()

    async def wait(self, grace: float) -> int | None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()
        return None


def _flush_on_drain(transport: asyncio.WriteTransport) -> None:
    """``drain()`` returns once a request is all with the kernel, not merely buffered.

    Otherwise the tail of a long processRecords line waits in the transport
    while the daemon encodes the next batch, and the processor waits with it.
    """
    transport.set_write_buffer_limits(high=0)


def _v4(address: tuple | None) -> tuple[str, int]:
    """An address a pcap can hold (the writer synthesises IPv4); IPv6 becomes loopback v4."""
    if not address:
        return ("127.0.0.1", 0)
    host, port = address[0], address[1]
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        host = "127.0.0.1"
    return host, port


# --------------------------------------------------------------------------- one conversation


class Session:
    """One processor's conversation for one shard: sends requests, answers checkpoints."""

    def __init__(self, daemon: MockDaemon, shard: ShardRecords, stats: ShardStats, channel: Channel) -> None:
        self.daemon = daemon
        self.shard = shard
        self.stats = stats
        self.channel = channel
        self.dialect = daemon.config.dialect
        self.conv = Conversation(self.dialect)
        self.splitter = LineSplitter()
        self.lines: deque[Line] = deque()
        self.eof = False
        self.input_lost = False
        self.pcap: TcpSession | None = None
        if daemon.pcap is not None:
            daemon.sessions += 1
            mine, theirs = channel.ends
            if mine[1] == 0:
                mine = ("127.0.0.1", 40000 + daemon.sessions)
            client, server = (mine, theirs) if channel.daemon_is_client else (theirs, mine)
            self.pcap = daemon.pcap.tcp_session(client, server)

    async def request(self, msg: Message) -> None:
        """Send one request and serve the processor until its status."""
        await self.send_request(msg, encode(msg, self.dialect))
        await self.until_status()

    async def send_request(self, msg: Message, data: bytes) -> None:
        """Send a request already encoded as ``data``."""
        verdict = self.conv.feed(DAEMON, msg)
        assert verdict.ok, verdict.describe()
        await self._send(data, msg.action)

    async def _send(self, data: bytes, what: str) -> None:
        if self.pcap is not None:
            self.pcap.send(self.channel.daemon_is_client, data)
        try:
            await self.channel.write(data)
        except (ConnectionError, OSError) as err:
            await self._judge_remaining_output()
            raise ShardFailure(
                f"cannot write {what} to the processor: {err.strerror or err}{await self._exit_note()}; "
                f"it was to read {what} next (after its output line {self.splitter.lines})"
            ) from None

    async def _judge_remaining_output(self) -> None:
        """A processor whose input broke has usually ended: what it wrote before is the better report.

        Whether its exit beats our write is a race; judging its output either way
        gives one answer (a bad line, or its output closing) whichever came first.
        """
        if self.input_lost:
            return
        self.input_lost = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.daemon.config.exit_grace):
                await self.until_status()

    async def _exit_note(self) -> str:
        """How the processor ended, for a failure report; one that closed its pipes but lives on is killed."""
        with contextlib.suppress(TimeoutError):
            await self.channel.wait(self.daemon.config.exit_grace)
        return self.channel.describe_exit()

    async def _next_line(self, *, answer_due: bool = False) -> Line | None:
        """The processor's next line (None at its end); ``answer_due``: one wait of over
        ``wait_note`` seconds for it is told on stderr, so a silent processor is not waited on in silence."""
        while not self.lines:
            if self.eof:
                return None
            timeout = self.daemon.config.timeout or None
            note = None
            if answer_due and self.daemon.config.wait_note:
                note = asyncio.get_running_loop().call_later(self.daemon.config.wait_note, self._note_wait)
            try:
                async with asyncio.timeout(timeout):
                    chunk = await self.channel.read()
            except TimeoutError:
                raise ShardFailure(
                    f"no line from the processor within {timeout:g} s (--idle-timeout); expected "
                    f"{self.conv.expects().text} (after its output line {self.splitter.lines})"
                ) from None
            except (ConnectionError, OSError):
                chunk = b""
            finally:
                if note is not None:
                    note.cancel()
            if chunk:
                if self.pcap is not None:
                    self.pcap.send(not self.channel.daemon_is_client, chunk)
                self.lines.extend(self.splitter.feed(chunk))
            else:
                self.eof = True
                self.lines.extend(self.splitter.end())
        return self.lines.popleft()

    def _note_wait(self) -> None:
        self.daemon.log(
            f"{self.stats.shard_id}: waiting {self.daemon.config.wait_note:g} s so far for "
            f"{self.conv.expects().text} (after its output line {self.splitter.lines})"
        )

    async def until_status(self) -> None:
        """Serve the processor (answer its checkpoints) until its status for the pending request."""
        while True:
            line = await self._next_line(answer_due=True)
            if line is None:
                verdict = self.conv.end(PROCESSOR)
                reason = verdict.reason if verdict is not None else "closed its output"
                raise ShardFailure(f"the processor {reason}{await self._exit_note()}")
            verdict = self.conv.feed(PROCESSOR, line)
            kind = verdict.kind
            if kind is Kind.ACCEPTED:
                if isinstance(verdict.message, Status):
                    return
                await self._answer(verdict.message)
            elif kind is Kind.VIOLATION:
                reason = verdict.reason
                if "expected" not in reason:
                    reason += f"; expected {self.conv.expects().text}"
                raise ShardFailure(
                    f"line {line.number} of the processor's output: {reason}: {_show(line.data)}"
                )
            elif line.data or verdict.note:
                self.stats.skipped_lines += 1
                self.daemon.log(
                    f"{self.stats.shard_id}: processor line {line.number} {kind.value}: {verdict.note}: "
                    f"{_show(line.data)}"
                )

    async def _answer(self, request: Checkpoint) -> None:
        stats, conv = self.stats, self.conv
        stats.checkpoint_requests += 1
        lease = self.daemon.leases.get(stats.shard_id)
        last = seq_key(*lease) if lease is not None and is_sequence_number(lease[0]) else None
        refusal = checkpoint_refusal(
            request, action=conv.pending, last=last, largest=conv.largest, reason=conv.pending_reason
        )
        log = self.daemon.log
        fault = self.daemon.config.faults.checkpoint_error(stats.checkpoint_requests)
        if refusal is None and fault is not None:  # injected: a line with -v only
            refusal = (fault, f"checkpoint request {stats.checkpoint_requests} (--checkpoint-error)")
            log = self.daemon.trace
        error = refusal[0] if refusal is not None else None
        if refusal is None:
            if request.sequence_number is None:
                ending = conv.pending == "shardEnded" or conv.pending_reason == "TERMINATE"
                at = (SHARD_END, 0) if ending else conv.largest_seq
            else:
                at = (request.sequence_number, request.sub_sequence_number or 0)
            if at is not None:
                # Durable before the reply, off the event loop: the other shards go on meanwhile.
                await asyncio.to_thread(self.daemon.leases.set, stats.shard_id, at[0], at[1])
                stats.checkpoint, stats.sub_sequence_number = at[0], at[1] or 0
                stats.checkpointed = self.shard.start_after(at)
            stats.checkpoints += 1
        else:
            stats.checkpoint_errors[error] += 1
            stats.checkpoint_error_reasons[error] = refusal[1]
            log(f"{stats.shard_id}: checkpoint during {conv.pending} refused with {error}: {refusal[1]}")
        reply = Checkpoint(request.sequence_number, request.sub_sequence_number, error)
        verdict = conv.feed(DAEMON, reply)
        assert verdict.ok, verdict.describe()
        await self._send(encode(reply, self.dialect, reply=True), "a checkpoint reply")

    async def finish(self) -> None:
        """After the final status: close the processor's input, drain its output, wait for it."""
        await self.channel.close_input()
        grace = self.daemon.config.exit_grace
        try:
            async with asyncio.timeout(grace):
                while await self._next_line() is not None:
                    pass
            code = await self.channel.wait(grace)
        except TimeoutError:
            await self.channel.kill()
            raise ShardFailure(
                f"the processor did not exit within {grace:g} s after its input closed "
                "(the Java MLD waits for it forever); killed"
            ) from None
        if code is not None:
            self.stats.exit_codes.append(code)
        if self.pcap is not None:
            self.pcap.close(self.channel.daemon_is_client)

    async def release(self, *, fail_if_killed: bool = False) -> None:
        """As the MLD lets go of a processor it stops or gave up on: input closed, output drained,
        exit awaited. The MLD never kills one; the mock does after ``--exit-grace`` seconds, and
        with ``fail_if_killed`` (a stop, not a failure already) that fails the shard."""
        await self.channel.close_input()
        grace = self.daemon.config.exit_grace
        try:
            async with asyncio.timeout(grace):
                while await self._next_line() is not None:
                    pass
                code = await self.channel.wait(grace)
        except (TimeoutError, ShardFailure):
            why = (
                f"the processor did not exit within {grace:g} s (--exit-grace) after its input closed; killed"
            )
            if fail_if_killed:
                end = self.stats.end
                self.daemon.fail(self.stats, why)
                self.stats.end = f"{end}; killed"
            else:
                self.daemon.log(f"{self.stats.shard_id}: {why}")
            await self.abort()
            return
        if code is not None:
            self.stats.exit_codes.append(code)
        if self.pcap is not None:
            self.pcap.close(self.channel.daemon_is_client)

    async def abort(self) -> None:
        await self.channel.kill()
        if isinstance(self.channel, ChildChannel) and self.channel.proc.returncode is not None:
            self.stats.exit_codes.append(self.channel.proc.returncode)
        if self.pcap is not None:
            self.pcap.reset(self.channel.daemon_is_client)


def _show(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", errors="replace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --------------------------------------------------------------------------- the daemon


class MockDaemon:
    def __init__(
        self,
        config: DaemonConfig,
        shards: list[ShardRecords],
        leases: LeaseTable,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.shards = shards
        self.leases = leases
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        #: A processor's stderr lines, already prefixed with its shard.
        self.echo = lambda line: print(line, file=sys.stderr, flush=True)
        #: A line per processor started and per shard's end (none unless set).
        self.trace: Callable[[str], None] = lambda line: None
        self.stats = {s.shard_id: ShardStats(s.shard_id, records=len(s)) for s in shards}
        self.stopping = False
        #: Set when the processors' inputs are closed at once: a stop without (or past) the grace.
        self.cut = False
        self._cut_timer: asyncio.TimerHandle | None = None
        self.failed: str | None = None
        self._tasks: dict[asyncio.Task, str] = {}  # shard tasks, to their shard ids
        #: Set once a shard's lease is at SHARD_END: its children may start.
        self._ended = {s.shard_id: asyncio.Event() for s in shards}
        self._releasing: set[str] = set()  # shards already letting their processor go
        self.pcap: PcapWriter | None = None
        self.sessions = 0
        self._server: asyncio.AbstractServer | None = None
        self._accepted: asyncio.Queue = asyncio.Queue()
        self._stop = asyncio.Event()
        self._started = 0.0
        self._seconds = 0.0
        #: From the first processRecords sent to the last one answered: the rate leaves process start-up out.
        self._first_batch: float | None = None
        self._last_batch = 0.0
        #: Records in the batches answered by then: the rate's records, over the same span.
        self._answered = 0

    def resumed(self) -> list[tuple[ShardRecords, int]]:
        """Each shard with how many of its records its lease's checkpoint covers: a run on a used
        lease table delivers only the rest, and should say what it skips."""
        return [(shard, shard.start_after(self.leases.get(shard.shard_id))) for shard in self.shards]

    def fault_reach(self) -> str | None:
        """Why a fault counted in records can never fire in this run, or None.

        No shard gets more records than it has left after its checkpoint; a fault counted past that
        would leave a run that tested nothing. A kill delivers records again, and they count too,
        so with --kill-after only the kill itself is checked.
        """
        most = max((len(shard) - skipped for shard, skipped in self.resumed()), default=0)
        faults = self.config.faults
        counted = (
            ("--kill-after", faults.kill_after),
            ("--lease-lost-after", faults.lease_lost_after),
            ("--shutdown-requested-after", faults.shutdown_requested_after),
        )
        for option, count in counted[:1] if faults.kill_after else counted:
            if count > most:
                why = f"{option} {count} cannot fire: the most records a shard gets in this run is {most:,}"
                return why + (" (what --state holds as checkpointed is skipped)" if self.leases.path else "")
        return None

    async def start(self) -> tuple[str, int] | None:
        """Open what must be open before the shards start: the listening socket, the recording."""
        if self.config.record:
            self.pcap = PcapWriter(self.config.record)
        if self.config.listen is not None:
            host, port = self.config.listen

            async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await self._accepted.put((reader, writer))

            quiet_accept_errors("kinesis mock-daemon")
            self._server = await asyncio.start_server(accepted, host, port, limit=_READ_SIZE)
            return self._server.sockets[0].getsockname()[:2]
        return None

    def stop(self) -> None:
        """The worker stops (a signal, or a shard failed): as the KCL does with ``shutdown_grace``.

        With a grace, every shard ends at its next request with shutdownRequested
        then leaseLost, and what is left when the grace runs out is cut; without
        one (the KCL's default) every processor's input is closed at once.
        """
        if self.stopping:
            return
        self.stopping = True
        self._stop.set()
        if self.config.shutdown_grace:
            self._cut_timer = asyncio.get_running_loop().call_later(self.config.shutdown_grace, self._cut)
        else:
            self._cut()

    def _cut(self) -> None:
        self.cut = True
        for task, shard_id in self._tasks.items():
            if shard_id not in self._releasing:
                task.cancel()

    async def run(self) -> dict:
        self._started = time.monotonic()
        now_ms = int(time.time() * 1000)
        tasks = {}
        for shard in self.shards:
            shard.stamp(now_ms)
            tasks[asyncio.ensure_future(self._shard(shard))] = shard.shard_id
        self._tasks = tasks
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if self.failed is not None and pending and not self.stopping:
                    # As the Java MLD after a failure: the other shards get a graceful stop, then it exits 1.
                    for task in pending:
                        self.stats[tasks[task]].stopped_by = self.failed
                    self.stop()
        finally:
            if self._cut_timer is not None:
                self._cut_timer.cancel()  # every shard ended within the grace
            for task in pending:
                task.cancel()
            self._seconds = time.monotonic() - self._started
            if self._server is not None:
                self._server.close()
            if self.pcap is not None:
                self.pcap.close()
        return self.summary()

    async def _open(self, shard_id: str) -> Channel | None:
        """The shard's processor; None when the daemon stops before one connects."""
        config = self.config
        if config.command:
            try:
                return await ChildChannel.spawn(config.command, shard_id, self.echo)
            except OSError as err:
                raise ShardFailure(f"cannot run {config.command[0]!r}: {err.strerror or err}") from None
        if config.connect is not None:
            host, port = config.connect
            try:
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_SIZE)
            except OSError as err:
                why = os.strerror(err.errno) if err.errno else str(err)  # asyncio's strerror holds a tuple
                raise ShardFailure(f"cannot connect to the processor at {host}:{port}: {why}") from None
            return TcpChannel(reader, writer, daemon_is_client=True)
        get = asyncio.ensure_future(self._accepted.get())
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not get.done():
            get.cancel()
            return None
        reader, writer = get.result()
        return TcpChannel(reader, writer, daemon_is_client=False)

    async def _shard(self, shard: ShardRecords) -> None:
        stats = self.stats[shard.shard_id]
        try:
            if shard.parents and not await self._parents_ended(shard):
                stats.end = "stopped before start (parents not ended)"
                return
            await self._serve_shard(shard, stats)
            lease = self.leases.get(shard.shard_id)
            if lease is not None and lease[0] == SHARD_END:
                self._ended[shard.shard_id].set()
        except ShardFailure as err:
            self.fail(stats, str(err))
        except Exception as err:  # a fault of ours: the shard still fails visibly, and the others stop
            self.fail(stats, f"internal error: {type(err).__name__}: {err}")
        except asyncio.CancelledError:
            if stats.end in ("not started", "initialized"):
                stats.end = "stopped before start" if stats.end == "not started" else "stopped"
            raise
        finally:
            if stats.stopped_by is not None and stats.failure is None:
                stats.end = f"stopped: {stats.stopped_by} failed; {stats.end}"
            self.trace(f"{shard.shard_id}: {stats.end}, {stats.delivered} records delivered")

    async def _parents_ended(self, shard: ShardRecords) -> bool:
        """Wait, as the KCL does for a child shard, until every parent's lease is at SHARD_END."""
        ends = [asyncio.ensure_future(self._ended[p].wait()) for p in shard.parents if p in self._ended]
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            while not all(e.done() for e in ends) and not stop.done():
                await asyncio.wait([stop, *ends], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (*ends, stop):
                f.cancel()
        return all(self._ended[p].is_set() for p in shard.parents if p in self._ended)

    def fail(self, stats: ShardStats, reason: str) -> None:
        """The shard failed: said on stderr, in its summary, and the daemon's exit is 1."""
        stats.failure = reason
        stats.end = "failed"
        if self.failed is None:
            self.failed = stats.shard_id
        self.log(f"{stats.shard_id}: {reason}")

    async def _serve_shard(self, shard: ShardRecords, stats: ShardStats) -> None:
        lease = self.leases.get(shard.shard_id)
        if lease is not None:
            stats.checkpoint, stats.sub_sequence_number = lease
            stats.checkpointed = shard.start_after(lease)
        if lease is not None and lease[0] == SHARD_END:
            stats.end = "already ended (lease at SHARD_END)"
            return
        while True:  # one processor per pass; a killed one is replaced, as a new lease owner would be
            if self.stopping:
                stats.end = "stopped before start"
                return
            lease = self.leases.get(shard.shard_id)
            index = shard.start_after(lease)
            channel = await self._open(shard.shard_id)
            if channel is None:
                stats.end = "stopped before start"
                return
            stats.spawns += 1
            start = lease[0] if lease is not None else "TRIM_HORIZON"
            self.trace(f"{shard.shard_id}: processor {stats.spawns} started from {start}")
            session = Session(self, shard, stats, channel)
            try:
                seq, sub = lease if lease is not None else ("TRIM_HORIZON", 0)
                await session.request(Initialize(shard.shard_id, seq, sub))
                stats.end = "initialized"
                end = await self._deliver(session, shard, stats, index)
                if end == "killed":
                    continue
                await self._end(session, end)
                await session.finish()
                return
            except asyncio.CancelledError:
                if self.cut:
                    stats.end = "input closed at the stop" + (
                        " (shutdown grace over)" if self.config.shutdown_grace else ""
                    )
                    await session.release(fail_if_killed=True)
                else:
                    await session.abort()
                raise
            except BaseException:
                self._releasing.add(shard.shard_id)  # a stop now must not cut this short
                await session.release()  # the MLD closes a failed processor's input and waits
                raise

    async def _deliver(self, session: Session, shard: ShardRecords, stats: ShardStats, index: int) -> str:
        """processRecords until the records or a fault end it; says how the lease ends.

        The next batch is encoded while the processor works on the current one,
        so the daemon's encoding and the processor's decoding overlap.
        """
        total = len(shard)
        prepared: tuple[int, int, ProcessRecords, bytes] | None = None
        while True:
            end = self._end_of_delivery(stats, index, total, shard.closed)
            if end == "killed":
                stats.kills += 1
                await session.abort()
                self.log(
                    f"{shard.shard_id}: killed the processor after {stats.delivered} records (--kill-after)"
                )
            if end == "idle":
                await self._idle(session)
                continue
            if end is not None:
                return end
            if prepared is None or prepared[0] != index:
                prepared = self._prepare(shard, stats.delivered, stats.kills, index)
            _, last, msg, data = prepared
            stats.batches += 1
            stats.delivered += last - index
            if index < stats.high_water:
                stats.redelivered += min(last, stats.high_water) - index
            stats.high_water = max(stats.high_water, last)
            if self._first_batch is None:
                self._first_batch = time.monotonic()
            await session.send_request(msg, data)
            prepared = None
            if self._end_of_delivery(stats, last, total, shard.closed) is None:
                prepared = self._prepare(shard, stats.delivered, stats.kills, last)
            await session.until_status()
            self._last_batch = time.monotonic()
            self._answered += last - index
            index = last

    def _end_of_delivery(self, stats: ShardStats, index: int, total: int, closed: bool = False) -> str | None:
        """Why no batch follows now (a fault, a stop, the end of the records), or None."""
        faults, sent = self.config.faults, stats.delivered
        if faults.kill_after and not stats.kills and sent >= faults.kill_after:
            return "killed"
        if faults.lease_lost_after and sent >= faults.lease_lost_after:
            return "leaseLost"
        if faults.shutdown_requested_after and sent >= faults.shutdown_requested_after:
            return "shutdownRequested"
        if self.stopping:
            return "shutdownRequested"
        if index >= total:
            if faults.shard_end or closed:
                return "shardEnded"
            return "idle" if self.config.wait_at_end else "shutdownRequested"
        return None

    async def _idle(self, session: Session) -> None:
        """No record left on an open shard: wait for a stop, sending empty batches if asked to."""
        try:
            async with asyncio.timeout(self.config.empty_batches or None):
                await self._stop.wait()
        except TimeoutError:
            session.stats.batches += 1
            await session.request(ProcessRecords([], 0))

    def _prepare(
        self, shard: ShardRecords, sent: int, kills: int, index: int
    ) -> tuple[int, int, ProcessRecords, bytes]:
        """The batch from ``index``, cut short where a fault is due, and its line."""
        faults = self.config.faults
        limit = self.config.batch_size
        for after in (
            0 if kills else faults.kill_after,
            faults.lease_lost_after,
            faults.shutdown_requested_after,
        ):
            if after and sent < after:
                limit = min(limit, after - sent)
        last = min(index + limit, len(shard))
        msg, data = shard.request(index, last, self.config.dialect)
        return index, last, msg, data

    async def _end(self, session: Session, how: str) -> None:
        legacy = self.config.dialect != CURRENT
        stats = session.stats
        if how == "shardEnded":
            await session.request(Shutdown("TERMINATE") if legacy else ShardEnded())
            stats.end = "shardEnded"
            return
        if how == "shutdownRequested" and self.config.dialect != V1:
            await session.request(ShutdownRequested())
        await session.request(Shutdown("ZOMBIE") if legacy else LeaseLost())
        stats.end = "leaseLost" if how == "leaseLost" else "shutdownRequested, leaseLost"

    def summary(self) -> dict:
        shards = [s.as_dict() for s in self.stats.values()]
        delivered = sum(s["delivered"] for s in shards)
        seconds = self._seconds or (time.monotonic() - self._started if self._started else 0.0)
        failures = [f"{s['shard_id']}: {s['failure']}" for s in shards if s["failure"]]
        delivering = self._last_batch - self._first_batch if self._first_batch is not None else 0.0
        return {
            "ok": not failures,
            "shards": shards,
            "records_delivered": delivered,
            "records_redelivered": sum(s["redelivered"] for s in shards),
            "records_checkpointed": sum(s["checkpointed"] for s in shards),
            "checkpoints": sum(s["checkpoints"] for s in shards),
            "checkpoint_errors": sum(sum(s["checkpoint_errors"].values()) for s in shards),
            "failures": failures,
            "seconds": round(seconds, 3),
            "delivery_seconds": round(delivering, 3),
            "records_per_second": round(self._answered / delivering, 1) if delivering > 0 else 0.0,
            "state_saves": self.leases.saves,
        }
