"""A mock Wallaroo worker for connector sources: an asyncio server on the protocol core.

Each accepted connection is a ``FramedConnection`` (reader + the sans-IO core),
so every rule the core knows is enforced the same way here as in the dissector.
This module adds what only a worker does: the handshake check, credits and their
refill, the stream registry across connections, checkpoints, de-duplication of
replays, fault injection, timeouts and the connection cap.

Delivered messages go through *consumers*: objects with ``async deliver(stream_id,
message)`` and optionally ``async sync()`` (make everything delivered so far
durable; awaited at each checkpoint before it is acknowledged) and ``async
aclose()``. A connection awaits every consumer before it reads its next bytes,
so a slow consumer slows the connectors down through TCP instead of growing a
buffer. ``JsonLinesOut`` (the ``--out`` file) is one; a sink forwarder is another.

Checkpoint rule (see ``registry``): ACK point_of_ref = the last delivered message
id the checkpoint holds, sent only after consumers synced and the state file was
written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import re
import stat
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

from wallaroo_proto.judge import Kind
from wallaroo_proto.latency import LatencyHistogram
from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.runtime import quiet_accept_errors

from .errors import ProtocolError
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SOURCE_VERSION,
    Ack,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    Text,
    show_text,
)
from .peer import ConnectionClosed, FramedConnection, OwnViolation, describe_protocol_error
from .protocol import ACCEPTED, Side, Use, Verdict, check_hello
from .registry import Registry, write_atomic
from .sink_forwarder import SinkForwarder

_ACCEPTED = Kind.ACCEPTED
_REPLAYED = Kind.REPLAYED
_VIOLATION = Kind.VIOLATION
#: Violations and refusals kept for the summary (all are counted).
MAX_RECORDED_ERRORS = 100


_MESSAGE_ID = itemgetter(1)


def _one_by_one(
    batch: list[tuple[Frame | list[Message], Verdict]],
) -> Iterator[tuple[Frame, Verdict]]:
    """Runs opened up into their MESSAGEs, each ACCEPTED (the core accepted the run whole)."""
    for frame, outcome in batch:
        if type(frame) is list:
            for message in frame:
                yield message, ACCEPTED
        else:
            yield frame, outcome


class Consumer(Protocol):
    async def deliver(self, stream_id: int, message: Message) -> None: ...


@dataclass
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = 7100
    version: str = SOURCE_VERSION
    cookie: bytes = b""
    credits: int = 100
    #: Send a refill ACK when the connector's remaining credits fall to this; None = half.
    refill_at: int | None = None
    #: The shipped worker never refuses a frame for want of credit; ``False`` follows the spec.
    lenient_credits: bool = True
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    checkpoint_every: int = 10_000
    checkpoint_ms: float = 1000.0
    restart_after: int = 0
    #: None: the spec's empty RESTART; a string: the shipped form carrying it.
    restart_address: str | None = None
    reject_streams: Callable[[int, Text], bool] | None = None
    ack_delay_ms: float = 0.0
    drop_connection_after: int = 0
    #: How many connections drop_connection_after drops (0: every one).
    drop_times: int = 0
    idle_timeout: float = 0.0
    write_timeout: float = 30.0
    #: Distinct streams one connection may NOTIFY: what a connector can make the worker keep.
    max_streams: int = 100_000
    handshake_timeout: float = 10.0
    max_connections: int = 64
    record: str | Path | None = None

    def __post_init__(self) -> None:
        if self.credits < 1 or self.credits > 0xFFFF_FFFF:
            raise ValueError("credits must be between 1 and 4294967295")
        if self.refill_at is None:
            self.refill_at = self.credits // 2
        if not 0 <= self.refill_at < self.credits:
            raise ValueError("refill-at must be at least 0 and below the credits")
        if self.max_connections < 1:
            raise ValueError("max-connections must be at least 1")

    def faults_not_fired(self, summary: dict[str, Any]) -> list[str]:
        """The faults asked for that no connection reached, each as a line naming its option: the
        run did not test what it was asked to."""
        notes = []
        faults = (("restart_after", "restarts_sent"), ("drop_connection_after", "dropped_connections"))
        for option, fired in faults:
            after = getattr(self, option)
            if after and not summary[fired]:
                notes.append(
                    f"--{option.replace('_', '-')} {after} never fired: no connection delivered "
                    f"{after:,} messages ({summary['messages']:,} delivered in all)"
                )
        return notes


def stream_rejecter(specs: Iterable[str]) -> Callable[[int, Text], bool] | None:
    """``--reject-streams`` values: comma-separated stream ids, or a regex searched in the name."""
    ids: set[int] = set()
    patterns: list[re.Pattern] = []
    for spec in specs:
        if re.fullmatch(r"\s*\d+(\s*,\s*\d+)*\s*", spec):
            ids.update(int(part) for part in spec.split(","))
        else:
            try:
                patterns.append(re.compile(spec))
            except re.error as err:
                raise ValueError(
                    f"--reject-streams {spec!r} is neither stream ids nor a regex: {err}"
                ) from err
    if not ids and not patterns:
        return None

    def reject(stream_id: int, name: Text) -> bool:
        return stream_id in ids or any(p.search(show_text(name)) for p in patterns)

    return reject


def _text_field(raw: bytes) -> tuple[str, str]:
    """(json field suffix, json value): UTF-8 text as a string, anything else base64."""
    try:
        return "", encode_basestring_ascii(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "_base64", '"' + base64.b64encode(raw).decode("ascii") + '"'


def message_json(stream_id: int, message: Message) -> str:
    """One ``--out`` line: key and payload as text when valid UTF-8, else ``*_base64`` fields."""
    if message.key:
        key_suffix, key = _text_field(message.key)
    else:
        key_suffix, key = "", "null"
    payload_suffix, payload = _text_field(message.payload)
    return (
        f'{{"stream_id":{stream_id},"message_id":{message.message_id},"event_time":{message.event_time},'
        f'"key{key_suffix}":{key},"payload{payload_suffix}":{payload}}}\n'
    )


class JsonLinesOut:
    """The ``--out`` consumer: one JSON line per delivered message.

    Lines collect in memory up to ``buffer_limit`` bytes and are written by the
    I/O thread while the delivering connection waits, so a slow disk stops the
    worker reading its sockets rather than growing the buffer. ``sync`` (at each
    checkpoint) writes and fsyncs, so a checkpointed message is on disk.

    ``resume_at`` reopens a file a killed worker left: it is cut back to the length
    its last checkpoint recorded (``mark``), so lines delivered after that
    checkpoint, which connectors will send again, are not written twice.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        resume_at: int | None = None,
        buffer_limit: int = 1 << 20,
        executor=None,
    ) -> None:
        self.path = Path(path)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed by aclose()
        # A pipe or FIFO (``--out /dev/stdout``, a reader process) has nothing to fsync or cut back.
        self._regular = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        self._resolved = str(self.path.resolve())
        #: Bytes handed to the file so far (a regular file: its length).
        self._written = 0
        if self._regular:
            keep = resume_at or 0
            size = os.fstat(self._file.fileno()).st_size
            if size < keep:
                self._file.close()
                raise OSError(
                    f"--out {self.path} holds {size} bytes, but the --state checkpoint says {keep} were "
                    "written: it is not the file this worker wrote"
                )
            self._file.truncate(keep)
            self._written = keep
        self._lines: list[str] = []
        self._size = 0
        self.buffer_limit = buffer_limit
        self._lock = asyncio.Lock()
        self._executor = executor
        self.lines = 0

    async def deliver(self, stream_id: int, message: Message) -> None:
        line = message_json(stream_id, message)
        self._lines.append(line)
        self._size += len(line)
        self.lines += 1
        if self._size >= self.buffer_limit:
            await self._write()

    def take_many(self, stream_id: int, messages: list[Message]) -> None:
        """A run's lines into the buffer, with no wait; ``flush`` then holds the connection back."""
        lines = [message_json(stream_id, m) for m in messages]
        self._lines += lines
        self._size += sum(map(len, lines))
        self.lines += len(lines)

    async def flush(self) -> None:
        """Write the buffer out once it reached its limit (back-pressure on the delivering connection)."""
        if self._size >= self.buffer_limit:
            await self._write()

    async def _write(self) -> None:
        async with self._lock:
            if not self._lines:
                return
            data = "".join(self._lines).encode("ascii")
            self._lines.clear()
            self._size = 0
            self._written += len(data)
            await asyncio.get_running_loop().run_in_executor(self._executor, self._file.write, data)

    def _fsync(self) -> None:
        self._file.flush()
        if self._regular:
            os.fsync(self._file.fileno())

    def mark(self) -> dict | None:
        """The file's length with every line delivered so far, which a checkpoint records
        (None for a pipe, which cannot be cut back)."""
        return {"path": self._resolved, "bytes": self._written + self._size} if self._regular else None

    async def sync(self) -> None:
        await self._write()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._fsync)

    async def aclose(self) -> None:
        await self.sync()
        self._file.close()


