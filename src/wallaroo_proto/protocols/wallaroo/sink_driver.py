"""The worker's side of the sink protocol: drive a connector sink through 2PC as Wallaroo does.

``SinkDriver`` connects and sends HELLO, NOTIFY(stream 1) and LIST_UNCOMMITTED
without waiting; settles every listed txn with PHASE2 before new data; sends
output as stream-1 MESSAGEs whose ids are byte offsets; and runs a round every
N messages or M milliseconds: PHASE1 over [last committed, sent), REPLY (a
timeout counts as an abort vote), PHASE2. On abort it rolls back and re-sends
from the last committed offset; on a lost connection it reconnects with
back-off and starts over from the handshake. It never waits for anything
after PHASE2, so a sink that answers like the shipped test sink (nothing) works.

Payloads wait in a bounded buffer until committed (``put`` blocks when full),
which is what makes re-sending after an abort or a crash possible.

For end-to-end exactly-once a worker ties the sink's commits to its own checkpoints:
``auto_checkpoint=False``; ``mark()`` with its snapshot, then ``checkpoint(mark)`` runs a
round ending exactly there; ``on_commit_vote(txn, end)`` writes the worker's checkpoint
between the commit vote and PHASE2; after a restart ``start_offset`` and ``resolve_listed`` (was this txn
in my last checkpoint?) resume it. A sink that has more committed than we do is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from wallaroo_proto.durable import write_atomic
from wallaroo_proto.input_spec import GENERATED, STDIN, generated_lines, open_input
from wallaroo_proto.judge import Kind
from wallaroo_proto.pcap_writer import PcapWriter

from .errors import ProtocolError
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SINK_VERSION,
    Error,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Text,
    show_text,
)
from .peer import FramedConnection, describe_protocol_error
from .protocol import Side, Use
from .registry import Registry, StateError
from .twopc import SINK_DATA_STREAM, ListUncommitted, Phase1, Phase2, Reply, ReplyUncommitted, twopc_frame

#: How many recent txn decisions are kept to settle a REPLY_UNCOMMITTED after a reconnect.
KEEP_DECISIONS = 64


class SinkRefused(Exception):
    """The sink refused the handshake (an ERROR before its OK: cookie, version, an instance
    name in use) or disagrees about what is committed: retrying cannot help."""


class SinkUnavailable(Exception):
    """No successful handshake for ``give_up_after`` seconds (``first_contact_within`` before the
    first one); ``reached`` tells whether the sink was ever reached."""

    def __init__(self, message: str, reached: bool = True) -> None:
        super().__init__(message)
        self.reached = reached


class _CannotConnect(Exception):
    """The TCP connection to the sink could not be made."""


class _Lost(Exception):
    """This connection is over; reconnect."""


@dataclass(slots=True)
class DriverStats:
    messages_put: int = 0
    bytes_put: int = 0
    messages_sent: int = 0
    committed_messages: int = 0
    committed_bytes: int = 0
    rounds: int = 0
    commits: int = 0
    aborts: int = 0
    timeouts: int = 0
    settled: int = 0
    connections: int = 0
    reconnects: int = 0
    last_problem: str = ""
    #: Seconds from sending PHASE1 to its REPLY (recent rounds only).
    phase1_latencies: deque = field(default_factory=lambda: deque(maxlen=100_000))

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "phase1_latencies"}
        lat = sorted(self.phase1_latencies)
        if lat:
            out["phase1_reply_p50_ms"] = round(lat[len(lat) // 2] * 1000, 3)
            out["phase1_reply_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3)
        return out


class SinkDriver:
    """Drives one sink connection (reconnecting as needed) from payloads given to ``put``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        checkpoint_every_messages: int = 1000,
        checkpoint_every_ms: float = 1000.0,
        reply_timeout: float = 5.0,
        instance_name: Text = "mock-worker",
        cookie: bytes = b"",
        record: str | None = None,
        program_name: Text = "wallaroo-proto",
        stream_name: Text = "mock-sink-output",
        version: Text = SINK_VERSION,
        max_buffer_messages: int | None = None,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        connect_timeout: float = 5.0,
        give_up_after: float = 60.0,
        first_contact_within: float | None = None,
        first_checkpoint_id: int = 1,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        log: Callable[[str], None] | None = None,
        auto_checkpoint: bool = True,
        on_commit_vote: Callable[[Text, int], Awaitable[None]] | None = None,
        resolve_listed: Callable[[Text], bool] | None = None,
        start_offset: int = 0,
    ) -> None:
        if checkpoint_every_messages < 1 or checkpoint_every_ms <= 0 or reply_timeout <= 0:
            raise ValueError("checkpoint intervals and reply_timeout must be positive")
        self.host, self.port = host, port
        self.every_n = checkpoint_every_messages
        self.every_s = checkpoint_every_ms / 1000
        self.reply_timeout = reply_timeout
        self.instance_name = instance_name
        self.cookie = cookie
        self.record = record
        self.program_name = program_name
        self.stream_name = stream_name
        self.version = version
        self.max_buffer_messages = max_buffer_messages or max(2 * checkpoint_every_messages, 64)
        self.max_buffer_bytes = max_buffer_bytes
        self.connect_timeout = connect_timeout
        self.give_up_after = give_up_after
        #: Seconds a sink never reached is tried for (a typo in its address should not wait long).
        self.first_contact_within = give_up_after if first_contact_within is None else first_contact_within
        self._reached = False
        self.max_frame_size = max_frame_size
        self.log = log or (lambda line: None)
        self.auto_checkpoint = auto_checkpoint
        self.on_commit_vote = on_commit_vote
        self.resolve_listed = resolve_listed
        self.stats = DriverStats()
        #: Bytes [0, committed) are committed at the sink by our decision.
        self.committed = start_offset
        self._buf: deque[bytes] = deque()  # payloads from offset ``committed`` on
        self._buf_bytes = 0
        self._sent = 0  # entries of _buf sent on the current connection since the last decided round
        self._sent_end = start_offset
        self._requests: list[tuple[int, asyncio.Future]] = []  # checkpoint(): (end offset, future)
        self._fence: int | None = None  # mark(): nothing past it is sent until its round is decided
        self._cid = first_checkpoint_id
        self._rtag = 0
        self._decisions: OrderedDict[Text, bool] = OrderedDict()
        self._closing = False
        self._handshook = False
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._finished = asyncio.Event()
        self._fatal: BaseException | None = None
        self._lost: str | None = None
        self._waiters: dict[str, asyncio.Future] = {}
        self._reply_for: tuple[Text, asyncio.Future] | None = None

    # --- the application side ------------------------------------------------

    @property
    def full(self) -> bool:
        """True while ``put`` would wait: the uncommitted buffer is at its cap."""
        return self._full()

    def _full(self) -> bool:
        return bool(self._buf) and (
            len(self._buf) >= self.max_buffer_messages or self._buf_bytes >= self.max_buffer_bytes
        )

    async def put(self, payload: bytes) -> None:
        """Queue one output message; waits while the uncommitted buffer is full."""
        if self._closing:
            raise RuntimeError("put() after close()")
        while self._full():
            if self._fatal is not None:
                raise self._fatal
            self._space.clear()
            await self._space.wait()
        if self._fatal is not None:
            raise self._fatal
        self._buf.append(payload)
        self._buf_bytes += len(payload)
        self.stats.messages_put += 1
        self.stats.bytes_put += len(payload)
        self._wake.set()

    @property
    def never_reached(self) -> bool:
        """Whether the driver gave up on a sink it never reached (a wrong address, a sink not started)."""
        return isinstance(self._fatal, SinkUnavailable) and not self._fatal.reached

    async def close(self) -> None:
        """No more input: run a final round (until it commits), then close. Waits for ``run``."""
        self._closing = True
        self._wake.set()
        await self._finished.wait()
        if self._fatal is not None:
            raise self._fatal

    # --- the connection side -------------------------------------------------

    async def run(self) -> None:
        """Connect, drive 2PC until ``close()`` and everything is committed; reconnect on loss."""
        backoff = 0.05
        last_good = time.monotonic()
        writer = PcapWriter(self.record) if self.record else None
        try:
            while True:
                self._handshook = False
                try:
                    await self._session(writer)
                    return
                except SinkRefused as err:
                    self._fatal = err
                    raise
                except _CannotConnect as err:
                    problem = f"cannot connect to the sink at {self.host}:{self.port}: {err}"
                except (TimeoutError, _Lost, ConnectionError, OSError, ProtocolError) as err:
                    reason = str(err) or type(err).__name__
                    problem = f"connection to the sink at {self.host}:{self.port} lost: {reason}"
                if self._handshook:
                    backoff, last_good = 0.05, time.monotonic()
                    self._reached = True
                if problem != self.stats.last_problem:  # a line per new problem, not per attempt
                    wait = self.give_up_after if self._reached else self.first_contact_within
                    self.log(f"{problem} (retrying for up to {wait:g} s)")
                self.stats.last_problem = problem
                wait = self.give_up_after if self._reached else self.first_contact_within
                if time.monotonic() - last_good > wait:
                    self._fatal = SinkUnavailable(
                        f"{self.stats.last_problem} (no working connection for {wait:g} s)"
                        if self._reached
                        else f"{self.stats.last_problem} (tried for {wait:g} s)",
                        reached=self._reached,
                    )
                    raise self._fatal
                self.stats.reconnects += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        except BaseException as err:
            if self._fatal is None:
                self._fatal = err if isinstance(err, Exception) else RuntimeError("driver stopped")
            raise
        finally:
            self._finished.set()
            self._space.set()
            for _, future in self._requests:
                if not future.done():
                    future.set_result(False)
            if writer is not None:
                writer.close()

    async def _session(self, pcap: PcapWriter | None) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.connect_timeout
            )
        except TimeoutError:
            raise _CannotConnect(f"no answer in {self.connect_timeout:g} s") from None
        except OSError as err:
            raise _CannotConnect(os.strerror(err.errno) if err.errno else str(err)) from None
        recording = None
        if pcap is not None:
            recording = pcap.tcp_session(writer.get_extra_info("sockname"), writer.get_extra_info("peername"))
        conn = FramedConnection(
            reader,
            writer,
            use=Use.SINK,
            our_side=Side.WORKER,
            lenient_credits=True,
            recording=recording,
            we_connected=True,
            max_frame_size=self.max_frame_size,
        )
        self._lost = None
        loop = asyncio.get_running_loop()
        self._waiters = {name: loop.create_future() for name in ("ok", "notify_ack", "uncommitted")}
        self._rtag += 1
        receiver = asyncio.create_task(self._receive(conn))
        try:
            conn.write(
                [
                    Hello(self.version, self.cookie, self.program_name, self.instance_name),
                    Notify(SINK_DATA_STREAM, self.stream_name, self.committed),
                    twopc_frame(ListUncommitted(self._rtag)),
                ]
            )
            await conn.writer.drain()
            waiters = list(self._waiters.values())
            done, _ = await asyncio.wait(waiters, timeout=max(self.reply_timeout, self.connect_timeout))
            if len(done) < len(waiters):
                self._check_lost()
                raise _Lost("no OK, NOTIFY_ACK and REPLY_UNCOMMITTED in time after HELLO")
            for fut in waiters:
                fut.result()  # raises the handshake's failure, if any
            uncommitted: ReplyUncommitted = self._waiters["uncommitted"].result()
            point = self._waiters["notify_ack"].result().point_of_ref
            if point > self.committed:
                raise SinkRefused(
                    f"the sink has {point} bytes committed but this worker only {self.committed}: another "
                    "worker with this instance name, or a checkpoint older than the sink's; refusing to go on"
                )
            self._handshook = True
            self.stats.connections += 1
            self.log(f"connected; sink lists {len(uncommitted.txn_ids)} undecided txn(s), resumes at {point}")
            for txn in uncommitted.txn_ids:
                decision = self._decisions.get(txn)
                if decision is None:
                    decision = bool(self.resolve_listed(txn)) if self.resolve_listed is not None else False
                await conn.send(twopc_frame(Phase2(txn, decision)))
                self.stats.settled += 1
            self._sent, self._sent_end = 0, self.committed
            await self._stream(conn)
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await receiver
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await conn.close()

    def _check_lost(self) -> None:
        if self._lost is not None:
            raise _Lost(self._lost)

    def _lose(self, reason: str, exc: BaseException | None = None) -> None:
        if self._lost is None:
            self._lost = reason
        futures = list(self._waiters.values())
        if self._reply_for is not None:
            futures.append(self._reply_for[1])
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc or _Lost(reason))
                fut.exception()  # retrieved here: whoever awaits it still gets the exception
        self._wake.set()

    async def _receive(self, conn: FramedConnection) -> None:
        """Route what the sink sends; any end of the connection becomes ``_lose``."""
        try:
            while True:
                for frame, outcome in await conn.receive():
                    if outcome.kind is Kind.VIOLATION:
                        # A worker answers an illegal frame with ERROR, then closes; lost only
                        # then, so the session's end does not cut the ERROR short.
                        await conn.fail(f"Invalid message: {outcome.reason}")
                        self._lose(f"sink broke the protocol: {outcome.reason}")
                        return
                    self._on_frame(frame, outcome.twopc)
                    if self._lost is not None:
                        return
        except asyncio.CancelledError:
            raise
        except ProtocolError as err:
            with contextlib.suppress(Exception):
                await conn.fail(describe_protocol_error(err))
            self._lose(f"sink sent bytes that are not frames: {err}")
        except Exception as err:  # ConnectionClosed, ProtocolError, OSError
            self._lose(f"{type(err).__name__}: {err}")

    def _on_frame(self, frame, twopc) -> None:
        waiters = self._waiters
        if isinstance(frame, Error):
            # The state it arrives in decides, not its words. Before OK it answers the HELLO:
            # on a first connection the sink refuses us (fatal); on a reconnect it may still
            # hold our old session, so it is retried until --give-up. After OK the session
            # failed: reconnect.
            reason = show_text(frame.reason)
            if waiters["ok"].done():
                self._lose(f"sink sent ERROR: {reason}")
            elif self.stats.connections == 0:
                self._lose(reason, SinkRefused(f"the sink refused our HELLO: {reason}"))
            else:
                self._lose(f"the sink refused our HELLO on a reconnect: {reason}")
        elif isinstance(frame, Ok):
            if not waiters["ok"].done():
                waiters["ok"].set_result(frame)
        elif isinstance(frame, NotifyAck):
            if not frame.success:
                self._lose("the sink refused stream 1 (NOTIFY_ACK success=0)")
            elif not waiters["notify_ack"].done():
                waiters["notify_ack"].set_result(frame)
        elif isinstance(twopc, ReplyUncommitted):
            if twopc.rtag == self._rtag and not waiters["uncommitted"].done():
                waiters["uncommitted"].set_result(twopc)
        elif isinstance(twopc, Reply):
            pending = self._reply_for
            if pending is not None and pending[0] == twopc.txn_id and not pending[1].done():
                pending[1].set_result(twopc.commit)
            # else: a late REPLY (after a timeout) or a REPLY to PHASE2: nothing to do

    async def _stream(self, conn: FramedConnection) -> None:
        last_round = time.monotonic()
        auto = self.auto_checkpoint
        cap = self.every_n if auto else 1 << 62  # messages per round: rounds are ours to start
        while True:
            self._check_lost()
            buf = self._buf
            if self._sent < len(buf) and self._sent < cap:
                batch = []
                offset = self._sent_end
                limit = self._send_limit()
                while self._sent < len(buf) and self._sent < cap and len(batch) < 512:
                    payload = buf[self._sent]
                    if offset + len(payload) > limit:
                        break
                    batch.append(Message(SINK_DATA_STREAM, offset, 0, b"", payload))
                    offset += len(payload)
                    self._sent += 1
                if batch:
                    self._sent_end = offset
                    conn.write([batch])  # one run: checked by the core and encoded in one pass
                    self.stats.messages_sent += len(batch)
                    await conn.writer.drain()
                    continue
            now = time.monotonic()
            requested = [w for w in self._requests if w[0] <= self._sent_end]
            if requested:  # checkpoint(): a round that ends exactly where the caller asked
                await self._round(conn, max(target for target, _ in requested), requested)
                last_round = time.monotonic()
                continue
            due = self._sent > 0 and (
                (self._closing and self._sent == len(buf))
                or (auto and (self._sent >= self.every_n or now - last_round >= self.every_s))
            )
            if due:
                await self._round(conn, self._sent_end, [])
                last_round = time.monotonic()
                continue
            if self._closing and not buf:
                await self._confirm_settled(conn)
                return
            self._wake.clear()
            timeout = max(0.0, self.every_s - (now - last_round)) if self._sent and auto else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _send_limit(self) -> float:
        """How far output may be sent now: a round must end at everything sent, so nothing
        past a marked or requested end goes out before that round (the shipped sink exits
        when a commit leaves bytes after its end)."""
        ends = [target for target, _ in self._requests]
        if self._fence is not None and self._fence > self.committed:  # else its round is done
            ends.append(self._fence)
        return min(ends, default=float("inf"))

    async def _confirm_settled(self, conn: FramedConnection) -> None:
        """Before the last close, a LIST_UNCOMMITTED round trip.

        No answer comes to a PHASE2, so a sink killed just after our last one was sent
        could be left with that round voted but undecided, and nobody would come back to
        settle it. The sink handles a connection's frames in order: once it answers this
        listing, it has applied every PHASE2 before it. A sink that still lists a txn, or
        goes away first, is connected to again, and the new session settles what it lists.
        """
        self._rtag += 1
        answer = self._waiters["uncommitted"] = asyncio.get_running_loop().create_future()
        await conn.send(twopc_frame(ListUncommitted(self._rtag)))
        listed = (await asyncio.wait_for(answer, self.reply_timeout)).txn_ids
        if listed:
            raise _Lost(f"the sink still lists {len(listed)} undecided txn(s) at the end: settling them")

    async def _round(self, conn: FramedConnection, end: int, requests: list) -> None:
        """PHASE1 over [committed, end) -> REPLY (or timeout) -> decision -> PHASE2."""
        for request in requests:
            self._requests.remove(request)
        if self._fence is not None and self._fence <= end:
            self._fence = None
        commit = False
        try:
            commit = await self._two_phases(conn, end)
        finally:
            for _, future in requests:
                if not future.done():
                    future.set_result(commit)

    async def _two_phases(self, conn: FramedConnection, end: int) -> bool:
        txn: Text = f"{show_text(self.stream_name)}:c_id={self._cid}"
        self._cid += 1
        start = self.committed
        future = asyncio.get_running_loop().create_future()
        self._reply_for = (txn, future)
        self.stats.rounds += 1
        self._decisions[txn] = False  # until a commit vote arrives, the answer to a listing is abort
        while len(self._decisions) > KEEP_DECISIONS:
            self._decisions.popitem(last=False)
        sent_at = time.perf_counter()
        try:
            await conn.send(twopc_frame(Phase1(txn, ((SINK_DATA_STREAM, start, end),))))
            try:
                commit = await asyncio.wait_for(future, self.reply_timeout)
                self.stats.phase1_latencies.append(time.perf_counter() - sent_at)
            except TimeoutError:
                commit = False
                self.stats.timeouts += 1
                self.log(f"no REPLY for {txn} within {self.reply_timeout:g} s: deciding abort")
        finally:
            self._reply_for = None
        if commit and self.on_commit_vote is not None:
            try:  # the caller makes the decision durable on its side (its checkpoint) first
                await self.on_commit_vote(txn, end)
            except Exception as err:
                commit = False
                self.log(f"{txn}: on_commit_vote failed ({err!r}): deciding abort")
        self._decisions[txn] = commit
        if commit:  # decided: the sink holds the bytes durably and must commit them
            count, size = 0, 0
            while size < end - start:
                size += len(self._buf[count])
                count += 1
            for _ in range(count):
                self._buf_bytes -= len(self._buf.popleft())
            self.committed = end
            self._sent -= count
            self.stats.commits += 1
            self.stats.committed_messages += count
            self.stats.committed_bytes = end
            self._space.set()
        else:
            self.stats.aborts += 1
            self._sent, self._sent_end = 0, self.committed
            self.log(f"{txn} [{start}, {end}) aborted: re-sending from {start}")
        await conn.send(twopc_frame(Phase2(txn, commit)))
        return commit

    @property
    def next_checkpoint_id(self) -> int:
        """The checkpoint id the next round's txn will carry."""
        return self._cid

    @property
    def put_offset(self) -> int:
        """The sink offset just past everything put so far."""
        return self.committed + self._buf_bytes

    def mark(self) -> int:
        """``put_offset``, held back from the sink until a checkpoint there is decided.

        Taken with a worker's snapshot: output put after it waits, so that the round
        ending at the mark also ends at everything sent.
        """
        self._fence = self.put_offset
        self._wake.set()
        return self._fence

    async def checkpoint(self, upto: int | None = None) -> bool:
        """A round now over everything put so far (or up to offset ``upto``, a message
        boundary such as an earlier ``put_offset``), ending exactly there: True once committed.

        For a worker that ties the sink's commit to its own checkpoint (``auto_checkpoint=False``):
        take ``mark()`` with the checkpoint's snapshot, pass it here, and write the checkpoint
        in ``on_commit_vote``, which runs between the REPLY and PHASE2.
        """
        target = self.put_offset if upto is None else upto
        if target <= self.committed:
            return True
        if self._fatal is not None:
            raise self._fatal
        future = asyncio.get_running_loop().create_future()
        self._requests.append((target, future))
        self._wake.set()
        return await future


