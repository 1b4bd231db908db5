"""The rules of one IC <-> LB pair's two sockets (sans-IO).

``Session`` keeps the judge contract (``wallaroo_proto.judge``): ``feed(IC, (header,
body))`` for a log record from the IC, ``feed(LB, message)`` for a message from the
LB, ``end(side, how, partial, blob_left=...)`` for the end of a stream, and
``expects()``. Each ``feed`` returns a ``Verdict``: accepted, replayed (a record of
the recovery replay), or a violation with named reasons (``RULES``). The mock IC,
the mock LB and the capture dissector drive this same object, so a rule is written
once.

The order the IC's code holds: a first start opens with a control record
(sequence id -1) TakeBecomingPrimaryCheckpoint, to which the LB answers
InitialMessage, then Checkpoint + blob; a recovery opens with the checkpoint
record (-2) + blob, then the replayed records, then TakeBecomingPrimaryCheckpoint,
UpgradeTakeCheckpoint or BecomingPrimary ends the replay. While a checkpoint
request is outstanding the IC sends no record, normal or control: one request at
a time. Normal records have sequence ids one above the last. Where the protocol's first document (the
"seed") and the current code differ, the reader takes both: the seed knows no
-2 record nor the TakeCheckpoint that follows an upgrade's checkpoint, and
lets the C# binding's InitialMessage be a whole RPC (any bytes are taken).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from xxhash import xxh64_intdigest

from wallaroo_proto.judge import End, Expected, Kind
from wallaroo_proto.judge import Verdict as _Verdict

from .codec import (
    ATTACH_TO,
    BECOMING_PRIMARY,
    CHECKPOINT,
    CHECKPOINT_SEQ,
    CONTROL,
    CONTROL_SEQ,
    COUNT_REPLAYABLE_RPC_BATCH,
    FROM_LB,
    IMPULSE,
    IN_RECORDS,
    INITIAL_MESSAGE,
    RPC,
    RPC_BATCH,
    RPC_TYPE_NAMES,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_SERVICE,
    UPGRADE_TAKE_CHECKPOINT,
    Header,
    MalformedError,
    Message,
    Rpc,
    batch_messages,
    check_bytes,
    checkpoint_length,
    decode_rpc,
    record_messages,
    scan_batched_rpcs,
    scan_rpcs,
    scan_self_calls,
    type_name,
)

IC, LB = "ic", "lb"

#: Every rule a violation can name, with what it says.
RULES: dict[str, str] = {
    "framing": "bytes that cannot be split into records (IC) or messages (LB)",
    "check-bytes": "a record's check bytes are not xxHash64 of its body (0 for the checkpoint record)",
    "sequence-gap": "a normal record's sequence id is not one above the previous one",
    "sequence-id": "a negative sequence id other than -1 (control) and -2 (checkpoint)",
    "committer-changed": "the committer id changed within one connection",
    "record-body": "a message in a record body overruns it or is malformed",
    "control-record": "a -1 record that is not exactly one body-less control message",
    "checkpoint-record": "a -2 record that is not exactly one Checkpoint message, or not the first record",
    "type-in-record": "a message type that a normal record never carries",
    "start-sequence": "the IC's first record is not TakeBecomingPrimaryCheckpoint nor the -2 record",
    "record-while-checkpointing": (
        "a normal or control record while the IC waits for the LB's checkpoint (it quiesces)"
    ),
    "batch": "an RPC batch whose count, replayable count or inner messages are wrong",
    "rpc": "a malformed RPC: cut short, an unknown RPC type, a bad destination name",
    "lb-message-type": "a message type the IC does not accept from an LB (the IC dies on it)",
    "attach-before-send": "an RPC to another instance before an AttachTo for it",
    "initial-message": "an InitialMessage outside a first start, or a second one",
    "initial-before-checkpoint": "a first start's Checkpoint before its InitialMessage (the IC deadlocks)",
    "unsolicited-checkpoint": "a Checkpoint from the LB with no checkpoint request outstanding",
    "checkpoint-message": "a Checkpoint message whose length is missing, negative or followed by bytes",
    "checkpoint-truncated": "the stream ended inside a checkpoint's raw bytes",
    "impulse-during-recovery": "the LB sent an Impulse RPC while the IC replays its log",
}

#: Control messages that ask the LB for a checkpoint.
_ASKS_CHECKPOINT = frozenset({TAKE_CHECKPOINT, TAKE_BECOMING_PRIMARY_CHECKPOINT, UPGRADE_TAKE_CHECKPOINT})
#: Control messages that end a recovery's replay.
_ENDS_REPLAY = frozenset({TAKE_BECOMING_PRIMARY_CHECKPOINT, UPGRADE_TAKE_CHECKPOINT, BECOMING_PRIMARY})


class Phase(StrEnum):
    START = "start"  # nothing from the IC yet
    FIRST_START = "first-start"  # TakeBecomingPrimaryCheckpoint came first: no checkpoint yet
    REPLAY = "replay"  # after the checkpoint record, before the replay's end
    UPGRADE_TEST = "upgrade-test"  # UpgradeService: replay goes on (the IC never ends it)
    NORMAL = "normal"


#: The phase a control record moves the IC to: (phase, control message) -> next phase; a pair
#: not here keeps the phase (a first record other than TakeBecomingPrimaryCheckpoint breaks
#: start-sequence). The checkpoint record moves it to REPLAY, the LB's Checkpoint answering a
#: first start to NORMAL.
_AFTER_CONTROL: dict[tuple[Phase, int], Phase] = {
    (Phase.START, TAKE_BECOMING_PRIMARY_CHECKPOINT): Phase.FIRST_START,
    **{(Phase.REPLAY, kind): Phase.NORMAL for kind in _ENDS_REPLAY},
    **{(phase, UPGRADE_SERVICE): Phase.UPGRADE_TEST for phase in Phase if phase is not Phase.START},
}
_CONTROL_NAMES = frozenset(type_name(kind) for kind in CONTROL)
#: The frame types the LB may always send (their contents decide); InitialMessage and
#: Checkpoint only when ``expects`` says so.
_LB_ANY_TIME = frozenset(type_name(kind) for kind in FROM_LB - {INITIAL_MESSAGE, CHECKPOINT})


@dataclass(slots=True)
class Verdict(_Verdict):
    """The judge's verdict, with every rule a record broke (``rule``/``reason``: the first)."""

    #: "rule: reason" for each rule broken.
    violations: tuple[str, ...] = ()
    #: The record's or message's messages (a message: itself), decoded as far as they go.
    messages: tuple[Message, ...] = ()
    note: str | None = None


