"""The mock language binding: a counter immortal for people who build an IC.

It connects to the IC's receive port, then its send port (the order the IC
requires), and follows the IC's records: on a first start it sends its
InitialMessage and first checkpoint; on a recovery it loads the checkpoint
record's bytes and replays the records after it; it answers every checkpoint
request with its state, applies each RPC to the counter (``immortal.Counter``)
and sends the self calls that makes (those of the records in one read
together, in one RPCBatch). Every record is judged by the shared rules as it
comes (check bytes included, which real bindings skip); the plain RPCs of one
read are applied together, in order, before anything else is done. A
violation is reported and the record still applied, as a binding that trusts
its IC would.
It ends when the IC closes the send port.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wallaroo_proto.judge import End, Kind
from wallaroo_proto.write_watch import WriteWatch, reset

from .codec import (
    CHECKPOINT,
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    COUNT_REPLAYABLE_RPC_BATCH,
    DEFAULT_MAX_RECORD,
    INITIAL_MESSAGE,
    RPC,
    RPC_BATCH,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_SERVICE,
    UPGRADE_TAKE_CHECKPOINT,
    Blob,
    Garbage,
    Incomplete,
    MalformedError,
    Message,
    RecordFrame,
    RecordSplitter,
    batch_messages,
    encode_batch,
    encode_message,
    read_zz,
    type_name,
    zz64,
)
from .core import IC, LB, Session
from .immortal import Counter

_ASKS = (TAKE_CHECKPOINT, TAKE_BECOMING_PRIMARY_CHECKPOINT, UPGRADE_TAKE_CHECKPOINT)


@dataclass
class LbConfig:
    host: str = "127.0.0.1"
    receive_port: int = 0  # the IC's: where this LB sends
    send_port: int = 0  # the IC's: where this LB reads records
    send_host: str | None = None  # the send port's host, when not ``host``
    connect_timeout: float = 10.0
    initial_message: bytes = b"wallaroo-proto mock-lb"
    ask_checkpoint_every: int = 0
    write_timeout: float = 30.0
    log: Callable[[str], None] = lambda line: None
    #: Lines only a verbose run shows: connections made, checkpoints sent and loaded.
    trace: Callable[[str], None] = lambda line: None


@dataclass
class LbStats:
    records: int = 0
    replayed: int = 0
    rpcs: int = 0
    self_calls: int = 0
    checkpoints_sent: int = 0
    checkpoints_loaded: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    start: str = ""
    upgraded: bool = False
    lost: str = ""  # how the IC's sockets failed under us, if they did
    seconds: float = 0.0


class IcUnreachable(Exception):
    """A port of the IC did not take a connection within ``connect_timeout``."""


class MockLB:
    def __init__(self, config: LbConfig) -> None:
        self.config = config
        self.counter = Counter()
        self.session = Session()
        self.stats = LbStats()
        self.writer: asyncio.StreamWriter | None = None
        self._watch: WriteWatch | None = None
        self._blob: list[bytes] = []
        self._since_ask = 0
        self._self_calls: list[bytes] = []  # made, not yet sent
        # plain RPCs read (and judged), applied together before anything else happens
        self._methods: list[bytes] = []
        self._args: list[bytes] = []
        #: A rule break planted for fuzz's tests only (``tests/test_fuzz_ambrosia.py``), never set otherwise.
        self._plant = os.environ.get("WALLAROO_PROTO_PLANT")

    async def _connect(
        self, which: str, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect, retrying (the IC may not be up yet) for ``connect_timeout`` seconds at most."""
        timeout = self.config.connect_timeout
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    return await asyncio.open_connection(host, port)
            except (OSError, TimeoutError) as err:
                if time.monotonic() + delay > deadline:
                    reason = (os.strerror(err.errno) if getattr(err, "errno", None) else "") or "no answer"
                    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                    raise IcUnreachable(
                        f"cannot connect to the IC's {which} {address}: {reason} (tried for {timeout:g} s)"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def run(self) -> LbStats:
        """Connect (receive port first), follow the IC's records until it closes the send port."""
        cfg = self.config
        _, self.writer = await self._connect("receive port", cfg.host, cfg.receive_port)
        cfg.trace(f"connected to the IC's receive port {cfg.host}:{cfg.receive_port}")
        try:
            reader, send_writer = await self._connect("send port", cfg.send_host or cfg.host, cfg.send_port)
        except IcUnreachable:
            self.writer.close()
            raise
        cfg.trace(f"connected to the IC's send port {cfg.send_host or cfg.host}:{cfg.send_port}")
        if self.config.write_timeout:

            def stalled(why: str) -> None:  # the IC reads none of our messages: both sockets reset
                self.stats.lost = why
                for writer in (self.writer, send_writer):
                    reset(writer.transport)

            self._watch = WriteWatch(self.writer.transport, self.config.write_timeout, stalled, "the IC")
        splitter = RecordSplitter()
        start = time.perf_counter()
        try:
            while True:
                data = await reader.read(1 << 18)
                if not data or self.stats.lost:
                    break
                for frame in splitter.feed(data):
                    if type(frame) is RecordFrame:
                        if self._record(frame, splitter.max_size):
                            self._flush_self_calls()
                            return self.stats
                    elif type(frame) is Blob:
                        self._blob.append(frame.data)
                        if not frame.remaining:
                            self._load(b"".join(self._blob))
                    elif type(frame) is Garbage:
                        self._violations((f"framing: {frame.reason} (stream offset {frame.offset})",))
                        self._flush_self_calls()
                        return self.stats
                self._flush_self_calls()
                await self.writer.drain()
                if self.stats.lost:
                    break
            pending = splitter.pending
            how = End.CUT if pending else End.CLOSED
            verdict = (
                None if self.stats.lost else self.session.end(IC, how, pending, blob_left=splitter.blob_left)
            )
            if verdict is not None:
                self._violations(verdict.violations)
        except ConnectionError as err:
            self.stats.lost = self.stats.lost or f"the IC's socket failed: {err.strerror or err}"
        finally:
            if self.stats.lost:
                self.config.log(self.stats.lost)
            if self._watch is not None:
                self._watch.stop()
            self.stats.seconds = time.perf_counter() - start
            self.writer.close()
            send_writer.close()
        return self.stats

    def _violations(self, reasons: tuple[str, ...]) -> None:
        for reason in reasons:
            self.stats.violations.append(reason)
            self.config.log(f"violation: {reason}")

    def _record(self, frame: RecordFrame, max_blob: int = DEFAULT_MAX_RECORD) -> bool:
        """Judge and apply one record; True when the stream cannot be followed further."""
        header = frame.header
        verdict, rpcs = self.session.from_ic_rpcs(header, frame.body)
        if verdict.violations:
            self._violations(
                tuple(f"record {header.seq} at stream offset {frame.offset}: {v}" for v in verdict.violations)
            )
        stats = self.stats
        if rpcs is not None:  # plain RPCs, read in one pass: applied with the rest of this read's
            methods, args = rpcs
            stats.records += 1
            stats.rpcs += len(args)
            if verdict.kind is Kind.REPLAYED:
                stats.replayed += 1
            self._methods.append(methods)
            self._args += args
            self._asked_every()
            return False
        self._apply_pending()
        seq = header.seq
        if seq == CONTROL_SEQ:
            if len(verdict.messages) == 1:
                self._control(verdict.messages[0].type)
            return False
        if seq == CHECKPOINT_SEQ:
            self.stats.start = self.stats.start or "recovery"
            self._blob.clear()
            size = _blob_len(verdict.messages[0].data) if len(verdict.messages) == 1 else -1
            if size > max_blob:  # held in memory to be loaded: refused, not buffered
                self._violations(
                    (f"checkpoint-message: a checkpoint of {size} bytes is above the {max_blob}-byte limit",)
                )
                return True
            if size == 0:
                self._load(b"")
            return False
        stats.records += 1
        if verdict.kind is Kind.REPLAYED:
            stats.replayed += 1
        out = self._messages(verdict.messages)
        if out:
            stats.self_calls += len(out)
            self._self_calls += out
        self._asked_every()
        return False

    def _asked_every(self) -> None:
        """``--ask-checkpoint-every``: the LB's own TakeCheckpoint after so many records."""
        every = self.config.ask_checkpoint_every
        if every:
            self._since_ask += 1
            if self._since_ask >= every:
                self._since_ask = 0
                self._send(Message(TAKE_CHECKPOINT, b""))

    def _apply_pending(self) -> None:
        """Apply the plain RPCs read so far, in order, in one ``apply_many`` (the per-call costs are
        paid once a read, not once a record); their self calls queue to be sent."""
        if self._args:
            out = self.counter.apply_many(b"".join(self._methods), self._args)
            self._methods = []
            self._args = []
            if out:
                self.stats.self_calls += len(out)
                self._self_calls += out

    def _messages(self, messages: tuple[Message, ...]) -> list[bytes]:
        """A record's messages applied one by one: the self calls they make."""
        out: list[bytes] = []
        for msg in messages:
            kind = msg.type
            if kind == RPC:
                self._apply(msg.data, out)
            elif kind in (RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH):
                try:
                    for inner in batch_messages(msg)[2]:
                        if inner.type == RPC:
                            self._apply(inner.data, out)
                except MalformedError:
                    pass
            elif kind == INITIAL_MESSAGE:
                self.counter.initialized = True
        return out

    def _apply(self, data: bytes, out: list[bytes]) -> None:
        """An incoming RPC's data: reserved byte, method id, RPC type, args."""
        try:
            if data[1] < 0x80:  # a one-byte method id: the common case, read inline
                method, pos = (data[1] >> 1) ^ -(data[1] & 1), 2
            else:
                method, pos = read_zz(data, 1, len(data))
            args = data[pos + 1 :]
        except (IndexError, MalformedError, Incomplete):
            return  # judged a violation already
        self.stats.rpcs += 1
        call = self.counter.apply(method, args)
        if call:
            out.append(call)

    def _control(self, kind: int) -> None:
        name = type_name(kind)
        self.stats.requests[name] = self.stats.requests.get(name, 0) + 1
        if kind == TAKE_BECOMING_PRIMARY_CHECKPOINT and not self.stats.start:
            self.stats.start = "first start"
            self._send(Message(INITIAL_MESSAGE, self.config.initial_message))
        if kind in (UPGRADE_SERVICE, UPGRADE_TAKE_CHECKPOINT):
            self.stats.upgraded = True  # the counter's code and state are the same in both versions
        if kind in _ASKS:
            blob = self.counter.snapshot()
            self._send(Message(CHECKPOINT, zz64(len(blob))), blob)
            if kind == TAKE_CHECKPOINT and self._plant == "lb-checkpoint-twice":
                self._send(Message(CHECKPOINT, zz64(len(blob))), blob)
            self.stats.checkpoints_sent += 1
            self.config.trace(f"{name} answered with a checkpoint of {len(blob)} bytes")

    def _flush_self_calls(self, then: bytes = b"") -> None:
        """The self calls made since the last flush, in one RPCBatch (one send for many records),
        and ``then`` after them in the same write."""
        self._apply_pending()
        calls = self._self_calls
        if calls:
            then = (calls[0] if len(calls) == 1 else encode_batch(calls)) + then
            calls.clear()
        if then:
            if self._watch is not None:
                self._watch.wrote(len(then))
            self.writer.write(then)

    def _send(self, message: Message, blob: bytes = b"") -> None:
        """A message of the LB's own protocol steps, judged like the IC would judge it, then sent.

        Self calls made before it go first: a checkpoint must follow the calls its state made."""
        self._apply_pending()
        verdict = self.session.feed(LB, message)
        if not verdict.ok:
            self._violations(verdict.violations)
        self._flush_self_calls(encode_message(message.type, message.data) + blob)

    def _load(self, blob: bytes) -> None:
        self._apply_pending()
        try:
            self.counter = Counter.load(blob)
        except ValueError as err:
            self._violations((f"checkpoint bytes are not a counter's state: {err}",))
            self.counter = Counter()
        self.stats.checkpoints_loaded += 1
        self.config.trace(f"checkpoint of {len(blob)} bytes loaded")
        self._blob.clear()

    def summary(self) -> dict:
        s = self.stats
        return {
            "start": s.start or "none",
            "records": s.records,
            "replayed": s.replayed,
            "rpcs": s.rpcs,
            "self_calls": s.self_calls,
            "checkpoints_sent": s.checkpoints_sent,
            "checkpoints_loaded": s.checkpoints_loaded,
            "requests": s.requests,
            "upgraded": s.upgraded,
            "violations": s.violations,
            "lost": s.lost,
            "state": self.counter.state(),
            "seconds": round(s.seconds, 6),
        }


def _blob_len(data: bytes) -> int:
    try:
        return read_zz(data, 0, len(data), 64)[0]
    except (Incomplete, MalformedError):
        return -1
