"""Replay for AMBROSIA's IC <-> LB protocol: a recorded frame follows the live peer's values.

One conversation is one LB's two sockets (the records' ``lb``), opened by the LB, receive
port first (``opening``). The played side keeps its own ``core.Session``, fed with what it
sends and with the live peer's frames, so it knows what the protocol allows next:

* playing the IC, a normal record is held while the live LB owes a checkpoint it was asked
  for (the IC quiesces until the Checkpoint and all its bytes are in), and a record echoing
  the first start's InitialMessage echoes the live LB's, re-encoded with the codec (its size
  and check bytes follow);
* playing the LB, InitialMessage waits for the live IC's first start and a Checkpoint for
  its request; the live IC's committer id (random at its first start) and sequence ids (its
  own log's numbering after a recovery; 0 on a first start) stand in for the recorded ones
  in what its records are expected to hold. Check bytes are compared: they hash the body
  alone, so equal bodies have equal check bytes whoever commits them.

The LB's RPCs are compared one by one, wherever they sit: a binding may send them alone or
in RPCBatch messages as its reads and timers fall (the protocol makes a batch a hint the IC
unpacks; the Node binding batches by timing), so an RPCBatch stands for its RPCs
(``units``), each with a digest of its arguments.

What it cannot adapt: the self calls a live LB sends that the recording's did not (the
recorded IC's records echo the recorded LB's), and a recovery whose checkpoint the live
peer did not write. Those show as divergent frames.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

from xxhash import xxh64_intdigest

from wallaroo_proto.replay.adapter import Adapter as PlainAdapter
from wallaroo_proto.replay.adapter import Hold

from .codec import (
    CHECKPOINT,
    HEADER_SIZE,
    INITIAL_MESSAGE,
    RPC,
    RPC_TYPE_NAMES,
    Incomplete,
    MalformedError,
    batch_messages,
    checkpoint_length,
    decode_rpc,
    encode_message,
    encode_record,
    read_header,
    read_message,
)
from .core import IC, LB, Phase, Session

_UNREADABLE = (MalformedError, Incomplete, struct.error, IndexError)


class Adapter(PlainAdapter):
    #: ``lb``: the pair's label names the LB's and IC's addresses and counts pairs between
    #: them: where the run was, not what was said. ``direction``: which TCP end sent a frame;
    #: a capture read without its SYNs takes the first sender (the IC, on the send socket) for
    #: the initiator, a live run knows the TCP client. ``sender`` says who sent it either way.
    NOISE: ClassVar[frozenset[str]] = frozenset({"lb", "direction"})

    def __init__(self, side: str) -> None:
        super().__init__(side)
        #: What the protocol allows next (the live frames are judged by the replay's dissector:
        #: this one only follows, so it neither hashes nor reads normal records' bodies).
        self.session = Session(verify_check_bytes=False, judge_own_bodies=False)
        #: The live LB's InitialMessage data (playing the IC).
        self.live_initial: bytes | None = None
        #: The live LB sent a Checkpoint whose bytes have not all come (playing the IC).
        self.blob_owed = False
        # playing the LB: the live IC's values, and the recorded ones they replace
        self.recorded_committer: int | None = None
        self.live_committer: int | None = None
        self.recorded_first_seq: int | None = None
        self.live_first_seq: int | None = None
        #: Expected records made before the live values were known: (fields, recorded committer, seq).
        self._pending: list[tuple[dict, int | None, int | None]] = []

    # --- what we send ------------------------------------------------------------------------------

    def outgoing(self, frame: Any) -> bytes | Hold:
        raw = frame.raw
        if frame.type == "CheckpointBytes" or not raw:
            return raw
        try:
            if self.side == IC:
                return self._record_out(raw)
            return self._message_out(raw)
        except _UNREADABLE:
            return raw  # the recording's own bytes, malformed: sent as they are, the judge says why

    def _record_out(self, raw: bytes) -> bytes | Hold:
        header = read_header(raw)
        body = raw[HEADER_SIZE : header.size]
        session = self.session
        if header.seq >= 0:
            asked = session.checkpoint_asked is not None and session.phase is not Phase.UPGRADE_TEST
            if asked or self.blob_owed:
                return Hold("the live LB has not answered the checkpoint asked for: no record goes before it")
            echoed = self._echo_live_initial(body) if session.first_start and not session.records else None
            if echoed is not None:  # the first record after a first start echoes its InitialMessage
                body = echoed
                raw = encode_record(header.committer, header.seq, body) + raw[header.size :]
                header = read_header(raw)
        session.feed(IC, (header, body))
        return raw

    def _echo_live_initial(self, body: bytes) -> bytes | None:
        """``body`` with its InitialMessage echo holding the live LB's data; None: nothing to change."""
        if self.live_initial is None:
            return None
        pos, end = 0, len(body)
        while pos < end:
            message, after = read_message(body, pos, end)
            if message.type == INITIAL_MESSAGE:
                if message.data == self.live_initial:
                    return None
                return body[:pos] + encode_message(INITIAL_MESSAGE, self.live_initial) + body[after:]
            pos = after
        return None

    def _message_out(self, raw: bytes) -> bytes | Hold:
        message, _ = read_message(raw, 0, len(raw))
        session = self.session
        if message.type == INITIAL_MESSAGE and not session.first_start:
            return Hold(f"the live IC has not opened a first start (it is in {session.phase.value})")
        if message.type == CHECKPOINT and session.checkpoint_asked is None:
            return Hold("the live IC has not asked for a checkpoint")
        session.feed(LB, message)
        return raw

    # --- what the live peer sends ------------------------------------------------------------------

    def incoming(self, record: dict, raw: bytes) -> None:
        kind = record.get("type")
        if kind == "CheckpointBytes":
            if self.side == IC:
                self.blob_owed = False
            return
        if not raw:
            return
        try:
            if self.side == IC:
                self._message_in(raw)
            else:
                self._record_in(raw)
        except _UNREADABLE:
            pass  # a malformed live frame: the judge reports it, there is nothing to learn from it

    def _message_in(self, raw: bytes) -> None:
        message, _ = read_message(raw, 0, len(raw))
        if message.type == INITIAL_MESSAGE:
            self.live_initial = message.data
        elif message.type == CHECKPOINT:
            self.blob_owed = checkpoint_length(message) > 0
        self.session.feed(LB, message)

    def _record_in(self, raw: bytes) -> None:
        header = read_header(raw)
        self.session.feed(IC, (header, raw[HEADER_SIZE : header.size]))
        if self.live_committer is None:
            self.live_committer = header.committer
        if header.seq >= 0 and self.live_first_seq is None:
            self.live_first_seq = header.seq
        self._resolve()

    # --- what the live peer should send ------------------------------------------------------------

    def units(self, record: dict, raw: bytes) -> list[dict]:
        if record.get("type") in _RPC_TYPES and record.get("sender") == LB:
            return _rpcs(record, raw)
        return [record]

    def expected(self, frame: Any) -> dict | list[dict]:
        if self.side == IC:
            return self.units(frame.record, frame.raw)
        fields = dict(frame.record)
        committer, seq = fields.get("committer_id"), fields.get("seq_id")
        if committer is None:
            return fields
        if self.recorded_committer is None:
            self.recorded_committer = committer
        if seq is not None and seq >= 0 and self.recorded_first_seq is None:
            self.recorded_first_seq = seq
        self._pending.append((fields, committer, seq))
        self._resolve()
        return fields

    def _seq_offset(self) -> int | None:
        """Live minus recorded sequence ids: 0 on a live first start (ids start at 0), else the
        first normal records' difference (a recovery numbers on from the live IC's log)."""
        if self.session.first_start:
            return 0
        if self.live_first_seq is None or self.recorded_first_seq is None:
            return None
        return self.live_first_seq - self.recorded_first_seq

    def _resolve(self) -> None:
        """Put the live values in the expected records made before they were known."""
        offset = self._seq_offset()
        live = self.live_committer
        waiting = []
        for fields, committer, seq in self._pending:
            if live is not None and committer == self.recorded_committer:
                fields["committer_id"] = live
            if seq is not None and seq >= 0:
                if offset is None:
                    waiting.append((fields, committer, seq))
                    continue
                fields["seq_id"] = seq + offset
            if live is None:
                waiting.append((fields, committer, seq))
        self._pending = waiting


