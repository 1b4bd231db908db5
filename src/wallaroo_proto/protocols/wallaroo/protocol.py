"""The sans-IO protocol core: connection and stream state machines.

One ``Connection`` follows one TCP connection of either use of the protocol:

* source use: the connector sends HELLO, NOTIFY, MESSAGE, EOS_MESSAGE and the
  worker sends OK, NOTIFY_ACK, ACK, RESTART;
* sink use: the roles are reversed (the worker sends the data frames) and
  stream 0 carries two-phase-commit messages in both directions.

Feed it every frame with the side that sent it. It answers with an
``Outcome``: accepted, a replay to drop, ignored (in flight when the other side
closed), or a violation with a readable reason. A live peer answers a
violation with ERROR and a close; an observer such as the dissector records it.
No sockets, no clocks, no files.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum
from operator import itemgetter

from .errors import ProtocolError
from .frames import (
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
    WorkersLeft,
    show_text,
)
from .twopc import (
    TWOPC_STREAM,
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    TwoPCMessage,
    TwoPCWorkersLeft,
    decode_twopc,
)


class Side(Enum):
    CONNECTOR = "connector"
    WORKER = "worker"

    @property
    def other(self) -> Side:
        return Side.WORKER if self is Side.CONNECTOR else Side.CONNECTOR


class Use(Enum):
    SOURCE = "source"
    SINK = "sink"


class ConnState(Enum):
    CONNECTED = "Connected"
    HANDSHAKE = "Handshake"
    STREAMING = "Streaming"
    ERROR = "Error"
    DISCONNECTED = "Disconnected"


class StreamState(Enum):
    START = "Start"
    NOTIFY_SENT = "Notify-Sent"
    OPEN = "Open"
    CLOSED = "Closed"
    TERMINATED = "Terminated"


class Verdict(Enum):
    ACCEPTED = "accepted"
    #: A MESSAGE whose id is not above the last one seen: dropped, as the shipped worker does.
    REPLAYED = "replayed"
    #: Sent before the other side's ERROR or RESTART reached the sender: discarded.
    IGNORED = "ignored"
    VIOLATION = "violation"


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    reason: str = ""
    frame_index: int = -1
    #: The decoded 2PC message, when the frame was a stream-0 MESSAGE of the sink protocol.
    twopc: TwoPCMessage | None = None

    @property
    def is_violation(self) -> bool:
        return self.verdict is Verdict.VIOLATION


ACCEPTED = Outcome(Verdict.ACCEPTED)


@dataclass(slots=True)
class StreamRecord:
    stream_id: int
    name: Text = ""
    state: StreamState = StreamState.START
    #: Point of reference the NOTIFY_ACK told the connector to resume from.
    resume_from: int | None = None
    last_message_id: int | None = None
    last_acked: int | None = None
    messages: int = 0
    replays: int = 0
    #: NOTIFYs sent while the stream was pending or open: the worker refuses each (shipped
    #: behaviour) with a NOTIFY_ACK success=0 that leaves the stream as it was.
    refusals_due: int = 0


_STREAM_ID = itemgetter(0)
_MESSAGE_ID = itemgetter(1)
_ONLY_MESSAGES = {Message}

# Which side of each use sends the data frames.
_DATA_SIDE = {Use.SOURCE: Side.CONNECTOR, Use.SINK: Side.WORKER}
_DATA_FRAMES = (Hello, Notify, Message, EosMessage)
_CONTROL_FRAMES = (Ok, NotifyAck, Ack, Restart)
# 2PC messages and who sends them: the worker drives, the connector sink replies.
_TWOPC_SENDER = {
    ListUncommitted: Side.WORKER,
    Phase1: Side.WORKER,
    Phase2: Side.WORKER,
    TwoPCWorkersLeft: Side.WORKER,
    ReplyUncommitted: Side.CONNECTOR,
    Reply: Side.CONNECTOR,
}


@dataclass(slots=True)
class Connection:
    """State of one connection, seen from both ends at once."""

    use: Use = Use.SOURCE
    #: Let frames through with no credit left (counted in ``overdraft``) instead of a violation.
    lenient_credits: bool = False
    state: ConnState = ConnState.CONNECTED
    hello: Hello | None = None
    #: Credits the data side holds; None until OK grants them.
    credits: int | None = None
    overdraft: int = 0
    frame_index: int = 0
    streams: dict[int, StreamRecord] = field(default_factory=dict)
    #: The txn between its PHASE1 and its PHASE2, during which no application data may flow.
    phase1_txn: Text | None = None
    #: Undecided txns (in phase 1, or listed uncommitted), for checking REPLYs; bounded by
    #: what is undecided, not by the connection's age.
    undecided_txns: set = field(default_factory=set)
    #: The txn the last PHASE2 decided: a sink may REPLY to a PHASE2 too.
    last_decided_txn: Text | None = None
    #: Txns the sink listed in REPLY_UNCOMMITTED that no PHASE2 settled yet: until then
    #: the worker may send no application data and start no round.
    unsettled_listed: set = field(default_factory=set)
    closed_by: Side | None = None
    _data_side: Side = field(init=False, repr=False)

    @property
    def data_side(self) -> Side:
        """The side that sends HELLO and the data frames in this use."""
        return self._data_side

    def stream(self, stream_id: int) -> StreamRecord:
        record = self.streams.get(stream_id)
        if record is None:
            record = self.streams[stream_id] = StreamRecord(stream_id)
        return record

    def connection_lost(self) -> None:
        """The transport closed: the machine goes to Disconnected."""
        if self.state is not ConnState.ERROR:
            self.state = ConnState.DISCONNECTED

    def __post_init__(self) -> None:
        self._data_side = _DATA_SIDE[self.use]

    def process(self, frame: Frame, sender: Side) -> Outcome:
        """Apply one frame sent by ``sender``; the state changes only if it is legal."""
        index = self.frame_index
        self.frame_index = index + 1
        frame_type = type(frame)

        # Fast path for the bulk of any session: the next MESSAGE on an open stream.
        # Anything unusual falls through to the full rules below.
        if frame_type is Message and sender is self._data_side and self.state is ConnState.STREAMING:
            record = self.streams.get(frame.stream_id)
            credits = self.credits
            if (
                record is not None
                and record.state is StreamState.OPEN
                and self.phase1_txn is None
                and not self.unsettled_listed
                and credits is not None
                and credits > 0
                and (frame.stream_id != TWOPC_STREAM or self.use is Use.SOURCE)
            ):
                last = record.last_message_id
                if last is None or frame.message_id > last:
                    record.last_message_id = frame.message_id
                    record.messages += 1
                    self.credits = credits - 1
                    return ACCEPTED

        if self.state is ConnState.ERROR or self.state is ConnState.DISCONNECTED:
            ended_by = "ERROR" if self.state is ConnState.ERROR else "RESTART or close"
            if sender is self.closed_by:
                return self._violation(index, f"{frame.TYPE.name} sent after its own {ended_by}")
            return Outcome(
                Verdict.IGNORED, f"{frame.TYPE.name} arrived after the {ended_by}; discarded", index
            )
        if frame_type is Error:
            self.state = ConnState.ERROR
            self.closed_by = sender
            return ACCEPTED

        data_side = self._data_side
        if frame_type is WorkersLeft:
            if sender is not Side.WORKER:
                return self._violation(index, "Invalid message: WORKERS_LEFT may only be sent by the worker")
        elif isinstance(frame, _DATA_FRAMES):
            if sender is not data_side and not (
                frame_type is Message and self.use is Use.SINK and frame.stream_id == TWOPC_STREAM
            ):
                return self._violation(
                    index, f"Invalid message: {frame.TYPE.name} may only be sent by the {data_side.value}"
                )
        elif sender is data_side:
            return self._violation(
                index, f"Invalid message: {frame.TYPE.name} may only be sent by the {data_side.other.value}"
            )

        if frame_type is Hello:
            if self.state is not ConnState.CONNECTED:
                return self._violation(
                    index, f"HELLO in state {self.state.value}: the handshake happens once"
                )
            self.state = ConnState.HANDSHAKE
            self.hello = frame
            return ACCEPTED
        if frame_type is Ok:
            if self.state is not ConnState.HANDSHAKE:
                return self._violation(index, f"OK in state {self.state.value}: OK answers the HELLO only")
            self.state = ConnState.STREAMING
            self.credits = frame.initial_credits
            return ACCEPTED
        if self.state is ConnState.CONNECTED:
            return self._violation(index, f"{frame.TYPE.name} before HELLO")
        if self.state is ConnState.HANDSHAKE and not (self.use is Use.SINK and sender is data_side):
            # The shipped worker pipelines NOTIFY and LIST_UNCOMMITTED behind its HELLO to a sink.
            return self._violation(index, f"{frame.TYPE.name} before the handshake completed with OK")

        spends = sender is data_side and self.credits is not None
        if spends and self.credits <= 0 and self.use is Use.SOURCE and not self.lenient_credits:
            return self._violation(index, f"{frame.TYPE.name} sent with no credits left")
        outcome = self._apply(frame, frame_type, sender, index)
        if spends and not outcome.is_violation:
            if self.credits > 0:
                self.credits -= 1
            else:
                self.overdraft += 1
        return outcome

    def process_run(self, run: list[Message], sender: Side) -> bool:
        """Accept a run of MESSAGEs in one step, or change nothing and return False.

        True only when the per-frame fast path would accept every frame of the run:
        all MESSAGEs on one open stream, ids strictly rising and above the last seen,
        credit for all of them, no 2PC round in the way. Otherwise the caller feeds the
        run to ``process`` frame by frame, which gives each frame its own verdict.
        The checks are passes in C over the run, not a Python step per frame.
        """
        n = len(run)
        if n == 0 or sender is not self._data_side or self.state is not ConnState.STREAMING:
            return False
        stream_id = run[0][0]
        record = self.streams.get(stream_id)
        credits = self.credits
        if (
            record is None
            or record.state is not StreamState.OPEN
            or self.phase1_txn is not None
            or self.unsettled_listed
            or credits is None
            or credits < n
            or (stream_id == TWOPC_STREAM and self.use is Use.SINK)
            or set(map(type, run)) != _ONLY_MESSAGES
            or set(map(_STREAM_ID, run)) != {stream_id}
        ):
            return False
        ids = list(map(_MESSAGE_ID, run))
        first, last_id = ids[0], ids[-1]
        last = record.last_message_id
        if last is not None and first <= last:
            return False
        # Strictly rising: consecutive (the usual case, one comparison with a range), or
        # equal to its own sorted set of distinct values.
        if ids != list(range(first, first + n)) and ids != sorted(set(ids)):
            return False
        record.last_message_id = last_id
        record.messages += n
        self.credits = credits - n
        self.frame_index += n
        return True

    def _apply(self, frame: Frame, frame_type: type, sender: Side, index: int) -> Outcome:
        if frame_type is Message:
            return self._message(frame, sender, index)
        if frame_type is Ack:
            return self._ack(frame, index)
        if frame_type is Notify:
            record = self.stream(frame.stream_id)
            if record.state is StreamState.NOTIFY_SENT or record.state is StreamState.OPEN:
                # The spec lists NOTIFY only in Start and Closed; the shipped worker answers a
                # repeat with NOTIFY_ACK success=0 and the stream stays as it was.
                record.refusals_due += 1
                return Outcome(
                    Verdict.ACCEPTED,
                    f"NOTIFY for stream {frame.stream_id}, which is already {record.state.value} "
                    "on this connection: to be refused",
                    index,
                )
            record.state = StreamState.NOTIFY_SENT
            record.name = frame.stream_name
            return ACCEPTED
        if frame_type is NotifyAck:
            record = self.streams.get(frame.stream_id)
            if record is not None and record.state is StreamState.OPEN and record.refusals_due:
                if frame.success:
                    return self._violation(
                        index, f"NOTIFY_ACK success=1 for stream {frame.stream_id}, which is already open"
                    )
                record.refusals_due -= 1
                return ACCEPTED
            if record is None or record.state is not StreamState.NOTIFY_SENT:
                return self._violation(
                    index, f"NOTIFY_ACK for stream {frame.stream_id}, which has no NOTIFY pending"
                )
            record.state = StreamState.OPEN if frame.success else StreamState.CLOSED
            record.resume_from = frame.point_of_ref
            record.last_message_id = None
            return ACCEPTED
        if frame_type is EosMessage:
            record = self.streams.get(frame.stream_id)
            if record is None or record.state is not StreamState.OPEN:
                state = record.state.value if record else "never notified"
                return self._violation(
                    index, f"EOS_MESSAGE for stream {frame.stream_id}, which is not open ({state})"
                )
            record.state = StreamState.CLOSED
            return ACCEPTED
        if frame_type is Restart:
            for record in self.streams.values():
                record.state = StreamState.TERMINATED
            self.state = ConnState.DISCONNECTED
            self.closed_by = sender
            return ACCEPTED
        return ACCEPTED  # WORKERS_LEFT: informational

    def _unsettled(self) -> str:
        listed = ", ".join(repr(show_text(t)) for t in sorted(self.unsettled_listed, key=show_text))
        return f"before the listed uncommitted txn(s) {listed} were settled by PHASE2"

    def _violation(self, index: int, reason: str) -> Outcome:
        return Outcome(Verdict.VIOLATION, reason, index)

    def _message(self, frame: Message, sender: Side, index: int) -> Outcome:
        stream_id = frame.stream_id
        if self.use is Use.SINK and stream_id == TWOPC_STREAM:
            return self._twopc(frame, sender, index)
        record = self.streams.get(stream_id)
        if record is None or record.state is not StreamState.OPEN:
            state = record.state.value if record else "never notified"
            return self._violation(
                index,
                f"Bad/unregistered stream_id {stream_id} with message_id {frame.message_id} "
                f"(stream is {state}; MESSAGE needs a successful NOTIFY_ACK first)",
            )
        if self.phase1_txn is not None:
            return self._violation(
                index,
                f"application MESSAGE on stream {stream_id} between PHASE1 of txn "
                f"{show_text(self.phase1_txn)!r} and its PHASE2",
            )
        if self.unsettled_listed:
            return self._violation(index, f"application MESSAGE on stream {stream_id} {self._unsettled()}")
        last = record.last_message_id
        if last is not None and frame.message_id <= last:
            record.replays += 1
            return Outcome(
                Verdict.REPLAYED, f"message_id {frame.message_id} is not above the last seen {last}", index
            )
        record.last_message_id = frame.message_id
        record.messages += 1
        return ACCEPTED

    def _twopc(self, frame: Message, sender: Side, index: int) -> Outcome:
        try:
            msg = decode_twopc(frame.payload)
        except ProtocolError as err:
            return self._violation(index, f"bad 2PC payload on stream 0: {err}")
        expected = _TWOPC_SENDER[type(msg)]
        name = msg.TAG.name
        if sender is not expected:
            return self._violation(index, f"2PC {name} may only be sent by the {expected.value}")
        if isinstance(msg, Phase1):
            if self.unsettled_listed:
                return self._violation(index, f"PHASE1 of txn {show_text(msg.txn_id)!r} {self._unsettled()}")
            if self.phase1_txn is not None:
                return self._violation(
                    index,
                    f"PHASE1 of txn {show_text(msg.txn_id)!r} while txn "
                    f"{show_text(self.phase1_txn)!r} awaits its PHASE2",
                )
            self.phase1_txn = msg.txn_id
            self.undecided_txns.add(msg.txn_id)
        elif isinstance(msg, Phase2):
            if self.phase1_txn == msg.txn_id:
                self.phase1_txn = None
            elif self.phase1_txn is not None:
                return self._violation(
                    index,
                    f"PHASE2 of txn {show_text(msg.txn_id)!r} while txn "
                    f"{show_text(self.phase1_txn)!r} awaits its PHASE2",
                )
            self.undecided_txns.discard(msg.txn_id)
            self.unsettled_listed.discard(msg.txn_id)
            self.last_decided_txn = msg.txn_id
            if not msg.commit:
                # After an abort the worker re-sends from the last committed offset:
                # lower ids on the data streams are a legitimate re-send, not a replay.
                for record in self.streams.values():
                    record.last_message_id = None
        elif isinstance(msg, ReplyUncommitted):
            self.undecided_txns.update(msg.txn_ids)
            self.unsettled_listed.update(msg.txn_ids)
        elif (
            isinstance(msg, Reply)
            and msg.txn_id not in self.undecided_txns
            and msg.txn_id != self.last_decided_txn
        ):
            return self._violation(
                index, f"REPLY for txn {show_text(msg.txn_id)!r}, which no PHASE1 or PHASE2 named"
            )
        return Outcome(Verdict.ACCEPTED, "", index, msg)

    def _ack(self, frame: Ack, index: int) -> Outcome:
        for stream_id, _ in frame.acks:
            record = self.streams.get(stream_id)
            if record is None or record.state is StreamState.START:
                return self._violation(
                    index, f"ACK for stream {stream_id}, which was never notified on this connection"
                )
        for stream_id, point_of_ref in frame.acks:
            self.streams[stream_id].last_acked = point_of_ref
        if self.credits is not None:
            self.credits += frame.credits
        return ACCEPTED


def check_hello(hello: Hello, *, version: str, cookie: bytes) -> str | None:
    """The shipped worker's handshake check: None if accepted, else the ERROR reason.

    The cookie is compared in constant time.
    """
    if hello.version != version:
        return f"Unknown protocol version: {show_text(hello.version)}"
    if not hmac.compare_digest(hello.cookie, cookie):
        return "Bad cookie"
    return None