def _run_calls(consumers: Sequence[Consumer]) -> tuple[list, list] | None:
    """(take_many, flush) of every consumer when all of them take runs, else None."""
    if not all(hasattr(c, "take_many") and hasattr(c, "flush") for c in consumers):
        return None
    return [c.take_many for c in consumers], [c.flush for c in consumers]


@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    connections: int = 0
    refused_connections: int = 0
    handshakes_failed: int = 0
    frames: int = 0
    messages: int = 0
    replays: int = 0
    notifies: int = 0
    notify_refused: int = 0
    eos: int = 0
    acks_sent: int = 0
    restarts_sent: int = 0
    dropped_connections: int = 0
    timeouts: int = 0
    violations: int = 0
    #: Frames connectors sent with no credit left (counted, not refused, unless strict).
    credit_overdraft: int = 0
    checkpoints: int = 0
    #: The last MAX_RECORDED_ERRORS ERRORs sent: {"connection", "peer", "kind", "reason"}.
    errors: deque = field(default_factory=lambda: deque(maxlen=MAX_RECORDED_ERRORS))
    #: The last MAX_RECORDED_ERRORS ERRORs connectors sent us: {"connection", "peer", "reason"}.
    errors_received: deque = field(default_factory=lambda: deque(maxlen=MAX_RECORDED_ERRORS))
    #: From reading a MESSAGE's bytes off the socket to its delivery to every consumer, per message.
    delivery_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    #: From a checkpoint's snapshot to the ACK that reports it leaving, per ACK.
    ack_latency: LatencyHistogram = field(default_factory=LatencyHistogram)