class SinkCheckpointFailed(OSError):
    """The sink did not commit a checkpoint's round (abort vote, timeout, lost connection).

    An OSError so that a worker's checkpoint loop treats it like any failed sync: the
    deliveries stay dirty and the next checkpoint covers them again.
    """


class SinkConsumer:
    """The mock worker's consumer interface over a SinkDriver: deliver -> put, sync -> checkpoint."""

    def __init__(self, driver: SinkDriver) -> None:
        self.driver = driver
        self._runner: asyncio.Task | None = None

    def _ensure_running(self) -> None:
        if self._runner is None:
            self._runner = asyncio.create_task(self.driver.run())

    async def deliver(self, stream_id: int, message: Message) -> None:
        self._ensure_running()
        await self.driver.put(message.payload)

    async def sync(self) -> None:
        self._ensure_running()
        if not await self.driver.checkpoint():
            raise SinkCheckpointFailed("the sink did not commit this checkpoint's output")

    async def aclose(self) -> None:
        if self._runner is None:
            return
        await self.driver.close()
        await self._runner


# --- feeding a driver from --input -----------------------------------------------------------


def input_payloads(spec: str, *, payload_size: int = 32, start: int = 0) -> Iterator[bytes]:
    """Payloads for ``--input``: "-" is stdin, "gen:N" N generated lines, anything else a file.

    Every payload is one line with its newline, so the committed output equals the input bytes
    and a sink offset is also an input position: ``start`` resumes after the first ``start``
    bytes (a line boundary), which a file is sought to and gen:N computes. stdin cannot be read
    again, so it only starts at 0. A file is opened here, so a missing one fails now.
    """
    count = generated_lines(spec)
    if count is not None:
        width = max(1, payload_size - 1)
        first, rest = divmod(start, width + 1)
        if rest or not 0 <= first <= count:
            raise ValueError(f"byte {start} is not a line boundary of {count} lines of {width + 1} bytes")
        return (f"{i:0{width}d}\n".encode()[-width - 1 :] for i in range(first, count))
    f = open_input(spec)
    if spec == STDIN:
        if start:
            raise ValueError("stdin cannot be read again to resume after its first bytes")
        return iter(f)
    try:
        size = os.fstat(f.fileno()).st_size
        if start:
            f.seek(start - 1)
            if start > size or (f.read(1) != b"\n" and start < size):
                raise ValueError(f"byte {start} of {spec} ({size} bytes) is not the end of a line")
    except BaseException:
        f.close()
        raise
    return _lines(f)


