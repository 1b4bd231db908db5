"""The MultiLangDaemon protocol's rules for one shard's conversation (sans-IO).

``Conversation`` judges both directions of one record-processor connection:
lines (or message values) in, a ``Verdict`` out. It holds the rules the Java
MLD and kclpy enforce between them:

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

from enum import StrEnum
from typing import NamedTuple

from .codec import (
    CURRENT,
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
#: Violations a conversation keeps whole (the rest are counted): garbage is a violation a line.
KEEP_VERDICTS = 100


class Kind(StrEnum):
    ACCEPTED = "accepted"
    SKIPPED = "skipped"  # not a message: the MLD logs it and reads on
    IGNORED = "ignored"  # a message its reader decodes and does not act on
    VIOLATION = "violation"


class Verdict(NamedTuple):
    kind: Kind
    sender: str
    line: int | None
    message: Message | None = None
    reason: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind is not Kind.VIOLATION

    def describe(self) -> str:
        """One line for a person: who, which line, what."""
        where = f"{self.sender} line {self.line}" if self.line is not None else self.sender
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
    """One shard's conversation, both directions; feed it what each side sends.

    ``dialect`` None detects it from the daemon's first messages (V1 lacks
    sequence numbers in initialize and millisBehindLatest in processRecords; a
    ``shutdown`` request marks V1/V2).
    """

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
        #: The first ``KEEP_VERDICTS`` violations; ``violation_count`` counts them all.
        self.violations: list[Verdict] = []
        self.violation_count = 0
        self._line = {DAEMON: 0, PROCESSOR: 0}

    # ------------------------------------------------------------------ daemon side

    def from_daemon(self, line: Line | bytes | str) -> Verdict:
        """A line the daemon wrote to the processor, judged as kclpy would read it."""
        number, data, note = self._number(DAEMON, line)
        try:
            msg = decode_from_daemon(data, self.dialect)
        except Fatal as err:
            return self._violation(DAEMON, number, None, f"the processor cannot read this line: {err}")
        if self.dialect is None:
            self._detect(data)
        return self.daemon_sent(msg, line=number, note=note)

    def daemon_sent(self, msg: Message, *, line: int | None = None, note: str | None = None) -> Verdict:
        """A message value the daemon sent (no decoding: the daemon made it)."""
        if line is None:
            self._line[DAEMON] += 1
            line = self._line[DAEMON]
        action = msg.action
        if self.dialect is None and action == "initialize":
            self.dialect = CURRENT  # a value carries no sign of V1; from_daemon detects it from the line
        if action == "checkpoint":
            return self._reply(msg, line, note)
        if self.done:
            return self._violation(DAEMON, line, msg, f"{action} after the conversation ended")
        if self.checkpoint is not None:
            return self._violation(
                DAEMON,
                line,
                msg,
                f"{action} while the processor waits for the reply to its checkpoint "
                "(it would take this line as the reply)",
            )
        if self.pending is not None:
            reason = f"{action} while {self.pending} still awaits its status"
            return self._violation(DAEMON, line, msg, reason)
        if self.requests == 0 and action != "initialize":
            return self._violation(DAEMON, line, msg, f"{action} before initialize")
        if self.requests and action == "initialize":
            return self._violation(DAEMON, line, msg, "a second initialize")
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
        return Verdict(Kind.ACCEPTED, DAEMON, line, msg, None, note)

    def _reply(self, msg: Checkpoint, line: int, note: str | None) -> Verdict:
        asked = self.checkpoint
        if asked is None:
            return self._violation(DAEMON, line, msg, "a checkpoint reply with no checkpoint asked")
        self.checkpoint = None
        no_checkpointer = self.pending in ("initialize", "leaseLost") or (
            self.pending == "shutdown" and self.pending_reason != "TERMINATE"
        )
        if no_checkpointer and msg.error != "InvalidStateException":
            return self._violation(
                DAEMON,
                line,
                msg,
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
        return Verdict(Kind.ACCEPTED, DAEMON, line, msg, None, note)

    # ------------------------------------------------------------------ processor side

    def from_processor(self, line: Line | bytes | str) -> Verdict:
        """A line the processor wrote, judged as the Java MLD reads it."""
        number, data, note = self._number(PROCESSOR, line)
        try:
            decoded = decode_from_processor(data, self.dialect or CURRENT)
        except Skipped as err:
            return Verdict(Kind.SKIPPED, PROCESSOR, number, None, None, _join(note, str(err)))
        if decoded is None:
            return Verdict(Kind.SKIPPED, PROCESSOR, number, None, None, note)
        msg, lenient = decoded
        return self.processor_sent(msg, line=number, note=_join(note, lenient))

    def processor_sent(self, msg: Message, *, line: int | None = None, note: str | None = None) -> Verdict:
        """A message value the processor sent."""
        if line is None:
            self._line[PROCESSOR] += 1
            line = self._line[PROCESSOR]
        if self.done:
            return Verdict(Kind.IGNORED, PROCESSOR, line, msg, None, "after the final status: drained")
        if isinstance(msg, Status):
            return self._status(msg, line, note)
        if isinstance(msg, Checkpoint):
            if self.pending is None:
                return self._violation(PROCESSOR, line, msg, "a checkpoint with no request pending")
            if self.checkpoint is not None:
                reason = "a second checkpoint before the reply to the first"
                return self._violation(PROCESSOR, line, msg, reason)
            self.checkpoint = msg
            return Verdict(Kind.ACCEPTED, PROCESSOR, line, msg, None, note)
        note = _join(note, f"{msg.action} from the processor")
        return Verdict(Kind.IGNORED, PROCESSOR, line, msg, None, note)

    def _status(self, msg: Status, line: int, note: str | None) -> Verdict:
        if self.pending is None:
            return self._violation(PROCESSOR, line, msg, "a status with no request pending")
        if self.checkpoint is not None:
            return self._violation(PROCESSOR, line, msg, "a status while its checkpoint awaits the reply")
        if msg.response_for != self.pending:
            got = "no responseFor" if msg.response_for is None else f"responseFor {msg.response_for!r}"
            return self._violation(PROCESSOR, line, msg, f"status with {got}, expected {self.pending!r}")
        ending = self.pending == "shardEnded" or self.pending_reason == "TERMINATE"
        if ending and not self.ended_checkpointed:
            return self._violation(
                PROCESSOR,
                line,
                msg,
                f"status for {self.pending} without a successful checkpoint at the end of the shard "
                "(checkpoint with no sequence number first; the KCL logs an error and retries the "
                "shard's shutdown again and again, and its child shards never start)",
            )
        if self.pending in FINAL:
            self.done = True
        self.pending = None
        self.pending_reason = None
        return Verdict(Kind.ACCEPTED, PROCESSOR, line, msg, None, note)

    # ------------------------------------------------------------------ both

    def close(self, sender: str) -> Verdict | None:
        """``sender`` closed its direction (EOF): a violation if the processor still owed an answer."""
        self.closed[sender] = True
        if sender == PROCESSOR and not self.done:
            line = self._line[PROCESSOR]
            if self.checkpoint is not None and self.closed[DAEMON]:
                # The daemon closed the processor's input instead of replying: a stop without a
                # shutdown grace does so at any moment; the processor's reader has nothing to wait for.
                note = f"closed its output after the daemon closed its input during {self.pending}"
                return Verdict(Kind.IGNORED, PROCESSOR, None, None, None, note)
            if self.checkpoint is not None:
                what = f"closed its output while its checkpoint during {self.pending} awaited the reply"
                return self._violation(PROCESSOR, line, None, f"{what} (after line {line})")
            if self.pending is not None:
                what = f"closed its output before its status for {self.pending}"
                return self._violation(PROCESSOR, line, None, f"{what} (after line {line})")
            if self.requests:
                what = "closed its output before leaseLost or shardEnded"
                return self._violation(PROCESSOR, line, None, f"{what} (after line {line})")
        if sender == DAEMON and not self.done and self.pending is not None:
            return Verdict(Kind.IGNORED, DAEMON, None, None, None, f"closed while {self.pending} was pending")
        return None

    def expecting(self) -> str:
        """What the conversation waits for, for a person reading a report."""
        if self.done:
            return "nothing (ended)"
        if self.checkpoint is not None:
            return f"the daemon's reply to a checkpoint during {self.pending}"
        if self.pending is not None:
            return f"the processor's status for {self.pending}"
        return "the daemon's next request" if self.requests else "initialize"

    def _number(self, sender: str, line: Line | bytes | str) -> tuple[int, bytes | str, str | None]:
        if isinstance(line, Line):
            self._line[sender] = line.number
            return line.number, line.data, line.note
        self._line[sender] += 1
        return self._line[sender], line, None

    def _detect(self, data: bytes | str) -> None:
        obj = peek_object(data)
        found = detect_dialect(obj) if obj is not None else None
        if found is not None:
            self.dialect = V1 if found == V1 else CURRENT

    def _violation(self, sender: str, line: int | None, msg: Message | None, reason: str) -> Verdict:
        verdict = Verdict(Kind.VIOLATION, sender, line, msg, reason)
        self.violation_count += 1
        if len(self.violations) < KEEP_VERDICTS:  # a stream of garbage costs no memory a line
            self.violations.append(verdict)
        return verdict


def _join(a: str | None, b: str | None) -> str | None:
    if a and b:
        return f"{a}; {b}"
    return a or b
