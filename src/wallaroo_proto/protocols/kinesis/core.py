"""The MultiLangDaemon protocol's rules for one shard's conversation (sans-IO).

``Conversation`` judges both directions of one record-processor connection and
keeps the judge contract (``wallaroo_proto.judge``): ``feed(side, frame)`` with a
line (or a message value) in, a ``Verdict`` out; ``end(side)``; ``expects()``. It
holds the rules the Java MLD and kclpy enforce between them, each named in
``RULES``, the order of frames as the table ``TRANSITIONS``:

- strict alternation: the daemon sends one request, the processor answers it
  with one ``status`` whose ``responseFor`` names it; in between, zero or more
  checkpoint request/reply pairs, one at a time;
- a checkpoint only while a request is pending; during ``initialize`` and
  ``leaseLost`` (and a V1/V2 ``shutdown`` ZOMBIE) there is no checkpointer, so
  the only right answer is ``InvalidStateException``;
- at ``shardEnded`` (V1/V2: ``shutdown`` TERMINATE) the processor must
  checkpoint at the end of the shard (no sequence number) and succeed before
  its ``status``, or the KCL refuses the shutdown;
- ``initialize`` first; nothing after the ``status`` for ``leaseLost`` or
  ``shardEnded``; the processor may not close its stdout before then.

No sockets, files or clocks: the mock peers and a capture dissector drive the
same object. ``checkpoint_error`` is the KCL checkpointer's own validation,
for a daemon that must answer a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ... import judge
from ...judge import End, Expected, Kind
from .codec import (
    CURRENT,
    REQUESTS,
    V1,
    Checkpoint,
    Fatal,
    Initialize,
    Line,
    Message,
    ProcessRecords,
    Shutdown,
    Skipped,
    Status,
    decode_from_daemon,
    decode_from_processor,
    detect_dialect,
    is_sequence_number,
    peek_object,
)

DAEMON, PROCESSOR = "daemon", "processor"
#: Requests that end the conversation once answered.
FINAL = ("leaseLost", "shardEnded", "shutdown")
SHARD_END = "SHARD_END"
#: The frame type ``TRANSITIONS`` gives every daemon request but ``initialize``.
REQUEST = "request"

#: Every rule a violation can name, with what it says.
RULES: dict[str, str] = {
    "daemon-line": "a daemon line the processor cannot read (kclpy dies on it)",
    "initialize-first": "a request before initialize",
    "one-initialize": "a second initialize",
    "request-before-status": "a request while the last one still awaits the processor's status",
    "request-during-checkpoint": "a request while the processor waits for the reply to its checkpoint",
    "request-after-end": "a request after the status for leaseLost, shardEnded or shutdown",
    "unsolicited-reply": "a checkpoint reply with no checkpoint asked",
    "no-checkpointer": (
        "a checkpoint reply other than InvalidStateException during initialize, leaseLost "
        "or a shutdown ZOMBIE (there is no checkpointer)"
    ),
    "checkpoint-outside-request": "a checkpoint with no request pending",
    "one-checkpoint-at-a-time": "a second checkpoint before the reply to the first",
    "unsolicited-status": "a status with no request pending",
    "status-during-checkpoint": "a status while its checkpoint awaits the reply",
    "response-for": "a status whose responseFor is not the pending request's action",
    "shard-end-checkpoint": (
        "a status for shardEnded (V1/V2: shutdown TERMINATE) without a successful checkpoint "
        "at the end of the shard first"
    ),
    "close-during-checkpoint": "the processor closed its output while its checkpoint awaited the reply",
    "close-before-status": "the processor closed its output before its status for the pending request",
    "close-before-end": "the processor closed its output before leaseLost or shardEnded",
}


class State(StrEnum):
    """Where a conversation is, read from its fields (``Conversation.state``)."""

    START = "start"  # nothing asked yet
    IDLE = "idle"  # between requests
    PENDING = "pending"  # a request awaits its status
    CHECKPOINTING = "checkpointing"  # the processor's checkpoint awaits the daemon's reply
    ENDED = "ended"  # the final status came


#: The conversation as a state machine (as h11's ``EVENT_TRIGGERED_TRANSITIONS``): in each state,
#: the frames (side, type) that are legal and the state each leads to (a status for one of
#: ``FINAL``: ENDED). The processor's other frames, and all of them once ENDED, are read and ignored.
TRANSITIONS: dict[State, dict[tuple[str, str], State]] = {
    State.START: {(DAEMON, "initialize"): State.PENDING},
    State.IDLE: {(DAEMON, REQUEST): State.PENDING},
    State.PENDING: {(PROCESSOR, "status"): State.IDLE, (PROCESSOR, "checkpoint"): State.CHECKPOINTING},
    State.CHECKPOINTING: {(DAEMON, "checkpoint"): State.PENDING},
    State.ENDED: {},
}

_REQUEST_REFUSED = {
    State.PENDING: ("request-before-status", "{action} while {pending} still awaits its status"),
    State.CHECKPOINTING: (
        "request-during-checkpoint",
        "{action} while the processor waits for the reply to its checkpoint "
        "(it would take this line as the reply)",
    ),
    State.ENDED: ("request-after-end", "{action} after the conversation ended"),
}
_NO_REQUEST = ("unsolicited-status", "a status with no request pending")
_CHECKPOINT_OUTSIDE = ("checkpoint-outside-request", "a checkpoint with no request pending")
#: A frame in a state ``TRANSITIONS`` does not take it in: the rule it breaks, and why
#: (``{action}`` and ``{pending}`` filled in).
REFUSED: dict[tuple[str, str], dict[State, tuple[str, str]]] = {
    (DAEMON, "initialize"): {**_REQUEST_REFUSED, State.IDLE: ("one-initialize", "a second initialize")},
    (DAEMON, REQUEST): {**_REQUEST_REFUSED, State.START: ("initialize-first", "{action} before initialize")},
    (DAEMON, "checkpoint"): dict.fromkeys(
        (State.START, State.IDLE, State.PENDING, State.ENDED),
        ("unsolicited-reply", "a checkpoint reply with no checkpoint asked"),
    ),
    (PROCESSOR, "status"): {
        State.START: _NO_REQUEST,
        State.IDLE: _NO_REQUEST,
        State.CHECKPOINTING: ("status-during-checkpoint", "a status while its checkpoint awaits the reply"),
    },
    (PROCESSOR, "checkpoint"): {
        State.START: _CHECKPOINT_OUTSIDE,
        State.IDLE: _CHECKPOINT_OUTSIDE,
        State.CHECKPOINTING: (
            "one-checkpoint-at-a-time",
            "a second checkpoint before the reply to the first",
        ),
    },
}
#: The record types a frame type of ``TRANSITIONS`` stands for.
_TYPES = {
    "initialize": ("initialize",),
    REQUEST: REQUESTS[1:],
    "status": ("status",),
    "checkpoint": ("checkpoint",),
}


#: What ``feed`` decodes (anything else is a message value).
_LINES = (Line, bytes, str)


@dataclass(slots=True)
class Verdict(judge.Verdict):
    """The judge's verdict, with the line it was on, the message read from it and a note."""

    line: int | None = None
    message: Message | None = None
    note: str | None = None

    def describe(self) -> str:
        """One line for a person: who, which line, what."""
        where = f"{self.side} line {self.line}" if self.line is not None else self.side
        what = (
            self.reason or self.note or (self.message.action if self.message is not None else "an empty line")
        )
        return f"{where}: {self.kind.value}: {what}"


