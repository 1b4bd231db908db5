"""Fuzzing the Tremor network protocol: WebSocket frames that carry one JSON message each.

A frame's layout is RFC 6455 5.2's (``wsframes``): FIN, RSV and opcode in its first byte,
the mask bit and a 7-bit length in its second, a 16- or 64-bit length after it, a client's
4-byte masking key, then the payload. A whole text frame's payload is a message (RFC 0019:
one record whose key is the stream alias), whose names are fuzzed as an ``enum`` over the
names the protocol knows (``NAMES``: a neighbour of ``echo`` is ``pubsub``) and whose
integers as ``uint``. ``with_value`` writes the frame again: the payload unmasked, changed,
its header written with the length in its form, and masked again with the frame's key, so a
changed message is still a well-framed one unless a header field was the one changed.

What a node owes is the prototype's: an ack for connect, disconnect and close, the version,
an echo, a pub/sub ack, list or version; any of them may be its error close instead. A
WebSocket Close is owed one back, a Ping a Pong (RFC 6455 5.5). A node refuses with its
error close (``{"tremor":{"close":"0.207: ..."}}``) or, for what breaks WebSocket, a Close
with an error code, before it closes; a client refuses by closing (it has no error message).
"""

from __future__ import annotations

import json
import re
from typing import Any

from wsproto.frame_protocol import CloseReason, FrameProtocol

from wallaroo_proto.fuzz.hooks import Field, Owed

from .core import CLIENT, PUBSUB_LISTS, SERVER
from .messages import (
    CONTROL,
    VERSION,
    Close,
    CloseAck,
    Connect,
    ConnectAck,
    Disconnect,
    DisconnectAck,
    ErrorClose,
    StreamMessage,
    VersionInfo,
    VersionRequest,
    dumps,
    encode,
    status_text,
)
from .wsframes import CLOSE, TEXT, decode_frame, parse_header, unmask

#: The names a message's aliases, protocols and operations take: a field's value is its index.
NAMES = (
    "tremor",
    "echo",
    "pubsub",
    "ps",
    "api",
    "control",
    "connect",
    "disconnect",
    "close",
    "version",
    "connect-ack",
    "disconnect-ack",
    "close-ack",
    *PUBSUB_LISTS,
    "send",
    "list",
    "data",
    "",
)
#: Integers of a message changed at most (the first ones, depth first).
_MAX_INTS = 4
#: The masking key a frame made masked by a change gets (RFC 6455 5.7's example).
_KEY = bytes.fromhex("37fa213d")
_STATUS_LINE = re.compile(rb"^(HTTP/1\.1 )(\d+)")
_VERSION_HEADER = re.compile(rb"(?im)^(sec-websocket-version:[ \t]*)(\d+)")


def _name(value: int) -> str:
    return NAMES[value] if value < len(NAMES) else f"n{value}"


def _index(name: Any) -> int:
    return NAMES.index(name) if name in NAMES else len(NAMES)


def _frame(raw: bytes):
    """The frame ``raw`` is (one whole frame, no more), else None."""
    header = parse_header(raw, 0)
    if header is None or header[0] + header[1] != len(raw):
        return None
    return decode_frame(raw)


def _message(payload: bytes) -> dict | None:
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    return value if isinstance(value, dict) and len(value) == 1 else None


# ------------------------------------------------------------------ where a message's names and numbers are
# Each path is a list of steps into the message: a key (str), or ("key", i) for the name of the
# i-th key of the record there, or ("value",) for a string value itself.


def _names(message: dict) -> list[tuple[str, list]]:
    """The message's names worth changing, and where each is."""
    alias, body = next(iter(message.items()))
    out: list[tuple[str, list]] = [("alias", [("key", 0)])]
    if isinstance(body, str):
        out.append(("op", [alias, ("value",)]))
    elif isinstance(body, dict) and len(body) == 1:
        out.append(("op", [alias, ("key", 0)]))
        op, arg = next(iter(body.items()))
        if alias == CONTROL and isinstance(arg, dict):
            if isinstance(arg.get("protocol"), str):
                out.append(("protocol", [alias, op, "protocol"]))
            if isinstance(arg.get("alias"), str):
                out.append(("stream_alias", [alias, op, "alias"]))
        elif alias == CONTROL and isinstance(arg, str) and op == "disconnect":
            out.append(("stream_alias", [alias, op, ("value",)]))
    return out


def _ints(value: Any, path: list, out: list) -> None:
    if len(out) >= _MAX_INTS:
        return
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if 0 <= value < 1 << 64:
            out.append(("int " + "/".join(map(str, path)), path, value))
    elif isinstance(value, dict):
        for key, item in value.items():
            _ints(item, [*path, key], out)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _ints(item, [*path, i], out)


def _get(message: Any, path: list) -> Any:
    node = message
    for step in path:
        if isinstance(step, tuple):
            return next(iter(node)) if step[0] == "key" else node
        node = node[step]
    return node