#: Seconds before a failed checkpoint (disk, sink abort vote) is tried again.
CHECKPOINT_RETRY_S = 0.2


class _Stop(Exception):
    """This connection is over (ERROR sent, RESTART sent, or dropped on purpose)."""


class WorkerConnection:
    """One connector connection: the handler loop, its replies and its ACK sender."""

    def __init__(self, worker: MockWorker, conn_id: int, framed: FramedConnection) -> None:
        self.worker = worker
        self.id = conn_id
        self.framed = framed
        self.machine = framed.machine
        self.peer = framed.peer
        self.hello: Hello | None = None
        self.started = time.monotonic()
        self.messages = 0
        self.replays = 0
        #: A rule break planted for fuzz's tests only (``tests/test_fuzz_wallaroo.py``), never set otherwise.
        self._plant = os.environ.get("WALLAROO_PROTO_PLANT")
        self.frames = 0
        self.state = "handshake"
        self._ack_wanted = asyncio.Event()
        self._refill = False
        self._report: set[int] = set()
        #: Streams ended by EOS_MESSAGE whose final ACK waits for a checkpoint covering them.
        self._eos_pending: set[int] = set()
        #: Distinct streams this connection has NOTIFYed, held to ``max_streams``.
        self._notified: set[int] = set()
        self._ack_task: asyncio.Task | None = None
        #: When the oldest checkpoint whose news waits in ``_report`` began.
        self._report_since: float | None = None

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        cfg = self.worker.config
        deadline = time.monotonic() + cfg.handshake_timeout if cfg.handshake_timeout > 0 else None
        framed = self.framed
        try:
            while True:
                pending_error: ProtocolError | None = None
                try:
                    if self.hello is None and deadline is not None:
                        async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                            batch = await framed.receive_runs()
                    elif cfg.idle_timeout > 0:
                        async with asyncio.timeout(cfg.idle_timeout):
                            batch = await framed.receive_runs()
                    else:
                        batch = await framed.receive_runs()
                except TimeoutError:
                    self.worker.stats.timeouts += 1
                    if self.hello is None:
                        reason = f"handshake timeout: no HELLO within {cfg.handshake_timeout:g}s"
                    else:
                        reason = f"idle timeout: nothing received for {cfg.idle_timeout:g}s"
                    await self._fail("timeout", reason)
                except ProtocolError as err:
                    # Frames before the bad bytes still count, in order; then the ERROR.
                    feed = self.machine.feed
                    batch = [(f, feed(Side.CONNECTOR, f)) for f in err.decoded]
                    pending_error = err
                delivered = self.messages
                await self._handle(batch)
                self.worker.stats.delivery_latency.add(
                    time.monotonic() - framed.read_at, self.messages - delivered
                )
                if pending_error is not None:
                    await self._fail("bad frame", describe_protocol_error(pending_error))
                credits = self.machine.credits
                if not self._refill and credits is not None and credits <= cfg.refill_at:
                    self._refill = True
                    self._ack_wanted.set()
                await framed.drain()
        except ConnectionClosed:
            self.state = "closed by peer"
        except _Stop:
            pass
        except (ConnectionError, OSError):
            self.state = "reset"
        finally:
            if self._ack_task is not None:
                self._ack_task.cancel()
            self.worker.stats.credit_overdraft += self.machine.overdraft
            self.worker.registry.release_all(self)
            await framed.close()  # waits for the peer to take what we sent, or for its stall
            if framed.stalled is not None:  # whichever path (ERROR, ACK, reply) was waiting on it
                self.state = "stalled"
                self.worker.stats.timeouts += 1
                self.worker.note_error(self, "stalled", framed.stalled)

    async def _handle(self, batch: list[tuple[Frame | list[Message], Verdict]]) -> None:
        worker = self.worker
        stats = worker.stats
        registry_streams = worker.registry.streams
        registry_dirty = worker.registry.dirty
        consumers = worker.consumer_calls
        cfg = worker.config
        checkpoint_every = cfg.checkpoint_every or float("inf")
        frames = len(batch)
        runs = [frame for frame, _ in batch if type(frame) is list]
        if runs:
            frames += sum(map(len, runs)) - len(runs)
            if worker.run_consumers is None or cfg.restart_after or cfg.drop_connection_after:
                # Message by message: a consumer that takes one at a time, or a fault counted in messages.
                batch = list(_one_by_one(batch))
        self.frames += frames
        stats.frames += frames
        for frame, outcome in batch:
            if type(frame) is list:
                await self._deliver_run(frame)
                continue
            verdict = outcome.kind
            if verdict is _ACCEPTED:
                if type(frame) is Message:
                    stream_id = frame.stream_id
                    entry = registry_streams[stream_id]
                    if frame.message_id <= entry.last_seen:
                        entry.replays += 1
                        self.replays += 1
                        stats.replays += 1
                        continue
                    try:
                        for deliver in consumers:
                            await deliver(stream_id, frame)
                    except Exception as err:  # a consumer (file, sink) failed: this worker cannot go on
                        await self._fail(
                            "delivery",
                            f"worker cannot deliver message {frame.message_id} of stream {stream_id}: {err}",
                        )
                    entry.last_seen = frame.message_id
                    entry.delivered += 1
                    registry_dirty.add(stream_id)
                    self.messages += 1
                    stats.messages += 1
                    worker.since_checkpoint += 1
                    if worker.since_checkpoint >= checkpoint_every:
                        worker.checkpoint_soon()
                    if cfg.restart_after and self.messages >= cfg.restart_after:
                        await self._restart()
                    if (
                        cfg.drop_connection_after
                        and self.messages >= cfg.drop_connection_after
                        and (not cfg.drop_times or stats.dropped_connections < cfg.drop_times)
                    ):
                        self._drop()
                else:
                    await self._control(frame)
            elif verdict is _REPLAYED:
                self.replays += 1
                stats.replays += 1
                entry = registry_streams.get(frame.stream_id)
                if entry is not None:
                    entry.replays += 1
            elif verdict is _VIOLATION:
                if self._plant == "worker-takes-connector-ack" and type(frame) is Ack:
                    continue  # planted: an ACK from the connector passed over, not refused
                stats.violations += 1
                await self._fail("violation", outcome.reason)
            # IGNORED cannot happen: this side stops reading once it sent ERROR or RESTART.

    async def _deliver_run(self, run: list[Message]) -> None:
        """A run of MESSAGEs on one stream the core accepted whole: de-duplicated against the
        registry, handed to the consumers and counted as one step.

        The consumers' ``take_many`` is synchronous and their back-pressure (``flush``) is
        awaited after the registry counts the run, so a checkpoint taken meanwhile finds the
        run in both the registry and the consumers' marks, or in neither.
        """
        worker = self.worker
        stats = worker.stats
        stream_id = run[0][0]
        entry = worker.registry.streams[stream_id]
        if run[0][1] <= entry.last_seen:
            replays = bisect_right(run, entry.last_seen, key=_MESSAGE_ID)
            entry.replays += replays
            self.replays += replays
            stats.replays += replays
            run = run[replays:]
            if not run:
                return
        takes, flushes = worker.run_consumers
        try:
            for take in takes:
                take(stream_id, run)
        except Exception as err:
            await self._fail(
                "delivery",
                f"worker cannot deliver messages {run[0][1]} to {run[-1][1]} of stream {stream_id}: {err}",
            )
        n = len(run)
        entry.last_seen = run[-1][1]
        entry.delivered += n
        worker.registry.dirty.add(stream_id)
        self.messages += n
        stats.messages += n
        worker.since_checkpoint += n
        if worker.since_checkpoint >= (worker.config.checkpoint_every or float("inf")):
            worker.checkpoint_soon()
        try:
            for flush in flushes:
                await flush()
        except Exception as err:  # the file cannot take them: this worker cannot go on
            await self._fail(
                "delivery",
                f"worker cannot deliver messages {run[0][1]} to {run[-1][1]} of stream {stream_id}: {err}",
            )

    async def _control(self, frame: Frame) -> None:
        kind = type(frame)
        worker = self.worker
        cfg = worker.config
        if kind is Hello:
            self.hello = frame
            reason = check_hello(frame, version=cfg.version, cookie=cfg.cookie)
            if reason is not None:
                worker.stats.handshakes_failed += 1
                await self._fail("handshake", reason)
            self.framed.write([Ok(cfg.credits)])
            self.state = "streaming"
            self._ack_task = asyncio.create_task(self._ack_loop(), name=f"acks-{self.id}")
        elif kind is Notify:
            worker.stats.notifies += 1
            if frame.stream_id not in self._notified:
                if len(self._notified) >= cfg.max_streams:
                    await self._fail("limit", f"too many streams on one connection (limit {cfg.max_streams})")
                self._notified.add(frame.stream_id)
            if cfg.reject_streams is not None and cfg.reject_streams(frame.stream_id, frame.stream_name):
                entry = worker.registry.streams.get(frame.stream_id)
                por = entry.point_of_ref if entry is not None else frame.point_of_ref
                worker.stats.notify_refused += 1
                self.framed.write([NotifyAck(False, frame.stream_id, por)])
                return
            claim = worker.registry.notify(frame.stream_id, frame.stream_name, self, frame.point_of_ref)
            if not claim.success:
                worker.stats.notify_refused += 1
            self.framed.write([NotifyAck(claim.success, frame.stream_id, claim.point_of_ref)])
        elif kind is Error:
            # The connector gave up (spec: "so the problem may be logged within Wallaroo").
            reason = show_text(frame.reason)
            worker.stats.errors_received.append({"connection": self.id, "peer": self.peer, "reason": reason})
            self.state = f"ERROR from connector: {reason}"
            raise _Stop
        elif kind is EosMessage:
            worker.stats.eos += 1
            # The final ACK must report a durable point: it goes out, and the stream is
            # released, from ``report`` once a checkpoint covering the stream succeeded.
            self._eos_pending.add(frame.stream_id)
            try:
                await worker.checkpoint()
            except Exception as err:  # disk or sink, perhaps passing: retried shortly
                worker.note_checkpoint_failure(err)

    # --- outgoing ---------------------------------------------------------------------

    def settle_eos(self) -> None:
        """After a checkpoint: send the final ACK of every ended stream it fully covers.

        A checkpoint that was under way when the EOS arrived may cover only part of
        the stream; its ACK is then not the final one, and the stream stays held.
        """
        streams = self.worker.registry.streams
        for stream_id in list(self._eos_pending):
            entry = streams[stream_id]
            if entry.point_of_ref >= entry.last_seen:
                self._eos_pending.discard(stream_id)
                self.worker.registry.release(stream_id, self)
                self.report(stream_id)

    def report(self, stream_id: int, since: float | None = None) -> None:
        """A checkpoint (begun at ``since``, monotonic) advanced this stream: tell the connector
        in the next ACK."""
        self._report.add(stream_id)
        if since is not None and (self._report_since is None or since < self._report_since):
            self._report_since = since
        self._ack_wanted.set()

    async def _ack_loop(self) -> None:
        """Sends ACKs: credit refills and checkpointed points of reference, coalesced.

        One task per connection, so a connector that does not read blocks only
        this task in drain() while newer news replaces older in ``_report``.
        """
        cfg = self.worker.config
        registry = self.worker.registry.streams
        while True:
            await self._ack_wanted.wait()
            if cfg.ack_delay_ms > 0:
                await asyncio.sleep(cfg.ack_delay_ms / 1000)
            self._ack_wanted.clear()
            credits = 0
            if self._refill:
                credits = max(cfg.credits - (self.machine.credits or 0), 0)
                self._refill = False
            pairs = tuple(
                (sid, registry[sid].point_of_ref) for sid in sorted(self._report) if sid in registry
            )
            self._report.clear()
            since, self._report_since = self._report_since, None
            if credits == 0 and not pairs:
                continue
            try:
                self.framed.write([Ack(credits, pairs)])
                self.worker.stats.acks_sent += 1
                if pairs and since is not None:
                    self.worker.stats.ack_latency.add(time.monotonic() - since)
                await self.framed.drain()  # bounded: the connection's watchdog aborts a stalled peer
            except (OwnViolation, ConnectionError, OSError):
                return  # the connection already ended (ERROR, RESTART, stalled or lost)

    async def _fail(self, kind: str, reason: str) -> None:
        self.worker.note_error(self, kind, reason)
        self.state = f"error: {reason}"
        if self._ack_task is not None:
            self._ack_task.cancel()
        with contextlib.suppress(ConnectionError, OSError):
            self.framed.write([Error(reason)], check=False)
        raise _Stop  # run() releases the streams, then close() waits for the peer to take the ERROR

    async def _restart(self) -> None:
        cfg = self.worker.config
        if self._ack_task is not None:
            self._ack_task.cancel()
        self.worker.stats.restarts_sent += 1
        self.state = "restarted"
        with contextlib.suppress(ConnectionError, OSError):
            await self.framed.send(Restart(cfg.restart_address))
        raise _Stop

    def _drop(self) -> None:
        self.worker.stats.dropped_connections += 1
        self.state = "dropped"
        if self.framed.recording is not None:
            self.framed.recording.reset(from_client=False)
        self.framed.writer.transport.abort()
        raise _Stop

    def snapshot(self) -> dict[str, Any]:
        hello = self.hello
        return {
            "connection": self.id,
            "peer": self.peer,
            "program": show_text(hello.program_name) if hello else "",
            "instance": show_text(hello.instance_name) if hello else "",
            "state": self.state,
            "credits": self.machine.credits,
            "frames": self.frames,
            "messages": self.messages,
            "replays": self.replays,
            "streams": self.worker.registry.held_by(self),
            "seconds": round(time.monotonic() - self.started, 3),
        }