def seq_key(sequence_number: str, sub: int | None) -> tuple[int, str, int]:
    """Sequence numbers order as integers (the KCL compares BigIntegers), subsequence numbers break ties.

    Compared as (length, digits) without leading zeros, so a number of any
    length orders without conversion (Python refuses ``int`` of over 4,300 digits).
    """
    digits = sequence_number.lstrip("0") or "0"
    return len(digits), digits, sub or 0


def checkpoint_error(
    request: Checkpoint,
    *,
    action: str | None,
    last: tuple[int, int] | None,
    largest: tuple[int, int] | None,
    reason: str | None = None,
) -> str | None:
    """What the KCL checkpointer says to ``request`` during ``action``: an exception name, or None."""
    refusal = checkpoint_refusal(request, action=action, last=last, largest=largest, reason=reason)
    return refusal[0] if refusal is not None else None


def checkpoint_refusal(
    request: Checkpoint,
    *,
    action: str | None,
    last: tuple[int, int] | None,
    largest: tuple[int, int] | None,
    reason: str | None = None,
) -> tuple[str, str] | None:
    """The KCL checkpointer's exception name for ``request`` during ``action`` and why, or None.

    ``last`` is the lease's checkpoint and ``largest`` the greatest record
    delivered (both as ``seq_key``). With no sequence number the checkpointer
    takes the largest permitted value (``SHARD_END`` at the end of a shard).
    The why names the sequence number and the range allowed, so a refused
    processor need not be debugged by hand.
    """
    if action in ("initialize", "leaseLost") or (action == "shutdown" and reason != "TERMINATE"):
        return "InvalidStateException", f"no checkpointer during {action}"
    if action is None:
        return "InvalidStateException", "no request pending"
    seq, sub = request.sequence_number, request.sub_sequence_number
    if seq is None or seq == SHARD_END:
        if seq is None or action in ("shardEnded", "shutdown"):
            return None
        return "IllegalArgumentException", f"SHARD_END during {action} (only at the end of a shard)"
    shown = f"{_short(seq)}/{sub if sub is not None else 0}"
    if sub is not None and sub < 0:
        return "IllegalArgumentException", f"subsequence number {sub} is below 0"
    if not is_sequence_number(seq):
        return "IllegalArgumentException", f"{_short(seq)!r} is not a sequence number"
    key = seq_key(seq, sub)
    if largest is None:
        return "IllegalArgumentException", f"{shown}: no record delivered yet"
    if (last is not None and key < last) or key > largest:
        where = "before the last checkpoint" if last is not None and key < last else "beyond the last record"
        low = _shown_key(last) if last is not None else "the shard's start"
        return "IllegalArgumentException", f"{shown} is {where}: allowed {low} to {_shown_key(largest)}"
    return None


