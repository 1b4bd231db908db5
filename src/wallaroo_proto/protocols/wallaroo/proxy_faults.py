"""The Wallaroo connector protocol under the proxy's fault rules: its frames, their fields, its faults.

Frames are split with the protocol's own ``FrameReader`` and read with its codec; a
frame's fields are the names ``dissect`` gives its record (a 2PC message is a MESSAGE
on stream 0 of the sink protocol, with ``twopc``, ``txn_id``, ``commit``, ...). Sans-IO.

The faults Wallaroo's users fear most:

- ``restart``: a RESTART sent to the client after a frame on its way there (the worker
  of a source connection, or the sink of a sink connection, asking its peer to
  reconnect), by default after an ACK;
- ``abort-vote``: a sink's 2PC REPLY that voted commit, turned to abort;
- ``withhold-phase2``: a worker's 2PC PHASE2 never reaches the sink.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from wallaroo_proto.proxy.faultkit import Close, FaultError, Frame, NamedFault, Send

from .codec import decode, encode
from .errors import EncodeError, ProtocolError
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SINK_VERSION,
    SOURCE_VERSION,
    Ack,
    EosMessage,
    Error,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    WorkersLeft,
    show_text,
    type_name,
)
from .reader import FrameReader
from .twopc import TWOPC_STREAM, Phase1, Reply, ReplyUncommitted, TwoPCWorkersLeft, decode_twopc, encode_twopc
from .wire import U32

#: The frame of bytes that could not be framed (a length prefix of 0 or above the maximum).
INVALID = "INVALID"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _from_b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise FaultError(f"a base64 text is wanted, not {value!r}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as err:
        raise FaultError(f"{value!r} is not base64: {err}") from err


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise FaultError(f"a text is wanted, not {value!r}")
    return value


def _same(value: Any) -> Any:
    return value


#: Per frame value type: the record field names that can be rewritten -> (the value's own
#: field, how a rule's value becomes it). The codec's encoder checks ranges and types.
_REWRITABLE: dict[type, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    Hello: {
        "version": ("version", _text),
        "cookie_b64": ("cookie", _from_b64),
        "program_name": ("program_name", _text),
        "instance_name": ("instance_name", _text),
    },
    Ok: {"initial_credits": ("initial_credits", _same)},
    Error: {"reason": ("reason", _text)},
    Notify: {
        "stream_id": ("stream_id", _same),
        "stream_name": ("stream_name", _text),
        "point_of_ref": ("point_of_ref", _same),
    },
    NotifyAck: {
        "success": ("success", _same),
        "stream_id": ("stream_id", _same),
        "point_of_ref": ("point_of_ref", _same),
    },
    Message: {
        "stream_id": ("stream_id", _same),
        "message_id": ("message_id", _same),
        "event_time": ("event_time", _same),
        "key_b64": ("key", _from_b64),
        "payload_b64": ("payload", _from_b64),
    },
    Ack: {"credits": ("credits", _same)},
    Restart: {"address": ("address", _text)},
    EosMessage: {"stream_id": ("stream_id", _same), "message_id": ("message_id", _same)},
    WorkersLeft: {"rtag": ("rtag", _same)},
}
#: An ACK's checkpoint pairs: every pair's point (or stream) set to the value.
_ACK_PAIRS = {"point_of_ref": 1, "acks.point_of_ref": 1, "acks.stream_id": 0}
#: 2PC messages (sink use, stream 0): record field -> the message's own field.
_TWOPC_REWRITABLE = {"commit": "commit", "txn_id": "txn_id", "rtag": "rtag"}


class WallarooAdapter:
    """One proxied connection: both directions' framing, and whether it is a source or a sink.

    The client is the side that sent HELLO: the connector of a source connection, the
    worker of a sink connection (HELLO version ``v0.0.1``, or 2PC on stream 0).
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._readers = {True: FrameReader(max_frame_size), False: FrameReader(max_frame_size)}
        #: Bytes received and not yet given out as whole frames, per direction.
        self._pending = {True: bytearray(), False: bytearray()}
        #: A direction whose framing broke: its bytes go on as they come.
        self._broken = {True: False, False: False}
        #: "source", "sink", or None until the frames tell.
        self.use: str | None = None

    # framing ------------------------------------------------------------------------------

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        """Whole frames these bytes complete; once a length prefix is impossible (0, or above
        the maximum frame size) the rest of that direction comes out as it arrives, unframed."""
        if self._broken[from_client]:
            return [bytes(data)] if data else []
        pending = self._pending[from_client]
        pending += data
        try:
            bodies = self._readers[from_client].feed_bodies(data)
        except ProtocolError as err:
            frames = [U32.pack(len(body)) + body for _, body in err.decoded]
            used = sum(map(len, frames))
            rest = bytes(pending[used:])
            pending.clear()
            self._broken[from_client] = True
            return [*frames, rest] if rest else frames
        frames = [U32.pack(len(body)) + body for _, body in bodies]
        if frames:
            del pending[: sum(map(len, frames))]
        return frames

    def tail(self, from_client: bool) -> bytes:
        """The bytes of a frame not yet whole in this direction: at the end of the
        connection, what a peer sent of a truncated frame."""
        return bytes(self._pending[from_client])

    # fields -------------------------------------------------------------------------------

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        """``type`` and the record fields ``dissect`` gives this frame, plus ``use`` and ``sender``."""
        if len(frame) < 5 or U32.unpack_from(frame)[0] != len(frame) - 4:
            return {"type": INVALID}
        try:
            value = decode(frame[4:])
        except ProtocolError:
            return {"type": type_name(frame[4]), **self._who(from_client)}
        self._settle(value)
        record: dict[str, Any] = {"type": value.TYPE.name, **self._who(from_client)}
        record.update(_record_fields(value, self.use == "sink"))
        return record

    def _settle(self, value: Any) -> None:
        """The use, as ``dissect`` settles it: by HELLO's version, else by a stream-0 MESSAGE."""
        if self.use is not None:
            return
        if type(value) is Hello:
            if value.version == SINK_VERSION:
                self.use = "sink"
            elif value.version == SOURCE_VERSION:
                self.use = "source"
        elif type(value) is Message:
            self.use = "sink" if value.stream_id == TWOPC_STREAM and _twopc(value) is not None else "source"

    def _who(self, from_client: bool) -> dict[str, str]:
        if self.use is None:
            return {}
        connector = from_client == (self.use == "source")
        return {"use": self.use, "sender": "connector" if connector else "worker"}

    # rewriting ----------------------------------------------------------------------------

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        """The frame with one record field set, re-encoded by the codec."""
        try:
            parsed = decode(frame.data[4:])
        except ProtocolError as err:
            raise FaultError(f"the frame cannot be decoded, so not rewritten: {err}") from err
        ftype = type(parsed)
        msg = _twopc(parsed) if self.use == "sink" else None
        try:
            if msg is not None and field_name in _TWOPC_REWRITABLE and hasattr(msg, field_name):
                if field_name == "commit" and not isinstance(value, bool):
                    raise FaultError(f"commit is true or false, not {value!r}")
                changed = msg._replace(**{field_name: _text(value) if field_name == "txn_id" else value})
                return encode(parsed._replace(payload=encode_twopc(changed)))
            if ftype is Ack and field_name in _ACK_PAIRS:
                at = _ACK_PAIRS[field_name]
                pairs = tuple((value, p) if at == 0 else (s, value) for s, p in parsed.acks)
                return encode(parsed._replace(acks=pairs))
            known = _REWRITABLE.get(ftype, {})
            if field_name not in known:
                can = sorted(known) + (sorted(_ACK_PAIRS) if ftype is Ack else [])
                if msg is not None:
                    can += sorted(k for k in _TWOPC_REWRITABLE if hasattr(msg, k))
                raise FaultError(
                    f"{field_name!r} of a {ftype.TYPE.name}{' ' + msg.TAG.name if msg else ''} cannot be "
                    f"rewritten; these can: {', '.join(can) or 'none'}"
                )
            own, convert = known[field_name]
            if ftype is Restart and value == "":
                return encode(Restart(None))
            return encode(parsed._replace(**{own: convert(value)}))
        except EncodeError as err:
            raise FaultError(str(err)) from err

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        """The protocol's ERROR frame (either side may send one), its reason cut to fit."""
        raw = reason.encode("utf-8")[:0xFFFF].decode("utf-8", "ignore")
        return encode(Error(raw))


