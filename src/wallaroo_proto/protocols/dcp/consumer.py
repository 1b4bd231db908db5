"""The mock DCP consumer: streams vbuckets from a producer into a durable copy, as a replica does.

It says HELLO, authenticates (the strongest SCRAM the producer lists, else
PLAIN) and selects the bucket as a data node's clients do, opens a DCP
connection, sets its controls (noops, a flow-control buffer, stream ids),
asks for the vbuckets' high seqnos and requests a stream per vbucket from
what its copy holds: the vbucket uuid, the last seqno and the snapshot range
it is in. Every producer packet goes through the same
``core.Connection`` the dissector uses, so a producer that breaks a rule is
named. NOOPs are answered with their opaque; buffers are acknowledged once
half the window is used. A ROLLBACK truncates the copy to the newest
completed snapshot at or before the rollback seqno and asks again; a
STREAM_END other than ok asks again from where the copy is.

The copy (``--state``) is written atomically (``durable.write_atomic``) at
completed snapshots, at most every ``persist_interval`` seconds, after each
rollback and at the end, so a consumer killed with SIGKILL resumes from a
consistent point. Connections that drop are reopened up to ``retries`` times.

A producer that sends no whole packet, or reads nothing of ours, or leaves a
request unanswered for ``timeout`` seconds (by default twice the noop interval:
the DCP rule for a dead connection) counts as a dropped connection. The first violation ends the
run unless ``keep_going``; then an answer the consumer cannot use drops the
connection. A vbucket whose stream is asked for again ``stream_retries`` times
in a row without a seqno newer than any it reached (ROLLBACK after ROLLBACK,
STREAM_END after STREAM_END) is given up, with a growing pause between the attempts as a real
client has.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wallaroo_proto.durable import write_atomic
from wallaroo_proto.judge import Kind

from . import codec, sasl
from .codec import (
    FOREVER,
    HEADER_SIZE,
    SUCCESS,
    Packet,
    PacketSplitter,
    ProtocolError,
    Response,
    decode_packet,
)
from .core import CONSUMER, PRODUCER, Connection
from .link import Link
from .store import ConsumerVBucket, StateError

_ITEM_OPCODES = frozenset((codec.MUTATION, codec.DELETION, codec.EXPIRATION))
_KEEP_VIOLATIONS = 100
#: The pause before the second request in a row for a stream, doubled after each (the first is at once),
#: and the longest pause: java-dcp-client's backoff when it restarts a stream after a rollback.
RETRY_PAUSE, RETRY_PAUSE_MAX = 0.01, 5.0
#: Seconds a closing connection waits for what we wrote to be sent before it is cut.
CLOSE_GRACE = 5.0


#: What the run path (``Connection.feed_run``) can take, as the first byte after magic 0x80.
_RUN_OPCODES = frozenset((codec.SNAPSHOT_MARKER, codec.MUTATION, codec.DELETION, codec.EXPIRATION))


@dataclass
class ConsumerConfig:
    host: str = "127.0.0.1"
    port: int = 11210
    name: str = "wallaroo-proto-mock-consumer"
    vbuckets: list[int] | None = None  # None: every vbucket the producer has
    buffer_size: int = 1024 * 1024  # 0: no flow control
    noop_interval: float = 0.0  # 0: no noops
    follow: bool = False  # streams without end; otherwise up to the high seqnos at connect time
    stream_ids: bool = False
    state: str | None = None
    out: str | None = None
    retries: int = 0
    retry_delay: float = 0.2
    persist_interval: float = 0.5
    timeout: float | None = None  # None: twice noop_interval (none when noops are off); 0: none
    keep_going: bool = False  # go on after a violation instead of stopping
    stream_retries: int = 10  # requests in a row for one vbucket's stream that bring no new seqno
    #: SASL account and the bucket to select; user None: neither (a producer that wants no login).
    user: str | None = "Administrator"
    password: str = "password"
    bucket: str = "default"

    @property
    def silence(self) -> float:
        """Seconds without a whole packet from the producer (or a byte read by it) that end a connection."""
        if self.timeout is not None:
            return self.timeout
        return 2 * self.noop_interval


class ConnectionLost(Exception):
    pass


class Unreachable(ConnectionError):
    """The producer could not be connected to at all (not a connection lost once made)."""


class Refused(Exception):
    """The producer refused the login, the bucket or the DCP connection: asking again with the same
    account gets the same answer, so it is not retried (``retries`` is for connections lost)."""


class RuleBroken(Exception):
    """The producer broke the protocol and the consumer stops (it goes on only with ``keep_going``)."""


@dataclass
class _Run:
    vbuckets: dict[int, ConsumerVBucket]
    status: dict[int, str] = field(default_factory=dict)  # vb -> streaming / done / not_my_vbucket / error
    stream_ends: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    connections: int = 0
    noops: int = 0
    acks: int = 0
    items: int = 0
    failures: list[str] = field(default_factory=list)


class MockConsumer:
    def __init__(self, config: ConsumerConfig, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.run_state = _Run(self.load_state())
        self.last_persist = 0.0
        self.started = time.monotonic()
        self.stream_seconds = 0.0
        self.stop_requested = False

    # ------------------------------------------------------------------------------- state

    def load_state(self) -> dict[int, ConsumerVBucket]:
        path = self.config.state
        if not path or not os.path.exists(path):
            return {}
        try:
            with open(path, "rb") as f:
                obj = json.loads(f.read())
            return {int(vb): ConsumerVBucket.from_json(int(vb), v) for vb, v in obj["vbuckets"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise StateError(f"{path}: not a mock-consumer state file ({err})") from None

    def persist(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.config.state or (not force and now - self.last_persist < self.config.persist_interval):
            return
        self.last_persist = now
        obj = {"vbuckets": {str(vb): v.to_json() for vb, v in self.run_state.vbuckets.items()}}
        write_atomic(self.config.state, json.dumps(obj).encode())

    def write_out(self) -> int:
        """The copy's live items as JSONL, one per key, by vbucket and key."""
        lines = []
        for vb in sorted(self.run_state.vbuckets):
            state = self.run_state.vbuckets[vb]
            for key, value in sorted(state.state().items()):
                lines.append(json.dumps({"vbucket": vb, "key": key, "value": value}))
        if self.config.out:
            data = "".join(line + "\n" for line in lines).encode()
            if self.config.out == "-":
                os.write(1, data)
            else:
                write_atomic(self.config.out, data)
        return len(lines)

    # ------------------------------------------------------------------------------- running

    async def run(self) -> dict[str, Any]:
        attempts = 0
        while True:
            try:
                await self.session()
                break
            except RuleBroken:
                self.run_state.failures.append("stopped at the first violation (--keep-going goes on)")
                break
            except Refused as err:
                self.run_state.failures.append(str(err))
                self.log(str(err))
                break
            except (ConnectionLost, ConnectionError, OSError) as err:
                if self.stop_requested:
                    break
                lost = f"connection lost: {err or type(err).__name__}"
                what = str(err) if isinstance(err, Unreachable) else lost
                if attempts >= self.config.retries:
                    self.run_state.failures.append(what)
                    self.log(f"{what}; giving up")
                    break
                attempts += 1
                self.log(f"{what}; reconnecting ({attempts})")
                await asyncio.sleep(self.config.retry_delay)
                if self.stop_requested:
                    break
        self.persist(force=True)
        return self.summary()

    def stop(self) -> None:
        self.stop_requested = True
        opening = getattr(self, "opening", None)
        if opening is not None and not opening.done():
            opening.cancel()  # a producer that never answers the SYN must not hold up a stop
        if getattr(self, "link", None) is not None:
            self.link.abort()

    async def session(self) -> None:
        cfg = self.config
        self.opening = asyncio.ensure_future(Link.open(cfg.host, cfg.port))
        try:
            link = await self.opening
        except asyncio.CancelledError:
            if self.stop_requested:
                raise ConnectionLost("stopped while connecting") from None
            raise
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno and err.errno > 0 else err.strerror or str(err)
            host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
            raise Unreachable(f"cannot connect to {host}:{cfg.port}: {reason}") from None
        self.link = link
        self.conn = Connection()
        self.splitter = PacketSplitter()
        self.packets: list[tuple[int, Packet]] = []
        self.fresh = b""  # read, not yet in the splitter
        self.opaque = 0
        self.unacked = 0
        self.streams: dict[int, int] = {}  # opaque -> vb
        self.asked: dict[int, int] = {}  # vb -> stream requests in a row that brought no new seqno
        self.reached: dict[int, int] = {}  # vb -> the highest seqno its copy reached on this connection
        self.due: list[tuple[float, int]] = []  # (when, vb): stream requests waiting out their pause
        self.heard = time.monotonic()  # the last whole packet from the producer, or request to it
        self.awaiting: dict[int, tuple[float, str]] = {}  # opaque -> (sent at, what) of unanswered requests
        self.run_state.connections += 1
        started = time.monotonic()
        try:
            await self.setup()
            if self.stop_requested:
                return
            await self.stream_all()
        finally:
            self.stream_seconds += time.monotonic() - started
            link.close()
            try:  # what we wrote goes out first, unless the producer reads nothing
                await asyncio.wait_for(
                    link.wait_closed(), min(self.config.silence or CLOSE_GRACE, CLOSE_GRACE)
                )
            except TimeoutError:
                link.abort()

    def send(self, wire: bytes) -> None:
        p = decode_packet(wire)
        verdict = self.conn.feed(CONSUMER, p)
        if verdict.kind is not Kind.ACCEPTED:
            self.violation(f"own request: {verdict.reason}")
        self.link.write(wire)
        self.heard = time.monotonic()  # an answer is due from now
        if p.is_request and p.opcode != codec.BUFFER_ACK:  # a buffer ack has no answer
            what = f"{p.name} for vbucket {p.vbucket}" if p.opcode == codec.STREAM_REQ else p.name
            self.awaiting[p.opaque] = (self.heard, what)

    async def receive(self, until: float | None = None) -> bytes | None:
        """The next bytes from the producer, or None at ``until`` (a monotonic time) if none came first.

        ConnectionLost once the producer sent no whole packet for the silence limit (not
        counted while a request of ours waits for its time: the silence is then ours).
        """
        silence = self.config.silence
        oldest = next(iter(self.awaiting.values()), None)  # the request unanswered longest
        if until is not None:
            deadline = until
        elif silence:
            deadline = min(self.heard, oldest[0]) + silence if oldest else self.heard + silence
        else:
            deadline = None
        try:
            if deadline is None:
                return await self.link.read()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            return await self.link.read(left)
        except TimeoutError:
            if until is not None:
                return None
            if oldest and oldest[0] < self.heard:
                raise ConnectionLost(f"no answer to {oldest[1]} in {silence:g} s") from None
            raise ConnectionLost(f"the producer sent no whole packet for {silence:g} s") from None

    async def drain(self) -> None:
        """Wait for the producer to read what we wrote, at most the silence limit."""
        silence = self.config.silence
        try:
            await self.link.drain(silence or None)
        except TimeoutError:
            raise ConnectionLost(f"the producer read nothing of ours for {silence:g} s") from None

    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    async def next_packet(self) -> tuple[int, Packet]:
        while not self.packets:
            data = await self.receive()
            if not data:
                self.conn.end(PRODUCER)
                raise ConnectionLost("the producer closed the connection")
            try:
                self.packets = [(o, decode_packet(w)) for o, w in self.splitter.feed(data)]
            except ProtocolError as err:
                self.violation(str(err))
                raise ConnectionLost(str(err)) from None
            self.packets.reverse()
            if self.packets:
                self.heard = time.monotonic()
        return self.packets.pop()

    async def call(self, wire: bytes) -> Response:
        """Send one command and wait for its answer (stream traffic cannot come before streams exist)."""
        opaque = decode_packet(wire).opaque
        self.send(wire)
        await self.drain()
        while True:
            offset, p = await self.next_packet()
            verdict = self.judge(p, offset)
            if not p.is_request and p.opaque == opaque:
                return self.usable(p, verdict)
            if p.is_request and p.opcode == codec.NOOP:
                self.answer_noop(p)

    def usable(self, p: Packet, verdict: Any) -> Response:
        """The answer to a request of ours, or ConnectionLost when it says nothing we can act on."""
        if not isinstance(verdict.message, Response):
            raise ConnectionLost(f"{p.name} answer unusable: {verdict.reason}")
        return verdict.message

    def judge(self, p: Packet, offset: int) -> Any:
        if not p.is_request:
            self.awaiting.pop(p.opaque, None)
        verdict = self.conn.feed(PRODUCER, p, offset=offset)
        if verdict.kind is not Kind.ACCEPTED:
            self.violation(f"offset {offset}: {p.name}: {verdict.reason}")
        return verdict

    def violation(self, text: str) -> None:
        """Count and log a broken rule; RuleBroken unless the consumer keeps going."""
        run = self.run_state
        run.violation_count += 1
        if len(run.violations) < _KEEP_VIOLATIONS:
            run.violations.append(text)
            self.log(f"violation: {text}")
        if not self.config.keep_going:
            raise RuleBroken(text)

    def answer_noop(self, p: Packet) -> None:
        self.run_state.noops += 1
        self.send(codec.response(codec.NOOP, opaque=p.opaque))

    async def setup(self) -> None:
        cfg = self.config
        features = b"".join(f.to_bytes(2, "big") for f in (0x03, 0x07, 0x08))
        await self.call(
            codec.request(codec.HELLO, opaque=self.next_opaque(), key=cfg.name.encode(), value=features)
        )
        if cfg.user is not None:
            await self.authenticate(cfg.user, cfg.password)
            answer = await self.call(
                codec.request(codec.SELECT_BUCKET, opaque=self.next_opaque(), key=cfg.bucket.encode())
            )
            if answer.status != SUCCESS:
                raise Refused(f"SELECT_BUCKET {cfg.bucket} refused: {answer.status_name}")
        answer = await self.call(codec.open_request(cfg.name, codec.OPEN_PRODUCER, self.next_opaque()))
        if answer.status != SUCCESS:
            raise Refused(f"DCP_OPEN refused: {answer.status_name}")
        controls = []
        if cfg.noop_interval:
            controls += [("enable_noop", "true"), ("set_noop_interval", f"{cfg.noop_interval:g}")]
        if cfg.buffer_size:
            controls.append(("connection_buffer_size", str(cfg.buffer_size)))
        if cfg.stream_ids:
            controls.append(("enable_stream_id", "true"))
        for key, value in controls:
            answer = await self.call(codec.control_request(key, value, self.next_opaque()))
            if answer.status != SUCCESS:
                self.run_state.failures.append(f"control {key}={value}: {answer.status_name}")
        answer = await self.call(codec.request(codec.GET_ALL_VB_SEQNOS, opaque=self.next_opaque()))
        if answer.status != SUCCESS:
            raise ConnectionLost(f"GET_ALL_VB_SEQNOS refused: {answer.status_name}")
        self.high = dict(answer.vb_seqnos or [])

    async def authenticate(self, user: str, password: str) -> None:
        """SASL: the strongest SCRAM the producer lists (its signature checked), else PLAIN."""
        answer = await self.call(codec.request(codec.SASL_LIST_MECHS, opaque=self.next_opaque()))
        if answer.status != SUCCESS:
            raise ConnectionLost(f"SASL_LIST_MECHS refused: {answer.status_name}")
        offered = answer.value.decode("ascii", "replace").split()
        mechanism = sasl.choose(offered)
        if mechanism is None:
            raise Refused(f"no SASL mechanism in common: the producer offers {' '.join(offered) or 'none'}")
        refused = f"SASL {mechanism} as {user!r} refused"
        if mechanism == "PLAIN":
            message = sasl.plain_message(user, password)
            answer = await self.call(
                codec.request(codec.SASL_AUTH, opaque=self.next_opaque(), key=b"PLAIN", value=message)
            )
            if answer.status != SUCCESS:
                raise Refused(f"{refused}: {answer.status_name}")
            return
        scram = sasl.ScramClient(user, password, mechanism)
        key = mechanism.encode()
        answer = await self.call(
            codec.request(codec.SASL_AUTH, opaque=self.next_opaque(), key=key, value=scram.first())
        )
        if answer.status != codec.AUTH_CONTINUE:
            raise Refused(f"{refused}: {answer.status_name}")
        try:
            final = scram.final(answer.value)
            answer = await self.call(
                codec.request(codec.SASL_STEP, opaque=self.next_opaque(), key=key, value=final)
            )
            if answer.status != SUCCESS:
                raise Refused(f"{refused}: {answer.status_name}")
            scram.verify(answer.value)
        except sasl.AuthFailed as err:
            raise Refused(f"{refused}: {err}") from None

    def stream_request(self, vb: int) -> None:
        state = self.run_state.vbuckets.setdefault(vb, ConsumerVBucket(vb))
        end = FOREVER if self.config.follow else max(self.high.get(vb, 0), state.seqno)
        req = state.stream_request(end)
        if self.config.stream_ids:
            req.json = json.dumps({"sid": vb + 1}).encode()
        opaque = self.next_opaque()
        self.streams[opaque] = vb
        self.run_state.status[vb] = "requested"
        self.send(codec.stream_req_request(vb, opaque, req))

    async def stream_all(self) -> None:
        run = self.run_state
        wanted = self.config.vbuckets if self.config.vbuckets is not None else sorted(self.high)
        todo = [vb for vb in wanted if run.status.get(vb) not in ("done", "not_my_vbucket")]
        for vb in todo:
            self.stream_request(vb)
        await self.drain()
        self.open_count = len(todo)
        while self.open_count and not self.stop_requested:
            if self.due and self.due[0][0] <= time.monotonic():
                self.stream_request(heapq.heappop(self.due)[1])
            if not self.packets and not self.splitter.resync:
                self.take_run()
            item = self.buffered_packet()
            if item is None:
                await self.read_more()
                continue
            self.heard = time.monotonic()
            self.handle(*item)
            if self.link.transport.get_write_buffer_size() > 64 * 1024:
                await self.drain()
        await self.drain()

    async def read_more(self) -> None:
        """One read; the bytes wait in ``fresh`` for the run path, which joins them to the splitter's."""
        if self.link.transport.get_write_buffer_size() > 64 * 1024:
            await self.drain()
        data = await self.receive(self.due[0][0] if self.due else None)
        if data is None:
            return  # a stream request is due
        if not data:
            self.conn.end(PRODUCER)
            raise ConnectionLost("the producer closed the connection")
        self.splitter.buf += self.fresh
        self.fresh = data

    def buffered_packet(self) -> tuple[int, Packet] | None:
        """The next packet for the general path: one left from setup, else one from the buffer."""
        if self.packets:
            return self.packets.pop()
        fresh, self.fresh = self.fresh, b""
        try:
            got = self.splitter.feed(fresh, 1)
            return (got[0][0], decode_packet(got[0][1])) if got else None
        except ProtocolError as err:
            self.violation(str(err))
            raise ConnectionLost(str(err)) from None

    def take_run(self) -> None:
        """Judge and apply the stream messages at the head of the buffer in one pass (``feed_run``).

        The copy is written per stream and run, and the flow-control buffer is
        acknowledged per run, not per item.
        """
        splitter = self.splitter
        buf, fresh = splitter.buf, self.fresh
        head = bytes(buf[:12]) + fresh[:12]
        if len(buf) + len(fresh) < HEADER_SIZE + max(8, int.from_bytes(head[8:12], "big")):
            return  # not even one whole packet yet (a large one is not copied again per read)
        if head[0] != codec.REQ or head[1] not in _RUN_OPCODES:
            return  # the run path would not take it (a noop, a stream end, a stream id): no copy
        # What the splitter holds (normally the end of a packet) and what came, as one bytes.
        data = bytes(buf) + fresh if buf else fresh
        end, taken = self.conn.feed_run(data, 0, splitter.max_body)
        if not end:
            return
        self.fresh = b""
        splitter.rebuffer(data, end)
        self.heard = time.monotonic()
        run = self.run_state
        completed = False
        for stream_run in taken:
            vb = self.streams.get(stream_run.opaque)
            if vb is None:
                continue
            state = run.vbuckets[vb]
            items, done, acks = state.apply_run(stream_run)
            run.items += items
            if items:
                self.progress(vb, state.seqno)
            completed = completed or done
            for _ in range(acks):
                self.send(codec.response(codec.SNAPSHOT_MARKER, opaque=stream_run.opaque))
        if completed:
            self.persist()
        self.count_unacked(end)

    def count_unacked(self, size: int) -> None:
        """Stream bytes taken; a BUFFER_ACK once half the window is used."""
        buffer_size = self.config.buffer_size
        if buffer_size:
            self.unacked += size
            if self.unacked >= buffer_size // 2:
                self.run_state.acks += 1
                self.send(codec.buffer_ack(self.unacked))
                self.unacked = 0

    def handle(self, offset: int, p: Packet) -> None:
        """One packet by the general path: the core's verdict, then what it means for the copy."""
        run = self.run_state
        verdict = self.judge(p, offset)
        msg = verdict.message
        if not p.is_request:
            vb = self.streams.get(p.opaque)
            if vb is not None and run.status.get(vb) == "requested":  # its stream request's answer
                self.open_count -= self.stream_answer(p, self.usable(p, verdict))
            return
        op = p.opcode
        if op == codec.NOOP:
            self.answer_noop(p)
            return
        self.count_unacked(p.size)
        vb = self.streams.get(p.opaque)
        if vb is None or msg is None:
            return
        state = run.vbuckets[vb]
        if op in _ITEM_OPCODES:
            run.items += 1
            if state.apply(msg.seqno, msg.key, op, msg.value):
                self.persist()
            self.progress(vb, state.seqno)
        elif op == codec.SNAPSHOT_MARKER:
            state.marker(msg.start, msg.end)
            if msg.flags & codec.SNAP_ACK:
                self.send(codec.response(codec.SNAPSHOT_MARKER, opaque=p.opaque))
        elif op == codec.SEQNO_ADVANCED:
            state.seqno = msg.seqno
            if state.complete(msg.seqno):
                self.persist()
        elif op == codec.STREAM_END:
            reason = msg.reason_name
            run.stream_ends[reason] = run.stream_ends.get(reason, 0) + 1
            del self.streams[p.opaque]
            if msg.reason == codec.END_OK:
                run.status[vb] = "done"
                self.open_count -= 1
                self.persist(force=True)
            else:
                self.open_count -= self.ask_again(vb, f"stream end {reason}")

    def stream_answer(self, p: Packet, msg: Any) -> int:
        """A STREAM_REQ's answer; returns 1 when the vbucket's stream will not come (closed here)."""
        vb = self.streams[p.opaque]
        run = self.run_state
        state = run.vbuckets[vb]
        if msg.status == SUCCESS:
            state.failover = list(msg.failover_log or [])
            run.status[vb] = "streaming"
            return 0
        del self.streams[p.opaque]
        if msg.status == codec.ROLLBACK:
            point = state.rollback(msg.rollback_seqno or 0)
            self.log(f"vbucket {vb}: rollback to {msg.rollback_seqno}: truncated to seqno {point}")
            self.persist(force=True)
            return self.ask_again(vb, f"rollback to {msg.rollback_seqno}")
        if msg.status == codec.NOT_MY_VBUCKET:
            run.status[vb] = "not_my_vbucket"
        else:
            run.status[vb] = "error"
            run.failures.append(f"vbucket {vb}: stream request {msg.status_name}")
        return 1

    def progress(self, vb: int, seqno: int) -> None:
        """A new highest seqno for ``vb`` restarts its count of requests in a row.

        Items seen before (a stream that rolls back to 0 and sends item 1 again and
        again) are no progress.
        """
        if seqno > self.reached.get(vb, 0):
            self.reached[vb] = seqno
            self.asked[vb] = 0

    def ask_again(self, vb: int, why: str) -> int:
        """Request ``vb``'s stream again after a pause that grows; returns 1 when it is given up instead."""
        asked = self.asked.get(vb, 0) + 1
        self.asked[vb] = asked
        state = self.run_state.vbuckets[vb]
        if asked > self.config.stream_retries:
            self.run_state.status[vb] = "error"
            again = asked - 1
            failure = (
                f"vbucket {vb}: {why}; given up after asking again {again} times in a row with no new seqno"
            )
            self.run_state.failures.append(failure)
            self.log(failure)
            return 1
        pause = 0.0 if asked == 1 else min(RETRY_PAUSE * 2 ** (asked - 2), RETRY_PAUSE_MAX)
        self.log(
            f"vbucket {vb}: {why}; asking again from seqno {state.seqno}"
            + (f" in {pause:g} s" if pause else "")
        )
        if pause:
            self.run_state.status[vb] = "waiting"
            heapq.heappush(self.due, (time.monotonic() + pause, vb))
        else:
            self.stream_request(vb)
        return 0

    def summary(self) -> dict[str, Any]:
        run = self.run_state
        live = self.write_out()
        vbs = []
        for vb in sorted(run.vbuckets):
            s = run.vbuckets[vb]
            vbs.append(
                {
                    "vbucket": vb,
                    "status": run.status.get(vb, "resumable"),
                    "uuid": s.failover[0][0] if s.failover else 0,
                    "seqno": s.seqno,
                    "snapshot": [s.snap_start, s.snap_end],
                    "items_received": s.items,
                    "live_items": len(s.state()),
                    "rollbacks": s.rollbacks,
                }
            )
        return {
            "ok": not run.failures and not run.violation_count,
            "connections": run.connections,
            "items_received": run.items,
            "live_items": live,
            "noops_answered": run.noops,
            "buffer_acks": run.acks,
            "stream_ends": run.stream_ends,
            "rollbacks": sum(v["rollbacks"] for v in vbs),
            "violations": run.violation_count,
            "violation_list": run.violations,
            "failures": run.failures,
            "vbuckets": vbs,
            "seconds": round(time.monotonic() - self.started, 3),
            "stream_seconds": round(self.stream_seconds, 3),
            "items_per_second": round(run.items / self.stream_seconds, 1) if self.stream_seconds else 0.0,
        }