class MockWorker:
    """The server: accepts connectors, shares one registry, checkpoints, records."""

    def __init__(
        self,
        config: WorkerConfig,
        registry: Registry | None = None,
        consumers: Sequence[Consumer] = (),
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else Registry()
        self.consumers = list(consumers)
        self.consumer_calls = [c.deliver for c in self.consumers]
        self.run_consumers = _run_calls(self.consumers)
        self.sink: SinkForwarder | None = None
        #: The ``--out`` file, whose checkpointed length the state file records.
        self.out: JsonLinesOut | None = None
        #: Why the worker cannot go on (the sink gave up), and who to tell.
        self.fatal: str | None = None
        self.on_fatal: Callable[[], None] = lambda: None
        self.stats = Stats()
        self.connections: dict[int, WorkerConnection] = {}
        self.address: tuple[str, int] | None = None
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self._checkpoint_lock = asyncio.Lock()
        self._checkpoint_due = asyncio.Event()
        self.since_checkpoint = 0
        self._checkpoint_task: asyncio.Task | None = None
        # One I/O thread: state writes and fsyncs happen in the order they were asked for.
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mock-worker-io")
        self._pcap: PcapWriter | None = PcapWriter(config.record) if config.record else None

    def set_sink(self, forwarder: SinkForwarder) -> None:
        """Forward delivered messages to a connector sink, committed with each checkpoint."""
        self.sink = forwarder
        forwarder.request_checkpoint = self.checkpoint_soon
        forwarder.on_fatal = self._sink_failed
        self.add_consumer(forwarder)

    def add_consumer(self, consumer: Consumer) -> None:
        """Add a consumer before ``start``: its ``deliver`` sees every delivered message, in order.

        The sink forwarder stays last: a delivery is then complete at the sink only after
        every other consumer took it, which the checkpoint's snapshot relies on.
        """
        if isinstance(consumer, JsonLinesOut):
            self.out = consumer
        at = len(self.consumers) - 1 if self.sink is not None and consumer is not self.sink else None
        if at is None:
            self.consumers.append(consumer)
        else:
            self.consumers.insert(at, consumer)
        self.consumer_calls = [c.deliver for c in self.consumers]
        self.run_consumers = _run_calls(self.consumers)

    def _sink_failed(self, err: BaseException) -> None:
        """The sink is gone for good: stop, and say why (the CLI exits 1)."""
        self.fatal = f"sink: {err}"
        self.stats.errors.append({"connection": None, "peer": None, "kind": "sink", "reason": str(err)})
        self.on_fatal()

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Bind and listen; returns the (host, port) actually bound."""
        quiet_accept_errors("mock-worker")
        self._server = await asyncio.start_server(self._accept, self.config.host, self.config.port)
        sockname = self._server.sockets[0].getsockname()
        self.address = (sockname[0], sockname[1])
        self._checkpoint_task = asyncio.create_task(self._checkpoint_loop(), name="checkpoints")
        if self.sink is not None:
            self.sink.start()
        return self.address

    async def close(self) -> None:
        """Stop accepting, end every connection, take a last checkpoint, flush everything."""
        if self._server is not None:
            self._server.close()
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoint_task
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        try:
            await self.checkpoint()
        except Exception as err:
            self.note_checkpoint_failure(err)
        for consumer in self.consumers:
            aclose = getattr(consumer, "aclose", None)
            if aclose is not None:
                await aclose()
        if self._pcap is not None:
            self._pcap.close()
        self.io.shutdown(wait=True)

    # --- connections ---------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The connection runs in a task of its own that ``close`` may cancel: Python 3.11's
        # start_server callback logs a cancelled callback task as an error, so keep this one clean.
        task = asyncio.create_task(self._serve(reader, writer))
        self._handlers.add(task)
        try:
            await task
        except asyncio.CancelledError:
            pass
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cfg = self.config
        recording = self._record_session(writer)
        framed = FramedConnection(
            reader,
            writer,
            use=Use.SOURCE,
            our_side=Side.WORKER,
            max_frame_size=cfg.max_frame_size,
            lenient_credits=cfg.lenient_credits,
            recording=recording,
            write_timeout=cfg.write_timeout or None,
        )
        conn_id = next(self._ids)
        try:
            if len(self.connections) >= cfg.max_connections:
                self.stats.refused_connections += 1
                self.stats.errors.append(
                    {
                        "connection": conn_id,
                        "peer": framed.peer,
                        "kind": "refused",
                        "reason": "too many connections",
                    }
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await framed.fail("too many connections")
                return
            self.stats.connections += 1
            conn = WorkerConnection(self, conn_id, framed)
            self.connections[conn_id] = conn
            try:
                await conn.run()
            finally:
                del self.connections[conn_id]
        finally:
            if not writer.is_closing():
                writer.close()

    def _record_session(self, writer: asyncio.StreamWriter) -> TcpSession | None:
        if self._pcap is None:
            return None
        peer = writer.get_extra_info("peername")
        local = writer.get_extra_info("sockname")
        try:
            return self._pcap.tcp_session((peer[0], peer[1]), (local[0], local[1]))
        except ValueError:
            return None  # not IPv4: the pcap writer synthesises IPv4 only

    def note_error(self, conn: WorkerConnection, kind: str, reason: str) -> None:
        self.stats.errors.append({"connection": conn.id, "peer": conn.peer, "kind": kind, "reason": reason})

    # --- checkpoints -------------------------------------------------------------------------

    def checkpoint_soon(self) -> None:
        """Ask the checkpoint task for a checkpoint (``--checkpoint-every`` messages were delivered)."""
        self.since_checkpoint = 0
        self._checkpoint_due.set()

    async def _checkpoint_loop(self) -> None:
        interval = self.config.checkpoint_ms / 1000 if self.config.checkpoint_ms > 0 else None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._checkpoint_due.wait()
            self._checkpoint_due.clear()
            try:
                await self.checkpoint()
            except Exception as err:  # a disk or sink failure: this checkpoint did not happen
                self.note_checkpoint_failure(err)

    def note_checkpoint_failure(self, err: Exception) -> None:
        """A checkpoint that did not happen (disk, sink abort): its deliveries stay dirty; retry soon."""
        self.stats.errors.append({"connection": None, "peer": None, "kind": "checkpoint", "reason": str(err)})
        if self.fatal is None:
            asyncio.get_running_loop().call_later(CHECKPOINT_RETRY_S, self.checkpoint_soon)

    async def checkpoint(self) -> dict[int, int]:
        """Make the deliveries so far durable, then ACK the advanced points of reference.

        Order: snapshot the registry, sync every consumer, write the state file,
        commit, and only then tell the owning connections.
        """
        async with self._checkpoint_lock:
            began = time.monotonic()
            snapshot = self.registry.advanced()
            out_mark = self.out.mark() if self.out is not None else None
            self.since_checkpoint = 0
            if not snapshot:
                self._settle_eos()
                return snapshot
            # No await since the snapshot. The sink holds back what comes after its mark until
            # this round is decided, so it is taken only for a round that follows.
            sink_mark = self.sink.mark() if self.sink is not None else 0
            loop = asyncio.get_running_loop()

            async def write_state(sink_position: dict | None = None) -> None:
                if self.registry.path is not None:
                    data = self.registry.state_bytes(snapshot, sink=sink_position, out=out_mark)
                    await loop.run_in_executor(self.io, write_atomic, self.registry.path, data)
                if sink_position is not None:
                    self.registry.sink = sink_position
                self.registry.out = out_mark

            try:
                for consumer in self.consumers:
                    sync = getattr(consumer, "sync", None)
                    if sync is not None and consumer is not self.sink:
                        await sync()
                if self.sink is not None:
                    # The state is written between the sink's commit vote and PHASE2.
                    await self.sink.commit(sink_mark, write_state)
                else:
                    await write_state()
            except BaseException:
                self.registry.dirty.update(snapshot)  # not durable: retry at the next checkpoint
                raise
            if self._pcap is not None:
                self._pcap.flush()
            self.registry.commit(snapshot)
            self.stats.checkpoints += 1
            streams = self.registry.streams
            for stream_id in snapshot:
                owner = streams[stream_id].owner
                if owner is not None:
                    owner.report(stream_id, began)
            self._settle_eos()
            return snapshot

    def _settle_eos(self) -> None:
        for conn in list(self.connections.values()):
            conn.settle_eos()

    # --- reporting -----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        s = self.stats
        elapsed = max(time.monotonic() - s.started, 1e-9)
        return {
            "address": f"{self.address[0]}:{self.address[1]}" if self.address else None,
            "seconds": round(elapsed, 3),
            "connections": s.connections,
            "refused_connections": s.refused_connections,
            "handshakes_failed": s.handshakes_failed,
            "frames": s.frames,
            "messages": s.messages,
            "messages_per_second": round(s.messages / elapsed, 1),
            "replays_dropped": s.replays,
            "notifies": s.notifies,
            "notify_refused": s.notify_refused,
            "eos": s.eos,
            "acks_sent": s.acks_sent,
            "checkpoints": s.checkpoints,
            "restarts_sent": s.restarts_sent,
            "dropped_connections": s.dropped_connections,
            "timeouts": s.timeouts,
            "violations": s.violations,
            "credit_overdraft": s.credit_overdraft,
            "errors": list(s.errors),
            "errors_received": list(s.errors_received),
            "latency": {
                "arrival_to_delivery": s.delivery_latency.summary(),
                "checkpoint_to_ack": s.ack_latency.summary(),
            },
            "fatal": self.fatal,
            "streams": [
                {
                    "stream_id": e.stream_id,
                    "name": show_text(e.name),
                    "delivered": e.delivered,
                    "replays": e.replays,
                    "last_seen": e.last_seen if e.last_seen >= 0 else None,
                    "point_of_ref": e.point_of_ref,
                    "held_by": e.owner.id if e.owner is not None else None,
                }
                for e in sorted(self.registry.streams.values(), key=lambda e: e.stream_id)
            ],
        }

    def live(self) -> dict[str, Any]:
        """A cheap view for the live display: connections and counters."""
        return {
            "connections": [c.snapshot() for c in list(self.connections.values())],
            "messages": self.stats.messages,
            "replays": self.stats.replays,
            "checkpoints": self.stats.checkpoints,
            "violations": self.stats.violations,
            "streams": len(self.registry.streams),
        }