def _twopc(value: Any) -> Any:
    """The 2PC message a stream-0 MESSAGE carries, or None."""
    if type(value) is not Message or value.stream_id != TWOPC_STREAM:
        return None
    try:
        return decode_twopc(value.payload)
    except ProtocolError:
        return None


def _record_fields(value: Any, sink: bool) -> dict[str, Any]:
    """The fields ``dissect``'s record holds for a decoded frame (after ``type``)."""
    ftype = type(value)
    if ftype is Message:
        out: dict[str, Any] = {
            "stream_id": value.stream_id,
            "message_id": value.message_id,
            "event_time": value.event_time,
            "key_b64": _b64(value.key) if value.key else "",
            "key_len": len(value.key),
            "payload_b64": _b64(value.payload),
            "payload_len": len(value.payload),
        }
        msg = _twopc(value) if sink else None
        if msg is not None:
            out["twopc"] = msg.TAG.name
            if hasattr(msg, "rtag"):
                out["rtag"] = msg.rtag
            if isinstance(msg, ReplyUncommitted):
                out["txn_ids"] = [show_text(t) for t in msg.txn_ids]
            elif isinstance(msg, TwoPCWorkersLeft):
                out["worker_names"] = [show_text(t) for t in msg.worker_names]
            if hasattr(msg, "txn_id"):
                out["txn_id"] = show_text(msg.txn_id)
            if isinstance(msg, Phase1):
                out["where"] = [{"stream_id": a, "start_por": b, "end_por": c} for a, b, c in msg.where]
            elif hasattr(msg, "commit"):
                out["commit"] = msg.commit
        return out
    if ftype is Ack:
        return {
            "credits": value.credits,
            "acks": [{"stream_id": s, "point_of_ref": p} for s, p in value.acks],
        }
    if ftype is Hello:
        return {
            "version": show_text(value.version),
            "cookie_b64": _b64(value.cookie),
            "cookie_len": len(value.cookie),
            "program_name": show_text(value.program_name),
            "instance_name": show_text(value.instance_name),
        }
    if ftype is Restart:
        return {} if value.address is None else {"address": show_text(value.address)}
    if ftype is WorkersLeft:
        return {"rtag": value.rtag, "worker_names": [show_text(t) for t in value.worker_names]}
    if ftype is Notify:
        return {
            "stream_id": value.stream_id,
            "stream_name": show_text(value.stream_name),
            "point_of_ref": value.point_of_ref,
        }
    if ftype is Error:
        return {"reason": show_text(value.reason)}
    # OK, NOTIFY_ACK, EOS_MESSAGE: the value's own names are the record's.
    return dict(value._asdict())


