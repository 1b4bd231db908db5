"""The sans-IO protocol core: connection and stream state machines.

One ``Connection`` follows one TCP connection of either use of the protocol:

* source use: the connector sends HELLO, NOTIFY, MESSAGE, EOS_MESSAGE and the
  worker sends OK, NOTIFY_ACK, ACK, RESTART;
* sink use: the roles are reversed (the worker sends the data frames) and
  stream 0 carries two-phase-commit messages in both directions.

It keeps the judge contract (``wallaroo_proto.judge``): ``feed(side, frame)`` with
every frame and the side that sent it, ``end(side, how)`` when the transport closes,
``expects()`` for what may come next. ``feed`` answers a ``Verdict``: accepted, a
replay to drop, ignored (in flight when the other side closed), or a violation
naming its rule (``RULES``) with a readable reason. The state machines are tables
(``CONNECTION_TRANSITIONS``, ``STREAM_TRANSITIONS``) that the frame-by-frame path,
the fast paths and ``expects`` all read. A live peer answers a violation with ERROR
and a close; an observer such as the dissector records it. No sockets, no clocks,
no files.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from operator import itemgetter

from wallaroo_proto import judge
from wallaroo_proto.judge import End, Expected, Kind

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


class Side(StrEnum):
    """A side of the connection; its value is the plain word the judge contract uses."""

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


#: Every rule a violation can name, with what it says.
RULES: dict[str, str] = {
    "sender": "a frame type only one side sends: the data frames the data side, a 2PC message its role",
    "after-end": "a frame sent after its own sender's ERROR, RESTART or close",
    "handshake": "a HELLO first and once, an OK only to answer it, nothing before OK (bar sink pipelining)",
    "credits": "a data frame of the source protocol sent with no credits left",
    "notify-ack": "a NOTIFY_ACK with no NOTIFY pending, or accepting a NOTIFY of a stream already open",
    "stream-not-open": "a MESSAGE or EOS_MESSAGE on a stream that no successful NOTIFY_ACK opened",
    "ack-stream": "an ACK for a stream never notified on this connection",
    "data-in-round": "application data between a PHASE1 and its PHASE2",
    "unsettled": "application data or a PHASE1 before PHASE2 settled every txn the sink listed uncommitted",
    "one-round": "a PHASE1 or PHASE2 while another txn awaits its PHASE2",
    "twopc-payload": "a stream-0 MESSAGE of the sink protocol that is no 2PC message",
    "reply-txn": "a REPLY for a txn no PHASE1 or PHASE2 named, or more REPLYs than they named it",
}

#: The connection's state machine: state -> {frame type: the state it leads to}. Who may send a
#: frame type is ``_SENDERS``'s; a type its state does not list breaks ``handshake`` (the sink's
#: worker may send ``_SINK_PIPELINED`` types during the handshake, staying in it).
CONNECTION_TRANSITIONS: dict[ConnState, dict[str, ConnState]] = {
    ConnState.CONNECTED: {"HELLO": ConnState.HANDSHAKE, "ERROR": ConnState.ERROR},
    ConnState.HANDSHAKE: {"OK": ConnState.STREAMING, "ERROR": ConnState.ERROR},
    ConnState.STREAMING: {
        **dict.fromkeys(
            ("NOTIFY", "NOTIFY_ACK", "MESSAGE", "EOS_MESSAGE", "ACK", "WORKERS_LEFT"), ConnState.STREAMING
        ),
        "RESTART": ConnState.DISCONNECTED,
        "ERROR": ConnState.ERROR,
    },
    ConnState.ERROR: {},
    ConnState.DISCONNECTED: {},
}
#: The shipped worker pipelines NOTIFY and LIST_UNCOMMITTED behind its HELLO to a sink.
_SINK_PIPELINED = frozenset({"NOTIFY", "MESSAGE", "EOS_MESSAGE", "WORKERS_LEFT"})

#: A stream's state machine: state -> {event: the state it leads to}. A NOTIFY that leaves its
#: stream as it was (pending or open) is one the worker refuses (shipped behaviour: the spec
#: lists NOTIFY only in Start and Closed); a NOTIFY_ACK success=0 closes a pending stream.
STREAM_TRANSITIONS: dict[StreamState, dict[str, StreamState]] = {
    StreamState.START: {"NOTIFY": StreamState.NOTIFY_SENT},
    StreamState.NOTIFY_SENT: {
        "NOTIFY": StreamState.NOTIFY_SENT,
        "NOTIFY_ACK success=1": StreamState.OPEN,
        "NOTIFY_ACK success=0": StreamState.CLOSED,
    },
    StreamState.OPEN: {
        "NOTIFY": StreamState.OPEN,
        "MESSAGE": StreamState.OPEN,
        "EOS_MESSAGE": StreamState.CLOSED,
    },
    StreamState.CLOSED: {"NOTIFY": StreamState.NOTIFY_SENT},
    StreamState.TERMINATED: {"NOTIFY": StreamState.NOTIFY_SENT},
}
# A RESTART ends every stream, whatever its state.
for _moves in STREAM_TRANSITIONS.values():
    _moves["RESTART"] = StreamState.TERMINATED
#: The one stream state a MESSAGE (and an EOS_MESSAGE) is legal in, read by every path.
(_MESSAGE_STATE,) = (state for state, moves in STREAM_TRANSITIONS.items() if "MESSAGE" in moves)


@dataclass(slots=True)
class Verdict(judge.Verdict):
    """The core's answer on one frame: the judge's, its number in the connection and its 2PC message."""

    #: The frame's number in the connection; -1 on the shared ACCEPTED (the caller counts).
    frame_index: int = -1
    #: The decoded 2PC message, when the frame was a stream-0 MESSAGE of the sink protocol.
    twopc: TwoPCMessage | None = None


#: The verdict on a frame with nothing to say, one per side (the common one, shared: a verdict
#: a frame would cost a dataclass on the hot path). Shared, so never changed by a caller.
ACCEPTED_FROM = {side: Verdict(Kind.ACCEPTED, side.value) for side in Side}
#: A run of MESSAGEs the core accepted whole (``feed_run``), as the mock peers mark it.
ACCEPTED = ACCEPTED_FROM[Side.CONNECTOR]
#: Each side, by its word or its member (a ``Side`` is the str it names).
_SIDE_OF = {side.value: side for side in Side}


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
    #: NOTIFYs sent while the stream was pending or open, answered in order after the pending
    #: one: a NOTIFY of an open stream is refused (shipped behaviour) with a NOTIFY_ACK success=0
    #: that leaves the stream as it was; once the pending one is refused, the next is pending.
    refusals_due: int = 0


#: How many txns' REPLYs the core keeps waiting for (``Connection.replies_due``).
_REPLIES_KEPT = 16
_STREAM_ID = itemgetter(0)
_MESSAGE_ID = itemgetter(1)
_ONLY_MESSAGES = {Message}

# Who may send each frame type, per use: the data frames are the data side's, the control
# frames the other's, WORKERS_LEFT the worker's; ERROR either side's (absent here).
_DATA_SIDE = {Use.SOURCE: Side.CONNECTOR, Use.SINK: Side.WORKER}
_SENDERS = {
    use: {
        **dict.fromkeys((Hello, Notify, Message, EosMessage), data_side),
        **dict.fromkeys((Ok, NotifyAck, Ack, Restart), data_side.other),
        WorkersLeft: Side.WORKER,
    }
    for use, data_side in _DATA_SIDE.items()
}
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

    SIDES = (Side.CONNECTOR.value, Side.WORKER.value)
    RULES = RULES

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
    #: Txns a PHASE1 or PHASE2 named -> REPLYs they may still get: a sink answers each PHASE1
    #: (and may answer a PHASE2) however late, after the worker decided and began the next
    #: round. The latest ``_REPLIES_KEPT`` txns only (a PHASE2 may never be answered).
    replies_due: dict = field(default_factory=dict)
    #: Txns the sink listed in REPLY_UNCOMMITTED that no PHASE2 settled yet: until then
    #: the worker may send no application data and start no round.
    unsettled_listed: set = field(default_factory=set)
    closed_by: str | None = None
    _data_side: Side = field(init=False, repr=False)
    _senders: dict = field(init=False, repr=False)

    @property
    def data_side(self) -> Side:
        """The side that sends HELLO and the data frames in this use."""
        return self._data_side

    def stream(self, stream_id: int) -> StreamRecord:
        record = self.streams.get(stream_id)
        if record is None:
            record = self.streams[stream_id] = StreamRecord(stream_id)
        return record

    def end(self, side: str, how: End = End.CLOSED, partial: int = 0) -> Verdict | None:
        """The transport closed (however, whichever side): the machine goes to Disconnected.

        No end breaks a rule here: bytes cut short are the reader's to report.
        """
        if side not in self.SIDES:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        if self.state is not ConnState.ERROR:
            self.state = ConnState.DISCONNECTED
        return None

    def expects(self) -> Expected:
        """The frame types each side may send now, read from ``CONNECTION_TRANSITIONS``."""
        moves = CONNECTION_TRANSITIONS[self.state]
        sink = self.use is Use.SINK
        legal = {}
        for side in (Side.CONNECTOR, Side.WORKER):
            names = {cls.TYPE.name for cls, sender in self._senders.items() if sender is side}
            if self.state is ConnState.HANDSHAKE and sink and side is self._data_side:
                allowed = moves.keys() | _SINK_PIPELINED
            else:
                allowed = moves.keys()
            if sink and side is Side.CONNECTOR:
                names.add("MESSAGE")  # its 2PC replies on stream 0
            legal[side.value] = frozenset(name for name in allowed if name in names or name == "ERROR")
        text = "; ".join(
            f"{' or '.join(sorted(names))} from the {side}" for side, names in legal.items() if names
        )
        return Expected(legal, text or f"nothing: the connection is {self.state.value}")

    def __post_init__(self) -> None:
        self._data_side = _DATA_SIDE[self.use]
        self._senders = _SENDERS[self.use]

    def feed(self, side: str, frame: Frame) -> Verdict:
        """Apply one frame sent by ``side``; the state changes only if it is legal."""
        sender = _SIDE_OF.get(side)
        if sender is None:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        accepted = ACCEPTED_FROM[sender]
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
                and record.state is _MESSAGE_STATE
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
                    return accepted

        state = self.state
        if state is ConnState.ERROR or state is ConnState.DISCONNECTED:
            ended_by = "ERROR" if state is ConnState.ERROR else "RESTART or close"
            if sender == self.closed_by:
                return self._violation(
                    index, sender, "after-end", f"{frame.TYPE.name} sent after its own {ended_by}"
                )
            return Verdict(
                Kind.IGNORED,
                sender,
                None,
                f"{frame.TYPE.name} arrived after the {ended_by}; discarded",
                index,
            )
        if frame_type is Error:
            self.state = CONNECTION_TRANSITIONS[state]["ERROR"]
            self.closed_by = sender
            return accepted

        data_side = self._data_side
        must = self._senders[frame_type]
        if sender != must and not (
            frame_type is Message and self.use is Use.SINK and frame.stream_id == TWOPC_STREAM
        ):
            return self._violation(
                index,
                sender,
                "sender",
                f"Invalid message: {frame.TYPE.name} may only be sent by the {must.value}",
            )

        name = frame.TYPE.name
        after = CONNECTION_TRANSITIONS[state].get(name)
        if after is None and not (
            state is ConnState.HANDSHAKE
            and self.use is Use.SINK
            and sender == data_side
            and name in _SINK_PIPELINED
        ):
            if frame_type is Hello:
                reason = f"HELLO in state {state.value}: the handshake happens once"
            elif frame_type is Ok:
                reason = f"OK in state {state.value}: OK answers the HELLO only"
            elif state is ConnState.CONNECTED:
                reason = f"{name} before HELLO"
            else:
                reason = f"{name} before the handshake completed with OK"
            return self._violation(index, sender, "handshake", reason)
        if frame_type is Hello:
            self.state = after
            self.hello = frame
            return accepted
        if frame_type is Ok:
            self.state = after
            self.credits = frame.initial_credits
            return accepted

        spends = sender == data_side and self.credits is not None
        if spends and self.credits <= 0 and self.use is Use.SOURCE and not self.lenient_credits:
            return self._violation(index, sender, "credits", f"{name} sent with no credits left")
        outcome = self._apply(frame, frame_type, sender, index)
        if spends and outcome.kind is not Kind.VIOLATION:
            if self.credits > 0:
                self.credits -= 1
            else:
                self.overdraft += 1
        return accepted if outcome is ACCEPTED else outcome

    def feed_run(self, run: list[Message], side: str) -> bool:
        """Accept a run of MESSAGEs in one step, or change nothing and return False.

        True only when the per-frame fast path would accept every frame of the run:
        all MESSAGEs on one open stream, ids strictly rising and above the last seen,
        credit for all of them, no 2PC round in the way. Otherwise the caller feeds the
        run to ``feed`` frame by frame, which gives each frame its own verdict.
        The checks are passes in C over the run, not a Python step per frame.
        """
        n = len(run)
        if n == 0 or _SIDE_OF.get(side) is not self._data_side or self.state is not ConnState.STREAMING:
            return False
        stream_id = run[0][0]
        record = self.streams.get(stream_id)
        credits = self.credits
        if (
            record is None
            or record.state is not _MESSAGE_STATE
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

    def _apply(self, frame: Frame, frame_type: type, sender: str, index: int) -> Verdict:
        if frame_type is Message:
            return self._message(frame, sender, index)
        if frame_type is Ack:
            return self._ack(frame, sender, index)
        if frame_type is Notify:
            record = self.stream(frame.stream_id)
            before = record.state
            after = STREAM_TRANSITIONS[before]["NOTIFY"]
            if after is before:
                # The spec lists NOTIFY only in Start and Closed; the shipped worker answers a
                # repeat with NOTIFY_ACK success=0 and the stream stays as it was.
                record.refusals_due += 1
                unless = " if the pending one opens it" if before is StreamState.NOTIFY_SENT else ""
                return Verdict(
                    Kind.ACCEPTED,
                    sender,
                    None,
                    f"NOTIFY for stream {frame.stream_id}, which is already {before.value} "
                    f"on this connection: to be refused{unless}",
                    index,
                )
            record.state = after
            record.name = frame.stream_name
            return ACCEPTED
        if frame_type is NotifyAck:
            record = self.streams.get(frame.stream_id)
            if record is not None and record.refusals_due:
                if not frame.success:
                    # A NOTIFY sent meanwhile refused, or the pending one (the next one sent
                    # meanwhile is pending now): either way one fewer awaits its answer, and the
                    # stream stays as it is (it may have closed by EOS_MESSAGE while this crossed).
                    record.refusals_due -= 1
                    return ACCEPTED
                if record.state is StreamState.OPEN:
                    return self._violation(
                        index,
                        sender,
                        "notify-ack",
                        f"NOTIFY_ACK success=1 for stream {frame.stream_id}, which is already open",
                    )
            event = "NOTIFY_ACK success=1" if frame.success else "NOTIFY_ACK success=0"
            after = None if record is None else STREAM_TRANSITIONS[record.state].get(event)
            if after is None:
                return self._violation(
                    index,
                    sender,
                    "notify-ack",
                    f"NOTIFY_ACK for stream {frame.stream_id}, which has no NOTIFY pending",
                )
            record.state = after
            record.resume_from = frame.point_of_ref
            record.last_message_id = None
            return ACCEPTED
        if frame_type is EosMessage:
            record = self.streams.get(frame.stream_id)
            after = None if record is None else STREAM_TRANSITIONS[record.state].get("EOS_MESSAGE")
            if after is None:
                state = record.state.value if record else "never notified"
                return self._violation(
                    index,
                    sender,
                    "stream-not-open",
                    f"EOS_MESSAGE for stream {frame.stream_id}, which is not open ({state})",
                )
            record.state = after
            return ACCEPTED
        if frame_type is Restart:
            for record in self.streams.values():
                record.state = STREAM_TRANSITIONS[record.state]["RESTART"]
            self.state = CONNECTION_TRANSITIONS[self.state]["RESTART"]
            self.closed_by = sender
            return ACCEPTED
        return ACCEPTED  # WORKERS_LEFT: informational

    def _unsettled(self) -> str:
        listed = ", ".join(repr(show_text(t)) for t in sorted(self.unsettled_listed, key=show_text))
        return f"before the listed uncommitted txn(s) {listed} were settled by PHASE2"

    def _violation(self, index: int, sender: str, rule: str, reason: str) -> Verdict:
        return Verdict(Kind.VIOLATION, sender, rule, reason, index)

    def _message(self, frame: Message, sender: str, index: int) -> Verdict:
        stream_id = frame.stream_id
        if self.use is Use.SINK and stream_id == TWOPC_STREAM:
            return self._twopc(frame, sender, index)
        record = self.streams.get(stream_id)
        if record is None or record.state is not _MESSAGE_STATE:
            state = record.state.value if record else "never notified"
            return self._violation(
                index,
                sender,
                "stream-not-open",
                f"Bad/unregistered stream_id {stream_id} with message_id {frame.message_id} "
                f"(stream is {state}; MESSAGE needs a successful NOTIFY_ACK first)",
            )
        if self.phase1_txn is not None:
            return self._violation(
                index,
                sender,
                "data-in-round",
                f"application MESSAGE on stream {stream_id} between PHASE1 of txn "
                f"{show_text(self.phase1_txn)!r} and its PHASE2",
            )
        if self.unsettled_listed:
            return self._violation(
                index, sender, "unsettled", f"application MESSAGE on stream {stream_id} {self._unsettled()}"
            )
        last = record.last_message_id
        if last is not None and frame.message_id <= last:
            record.replays += 1
            return Verdict(
                Kind.REPLAYED,
                sender,
                None,
                f"message_id {frame.message_id} is not above the last seen {last}",
                index,
            )
        record.last_message_id = frame.message_id
        record.messages += 1
        return ACCEPTED

    def _twopc(self, frame: Message, sender: str, index: int) -> Verdict:
        try:
            msg = decode_twopc(frame.payload)
        except ProtocolError as err:
            return self._violation(index, sender, "twopc-payload", f"bad 2PC payload on stream 0: {err}")
        expected = _TWOPC_SENDER[type(msg)]
        name = msg.TAG.name
        if sender != expected:
            return self._violation(
                index, sender, "sender", f"2PC {name} may only be sent by the {expected.value}"
            )
        if isinstance(msg, Phase1):
            if self.unsettled_listed:
                return self._violation(
                    index, sender, "unsettled", f"PHASE1 of txn {show_text(msg.txn_id)!r} {self._unsettled()}"
                )
            if self.phase1_txn is not None:
                return self._violation(
                    index,
                    sender,
                    "one-round",
                    f"PHASE1 of txn {show_text(msg.txn_id)!r} while txn "
                    f"{show_text(self.phase1_txn)!r} awaits its PHASE2",
                )
            self.phase1_txn = msg.txn_id
            self.undecided_txns.add(msg.txn_id)
            self._reply_due(msg.txn_id)
        elif isinstance(msg, Phase2):
            if self.phase1_txn == msg.txn_id:
                self.phase1_txn = None
            elif self.phase1_txn is not None:
                return self._violation(
                    index,
                    sender,
                    "one-round",
                    f"PHASE2 of txn {show_text(msg.txn_id)!r} while txn "
                    f"{show_text(self.phase1_txn)!r} awaits its PHASE2",
                )
            self.undecided_txns.discard(msg.txn_id)
            self.unsettled_listed.discard(msg.txn_id)
            self._reply_due(msg.txn_id)
            if not msg.commit:
                # After an abort the worker re-sends from the last committed offset:
                # lower ids on the data streams are a legitimate re-send, not a replay.
                for record in self.streams.values():
                    record.last_message_id = None
        elif isinstance(msg, ReplyUncommitted):
            self.undecided_txns.update(msg.txn_ids)
            self.unsettled_listed.update(msg.txn_ids)
        elif isinstance(msg, Reply):
            due = self.replies_due.pop(msg.txn_id, 0)
            if due > 1:
                self.replies_due[msg.txn_id] = due - 1
            elif not due and msg.txn_id not in self.undecided_txns:
                return self._violation(
                    index,
                    sender,
                    "reply-txn",
                    f"REPLY for txn {show_text(msg.txn_id)!r}, which no PHASE1 or PHASE2 named",
                )
        return Verdict(Kind.ACCEPTED, sender, None, None, index, msg)

    def _reply_due(self, txn: Text) -> None:
        due = self.replies_due
        due[txn] = due.pop(txn, 0) + 1
        if len(due) > _REPLIES_KEPT:
            del due[next(iter(due))]

    def _ack(self, frame: Ack, sender: str, index: int) -> Verdict:
        for stream_id, _ in frame.acks:
            record = self.streams.get(stream_id)
            if record is None or record.state is StreamState.START:
                return self._violation(
                    index,
                    sender,
                    "ack-stream",
                    f"ACK for stream {stream_id}, which was never notified on this connection",
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
