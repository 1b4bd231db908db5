"""Tremor's WebSocket for the proxy's fault rules: frames, their fields, a close with a status.

Each direction opens with its HTTP head (the client's upgrade request, the
node's 101), which comes out as a frame of its own; after it every RFC 6455
frame is one frame, as ``wsframes`` reads it. A refused upgrade is followed by
no WebSocket, so those bytes are not framed. Frames are judged as ``dissect``
judges them (``MessageAssembler`` per direction, the session's ``Session``),
which names each: its opcode, or the message it completes (``connect``,
``echo``, ``pubsub:subscribe``...). A client's frames are masked: a rewritten
one is masked again with its own key.
"""

from __future__ import annotations

import secrets
import struct
from collections import deque
from collections.abc import Mapping
from typing import Any

from wallaroo_proto.proxy.faultkit import FaultError, Frame, NamedFault, Send

from .core import CLIENT, SERVER, Session
from .dissect import verdict_fields
from .messages import ErrorClose, encode, status_text
from .wsframes import (
    CLOSE,
    DEFAULT_MAX_FRAME,
    TEXT,
    MessageAssembler,
    decode_frame,
    head_length,
    opcode_name,
    parse_header,
    read_request,
    read_response,
    unmask,
)

#: An HTTP head longer than this is not one (as ``dissect`` takes it).
MAX_HEAD = 64 * 1024
#: Control frames carry at most this much payload (RFC 6455 5.5): a close's reason is cut to fit.
_MAX_CONTROL = 125
_REWRITABLE = ("ws_close_code", "status_code", "message_json")


class _Side:
    __slots__ = ("client", "phase", "buf", "assembler", "kinds")

    def __init__(self, client: bool) -> None:
        self.client = client
        self.phase = "http"  # -> "frames" after the head; "none" after a refused upgrade
        self.buf = bytearray()
        self.assembler = MessageAssembler(client=client)
        self.kinds: deque[str] = deque()  # "head", "ws" or "raw", per frame handed out, for fields()


class TremorAdapter:
    """One proxied Tremor connection, for the fault rules."""

    def __init__(self) -> None:
        self.sides = {True: _Side(True), False: _Side(False)}
        self.session = Session()
        self.request = None

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        side = self.sides[from_client]
        side.buf += data
        if side.phase == "none":
            return _give_up(side)
        out: list[bytes] = []
        buf = side.buf
        if side.phase == "http":
            end = head_length(bytes(buf[:MAX_HEAD]))
            if end is None:
                return _give_up(side) if len(buf) > MAX_HEAD else out  # no HTTP head: not framed
            head = bytes(buf[:end])
            del buf[:end]
            out.append(head)
            side.kinds.append("head")
            side.phase = "frames"
            if not from_client and read_response(head, None).status != 101:
                return out + _give_up(side)  # a refusal's body follows, no WebSocket
        pos = 0
        while (header := parse_header(buf, pos)) is not None:
            head_len, n, _ = header
            if n > DEFAULT_MAX_FRAME:
                del buf[:pos]
                return out + _give_up(side)  # damage, not a frame: the rest passes as it comes
            if len(buf) - pos < head_len + n:
                break
            out.append(bytes(buf[pos : pos + head_len + n]))
            side.kinds.append("ws")
            pos += head_len + n
        del buf[:pos]
        return out

    def tail(self, from_client: bool) -> bytes:
        """The bytes of this direction not yet in a frame: an HTTP head without its blank line,
        or a WebSocket frame cut short."""
        return bytes(self.sides[from_client].buf)

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        side = self.sides[from_client]
        sender = CLIENT if from_client else SERVER
        kind = side.kinds.popleft()
        if kind == "raw":
            return {"type": "INVALID", "sender": sender}
        if kind == "head":
            if from_client:
                self.request = read_request(frame)
                return {"type": "UPGRADE_REQUEST", "sender": sender, "http_target": self.request.target}
            response = read_response(frame, self.request)
            return {"type": "UPGRADE_RESPONSE", "sender": sender, "http_status": response.status}
        f = decode_frame(frame)
        message, _ = side.assembler.frame(f)
        out: dict[str, Any] = {
            "type": opcode_name(f.opcode),
            "sender": sender,
            "ws_opcode": f.opcode,
            "ws_fin": f.fin,
            "ws_masked": f.masked,
            "ws_length_bits": f.length_bits,
            "ws_payload_len": len(f.payload),
        }
        if f.opcode == CLOSE:
            out["ws_close_code"] = side.assembler.close_code if len(f.payload) >= 2 else None
        if message is not None and message.opcode == TEXT and message.text is not None:
            verdict = self.session.feed(CLIENT if from_client else SERVER, message.text)
            out["type"] = verdict.type
            out["message_json"] = message.text
            verdict_fields(out, verdict)
        return out

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        if "ws_opcode" not in frame.fields:
            raise FaultError(
                f"{frame.fields.get('type')} is an HTTP head: only WebSocket frames are rewritten"
            )
        f = decode_frame(frame.data)
        if field_name == "ws_close_code":
            if f.opcode != CLOSE:
                raise FaultError("ws_close_code is a field of a CLOSE frame only")
            payload = _status(value) + f.payload[2:]
        elif field_name in ("status_code", "message_json"):
            if f.opcode != TEXT or not f.fin:
                raise FaultError(f"{field_name} is rewritten in a message of one TEXT frame only")
            if field_name == "status_code":
                if frame.fields.get("type") != "error-close":
                    raise FaultError("status_code is rewritten in an error-close message only")
                payload = encode(ErrorClose(status_text(str(value)))).encode()
            else:
                payload = str(value).encode()
        else:
            raise FaultError(
                f"field {field_name!r} cannot be rewritten in Tremor; these can: {', '.join(_REWRITABLE)}"
            )
        return encode_frame(f.opcode, payload, fin=f.fin, rsv=f.rsv, mask_key=f.mask_key)

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        """A WebSocket close 1002 (protocol error) with the reason: how RFC 6455 fails a connection."""
        return close_frame(1002, reason, masked=not to_client)


