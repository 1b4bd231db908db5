"""A connector source over real TCP: the client half of the source protocol.

``MockSource`` connects, says HELLO, NOTIFYs every stream, resumes each one
from the point of reference in the worker's NOTIFY_ACK (not its own), sends
MESSAGE frames only while it holds credits, trims a per-stream replay buffer at
the points the worker's ACKs report, and ends every stream with EOS_MESSAGE,
waiting for its final ACK.

At-least-once: a RESTART or a dropped connection closes the session; the source
reconnects with exponential back-off and jitter (bounded retries), NOTIFYs
again and replays everything not yet acknowledged. The worker drops replays by
message id, so what it delivers is exact.

Memory stays flat: the replay buffer holds at most ``max_unacked`` messages;
when it is full, no input is read until ACKs trim it.

Point of reference convention (the shipped worker's, PROTOCOL-NOTES.md): a
point of reference is the id of the last message the worker holds. An ACK for
point P frees messages at or below P; a NOTIFY_ACK for P resumes with message P + 1.

Every frame in or out goes through the shared protocol core (``peer.FramedConnection``),
so sending without credit is caught before it reaches the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat, starmap
from operator import itemgetter

from wallaroo_proto.judge import Kind
from wallaroo_proto.pcap_writer import PcapWriter

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
    show_text,
)
from .inputs import InputError, MessageReader, RateLimiter, StreamInput, ThreadedReader
from .peer import ConnectionClosed, FramedConnection, describe_protocol_error
from .protocol import ConnState, Side, Use, Verdict

_MESSAGE_ID = itemgetter(1)
_PAYLOAD = itemgetter(4)
_consume = deque(maxlen=0).extend  # runs an iterator to its end in C, keeping nothing


class SourceFailed(Exception):
    """The source cannot finish: a worker ERROR, a refused stream, retries exhausted."""

    exit_code = 1


class InputFailed(SourceFailed):
    """The input turned out to be unusable halfway through (a truncated record, a file gone)."""

    exit_code = 2


class Unreachable(SourceFailed):
    """No connection to the worker could be made in all the attempts: exit 2, as for bad usage."""

    exit_code = 2


class _Restart(Exception):
    def __init__(self, address: str | None) -> None:
        self.address = address
        super().__init__(f"worker sent RESTART{f' to {address}' if address else ''}")


#: Seconds a worker that owes an answer may be silent before the connector says what it waits for.
WAIT_NOTE = 5.0


class _Dropped(Exception):
    """The connection ended without a RESTART: worth another attempt."""


@dataclass
class SourceOptions:
    """How to reach the worker and how hard to try."""

    host: str = "127.0.0.1"
    port: int = 7100
    version: str = SOURCE_VERSION
    cookie: bytes = b""
    program_name: str = "wallaroo-proto"
    instance_name: str = "mock-source"
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: Consecutive attempts without progress before giving up.
    retries: int = 5
    backoff_base: float = 0.05
    backoff_max: float = 2.0
    #: Cap on messages read but not yet acknowledged (all streams together).
    max_unacked: int = 65_536
    rate: float | None = None
    record: str | None = None
    connect_timeout: float = 5.0
    handshake_timeout: float = 10.0
    #: Silence from a worker we are waiting on (credits, ACKs) that counts as a dead connection.
    idle_timeout: float = 30.0
    #: Most frames written before yielding to the event loop.
    batch: int = 4096
    #: "spec" or "shipped": how EOS_MESSAGE is written and when its ACK ends the stream.
    dialect: str = "spec"


@dataclass
class SourceStats:
    """What happened, for the progress bar and the final summary."""

    streams: int = 0
    #: Messages sent for the first time.
    messages: int = 0
    #: Messages sent again after a reconnect.
    replayed: int = 0
    #: Messages the worker's ACKs have covered (read from points of reference).
    acknowledged: int = 0
    payload_bytes: int = 0
    connections: int = 0
    restarts: int = 0
    drops: int = 0
    refusals: int = 0
    streams_done: int = 0
    total: int | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    error: str | None = None
    #: Final point of reference per stream name.
    points: dict[str, int] = field(default_factory=dict)
    #: Streams the worker already held a part of at their first NOTIFY: name -> messages skipped.
    resumed: dict[str, int] = field(default_factory=dict)
    #: Streams with nothing left to send (the worker held all of a known total): their names.
    nothing_left: list[str] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def as_dict(self) -> dict:
        elapsed = self.elapsed
        return {
            "streams": self.streams,
            "streams_done": self.streams_done,
            "messages": self.messages,
            "replayed": self.replayed,
            "acknowledged": self.acknowledged,
            "payload_bytes": self.payload_bytes,
            "connections": self.connections,
            "restarts": self.restarts,
            "drops": self.drops,
            "refusals": self.refusals,
            "elapsed_s": round(elapsed, 3),
            "messages_per_s": round(self.messages / elapsed, 1) if elapsed > 0 else 0.0,
            "mb_per_s": round(self.payload_bytes / elapsed / 1e6, 3) if elapsed > 0 else 0.0,
            "error": self.error,
            "points_of_reference": dict(self.points),
            "resumed": [
                {"stream": name, "skipped": n, "nothing_left": name in self.nothing_left}
                for name, n in self.resumed.items()
            ],
        }


# Per-stream states, on top of the core's per-connection stream machine.
NOTIFY = "notify"  # needs a NOTIFY on this connection
NOTIFIED = "notified"
OPEN = "open"
REFUSED = "refused"  # NOTIFY_ACK success=0: NOTIFY again after a back-off
EOS_SENT = "eos-sent"
DONE = "done"  # EOS acknowledged: finished for good


class StreamFeed:
    """One stream's replay buffer and position.

    ``unacked`` holds messages sent on this connection and not yet covered by
    an ACK; ``pending`` holds messages read (or to replay) and not yet sent.
    Both are trimmed at acknowledged points of reference.
    """

    def __init__(self, spec: StreamInput) -> None:
        self.spec = spec
        self.stream_id = spec.stream_id
        self.reader: MessageReader | None = None
        self.unacked: deque[Message] = deque()
        self.pending: deque[Message] = deque()
        #: Point of reference the worker acknowledged: every message id at or below it is durable.
        self.acked = 0
        #: Highest point any ACK has reported; unlike ``acked`` never lowered, so that
        #: re-acknowledging the same data after a reconnect is not counted as progress.
        self.acked_high = 0
        #: Highest message id read from the input (the resume point if none).
        self.last_id = 0
        self.max_sent = 0  # highest message id ever sent, to count replays
        self.exhausted = False
        self.state = NOTIFY
        self.retry_at = 0.0
        self.refused_in_row = 0

    @property
    def buffered(self) -> int:
        return len(self.unacked) + len(self.pending)

    def trim(self, point: int) -> int:
        """Forget messages at or below ``point``; returns how many were dropped.

        Ids rise along both buffers, so the count is found by bisection and dropped in C.
        """
        dropped = 0
        for buf in (self.unacked, self.pending):
            if buf and buf[0].message_id <= point:
                if buf[-1].message_id <= point:
                    count = len(buf)
                    buf.clear()
                else:
                    count = bisect_right(buf, point, key=_MESSAGE_ID)
                    _consume(starmap(buf.popleft, repeat((), count)))
                dropped += count
        return dropped

    def rewind_for_replay(self) -> None:
        """A new connection: everything unacknowledged goes out again, in order."""
        if self.unacked:
            self.unacked.extend(self.pending)
            self.pending = self.unacked
            self.unacked = deque()

    def close_reader(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class MockSource:
    """Streams inputs to a worker until every stream's EOS_MESSAGE is acknowledged."""

    def __init__(
        self,
        inputs: list[StreamInput],
        options: SourceOptions | None = None,
        *,
        log: Callable[[str], None] = lambda _msg: None,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options or SourceOptions()
        #: A line per routine event (a connection made, a stream finished); ``log`` has the rest.
        self.trace = log if trace is None else trace
        self.feeds = [StreamFeed(spec) for spec in inputs]
        self.by_id = {feed.stream_id: feed for feed in self.feeds}
        if len(self.by_id) != len(self.feeds):
            raise InputError("two streams share a stream id")
        self.log = log
        self.stats = SourceStats(streams=len(self.feeds))
        totals = [spec.total for spec in inputs]
        self.stats.total = None if None in totals else sum(totals)  # type: ignore[arg-type]
        self.host = self.options.host
        self.port = self.options.port
        self.limiter = RateLimiter(self.options.rate)
        self.eos = EosRule(self.options.dialect)
        self.buffered = 0
        self._wake = asyncio.Event()
        self._progress = False
        self._rotation = 0
        self._pcap: PcapWriter | None = None

    # --- the reconnect loop -------------------------------------------------

    async def run(self) -> SourceStats:
        """Stream everything; raises SourceFailed when it cannot."""
        opts = self.options
        failures = 0
        last_problem = ""
        if opts.record:
            try:
                self._pcap = PcapWriter(opts.record)
            except OSError as err:
                raise InputFailed(
                    f"cannot write the recording {opts.record!r}: {err.strerror or err}"
                ) from err
        try:
            while not self._all_done():
                self._progress = False
                try:
                    await self._connection()
                except _Restart as restart:
                    self.stats.restarts += 1
                    last_problem = str(restart)
                    self.log(f"{restart}; reconnecting")
                    self._redirect(restart.address)
                except (_Dropped, ConnectionClosed, OSError, TimeoutError) as err:
                    self.stats.drops += 1
                    problem = _describe(err, self.host, self.port)
                    if problem != last_problem:  # a line per new problem, not per attempt
                        self.log(f"{problem}; reconnecting")
                    last_problem = problem
                if self._all_done():
                    break
                failures = 0 if self._progress else failures + 1
                if failures > opts.retries:
                    if not self.stats.connections:
                        raise Unreachable(f"{last_problem} ({failures} attempts)")
                    raise SourceFailed(f"gave up after {failures} attempts without progress: {last_problem}")
                delay = min(opts.backoff_max, opts.backoff_base * 2**failures) * random.uniform(0.5, 1.0)
                await asyncio.sleep(delay)
            return self.stats
        except SourceFailed as err:
            self.stats.error = str(err)
            raise
        finally:
            self.stats.finished = time.monotonic()
            for feed in self.feeds:
                feed.close_reader()
                self.stats.points[feed.spec.name] = feed.acked
            if self._pcap is not None:
                self._pcap.close()

    def _all_done(self) -> bool:
        return self.stats.streams_done == len(self.feeds)

    def _redirect(self, address: str | bytes | None) -> None:
        if not address:
            return
        text = show_text(address)
        host, sep, port = text.rpartition(":")
        if sep and host and port.isdigit():
            self.host, self.port = host, int(port)
            self.log(f"redirected to {self.host}:{self.port}")
        else:
            self.log(f"ignoring RESTART address {text!r}: not HOST:PORT")

    # --- one connection -----------------------------------------------------

    async def _connection(self) -> None:
        opts = self.options
        async with asyncio.timeout(opts.connect_timeout):
            reader, writer = await asyncio.open_connection(self.host, self.port)
        recording = None
        if self._pcap is not None:
            local = writer.get_extra_info("sockname")
            remote = writer.get_extra_info("peername")
            recording = self._pcap.tcp_session((local[0], local[1]), (remote[0], remote[1]))
        conn = FramedConnection(
            reader,
            writer,
            use=Use.SOURCE,
            our_side=Side.CONNECTOR,
            max_frame_size=opts.max_frame_size,
            recording=recording,
            we_connected=True,
        )
        self.stats.connections += 1
        try:
            await self._session(conn)
        except ConnectionClosed:
            if recording is not None:
                recording.close(from_client=False)
            raise
        except ConnectionResetError:
            if recording is not None:
                recording.reset(from_client=False)
            raise
        finally:
            await conn.close()
            if self._pcap is not None:
                self._pcap.flush()

    async def _session(self, conn: FramedConnection) -> None:
        opts = self.options
        await conn.send(Hello(opts.version, opts.cookie, opts.program_name, opts.instance_name))
        deadline = time.monotonic() + opts.handshake_timeout
        while conn.machine.state is ConnState.HANDSHAKE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Dropped(f"no OK within {opts.handshake_timeout:g}s of HELLO")
            try:
                async with asyncio.timeout(remaining):
                    frames = await self._receive(conn)
            except TimeoutError:
                raise _Dropped(f"no OK within {opts.handshake_timeout:g}s of HELLO") from None
            await self._handle(conn, frames)
        for feed in self.feeds:
            if feed.state != DONE:
                feed.state = NOTIFY
                feed.rewind_for_replay()
        self._wake.set()
        sender = asyncio.create_task(self._send_loop(conn))
        receiver = asyncio.create_task(self._receive_loop(conn))
        tasks = {sender, receiver}
        try:
            while not receiver.done():
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # re-raise what ended it
                tasks -= done
        finally:
            for task in (sender, receiver):
                task.cancel()
            for task in (sender, receiver):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _receive(self, conn: FramedConnection) -> list[tuple[Frame, Verdict]]:
        try:
            return await conn.receive()
        except ProtocolError as err:
            # The frames before the bad bytes count first, in order: a RESTART among them ends
            # the connection, and what came after it is moot.
            feed = conn.machine.feed
            await self._handle(conn, [(frame, feed(Side.WORKER, frame)) for frame in err.decoded])
            reason = describe_protocol_error(err)
            await conn.fail(reason)
            raise SourceFailed(f"the worker sent bytes that are not frames: {err}") from err

    async def _receive_loop(self, conn: FramedConnection) -> None:
        """Handle the worker's frames until every stream is finished.

        A worker silent while it owes an answer is named once after ``WAIT_NOTE`` seconds, with
        what is owed, so a dropped ACK is not a silent wait; after ``idle_timeout`` it is given up.
        """
        idle = self.options.idle_timeout
        note_at = WAIT_NOTE if idle > WAIT_NOTE else None
        while not self._all_done():
            try:
                async with asyncio.timeout(note_at or idle):
                    frames = await self._receive(conn)
            except TimeoutError:
                if not self._waiting_on_worker(conn):
                    continue
                if note_at is None:
                    raise _Dropped(f"no frame from the worker for {idle:g}s while waiting for it") from None
                self.log(f"no frame from the worker for {note_at:g}s; waiting for {self._owed(conn)}")
                try:
                    async with asyncio.timeout(idle - note_at):
                        frames = await self._receive(conn)
                except TimeoutError:
                    raise _Dropped(f"no frame from the worker for {idle:g}s while waiting for it") from None
            note_at = WAIT_NOTE if idle > WAIT_NOTE else None
            await self._handle(conn, frames)
            self._wake.set()

    def _owed(self, conn: FramedConnection) -> str:
        """What the worker owes this connector now, in words."""
        owed = []
        for feed in self.feeds:
            name = f"stream {feed.stream_id} ({feed.spec.name})"
            if feed.state == NOTIFIED:
                owed.append(f"its NOTIFY_ACK of {name}")
            elif feed.state == EOS_SENT:
                owed.append(f"its ACK of the EOS of {name}")
            elif feed.unacked:
                last = feed.unacked[-1].message_id
                owed.append(f"an ACK of {name} up to {last} (acknowledged: {feed.acked})")
        if not conn.machine.credits:
            owed.append("credits (none left to send with)")
        return "; ".join(owed) or "its answer"

    def _waiting_on_worker(self, conn: FramedConnection) -> bool:
        if not conn.machine.credits:
            return True
        return any(feed.unacked or feed.state in (NOTIFIED, EOS_SENT) for feed in self.feeds)

    async def _handle(self, conn: FramedConnection, frames: list[tuple[Frame, Verdict]]) -> None:
        for frame, outcome in frames:
            if outcome.kind is Kind.IGNORED:
                continue
            if outcome.kind is Kind.VIOLATION:
                await conn.fail(f"Invalid message: {outcome.reason}")
                raise SourceFailed(f"the worker broke the protocol: {outcome.reason}")
            kind = type(frame)
            if kind is Ack:
                self._on_ack(frame)
            elif kind is NotifyAck:
                self._on_notify_ack(frame)
            elif kind is Error:
                raise SourceFailed(f"worker ERROR: {show_text(frame.reason)}")
            elif kind is Restart:
                raise _Restart(show_text(frame.address) if frame.address is not None else None)
            elif kind is Ok:
                self.trace(f"connected to {self.host}:{self.port} with {frame.initial_credits} credits")

    def _on_ack(self, frame: Ack) -> None:
        for stream_id, point in frame.acks:
            feed = self.by_id.get(stream_id)
            if feed is None:
                continue
            if point > feed.acked:
                dropped = feed.trim(point)
                self.buffered -= dropped
                self.stats.acknowledged += point - feed.acked
                feed.acked = point
            if point > feed.acked_high:
                feed.acked_high = point
                self._progress = True
            if feed.state == EOS_SENT and self.eos.finishes(feed, point):
                feed.state = DONE
                feed.close_reader()
                self.stats.streams_done += 1
                self.trace(f"stream {feed.spec.name!r} done: its EOS is acknowledged at {point}")
                self._progress = True

    def _on_notify_ack(self, frame: NotifyAck) -> None:
        feed = self.by_id.get(frame.stream_id)
        if feed is None or feed.state != NOTIFIED:
            return  # the core has already refused a NOTIFY_ACK nobody asked for
        if not frame.success:
            feed.state = REFUSED
            feed.refused_in_row += 1
            self.stats.refusals += 1
            if feed.refused_in_row > self.options.retries:
                raise SourceFailed(
                    f"stream {feed.spec.name!r} (id {feed.stream_id}) refused {feed.refused_in_row} times: "
                    "another connection holds it"
                )
            delay = min(self.options.backoff_max, self.options.backoff_base * 2**feed.refused_in_row)
            feed.retry_at = time.monotonic() + delay * random.uniform(0.5, 1.0)
            self.log(f"stream {feed.spec.name!r} refused by the worker; NOTIFY again in a moment")
            return
        feed.refused_in_row = 0
        feed.state = OPEN
        self._resume(feed, frame.point_of_ref)

    def _resume(self, feed: StreamFeed, point: int) -> None:
        """Position the stream at the worker's point of reference, whatever ours was."""
        if feed.reader is None and not feed.exhausted:
            feed.reader = self._open(feed, point)
            feed.acked, feed.last_id = point, point
            if point and feed.spec.name not in self.stats.resumed:
                self._say_resumed(feed, point)
            return
        if point >= feed.acked:
            self.buffered -= feed.trim(point)
            self.stats.acknowledged += point - feed.acked
            feed.acked = point
            if point > feed.last_id:
                # The worker is ahead of anything we read: skip forward to it.
                self.buffered -= feed.buffered
                feed.unacked.clear()
                feed.pending.clear()
                feed.close_reader()
                feed.reader = self._open(feed, point)
                feed.last_id = point
                feed.exhausted = False
            return
        # The worker went back behind what it had acknowledged (it lost its state).
        if not feed.spec.rewindable:
            raise SourceFailed(
                f"the worker asked to resume stream {feed.spec.name!r} from {point}, but messages up to "
                f"{feed.acked} were acknowledged and this input cannot be read again"
            )
        self.log(f"stream {feed.spec.name!r}: worker resumes from {point}, behind its ACK {feed.acked}")
        self.buffered -= feed.buffered
        feed.unacked.clear()
        feed.pending.clear()
        feed.close_reader()
        feed.reader = self._open(feed, point)
        feed.acked, feed.last_id = point, point
        feed.exhausted = False

    def _say_resumed(self, feed: StreamFeed, point: int) -> None:
        """A stream the worker already holds a part of: say what is skipped, so a rerun that sends
        nothing is not taken for one that sent everything."""
        total = feed.spec.total
        skipped = point if total is None else min(point, total)
        self.stats.resumed[feed.spec.name] = skipped
        why = f"the worker already holds its messages up to {point}"
        if total is not None and point >= total:
            self.stats.nothing_left.append(feed.spec.name)
            self.log(f"stream {feed.spec.name!r} resumed after {point}: all {total} messages skipped, "
                     f"nothing left to send ({why})")  # fmt: skip
        else:
            self.log(f"stream {feed.spec.name!r} resumed at {point + 1}: {skipped} messages skipped ({why})")

    def _open(self, feed: StreamFeed, point: int) -> MessageReader:
        """A reader of the messages above ``point``, the ones the worker does not hold."""
        try:
            reader = feed.spec.open(point + 1)
        except InputError as err:
            raise InputFailed(str(err)) from err
        if isinstance(reader, ThreadedReader):
            loop = asyncio.get_running_loop()
            wake = self._wake

            def ready() -> None:
                with contextlib.suppress(RuntimeError):  # the loop may be gone at exit
                    loop.call_soon_threadsafe(wake.set)

            reader.on_ready = ready
            ready()
        return reader

    # --- sending ------------------------------------------------------------

    async def _send_loop(self, conn: FramedConnection) -> None:
        """Write whatever the credits allow; sleep until an ACK, input or a timer changes that."""
        machine = conn.machine
        writer = conn.writer
        while True:
            self._wake.clear()
            frames = self._next_frames(machine.credits or 0)
            if frames:
                conn.write(frames)
                await writer.drain()
                await asyncio.sleep(0)  # let the receiver apply ACKs between batches
                continue
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with its timeout, and this loop would then never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_timer()):
                    await self._wake.wait()

    def _next_timer(self) -> float | None:
        timers = []
        now = time.monotonic()
        for feed in self.feeds:
            if feed.state == REFUSED:
                timers.append(max(0.0, feed.retry_at - now))
        if self.options.rate is not None:
            timers.append(max(0.001, self.limiter.wait_time()))
        return min(timers) if timers else None

    def _next_frames(self, credits: int) -> list[Frame | list[Message]]:
        """The next frames to write, at most ``credits`` of them, a stream's MESSAGEs as one list;
        updates the streams' states."""
        budget = min(credits, self.options.batch)
        if budget <= 0:
            return []
        out: list[Frame | list[Message]] = []
        now = time.monotonic()
        for feed in self.feeds:
            if budget == 0:
                return out
            if feed.state == NOTIFY or (feed.state == REFUSED and now >= feed.retry_at):
                out.append(Notify(feed.stream_id, feed.spec.name, feed.acked))
                feed.state = NOTIFIED
                budget -= 1
        feeds = self.feeds
        n = len(feeds)
        start = self._rotation
        self._rotation = (start + 1) % n
        share = max(16, budget // n)
        stats = self.stats
        for i in range(n):
            if budget == 0:
                break
            feed = feeds[(start + i) % n]
            if feed.state != OPEN:
                continue
            if not feed.pending and not feed.exhausted:
                self._read(feed, min(share, budget))
            take = min(budget, share, len(feed.pending))
            if take:
                pending = feed.pending
                if take == len(pending):
                    batch = list(pending)
                    pending.clear()
                else:
                    popleft = pending.popleft
                    batch = [popleft() for _ in range(take)]
                feed.unacked.extend(batch)
                out.append(batch)  # one run: checked by the core and encoded in one pass
                max_sent = feed.max_sent
                if batch[-1].message_id > max_sent:
                    # Ids rise within a stream: the new messages are a tail of the batch.
                    fresh = batch if batch[0].message_id > max_sent else [m for m in batch if m[1] > max_sent]
                    stats.messages += len(fresh)
                    stats.payload_bytes += sum(map(len, map(_PAYLOAD, fresh)))
                    stats.replayed += take - len(fresh)
                    feed.max_sent = batch[-1].message_id
                    self._progress = True
                else:
                    stats.replayed += take
                budget -= take
            if budget and feed.exhausted and not feed.pending:
                out.append(self.eos.frame(feed))
                feed.state = EOS_SENT
                budget -= 1
        return out

    def _read(self, feed: StreamFeed, wanted: int) -> None:
        room = self.options.max_unacked - self.buffered
        wanted = self.limiter.allow(min(wanted, room)) if room > 0 else 0
        if wanted <= 0 or feed.reader is None:
            return
        try:
            batch = feed.reader.read(wanted)
        except InputError as err:
            raise InputFailed(str(err)) from err
        if batch is None:
            feed.exhausted = True
            feed.close_reader()
            return
        if len(batch) < wanted and self.options.rate is not None:
            self.limiter.tokens += wanted - len(batch)  # give back what the input did not have
        if batch:
            feed.pending.extend(batch)
            feed.last_id = batch[-1].message_id
            self.buffered += len(batch)


class EosRule:
    """The dialect's EOS_MESSAGE wire form, and the ACK that finishes a stream.

    spec: ``EOS(stream_id, last_id)``; shipped: ``EOS(stream_id)`` (8 bytes). In
    both the worker answers ``ACK(0, [(stream_id, last_id)])``: a point of
    reference is the last id the worker holds, so the stream is done when the
    point reaches the last id.
    """

    DIALECTS = ("spec", "shipped")

    def __init__(self, dialect: str) -> None:
        if dialect not in self.DIALECTS:
            raise ValueError(f"unknown dialect {dialect!r}: expected one of {', '.join(self.DIALECTS)}")
        self.shipped = dialect == "shipped"

    def frame(self, feed: StreamFeed) -> EosMessage:
        return EosMessage(feed.stream_id, None if self.shipped else feed.last_id)

    @staticmethod
    def finishes(feed: StreamFeed, point: int) -> bool:
        return point >= feed.last_id


def _describe(err: BaseException, host: str, port: int) -> str:
    if isinstance(err, ConnectionRefusedError):
        return f"cannot connect to {host}:{port}: connection refused"
    if isinstance(err, TimeoutError):
        return f"cannot connect to {host}:{port}: no answer in time"
    if isinstance(err, ConnectionClosed):
        return f"the worker closed the connection ({err})"
    if isinstance(err, ConnectionResetError):
        return "the worker reset the connection"
    if isinstance(err, OSError):
        return f"connection to {host}:{port} failed: {err.strerror or err}"
    return str(err)


async def run_source(
    inputs: list[StreamInput], options: SourceOptions, *, log: Callable[[str], None] = lambda _m: None
) -> SourceStats:
    """Library entry point: stream ``inputs`` to the worker ``options`` names."""
    return await MockSource(inputs, options, log=log).run()
