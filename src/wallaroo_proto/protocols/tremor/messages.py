"""Tremor network protocol messages: JSON text in, message values out, and the exact replies out.

Every message is a JSON record with one key, the stream alias; ``"tremor"`` is
the control plane. Shapes follow RFC 0019 where it gives one and the 2021
prototype where it is silent (acks, the close reply, error closes, version):

==================  ================================================================
connect             ``{"tremor":{"connect":{"protocol":p,"alias":a,...}}}`` (both)
connect-ack         ``{"tremor":{"connect-ack":{"protocol":p,"alias":a}}}`` (prototype)
disconnect          ``{"tremor":{"disconnect":"a"}}`` (RFC) or ``{"alias":"a"}`` (prototype)
disconnect-ack      ``{"tremor":{"disconnect-ack":{"alias":a}}}`` (prototype)
close               ``{"tremor":"close"}`` (prototype; the RFC names it only)
close-ack           ``{"tremor":{"close-ack":"ok"}}`` (prototype)
error-close         ``{"tremor":{"close":"0.207: reason"}}`` (prototype)
version             ``{"tremor":"version"}`` (RFC)
version-info        ``{"tremor":{"version":"0.10.2"}}`` (prototype's push)
stream              ``{"<alias>":<value>}``
==================  ================================================================

``parse`` raises ``MessageError`` with the prototype's status code (see
``STATUS``) for what its dispatcher refuses.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

CONTROL = "tremor"
#: The version the prototype's node announces (tremor 0.10.2 on its last branch).
VERSION = "0.10.2"

#: Status codes and their texts as the prototype's ``nana.rs`` writes them (``"<base>.<code>: <text>"``);
#: the pub/sub 2.2xx texts are ours (the prototype names only the codes).
STATUS: dict[str, str] = {
    "0.0": "Ok",
    "0.100": "Malformed value - not UTF-8 valid",
    "0.101": "Malformed value - not a well-formed tremor value",
    "0.200": "Protocol not found error",
    "0.201": "Protocol not specified error",
    "0.202": "Protocol operation not supported",
    "0.203": "Protocol operation expected a record",
    "0.204": "Protocol operation - record has missing field",
    "0.205": "Protocol operation - record requires one field only",
    "0.206": "Protocol already registered error",
    "0.207": "Protocol session not connected error",
    "2.200": "PubSub Protocol - subscription failed",
    "2.201": "PubSub Protocol - unsubscription failed",
    "2.202": "PubSub Protocol - publication failed",
    "2.203": "PubSub Protocol - unpublication failed",
}


class MessageError(ValueError):
    """A message the control plane refuses: its status code and what exactly was wrong."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code} {STATUS.get(code, 'internal network error')}: {detail}")

    @property
    def status_text(self) -> str:
        """The error close's text as the prototype writes it."""
        return status_text(self.code)


def status_text(code: str) -> str:
    return f"{code}: {STATUS.get(code, 'internal network error')}"


@dataclass(frozen=True, slots=True)
class Connect:
    protocol: str
    alias: str
    properties: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    op = "connect"


@dataclass(frozen=True, slots=True)
class ConnectAck:
    protocol: str
    alias: str
    op = "connect-ack"


@dataclass(frozen=True, slots=True)
class Disconnect:
    alias: str
    #: "rfc" (a bare string) or "prototype" ({"alias": ...}).
    form: str = "prototype"
    op = "disconnect"


@dataclass(frozen=True, slots=True)
class DisconnectAck:
    alias: str
    op = "disconnect-ack"


@dataclass(frozen=True, slots=True)
class Close:
    op = "close"


@dataclass(frozen=True, slots=True)
class CloseAck:
    status: str = "ok"
    op = "close-ack"


@dataclass(frozen=True, slots=True)
class ErrorClose:
    text: str
    op = "error-close"

    @property
    def code(self) -> str | None:
        """The status code the text starts with (``"0.207"``), or None for a free text."""
        head, sep, _ = self.text.partition(":")
        return head if sep and head.replace(".", "", 1).isdigit() and "." in head else None


@dataclass(frozen=True, slots=True)
class VersionRequest:
    op = "version"


@dataclass(frozen=True, slots=True)
class VersionInfo:
    version: Any
    op = "version-info"


@dataclass(frozen=True, slots=True)
class StreamMessage:
    alias: str
    value: Any
    op = "stream"


Message = (
    Connect
    | ConnectAck
    | Disconnect
    | DisconnectAck
    | Close
    | CloseAck
    | ErrorClose
    | VersionRequest
    | VersionInfo
    | StreamMessage
)
#: Message type names (``op``), in the order a session usually shows them.
OPS = (
    "connect",
    "connect-ack",
    "disconnect",
    "disconnect-ack",
    "close",
    "close-ack",
    "error-close",
    "version",
    "version-info",
    "stream",
)


def _one_key(record: dict, what: str) -> tuple[str, Any]:
    if len(record) != 1:
        raise MessageError(
            "0.205", f"{what} has {len(record)} fields ({', '.join(map(str, record)) or 'none'})"
        )
    return next(iter(record.items()))


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MessageError("0.204", f"{what} must be a string, not {type(value).__name__}")
    return value


#: Deepest nesting of arrays and records a message may have. simd-json, the real node's parser,
#: had no limit in 2021 and has 1024 since 2026; ours is lower so that every value taken can be
#: compared and written back within Python's recursion budget.
MAX_DEPTH = 512
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise MessageError("0.101", f"number {text[:40]} is out of range (no JSON text can say it back)")
    return number