def input_state(path: str, source: str) -> Registry:
    """The --state of an --input run: its sink position names the input it belongs to, so a
    restart with another input (or stdin, which cannot be read again) is refused (StateError)."""
    if source == STDIN:
        raise StateError(
            f"--state {path}: stdin (--input -) cannot be read again after a crash; give a file or gen:N"
        )
    registry = Registry.open(path)
    sink = registry.sink
    if registry.streams or (sink is not None and sink.get("input") != source):
        was = f"--input {sink.get('input')}" if sink and sink.get("input") else "a worker serving connectors"
        raise StateError(f"--state {path} was written for {was}, not --input {source}; give another file")
    registry.sink = sink or {"offset": 0, "txn": None, "next_cid": 1, "input": source}
    return registry


def input_driver(
    host: str, port: int, source: str, registry: Registry | None = None, **options: Any
) -> SinkDriver:
    """A driver for ``--input`` named ``source``; crash-safe with ``registry`` (``input_state``).

    The sink position (offset, txn, next checkpoint id) is written between each commit vote and
    PHASE2, as the worker's checkpoints do, so a restarted run settles a listed txn by it and
    sends the input from the committed offset on: nothing lost or repeated.
    """
    saved = registry.sink if registry else {"offset": 0, "txn": None}

    async def write_position(txn: Text, end: int) -> None:
        position = {
            "offset": end,
            "txn": show_text(txn),
            "next_cid": driver.next_checkpoint_id,
            "input": source,
        }
        await asyncio.to_thread(write_atomic, registry.path, registry.state_bytes(sink=position))
        registry.sink = position

    driver = SinkDriver(
        host,
        port,
        start_offset=saved["offset"],
        first_checkpoint_id=saved.get("next_cid", 1),
        on_commit_vote=write_position if registry else None,
        resolve_listed=(lambda txn: show_text(txn) == registry.sink["txn"]) if registry else None,
        **options,
    )
    return driver