def _set(message: Any, path: list, new: Any) -> Any:
    """``message`` with the name or value at ``path`` replaced (a renamed key keeps its place)."""
    if not path:
        return new
    step, rest = path[0], path[1:]
    if isinstance(step, tuple):
        if step[0] == "value":
            return new
        old = next(iter(message))
        return {(new if k == old else k): v for k, v in message.items()}
    if isinstance(message, list):
        return [_set(v, rest, new) if i == step else v for i, v in enumerate(message)]
    return {k: (_set(v, rest, new) if k == step else v) for k, v in message.items()}


# ------------------------------------------------------------------ the hooks


def fields(record: dict, raw: bytes) -> list[Field]:
    """The header's fields, a close frame's code, and a whole text message's names and integers;
    an upgrade's WebSocket version (request) or status (response)."""
    kind = record.get("type")
    if kind == "UPGRADE_REQUEST":
        match = _VERSION_HEADER.search(raw)
        return [Field("ws_version", "enum", int(match.group(2)) & 0xFF, 8)] if match else []
    if kind == "UPGRADE_RESPONSE":
        match = _STATUS_LINE.match(raw)
        return [Field("http_status", "enum", int(match.group(2)) & 0xFFFF, 16)] if match else []
    frame = _frame(raw)
    if frame is None:
        return []
    second = 2 if frame.length_bits > 7 else 1
    length_at = None if frame.length_bits == 7 else second
    out = [  # FIN and RSV are left to byte mutations: most value edits go to the message
        Field("opcode", "enum", frame.opcode, 4),
        Field("mask", "enum", int(frame.masked), 1),
        Field("payload_len", "length", len(frame.payload), frame.length_bits, length_at),
    ]
    if frame.opcode == CLOSE and len(frame.payload) >= 2:
        out.append(Field("close_code", "enum", int.from_bytes(frame.payload[:2], "big"), 16))
    if frame.opcode == TEXT and frame.fin and (message := _message(frame.payload)) is not None:
        out += [Field(name, "enum", _index(_get(message, path)), 8) for name, path in _names(message)]
        numbers: list = []
        _ints(message, [], numbers)
        out += [Field(name, "uint", value, 64) for name, _, value in numbers]
    return out


def with_value(record: dict, raw: bytes, field: Field, value: int) -> bytes:
    """``raw`` with ``field`` set to ``value``: an HTTP head's line rewritten, a frame written
    again (see the module's docstring); as it was where the field is not there."""
    if field.name == "ws_version":
        return _VERSION_HEADER.sub(lambda m: m.group(1) + str(value).encode(), raw, count=1)
    if field.name == "http_status":
        return _STATUS_LINE.sub(lambda m: m.group(1) + b"%03d" % value, raw, count=1)
    frame = _frame(raw)
    if frame is None:
        return raw
    fin, rsv, opcode, key = frame.fin, frame.rsv, frame.opcode, frame.mask_key
    payload, declared = frame.payload, None
    if field.name == "opcode":
        opcode = value & 0xF
    elif field.name == "mask":
        key = _KEY if value & 1 else None
    elif field.name == "payload_len":
        declared = value
    elif field.name == "close_code":
        if len(payload) < 2:
            return raw
        payload = (value & 0xFFFF).to_bytes(2, "big") + payload[2:]
    else:
        message = _message(payload) if frame.opcode == TEXT else None
        if message is None:
            return raw
        paths = dict(_names(message))
        numbers = {name: path for name, path, _ in _ints_of(message)}
        if field.name in paths:
            message = _set(message, paths[field.name], _name(value))
        elif field.name in numbers:
            message = _set(message, numbers[field.name], value)
        else:
            return raw
        payload = dumps(message).encode()
    return write_frame(
        fin, rsv, opcode, key, payload, declared, frame.length_bits if declared is not None else None
    )


def _ints_of(message: dict) -> list:
    out: list = []
    _ints(message, [], out)
    return out


def write_frame(
    fin: bool,
    rsv: int,
    opcode: int,
    key: bytes | None,
    payload: bytes,
    declared: int | None = None,
    bits: int | None = None,
) -> bytes:
    """A frame's bytes (RFC 6455 5.2), written by hand: wsproto makes only frames that are right,
    and a fuzzer wants the others too. ``declared``: a payload length other than the payload's,
    in the length form ``bits`` (7, 16 or 64); else the minimal form of the real one."""
    n = len(payload) if declared is None else declared
    if bits is None:
        bits = 7 if n < 126 else 16 if n < 1 << 16 else 64
    mask = 0x80 if key is not None else 0
    head = bytes([(0x80 if fin else 0) | (rsv & 7) << 4 | (opcode & 0xF)])
    if bits == 7:
        head += bytes([mask | (n & 0x7F)])
    elif bits == 16:
        head += bytes([mask | 126]) + (n & 0xFFFF).to_bytes(2, "big")
    else:
        head += bytes([mask | 127]) + (n % (1 << 64)).to_bytes(8, "big")
    if key is None:
        return head + payload
    return head + key + unmask(payload, key)