def adapter() -> WallarooAdapter:
    """A new connection's adapter."""
    return WallarooAdapter()


# --- the named faults ----------------------------------------------------------------------


def _restart(frame: Frame, params: Mapping[str, Any], conn: WallarooAdapter) -> list[Send | Close]:
    """The frame goes on, then a RESTART to the client (empty, or with ``address``), then the
    connection ends: a worker that sent RESTART is disconnected, and its connector must close
    and connect again."""
    address = params.get("address") or None
    restart = Send(False, encode(Restart(address)), f"a RESTART{f' to {address}' if address else ''}")
    return [Send(frame.from_client, frame.data), restart, Close(reset=False)]


def _abort_vote(frame: Frame, params: Mapping[str, Any], conn: WallarooAdapter) -> list[Send]:
    """A 2PC REPLY with its vote set to abort."""
    if frame.fields.get("twopc") != "REPLY":
        kind = frame.fields.get("twopc") or frame.fields.get("type", "?")
        raise FaultError(f"abort-vote acts at a 2PC REPLY, not at a {kind}")
    value = decode(frame.data[4:])
    reply = decode_twopc(value.payload)
    data = encode(value._replace(payload=encode_twopc(Reply(reply.txn_id, False))))
    return [Send(frame.from_client, data, "the REPLY with its vote set to abort")]


NAMED_FAULTS: dict[str, NamedFault] = {
    "restart": NamedFault(
        help="send the client a RESTART after a frame on its way there (default: after an ACK), "
        "then close the connection; address=HOST:PORT gives the shipped form's address",
        where='type == "ACK"',
        params={"address": (str, "")},
        act=_restart,
        direction="client",
    ),
    "abort-vote": NamedFault(
        help="a sink's 2PC REPLY that voted commit arrives at the worker as an abort vote",
        where='twopc == "REPLY" and commit == true',
        act=_abort_vote,
        direction="client",
    ),
    "withhold-phase2": NamedFault(
        help="a worker's 2PC PHASE2 (its commit or abort decision) is never forwarded to the sink",
        where='twopc == "PHASE2"',
        action="drop",
        direction="upstream",
    ),
}