@dataclass
class InputRun:
    """An ``--input`` run made ready: its driver, what it sends, and where it resumes."""

    driver: SinkDriver
    payloads: Iterator[bytes]
    #: The committed input bytes it resumes after, and the txn its state names (None: none).
    offset: int
    txn: str | None


def input_run(
    host: str,
    port: int,
    spec: str,
    state_path: str | None = None,
    *,
    checkpoint_every: int,
    checkpoint_ms: float,
    **options: Any,
) -> InputRun:
    """Ready ``--input spec`` for the sink at host:port, crash-safe with ``state_path``.

    Checked before the first byte is sent, so a rerun fails at once, not mid-run: the state
    belongs to this input and can be written (StateError), and the input reads on from its
    committed offset (StateError when it is not the input the state was written for; ValueError
    when it cannot be read as an input at all; OSError when it cannot be read). An input run
    always checkpoints: 0 for either interval means every message, or every second.
    """
    source = input_name(spec)
    registry = input_state(state_path, source) if state_path else None
    saved = registry.sink if registry else {"offset": 0, "txn": None}
    driver = input_driver(
        host,
        port,
        source,
        registry,
        checkpoint_every_messages=max(checkpoint_every, 1),
        checkpoint_every_ms=checkpoint_ms or 1000.0,
        **options,
    )
    try:
        payloads = input_payloads(spec, start=saved["offset"])
    except ValueError as err:
        if not saved["offset"]:
            raise
        raise StateError(
            f"--state {state_path} has the first {saved['offset']} bytes of --input {source} committed, "
            f"but {err}: not the input it was written for"
        ) from err
    if registry is not None:
        try:
            registry.save()  # find out now, not at the first commit, that it cannot be written
        except OSError as err:
            raise StateError(f"cannot write --state {state_path}: {err.strerror or err}") from err
    return InputRun(driver, payloads, saved["offset"], saved["txn"])