def _shown_key(key: tuple[int, str, int]) -> str:
    return f"{_short(key[1])}/{key[2]}"


def _short(text: str, limit: int = 60) -> str:
    """A sequence number for a message: thousands of digits are cut in the middle."""
    return text if len(text) <= limit else f"{text[:8]}...{text[-8:]} ({len(text):,} digits)"


class Conversation:
    """One shard's conversation, both directions; ``feed`` it what each side sends.

    ``dialect`` None detects it from the daemon's first messages (V1 lacks
    sequence numbers in initialize and millisBehindLatest in processRecords; a
    ``shutdown`` request marks V1/V2).
    """

    SIDES = (DAEMON, PROCESSOR)
    RULES = RULES

    def __init__(self, dialect: str | None = None) -> None:
        self.dialect = dialect
        self.shard_id: str | None = None
        self.initial: tuple[str | None, int | None] | None = None
        self.pending: str | None = None  # the request awaiting its status
        self.pending_reason: str | None = None  # a shutdown request's reason
        self.checkpoint: Checkpoint | None = None  # a checkpoint request awaiting its reply
        self.ended_checkpointed = False  # a successful end-of-shard checkpoint in this request
        self.done = False  # the final status came: nothing more may be asked
        self.closed = {DAEMON: False, PROCESSOR: False}
        self.requests = 0
        self.records = 0
        self.largest: tuple[int, int] | None = None
        self.largest_seq: tuple[str, int | None] | None = None
        self.checkpoints = 0
        self.checkpoint_errors = 0
        self.last_checkpoint: tuple[str, int | None] | None = None
        self.violations = 0
        self._line = {DAEMON: 0, PROCESSOR: 0}

    @property
    def state(self) -> State:
        """Where the conversation is, for ``TRANSITIONS``."""
        if self.done:
            return State.ENDED
        if self.checkpoint is not None:
            return State.CHECKPOINTING
        if self.pending is not None:
            return State.PENDING
        return State.IDLE if self.requests else State.START

    def feed(
        self,
        side: str,
        frame: Line | bytes | str | Message,
        *,
        line: int | None = None,
        note: str | None = None,
    ) -> Verdict:
        """What ``side`` sent: a line (decoded as its reader would), or a message value it made.

        ``line`` and ``note`` go with a message value (a line carries its own); without
        ``line`` the side's lines are counted.
        """
        if side != DAEMON and side != PROCESSOR:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        if isinstance(frame, _LINES):
            return self._from_daemon(frame) if side == DAEMON else self._from_processor(frame)
        return (
            self._daemon_sent(frame, line, note)
            if side == DAEMON
            else self._processor_sent(frame, line, note)
        )

    # ------------------------------------------------------------------ daemon side

    def _from_daemon(self, line: Line | bytes | str) -> Verdict:
        """A line the daemon wrote to the processor, judged as kclpy would read it."""
        number, data, note = self._number(DAEMON, line)
        try:
            msg = decode_from_daemon(data, self.dialect)
        except Fatal as err:
            return self._violation(
                DAEMON, number, None, "daemon-line", f"the processor cannot read this line: {err}"
            )
        if self.dialect is None:
            self._detect(data)
        return self._daemon_sent(msg, number, note)

    def _daemon_sent(self, msg: Message, line: int | None, note: str | None) -> Verdict:
        """A message value the daemon sent (no decoding: the daemon made it)."""
        if line is None:
            self._line[DAEMON] += 1
            line = self._line[DAEMON]
        action = msg.action
        if self.dialect is None and action == "initialize":
            self.dialect = CURRENT  # a value carries no sign of V1; a line shows it
        frame = action if action in ("initialize", "checkpoint") else REQUEST
        refused = REFUSED[DAEMON, frame].get(self.state)
        if refused is not None:
            rule, why = refused
            return self._violation(DAEMON, line, msg, rule, why.format(action=action, pending=self.pending))
        if action == "checkpoint":
            return self._reply(msg, line, note)
        self.requests += 1
        self.pending = action
        self.pending_reason = msg.reason if isinstance(msg, Shutdown) else None
        self.ended_checkpointed = False
        if isinstance(msg, Initialize):
            self.shard_id = msg.shard_id
            self.initial = (msg.sequence_number, msg.sub_sequence_number)
            if is_sequence_number(msg.sequence_number):
                self.last_checkpoint = (msg.sequence_number, msg.sub_sequence_number)
        elif isinstance(msg, ProcessRecords) and msg.records:
            self.records += len(msg.records)
            last = msg.records[-1]
            if is_sequence_number(last.sequence_number) and isinstance(last.sub_sequence_number, int | None):
                key = seq_key(last.sequence_number, last.sub_sequence_number)
                if self.largest is None or key > self.largest:
                    self.largest = key
                    self.largest_seq = (last.sequence_number, last.sub_sequence_number)
        return Verdict(Kind.ACCEPTED, DAEMON, None, None, line, msg, note)

    def _reply(self, msg: Checkpoint, line: int, note: str | None) -> Verdict:
        asked = self.checkpoint
        assert asked is not None  # REFUSED holds a reply outside CHECKPOINTING
        self.checkpoint = None
        no_checkpointer = self.pending in ("initialize", "leaseLost") or (
            self.pending == "shutdown" and self.pending_reason != "TERMINATE"
        )
        if no_checkpointer and msg.error != "InvalidStateException":
            return self._violation(
                DAEMON,
                line,
                msg,
                "no-checkpointer",
                f"a checkpoint during {self.pending} must fail with InvalidStateException "
                f"(there is no checkpointer), got {msg.error or 'success'}",
            )
        if msg[:2] != asked[:2]:
            echo = "the Java MLD echoes the request's sequence numbers in its reply"
            note = f"{note}; {echo}" if note else echo
        if msg.error is None:
            self.checkpoints += 1
            if asked.sequence_number in (None, SHARD_END) and self.pending in ("shardEnded", "shutdown"):
                self.ended_checkpointed = True
                self.last_checkpoint = (SHARD_END, 0)
            elif asked.sequence_number is None:
                self.last_checkpoint = self.largest_seq
            else:
                self.last_checkpoint = (asked.sequence_number, asked.sub_sequence_number)
        else:
            self.checkpoint_errors += 1
        return Verdict(Kind.ACCEPTED, DAEMON, None, None, line, msg, note)

    # ------------------------------------------------------------------ processor side

    def _from_processor(self, line: Line | bytes | str) -> Verdict:
        """A line the processor wrote, judged as the Java MLD reads it."""
        number, data, note = self._number(PROCESSOR, line)
        try:
            decoded = decode_from_processor(data, self.dialect or CURRENT)
        except Skipped as err:
            return Verdict(Kind.SKIPPED, PROCESSOR, line=number, note=_join(note, str(err)))
        if decoded is None:
            return Verdict(Kind.SKIPPED, PROCESSOR, None, None, number, None, note)
        msg, lenient = decoded
        return self._processor_sent(msg, number, _join(note, lenient))

    def _processor_sent(self, msg: Message, line: int | None, note: str | None) -> Verdict:
        """A message value the processor sent."""
        if line is None:
            self._line[PROCESSOR] += 1
            line = self._line[PROCESSOR]
        if self.done:
            return Verdict(
                Kind.IGNORED, PROCESSOR, line=line, message=msg, note="after the final status: drained"
            )
        if not isinstance(msg, Status | Checkpoint):
            note = _join(note, f"{msg.action} from the processor")
            return Verdict(Kind.IGNORED, PROCESSOR, line=line, message=msg, note=note)
        refused = REFUSED[PROCESSOR, msg.action].get(self.state)
        if refused is not None:
            return self._violation(PROCESSOR, line, msg, *refused)
        if isinstance(msg, Status):
            return self._status(msg, line, note)
        self.checkpoint = msg
        return Verdict(Kind.ACCEPTED, PROCESSOR, None, None, line, msg, note)

    def _status(self, msg: Status, line: int, note: str | None) -> Verdict:
        if msg.response_for != self.pending:
            got = "no responseFor" if msg.response_for is None else f"responseFor {msg.response_for!r}"
            reason = f"status with {got}, expected {self.pending!r}"
            return self._violation(PROCESSOR, line, msg, "response-for", reason)
        ending = self.pending == "shardEnded" or self.pending_reason == "TERMINATE"
        if ending and not self.ended_checkpointed:
            return self._violation(
                PROCESSOR,
                line,
                msg,
                "shard-end-checkpoint",
                f"status for {self.pending} without a successful checkpoint at the end of the shard "
                "(checkpoint with no sequence number first; the KCL logs an error and retries the "
                "shard's shutdown again and again, and its child shards never start)",
            )
        if self.pending in FINAL:
            self.done = True
        self.pending = None
        self.pending_reason = None
        return Verdict(Kind.ACCEPTED, PROCESSOR, None, None, line, msg, note)

    # ------------------------------------------------------------------ both

    def end(self, side: str, how: End = End.CLOSED, partial: int = 0) -> Verdict | None:
        """``side`` stopped sending: a violation if the processor still owed an answer.

        However it ended (closed, reset, cut inside a line): a reader takes each the same.
        """
        if side != DAEMON and side != PROCESSOR:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        self.closed[side] = True
        if side == PROCESSOR and not self.done:
            line = self._line[PROCESSOR]
            if self.checkpoint is not None and self.closed[DAEMON]:
                # The daemon closed the processor's input instead of replying: a stop without a
                # shutdown grace does so at any moment; the processor's reader has nothing to wait for.
                note = f"closed its output after the daemon closed its input during {self.pending}"
                return Verdict(Kind.IGNORED, PROCESSOR, note=note)
            if self.checkpoint is not None:
                what = f"closed its output while its checkpoint during {self.pending} awaited the reply"
                return self._violation(
                    PROCESSOR, line, None, "close-during-checkpoint", f"{what} (after line {line})"
                )
            if self.pending is not None:
                what = f"closed its output before its status for {self.pending}"
                return self._violation(
                    PROCESSOR, line, None, "close-before-status", f"{what} (after line {line})"
                )
            if self.requests and not self.closed[DAEMON]:  # after its input closed: the KCL's stop
                what = "closed its output before leaseLost or shardEnded"
                return self._violation(
                    PROCESSOR, line, None, "close-before-end", f"{what} (after line {line})"
                )
        if side == DAEMON and not self.done and self.pending is not None:
            return Verdict(Kind.IGNORED, DAEMON, note=f"closed while {self.pending} was pending")
        return None

    def expects(self) -> Expected:
        """What the conversation waits for: the frames ``TRANSITIONS`` takes now, and a line for a person."""
        legal: dict[str, set[str]] = {DAEMON: set(), PROCESSOR: set()}
        for side, frame in TRANSITIONS[self.state]:
            legal[side].update(_TYPES[frame])
        return Expected({side: frozenset(types) for side, types in legal.items()}, self._expecting())

    def _expecting(self) -> str:
        if self.done:
            return "nothing (ended)"
        if self.checkpoint is not None:
            return f"the daemon's reply to a checkpoint during {self.pending}"
        if self.pending is not None:
            return f"the processor's status for {self.pending}"
        return "the daemon's next request" if self.requests else "initialize"

    def _number(self, side: str, line: Line | bytes | str) -> tuple[int, bytes | str, str | None]:
        if isinstance(line, Line):
            self._line[side] = line.number
            return line.number, line.data, line.note
        self._line[side] += 1
        return self._line[side], line, None

    def _detect(self, data: bytes | str) -> None:
        obj = peek_object(data)
        found = detect_dialect(obj) if obj is not None else None
        if found is not None:
            self.dialect = V1 if found == V1 else CURRENT

    def _violation(self, side: str, line: int | None, msg: Message | None, rule: str, reason: str) -> Verdict:
        self.violations += 1
        return Verdict(Kind.VIOLATION, side, rule, reason, line, msg)


def _join(a: str | None, b: str | None) -> str | None:
    if a and b:
        return f"{a}; {b}"
    return a or b