def templates(side: str) -> dict[str, bytes]:
    """One well-formed frame of each message (and control frame) ``side`` sends, on the aliases the
    mock client's exchange uses (``echo``, ``ps``), made by the codec: what is inserted where
    the session expects something else (a disconnect of a stream never connected)."""
    url = "/pipeline/mock/out"
    if side == CLIENT:
        messages = {
            "connect": Connect("echo", "echo"),
            "connect pubsub": Connect("pubsub", "ps", {"subscriptions": [url], "publications": [url]}),
            "disconnect": Disconnect("echo"),
            "disconnect ps": Disconnect("ps", "rfc"),
            "close": Close(),
            "version": VersionRequest(),
            "echo": StreamMessage("echo", {"n": 1}),
            "pubsub:send": StreamMessage("ps", {"send": {"to": url, "data": 1}}),
            "pubsub:list": StreamMessage("ps", "list"),
            "pubsub:version": StreamMessage("ps", "version"),
            **{f"pubsub:{op}": StreamMessage("ps", {op: [url]}) for op in PUBSUB_LISTS},
        }
    else:
        messages = {
            "version-info": VersionInfo(VERSION),
            "connect-ack": ConnectAck("echo", "echo"),
            "disconnect-ack": DisconnectAck("echo"),
            "close-ack": CloseAck(),
            "error-close": ErrorClose(status_text("0.207")),
            "echo": StreamMessage("echo", {"n": 1}),
            "pubsub:data": StreamMessage("ps", {"data": 1, "meta": {"url": url}}),
            "pubsub:list": StreamMessage("ps", {"list": {"subs": [], "pubs": []}}),
            **{f"pubsub:{op}-ack": StreamMessage("ps", {f"{op}-ack": [url]}) for op in PUBSUB_LISTS},
        }
    codec = FrameProtocol(client=side == CLIENT, extensions=[])
    out = {name: bytes(codec.send_data(encode(message), True)) for name, message in messages.items()}
    out["PING"] = bytes(codec.ping(b"fuzz"))
    out["BINARY"] = bytes(codec.send_data(b'{"echo":1}', True))
    out["CLOSE"] = bytes(
        FrameProtocol(client=side == CLIENT, extensions=[]).close(CloseReason.NORMAL_CLOSURE)
    )
    return out


#: What a node owes each client message (besides its error close, which it may always send).
_OWED = {
    "connect": "connect-ack",
    "disconnect": "disconnect-ack",
    "close": "close-ack",
    "version": "version-info",
    "echo": "echo",
    "pubsub:list": "pubsub:list",
    "pubsub:version": "pubsub:version",
    **{f"pubsub:{op}": f"pubsub:{op}-ack" for op in PUBSUB_LISTS},
}


def owed(record: dict) -> Owed | None:
    """A client's request is owed its answer or the error close; an upgrade request its answer;
    a Close a Close, a Ping a Pong (either side)."""
    kind = record.get("type")
    if kind == "CLOSE":
        return Owed(frozenset({"CLOSE"}))
    if kind == "PING":
        return Owed(frozenset({"PONG", "CLOSE"}))
    if record.get("sender") != CLIENT:
        return None
    if kind == "UPGRADE_REQUEST":
        return Owed(frozenset({"UPGRADE_RESPONSE"}))
    if kind in _OWED:
        return Owed(frozenset({_OWED[kind], "error-close"}))
    return None


def refusal(record: dict) -> bool:
    """The node's error close, a refused upgrade, or a Close with a code: one that says what was
    wrong (1002 and on: a frame that broke WebSocket), or the echo of a Close of ours (1000),
    after which nothing of ours is read. Not its bare Close (the prototype's ``88 00`` after a
    close-ack or an error close). A client has no error message: any Close of its refuses."""
    kind = record.get("type")
    if record.get("sender") != SERVER:
        return kind == "CLOSE"
    if kind == "UPGRADE_RESPONSE":
        return record.get("http_status") != 101
    return kind == "error-close" or kind == "CLOSE" and record.get("ws_close_code") is not None


def closed(record: dict) -> bool:
    """The session is over: a refusal, a close, its close-ack, or any Close (RFC 6455 5.5.1:
    after its Close a side sends nothing, and what comes after one's own is not read)."""
    return refusal(record) or record.get("type") in ("close", "close-ack", "CLOSE")


#: A node answers an illegal message with its error close before it closes (the prototype's
#: ``prelude.rs``), and a frame that breaks WebSocket with a Close frame (RFC 6455 7.1.7).
REPLY_BEFORE_CLOSE = frozenset({SERVER})