def input_name(spec: str) -> str:
    """What ``--input spec`` reads, comparable across runs: "gen:N", "-" or a file's absolute path."""
    if spec.startswith(GENERATED):
        return "gen:" + spec.split(":", 1)[1]
    return spec if spec == STDIN else os.path.abspath(spec)


def _lines(f: BinaryIO) -> Iterator[bytes]:
    with f:
        yield from f


def _take(it: Iterator[bytes], n: int) -> list[bytes]:
    out = []
    for item in it:
        out.append(item)
        if len(out) >= n:
            break
    return out


async def feed(driver: SinkDriver, payloads: Iterable[bytes], *, close: bool = True) -> None:
    """Put every payload into the driver (reading in a thread: stdin may block), then close it."""
    it = iter(payloads)
    while True:
        chunk = await asyncio.to_thread(_take, it, 256)
        if not chunk:
            break
        for payload in chunk:
            await driver.put(payload)
    if close:
        await driver.close()


async def drive(driver: SinkDriver, payloads: Iterable[bytes]) -> DriverStats:
    """Run the driver over the payloads to the end: every byte committed, connection closed."""
    runner = asyncio.create_task(driver.run())
    feeder = asyncio.create_task(feed(driver, payloads))
    done, _ = await asyncio.wait({runner, feeder}, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            for other in (runner, feeder):
                other.cancel()
            raise task.exception()
    await asyncio.gather(runner, feeder)
    return driver.stats