def _constant(name: str) -> Any:
    raise MessageError("0.101", f"{name} is not JSON (a JavaScript literal)")


_decode = json.JSONDecoder(parse_float=_finite, parse_constant=_constant).decode


def _nesting(text: str) -> int:
    """How deep arrays and records nest in ``text``, brackets inside strings not counted."""
    brackets = _STRING.sub("", text).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(text: str) -> Any:
    """The JSON value of a text message; 0.101 when it is not one the node could send back.

    As simd-json (the real node's parser) does, NaN and Infinity are refused, and so are
    lone surrogate escapes (a Rust string cannot hold one); so are numbers beyond a double's
    range and nesting deeper than MAX_DEPTH, which Python would read but not write back.
    """
    if len(text) > MAX_DEPTH and text.count("[") + text.count("{") > MAX_DEPTH and _nesting(text) > MAX_DEPTH:
        raise MessageError("0.101", f"nested deeper than {MAX_DEPTH} levels")
    try:
        value = _decode(text)
    except MessageError:
        raise
    except ValueError as err:
        raise MessageError("0.101", f"not JSON: {err}") from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        try:
            _dumps(value).encode()
        except UnicodeEncodeError:
            raise MessageError("0.101", "a lone surrogate escape (not a Unicode character)") from None
    return value


def parse(text: str) -> Message:
    """A text message as a message; ``MessageError`` if refused."""
    return parse_value(parse_json(text))


def parse_value(value: Any) -> Message:
    """An already decoded JSON value as a message (a string is the value, not text to decode)."""
    if not isinstance(value, dict):
        raise MessageError("0.203", f"a message must be a record, not {type(value).__name__}")
    alias, body = _one_key(value, "a message")
    if alias != CONTROL:
        return StreamMessage(alias, body)
    if isinstance(body, str):
        if body == "close":
            return Close()
        if body == "version":
            return VersionRequest()
        raise MessageError(
            "0.202",
            f"unknown control operation {body!r} (known: close, version, or a record: connect, disconnect)",
        )
    if not isinstance(body, dict):
        raise MessageError(
            "0.203", f"a control operation must be a record or a keyword, not {type(body).__name__}"
        )
    op, arg = _one_key(body, "a control operation")
    if op == "connect":
        if not isinstance(arg, dict):
            raise MessageError("0.203", "connect takes a record")
        if "protocol" not in arg:
            raise MessageError("0.201", "connect without a protocol")
        protocol = _string(arg["protocol"], "connect protocol")
        alias = _string(arg.get("alias", protocol), "connect alias")
        props, headers = arg.get("properties", {}), arg.get("headers", {})
        if not isinstance(props, dict) or not isinstance(headers, dict):
            raise MessageError("0.203", "connect properties and headers must be records")
        return Connect(protocol, alias, props, headers)
    if op == "disconnect":
        if isinstance(arg, str):
            return Disconnect(arg, "rfc")
        if isinstance(arg, dict):
            if "alias" not in arg:
                raise MessageError("0.204", "disconnect without an alias")
            return Disconnect(_string(arg["alias"], "disconnect alias"), "prototype")
        raise MessageError("0.203", "disconnect takes an alias or a record with one")
    if op in ("connect-ack", "disconnect-ack"):
        if not isinstance(arg, dict) or "alias" not in arg:
            raise MessageError("0.204", f"{op} must be a record with an alias")
        alias = _string(arg["alias"], f"{op} alias")
        if op == "disconnect-ack":
            return DisconnectAck(alias)
        return ConnectAck(_string(arg.get("protocol"), "connect-ack protocol"), alias)
    if op == "close-ack":
        return CloseAck(_string(arg, "close-ack status"))
    if op == "close":
        return ErrorClose(_string(arg, "close reason"))
    if op == "version":
        return VersionInfo(arg)
    known = "connect, disconnect, connect-ack, disconnect-ack, close-ack, close, version"
    raise MessageError("0.202", f"unknown control operation {op!r} (known: {known})")


#: NaN and Infinity are refused on the way out as on the way in: no JSON reader takes them.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode(message: Message) -> str:
    """A message as compact JSON text (the shapes in the module docstring)."""
    if isinstance(message, StreamMessage):
        return _dumps({message.alias: message.value})
    if isinstance(message, Close):
        return '{"tremor":"close"}'
    if isinstance(message, VersionRequest):
        return '{"tremor":"version"}'
    if isinstance(message, Connect):
        body: dict[str, Any] = {"protocol": message.protocol, "alias": message.alias}
        if message.properties:
            body["properties"] = message.properties
        if message.headers:
            body["headers"] = message.headers
        return _dumps({CONTROL: {"connect": body}})
    if isinstance(message, ConnectAck):
        return _dumps({CONTROL: {"connect-ack": {"protocol": message.protocol, "alias": message.alias}}})
    if isinstance(message, Disconnect):
        arg = message.alias if message.form == "rfc" else {"alias": message.alias}
        return _dumps({CONTROL: {"disconnect": arg}})
    if isinstance(message, DisconnectAck):
        return _dumps({CONTROL: {"disconnect-ack": {"alias": message.alias}}})
    if isinstance(message, CloseAck):
        return _dumps({CONTROL: {"close-ack": message.status}})
    if isinstance(message, ErrorClose):
        return _dumps({CONTROL: {"close": message.text}})
    if isinstance(message, VersionInfo):
        return _dumps({CONTROL: {"version": message.version}})
    raise TypeError(f"not a message: {message!r}")


def dumps(value: Any) -> str:
    """Any JSON value as compact text, as the peers send it."""
    return _dumps(value)
