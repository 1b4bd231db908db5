"""Replaying one side of a recorded MultiLangDaemon conversation: what follows the live peer.

The daemon decides the records (their sequence numbers) and the requests; the processor
decides when it checkpoints and at which sequence number. So, playing:

- the daemon: requests go as recorded, one at a time (strict alternation: each waits for
  the live processor's ``status`` of the last one). A checkpoint reply answers what the live
  processor asked: its sequence numbers echoed, as the Java MLD does, and the recorded
  ``error`` kept when it asked what the recorded processor asked; else the KCL checkpointer's
  own answer for the live conversation (``core.checkpoint_error``). A checkpoint the
  recording never had is answered the same way (``owed``), so the processor goes on, and the
  comparison reports it as extra. A recorded reply the live processor never asked for is not
  sent. The processor's answers are matched within the request they came during (``REQUEST``).
- the processor: a checkpoint asks for the live daemon's sequence number at the position the
  recorded one had among the recorded records (a daemon reading another stream numbers its
  records otherwise), and a ``status`` names the live daemon's pending request. Each waits
  until the live daemon's conversation allows it.

A live ``Conversation`` (the core's judge, fed both sides' lines) tells what is pending.
Lines are re-encoded with the codec, in the recorded writer's style (kclpy's ``json.dumps``
or the MLD's compact JSON), only when a value changed; otherwise the recorded bytes go.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

from wallaroo_proto.replay import adapter

from .codec import (
    CHECKPOINT_ERRORS,
    CURRENT,
    Checkpoint,
    Fatal,
    Initialize,
    LineSplitter,
    Message,
    ProcessRecords,
    Skipped,
    Status,
    decode_from_daemon,
    decode_from_processor,
    encode,
    encode_kclpy,
    is_sequence_number,
)
from .core import DAEMON, PROCESSOR, Conversation, State, checkpoint_error, seq_key

#: Checkpoint errors that say what the daemon's surroundings did (DynamoDB throttled, the lease
#: went, a dependency failed), not what it thinks of the numbers asked: a recorded one is kept
#: when the live processor asks otherwise. The others are the checkpointer's verdict on the numbers.
CIRCUMSTANTIAL = frozenset(CHECKPOINT_ERRORS) - {"InvalidStateException", "IllegalArgumentException"}


#: The processor's frames that answer a request (its status, its checkpoints during it).
ANSWERS = ("status", "checkpoint")
#: Set on a processor's answers, recorded and live, when the daemon is played: which request
#: (1 for initialize) it came during. A live checkpoint the recording never had waits to be
#: matched (``compare.Matcher``'s early frames) and must not be taken for a later request's.
REQUEST = "request_number"


#: Records whose places are kept (playing the processor), recorded and live: a checkpoint may only
#: ask for a record since the last one, and a processor that asks further back than this many
#: records asks the recorded numbers (memory stays bounded however long the conversation).
WINDOW = 65_536


class Adapter(adapter.Adapter):
    """One replay of a shard's conversation, playing ``side`` (``daemon`` or ``processor``)."""

    #: Fields that differ between runs of the same conversation:
    #:
    #: - ``line_number``: a line's place in its direction, as ``offset`` and ``frame_index`` are
    #:   places; a processor that prints one more debug line on stdout (the MLD skips it) would
    #:   otherwise shift every later line;
    #: - ``length``: a line's bytes depend on its writer's JSON style (kclpy's spaces, Jackson's
    #:   compact form, key order), while the message's fields are compared one by one;
    #: - ``millis_behind_latest``: how far behind the shard's newest record a batch was read, a
    #:   lag in milliseconds that depends on when the daemon polled.
    NOISE: ClassVar[frozenset[str]] = frozenset({"line_number", "length", "millis_behind_latest"})

    def __init__(self, side: str) -> None:
        if side not in (DAEMON, PROCESSOR):
            raise ValueError(f"unknown side {side!r} (known: {DAEMON}, {PROCESSOR})")
        super().__init__(side)
        self.peer = PROCESSOR if side == DAEMON else DAEMON
        #: The live conversation, both sides, as the core judges it.
        self.live = Conversation()
        # daemon played: checkpoints since the last request, recorded (expected) and live
        self._asks_recorded = 0
        self._asks_live = 0
        self._ask_record: dict | None = None
        self._requests = 0  # recorded requests sent
        # processor played: the recorded records' positions, and the live records at each position
        self._recorded_at: dict[tuple[str, int | None], int] = {}
        self._recorded_order: deque[tuple[tuple[str, int | None], int]] = deque()
        self._live_at: dict[int, tuple[str, int | None]] = {}
        self._recorded_count = 0
        self._live_count = 0
        self._recorded_initial: tuple[str | None, int | None] | None = None
        #: The checkpoint the processor asked live (the daemon echoes it in its reply).
        self._asked: Checkpoint | None = None
        #: Our line going out, taken by the live conversation at the next call (fuzz may change it).
        self._going: bytes | None = None

    # ------------------------------------------------------------------ the played side

    def outgoing(self, frame: Any) -> bytes | adapter.Hold:
        """The recorded line, once the live conversation allows it, with the live peer's values."""
        self._commit()
        raw = frame.raw
        if frame.type in ("SKIPPED", "INVALID"):  # not a message: as recorded (a blank line too)
            return self._sent(raw, raw + b"\n")
        if not raw:
            return adapter.SKIP  # a record of no line (the end of a stream)
        if self.side == DAEMON:
            return self._daemon_line(raw)
        return self._processor_line(raw)

    def _daemon_line(self, raw: bytes) -> bytes | adapter.Hold:
        msg = _decode(DAEMON, raw, self.live.dialect)
        state = self.live.state
        if not isinstance(msg, Checkpoint):
            if state is State.PENDING:
                return adapter.Hold(f"the live processor's status for {self.live.pending}")
            if state is State.CHECKPOINTING:
                return adapter.Hold(f"the reply to the processor's checkpoint during {self.live.pending}")
            if state is State.ENDED:
                return adapter.SKIP  # the live conversation ended (fuzz sent a leaseLost): no more requests
            self._asks_recorded = self._asks_live = 0
            self._requests += 1
            return self._sent(raw, raw + b"\n")
        if state is State.PENDING:
            return adapter.Hold(f"the live processor's checkpoint during {self.live.pending}")
        if state is not State.CHECKPOINTING:
            return adapter.SKIP  # the live processor did not ask: the comparison says so
        return self._reply(msg, raw)

    def _reply(self, recorded: Checkpoint | None, raw: bytes = b"") -> bytes:
        """The reply to the live processor's pending checkpoint: its numbers echoed, and the
        ``recorded`` reply's error when it asked the recorded numbers, else the checkpointer's own
        answer (None: a checkpoint the recording never had)."""
        live = self.live
        ask = live.checkpoint
        assert ask is not None
        if recorded is not None and (recorded[:2] == ask[:2] or recorded.error in CIRCUMSTANTIAL):
            error = recorded.error
        else:
            last = live.last_checkpoint
            error = checkpoint_error(
                ask,
                action=live.pending,
                last=seq_key(*last) if last is not None and is_sequence_number(last[0]) else None,
                largest=live.largest,
                reason=live.pending_reason,
            )
        reply = Checkpoint(ask.sequence_number, ask.sub_sequence_number, error)
        if reply == recorded:
            return self._sent(raw, raw + b"\n")
        line = encode(reply, live.dialect or CURRENT, reply=True)
        return self._sent(line.strip(b"\r\n"), line)

    def _processor_line(self, raw: bytes) -> bytes | adapter.Hold:
        live = self.live
        msg = _decode(PROCESSOR, raw, live.dialect)
        state = live.state
        if isinstance(msg, Status):
            if state is State.CHECKPOINTING:
                return adapter.Hold("the live daemon's reply to the checkpoint")
            if state is not State.PENDING:
                return adapter.Hold("a request from the live daemon to answer")
            adapted: Message = Status(live.pending)
        elif isinstance(msg, Checkpoint):
            if state is not State.PENDING:
                return adapter.Hold("a request from the live daemon to checkpoint in")
            seq, sub = self._live_position(msg.sequence_number, msg.sub_sequence_number)
            adapted = Checkpoint(seq, sub, msg.error)
            self._asked = adapted
        else:  # a daemon's message from the processor: the MLD ignores it
            return self._sent(raw, raw + b"\n")
        if adapted == msg:
            return self._sent(raw, raw + b"\n")
        dialect = live.dialect or CURRENT
        kclpy = encode_kclpy(msg, dialect).strip(b"\n") == raw
        line = encode_kclpy(adapted, dialect) if kclpy else encode(adapted, dialect)
        return self._sent(line.strip(b"\r\n"), line)

    def _sent(self, line: bytes, data: bytes) -> bytes:
        """``data`` goes live: the live conversation takes its line as the played side's."""
        self._commit()
        self._going = line + b"\n"
        return data

    def as_recorded(self, frame: Any) -> bytes:
        """The recorded line as it went, its line end put back (a fuzz reproducer's illegal line)."""
        return self._sent(frame.raw, frame.raw + b"\n")

    def sent(self, frame: Any, data: bytes) -> None:
        """Fuzz changed our line or inserted one: the live conversation takes the whole lines that went."""
        if frame.as_is:  # inserted: the line before it went as it was
            self._commit()
        self._going = data

    def _commit(self) -> None:
        going, self._going = self._going, None
        if going is not None:
            for line in LineSplitter().feed(going):
                self.live.feed(self.side, line.data)

    def _live_position(self, seq: str | None, sub: int | None) -> tuple[str | None, int | None]:
        """The live record at the recorded one's position (or the live initialize's at the recorded
        initialize's); numbers that are no recorded record's (none, SHARD_END, another) go as they are."""
        at = self._recorded_at.get((seq, sub or 0)) if seq is not None else None
        if at is not None and at in self._live_at:
            live_seq, live_sub = self._live_at[at]
            self._forget_before(at)
            return live_seq, (live_sub if sub is not None else None)
        if seq is not None and self._recorded_initial is not None and seq == self._recorded_initial[0]:
            initial = self.live.initial
            if initial is not None and initial[0] is not None:
                return initial[0], (initial[1] if sub is not None else None)
        return seq, sub

    def _forget_before(self, at: int) -> None:
        """A checkpoint at ``at``: no later checkpoint may go below it, so earlier positions go."""
        order = self._recorded_order
        while order and order[0][1] < at:
            key, position = order.popleft()
            if self._recorded_at.get(key) == position:
                del self._recorded_at[key]
            self._live_at.pop(position, None)

    # ------------------------------------------------------------------ the live peer

    def incoming(self, record: dict, raw: bytes) -> None:
        """A live line of the peer: the live conversation takes it; records' positions are noted."""
        self._commit()
        if not record.get("length") and record.get("type") != "INVALID":
            return  # the end of its stream, no line
        verdict = self.live.feed(self.peer, raw)
        msg = verdict.message
        if self.peer == PROCESSOR and record.get("type") in ANSWERS:
            record[REQUEST] = self.live.requests
        if isinstance(msg, Checkpoint) and self.peer == PROCESSOR and verdict.ok:
            self._asks_live += 1
            self._ask_record = record
        elif isinstance(msg, ProcessRecords) and self.peer == DAEMON:
            for r in msg.records:
                self._live_at[self._live_count] = (r.sequence_number, r.sub_sequence_number)
                self._live_at.pop(self._live_count - WINDOW, None)
                self._live_count += 1

    def expected(self, frame: Any) -> dict:
        """The recorded peer frame; a daemon's reply is to echo the numbers the replay asked live."""
        self._commit()
        record = frame.record
        if self.peer == PROCESSOR:
            if frame.type == "checkpoint":
                self._asks_recorded += 1
            return {**record, REQUEST: self._requests} if frame.type in ANSWERS else record
        if frame.type == "processRecords" or frame.type == "initialize":
            msg = _decode(DAEMON, frame.raw, None)
            if isinstance(msg, Initialize):
                self._recorded_initial = (msg.sequence_number, msg.sub_sequence_number)
            elif isinstance(msg, ProcessRecords):
                for r in msg.records:
                    key = (r.sequence_number, r.sub_sequence_number or 0)
                    self._recorded_at[key] = self._recorded_count
                    self._recorded_order.append((key, self._recorded_count))
                    self._recorded_count += 1
                if self._recorded_count > WINDOW:
                    self._forget_before(self._recorded_count - WINDOW)
        elif frame.type == "checkpoint" and self._asked is not None:
            asked, self._asked = self._asked, None
            return {**record, "sequence_number": asked[0], "sub_sequence_number": asked[1]}
        return record

    def owed(self) -> tuple[dict, bytes] | None:
        """The reply to a live checkpoint the recording never had (daemon played), else None.

        Asked while the replay waits, when every recorded frame before the next one played
        was expected: more live checkpoints since the last request than recorded ones."""
        self._commit()
        if self.side != DAEMON or self.live.state is not State.CHECKPOINTING:
            return None
        if self._asks_live <= self._asks_recorded or self._ask_record is None:
            return None
        return self._ask_record, self._reply(None)


def _decode(side: str, raw: bytes, dialect: str | None) -> Message | None:
    """A recorded line as its reader reads it; None for one that is not a message."""
    try:
        if side == DAEMON:
            return decode_from_daemon(raw, dialect)
        decoded = decode_from_processor(raw, dialect or CURRENT)
    except (Fatal, Skipped):
        return None
    return decoded[0] if decoded is not None else None


def match_key(record: dict) -> tuple:
    """A processor's answer matches one to the same request (``REQUEST``, set when the daemon is
    played); otherwise frames of one type match in their order. One conversation is one shard
    and its lines strictly alternate; a sequence number in the key would make a live daemon that
    numbers its records otherwise report every batch missing and extra, not one field divergent."""
    return (record.get(REQUEST),)