def _give_up(side: _Side) -> list[bytes]:
    """No more frames in this direction: what is held goes on as one frame, each later read as its own."""
    side.phase = "none"
    rest = bytes(side.buf)
    side.buf.clear()
    if not rest:
        return []
    side.kinds.append("raw")
    return [rest]


def _status(code: Any) -> bytes:
    try:
        number = int(code)
        return struct.pack("!H", number)
    except (TypeError, ValueError, struct.error):
        raise FaultError(f"a close status is a number from 0 to 65535, not {code!r}") from None


def encode_frame(
    opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask_key: bytes | None
) -> bytes:
    """One RFC 6455 frame, its length in the shortest form; masked when ``mask_key`` is given."""
    n = len(payload)
    mask_bit = 0x80 if mask_key else 0
    if n < 126:
        head = bytes((0x80 * fin | rsv << 4 | opcode, mask_bit | n))
    elif n < 1 << 16:
        head = bytes((0x80 * fin | rsv << 4 | opcode, mask_bit | 126)) + struct.pack("!H", n)
    else:
        head = bytes((0x80 * fin | rsv << 4 | opcode, mask_bit | 127)) + struct.pack("!Q", n)
    if mask_key:
        return head + mask_key + unmask(payload, mask_key)
    return head + payload


def close_frame(status: int, reason: str = "", *, masked: bool) -> bytes:
    """A close frame: status code and reason (cut to a control frame's 125 bytes); a client's is masked."""
    text = reason.encode()[: _MAX_CONTROL - 2].decode("utf-8", errors="ignore").encode()  # whole characters
    return encode_frame(CLOSE, _status(status) + text, mask_key=secrets.token_bytes(4) if masked else None)


def adapter() -> TremorAdapter:
    return TremorAdapter()


def _close(frame: Frame, params: Mapping[str, Any], adapter: TremorAdapter) -> list[Send]:
    """A close with the rule's status toward the frame's receiver, instead of the frame."""
    to_upstream = frame.from_client
    data = close_frame(params["status"], params["reason"], masked=to_upstream)
    return [Send(to_upstream, data, f"a WebSocket close of status {params['status']}")]


NAMED_FAULTS: dict[str, NamedFault] = {
    "close": NamedFault(
        help="a WebSocket close with a status (param status, default 1011; reason) sent to the frame's "
        "receiver instead of the frame, as if its peer closed",
        where="ws_opcode == 1",
        params={"status": (int, 1011), "reason": (str, "")},
        act=_close,
        direction="client",
    ),
}