#: The verdict on a record with nothing wrong (the common one, shared: a dataclass is slow to build).
_ACCEPTED = Verdict(Kind.ACCEPTED, IC)


def _violation(rule: str, reason: str) -> str:
    return f"{rule}: {reason}"


class Session:
    """One LB and its IC: both sockets' rules, in the order things happened."""

    SIDES: ClassVar[tuple[str, str]] = (IC, LB)
    RULES: ClassVar[dict[str, str]] = RULES

    def __init__(self, *, verify_check_bytes: bool = True, judge_own_bodies: bool = True) -> None:
        self.verify_check_bytes = verify_check_bytes
        #: False for an IC judging its own records: their bodies are what it built, only the order matters.
        self.judge_own_bodies = judge_own_bodies
        self.phase = Phase.START
        self.committer: int | None = None
        self.last_seq: int | None = None
        #: The control message whose checkpoint the IC waits for (None: none asked).
        self.checkpoint_asked: int | None = None
        self.first_start = False
        self.initial_message = False
        self.attached: set[str] = set()
        # counts, for summaries
        self.records = 0
        self.replayed = 0
        self.rpcs_in = 0
        self.rpcs_out = 0
        self.checkpoints_in = 0  # checkpoint records from the IC
        self.checkpoints_out = 0  # Checkpoint messages from the LB
        self.requests: dict[str, int] = {}
        self.violations = 0
        #: Which one-pass scanner ``from_ic_rpcs`` tries first (a hint of speed, not a rule).
        self._batches_seen = False

    def feed(self, side: str, frame: Any) -> Verdict:
        """``side`` sent ``frame``: the IC a log record as ``(Header, body)``, the LB a ``Message``."""
        if side == IC:
            header, body = frame
            return self._record(header, body)
        if side == LB:
            return self._message(frame)
        raise ValueError(f"side {side!r}: one of {self.SIDES}")

    # --- IC -> LB ---------------------------------------------------------------------------------

    def _record(self, header: Header, body: bytes) -> Verdict:
        """One log record from the IC."""
        problems: list[str] = []
        seq = header.seq
        self._header_checks(header, body, problems)
        try:
            messages = record_messages(body) if self.judge_own_bodies or seq < 0 else []
        except MalformedError as err:
            problems.append(_violation("record-body", f"{err.reason} (body offset {err.offset})"))
            messages = []
        note = None
        if seq == CONTROL_SEQ:
            note = self._control(messages, problems)
        elif seq == CHECKPOINT_SEQ:
            self._checkpoint_record(messages, problems)
        elif seq < 0:
            problems.append(_violation("sequence-id", f"sequence id {seq}"))
        else:
            self._normal(seq, messages, problems)
        kind = (
            Kind.REPLAYED if seq >= 0 and self.phase in (Phase.REPLAY, Phase.UPGRADE_TEST) else Kind.ACCEPTED
        )
        if seq >= 0:
            self.records += 1
            if kind is Kind.REPLAYED:
                self.replayed += 1
        return self._verdict(kind, IC, problems, messages, note)

    def from_ic_rpcs(self, header: Header, body: bytes) -> tuple[Verdict, tuple[bytes, list[bytes]] | None]:
        """``feed(IC, ...)`` for a record of plain RPCs, read in one pass: (verdict, (method ids, args)).

        Method ids come one a byte (``codec.scan_rpcs``); RPCs in batches come as if plain, in
        order (``codec.scan_batched_rpcs``), where every batch is one the general path accepts.

        The record-level rules are the same; the RPCs come as two lists instead
        of messages in the verdict. Any other record (a control or checkpoint
        record, an unusual message, a malformed size) goes through ``feed``,
        whose verdict holds its messages, with None for the lists.
        """
        seq = header.seq
        rpcs = None
        if seq < 0:
            pass
        elif self._batches_seen:  # an IC that batches: its bodies read by the scanner that knows batches
            rpcs = scan_batched_rpcs(body)
        else:  # else the plain scan, quicker where there are no batches, and the other if it fails
            rpcs = scan_rpcs(body)
            if rpcs is None:
                rpcs = scan_batched_rpcs(body)
                self._batches_seen = rpcs is not None
        if rpcs is None:
            return self._record(header, body), None
        if (  # the usual record, checked inline: the next one, in the normal phase, nothing wrong
            seq - 1 == self.last_seq
            and self.phase is Phase.NORMAL
            and self.checkpoint_asked is None
            and header.committer == self.committer
            and (not self.verify_check_bytes or header.check == xxh64_intdigest(body))
        ):
            self.last_seq = seq
            self.rpcs_in += len(rpcs[1])
            self.records += 1
            return _ACCEPTED, rpcs
        problems: list[str] = []
        self._header_checks(header, body, problems)
        self._normal(seq, (), problems)
        self.rpcs_in += len(rpcs[1])
        self.records += 1
        if self.phase is Phase.REPLAY or self.phase is Phase.UPGRADE_TEST:
            self.replayed += 1
            return self._verdict(Kind.REPLAYED, IC, problems, ()), rpcs
        return self._verdict(Kind.ACCEPTED, IC, problems, ()), rpcs

    def _header_checks(self, header: Header, body: bytes, problems: list[str]) -> None:
        """The committer id and the check bytes."""
        if self.committer is None:
            self.committer = header.committer
        elif header.committer != self.committer:
            problems.append(
                _violation("committer-changed", f"committer id {header.committer}, was {self.committer}")
            )
            self.committer = header.committer
        if self.verify_check_bytes:
            want = check_bytes(body, header.seq)
            if header.check != want:
                problems.append(
                    _violation(
                        "check-bytes", f"check bytes {header.check:#018x}, the body's are {want:#018x}"
                    )
                )

    def _verdict(
        self, kind: Kind, side: str, problems: list[str], messages, note: str | None = None
    ) -> Verdict:
        if problems:
            self.violations += 1
            rule, _, reason = problems[0].partition(": ")
            return Verdict(Kind.VIOLATION, side, rule, reason, tuple(problems), tuple(messages), note)
        return Verdict(kind, side, None, None, (), tuple(messages), note)

    def _control(self, messages: list[Message], problems: list[str]) -> str | None:
        if len(messages) != 1 or messages[0].type not in CONTROL or messages[0].data:
            what = ", ".join(m.name + (f"+{len(m.data)} bytes" if m.data else "") for m in messages) or "none"
            problems.append(_violation("control-record", f"a -1 record holds {what}"))
            return None
        kind = messages[0].type
        name = type_name(kind)
        self.requests[name] = self.requests.get(name, 0) + 1
        asked = self.checkpoint_asked
        if asked is not None and self.phase is not Phase.UPGRADE_TEST:  # one request at a time
            problems.append(
                _violation(
                    "record-while-checkpointing",
                    f"{name} while the IC waits for the checkpoint {type_name(asked)} asked for",
                )
            )
            return None
        after = _AFTER_CONTROL.get((self.phase, kind))
        if after is None and self.phase is Phase.START:
            problems.append(_violation("start-sequence", f"the IC opened with {name}"))
            after = Phase.NORMAL
        if after is not None:
            self.phase = after
        if after is Phase.FIRST_START:
            self.first_start = True
        elif after is Phase.UPGRADE_TEST:
            return "upgrade test: the LB upgrades, the replay goes on"
        if kind in _ASKS_CHECKPOINT:
            self.checkpoint_asked = kind
        return None

    def _checkpoint_record(self, messages: list[Message], problems: list[str]) -> None:
        self.checkpoints_in += 1
        if len(messages) != 1 or messages[0].type != CHECKPOINT:
            problems.append(_violation("checkpoint-record", "a -2 record must hold exactly one Checkpoint"))
        else:
            try:
                checkpoint_length(messages[0])
            except MalformedError as err:
                problems.append(_violation("checkpoint-message", err.reason))
        if self.phase is not Phase.START:
            problems.append(
                _violation("checkpoint-record", "a checkpoint record after the IC's first record")
            )
        self.phase = Phase.REPLAY

    def _normal(self, seq: int, messages: list[Message] | tuple[()], problems: list[str]) -> None:
        if self.phase is Phase.START:
            problems.append(_violation("start-sequence", f"the IC opened with record {seq}"))
            self.phase = Phase.NORMAL
        if self.checkpoint_asked is not None and self.phase is not Phase.UPGRADE_TEST:
            problems.append(
                _violation(
                    "record-while-checkpointing",
                    f"record {seq} while the IC waits for the checkpoint {type_name(self.checkpoint_asked)} "
                    "asked for",
                )
            )
        last = self.last_seq
        if last is not None and seq != last + 1:
            problems.append(_violation("sequence-gap", f"record {seq} after {last}"))
        self.last_seq = seq
        for msg in messages:
            kind = msg.type
            if kind == RPC:
                self.rpcs_in += 1
                data = msg.data
                # the common case read inline: a one-byte method id, then the RPC type
                if len(data) < 3 or data[1] & 0x80 or data[2] > 2:
                    self._rpc(data, False, problems)
            elif kind in (RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH):
                self._batch(msg, False, problems)
            elif kind not in IN_RECORDS:
                problems.append(_violation("type-in-record", f"{msg.name} in record {seq}"))

    def _rpc(self, data: bytes, outgoing: bool, problems: list[str]) -> Rpc | None:
        try:
            rpc = decode_rpc(data, outgoing)
        except MalformedError as err:
            problems.append(_violation("rpc", err.reason))
            return None
        if rpc.rpc_type not in RPC_TYPE_NAMES:
            problems.append(_violation("rpc", f"RPC type {rpc.rpc_type} (0 async, 1 fork, 2 impulse)"))
        if not outgoing:
            return rpc
        if rpc.destination and rpc.destination not in self.attached:
            problems.append(_violation("attach-before-send", f"RPC to {rpc.destination!r} before AttachTo"))
        if rpc.rpc_type == IMPULSE and self.phase in (Phase.REPLAY, Phase.UPGRADE_TEST):
            problems.append(_violation("impulse-during-recovery", "an Impulse RPC while the IC replays"))
        return rpc

    def _batch(self, msg: Message, outgoing: bool, problems: list[str]) -> None:
        try:
            count, replayable, inner = batch_messages(msg)
        except MalformedError as err:
            problems.append(_violation("batch", err.reason))
            return
        if count != len(inner):
            problems.append(_violation("batch", f"{msg.name} says {count} messages, holds {len(inner)}"))
        replayables = 0
        for m in inner:
            if m.type != RPC:
                problems.append(_violation("batch", f"{msg.name} holds a {m.name}"))
                continue
            if outgoing:
                self.rpcs_out += 1
            else:
                self.rpcs_in += 1
            rpc = self._rpc(m.data, outgoing, problems)
            if rpc is not None and rpc.rpc_type != IMPULSE:
                replayables += 1
        if replayable is not None and replayable != replayables:
            problems.append(
                _violation(
                    "batch", f"replayable count {replayable}, the batch holds {replayables} non-Impulse RPCs"
                )
            )

    # --- LB -> IC ---------------------------------------------------------------------------------

    def from_lb_self_calls(self, message: Message) -> tuple[Verdict, list[bytes] | None]:
        """``feed(LB, message)`` for an RPCBatch of plain self calls, read in one pass: (verdict, the
        calls re-encoded as the IC delivers them). Any other message goes through ``feed``, with None."""
        calls = scan_self_calls(message.data) if message.type == RPC_BATCH else None
        if calls is None:
            return self._message(message), None
        self.rpcs_out += len(calls)
        return Verdict(Kind.ACCEPTED, LB, None, None, (), (message,)), calls

    def _message(self, message: Message) -> Verdict:
        """One message from the LB."""
        problems: list[str] = []
        kind = message.type
        note = None
        if kind not in FROM_LB:
            problems.append(_violation("lb-message-type", f"{message.name}: 'Illegal leading byte'"))
        elif kind == RPC:
            self.rpcs_out += 1
            self._rpc(message.data, True, problems)
        elif kind == RPC_BATCH:
            self._batch(message, True, problems)
        elif kind == ATTACH_TO:
            try:
                self.attached.add(message.data.decode("utf-8"))
            except UnicodeDecodeError:
                problems.append(_violation("rpc", "AttachTo name is not UTF-8"))
        elif kind == INITIAL_MESSAGE:
            if not self.first_start or self.initial_message:
                problems.append(
                    _violation(
                        "initial-message",
                        "a second InitialMessage"
                        if self.initial_message
                        else "InitialMessage outside a first start",
                    )
                )
            self.initial_message = True
        elif kind == CHECKPOINT:
            note = self._lb_checkpoint(message, problems)
        elif kind == TAKE_CHECKPOINT:
            note = "the LB asks for a checkpoint now"
        return self._verdict(Kind.ACCEPTED, LB, problems, (message,), note)

    def _lb_checkpoint(self, message: Message, problems: list[str]) -> str | None:
        self.checkpoints_out += 1
        try:
            checkpoint_length(message)
        except MalformedError as err:
            problems.append(_violation("checkpoint-message", err.reason))
        asked = self.checkpoint_asked
        if asked is None:
            problems.append(_violation("unsolicited-checkpoint", "no checkpoint request is outstanding"))
            return None
        if asked == TAKE_BECOMING_PRIMARY_CHECKPOINT and self.phase is Phase.FIRST_START:
            if not self.initial_message:
                problems.append(_violation("initial-before-checkpoint", "Checkpoint before InitialMessage"))
            self.phase = Phase.NORMAL
        self.checkpoint_asked = None
        return f"answers {type_name(asked)}"

    # --- both -------------------------------------------------------------------------------------

    def end(
        self, side: str, how: End = End.CLOSED, partial: int = 0, *, blob_left: int = 0
    ) -> Verdict | None:
        """``side``'s stream ended with ``blob_left`` checkpoint bytes still owed (the splitter
        knows them), or ``partial`` bytes of a record (IC) or message (LB) it never finished: a
        violation if any. A close and a reset end alike: what breaks a rule is what was owed."""
        if side not in self.SIDES:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        if partial and not blob_left:
            rule, reason = (
                "framing",
                f"{side} stream ended {partial} bytes into a {'record' if side == IC else 'message'}",
            )
        elif blob_left:
            rule, reason = (
                "checkpoint-truncated",
                f"{side} stream ended {blob_left} bytes short of a checkpoint",
            )
        else:
            return None
        self.violations += 1
        return Verdict(Kind.VIOLATION, side, rule, reason, (_violation(rule, reason),))

    def expects(self) -> Expected:
        """What the pair waits for next: the frame types each side may send now, and a line."""
        phase, asked = self.phase, self.checkpoint_asked
        if phase is Phase.START:
            ic = frozenset({type_name(TAKE_BECOMING_PRIMARY_CHECKPOINT), "CheckpointRecord"})
        elif asked is None or phase is Phase.UPGRADE_TEST:
            ic = _CONTROL_NAMES | {"Record"}
        else:
            ic = _CONTROL_NAMES
        lb = _LB_ANY_TIME
        if self.first_start and not self.initial_message:
            lb |= {type_name(INITIAL_MESSAGE)}
        first = phase is Phase.FIRST_START and not self.initial_message
        if asked is not None and not (first and asked == TAKE_BECOMING_PRIMARY_CHECKPOINT):
            lb |= {type_name(CHECKPOINT)}
        if asked is not None:
            text = "InitialMessage, then Checkpoint from the LB" if first else "Checkpoint from the LB"
        else:
            text = {
                Phase.START: "the IC's first record",
                Phase.REPLAY: "replayed records, then the end of the replay",
                Phase.UPGRADE_TEST: "replayed records (upgrade test)",
                Phase.NORMAL: "records and RPCs",
                Phase.FIRST_START: "Checkpoint from the LB",
            }[phase]
        return Expected({IC: ic, LB: lb}, text)


__all__ = ["IC", "LB", "RULES", "Phase", "Session", "Verdict"]