_RPC_TYPES = frozenset({"RPC", "RPCBatch"})
#: A batch's fields that its RPCs do not share (each has its own).
_BATCH_ONLY = ("rpc_count", "length", "destination", "method_id", "rpc_type")


def _rpcs(record: dict, raw: bytes) -> list[dict]:
    """An LB's RPC, or each RPC of its RPCBatch, as compared: the message's fields and
    ``args_xxh64``, the RPC's own message length; a batch's verdict goes with its first RPC."""
    try:
        message, _ = read_message(raw, 0, len(raw))
        if message.type == RPC:
            inner = [(message, len(raw))]
        else:
            inner = [(m, len(encode_message(m.type, m.data))) for m in batch_messages(message)[2]]
        parts = []
        for i, (one, length) in enumerate(inner):
            rpc = decode_rpc(one.data, outgoing=True)
            part = {k: v for k, v in record.items() if k not in _BATCH_ONLY}
            if i:  # the batch's rules were judged once, on its first RPC
                for finding in ("violations", "severity", "finding"):
                    part.pop(finding, None)
                part["verdict"] = "accepted"
            part.update(
                type="RPC",
                destination=rpc.destination,
                method_id=rpc.method_id,
                rpc_type=RPC_TYPE_NAMES.get(rpc.rpc_type, str(rpc.rpc_type)),
                rpc_count=1,
                length=length,
                args_xxh64=f"{xxh64_intdigest(rpc.args):016x}",
            )
            parts.append(part)
    except _UNREADABLE:
        return [record]  # the judge says what is wrong with it; compared whole
    return parts or [record]


def match_key(record: dict) -> tuple:
    """Frames are matched in order: each socket is one ordered stream (the IC's log, the LB's
    messages), and the sequence ids are the live IC's own numbering, compared, not matched on."""
    return ()


def conversation_key(record: dict) -> tuple:
    """An LB's two sockets (the dissector pairs them: ``lb``) are one conversation."""
    return (record.get("lb") or f"#{record['conn_index']}",)


def opening(record: dict) -> tuple[str, int]:
    """The LB opens both sockets, the IC's receive port first: the IC listens on its send port
    only once that one is taken (``SetupLocalServiceStreams``), and speaks first on it."""
    return LB, 0 if record.get("ambrosia_socket") == "receive" else 1
