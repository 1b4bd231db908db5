"""Tremor replay: a recorded session follows the live peer's upgrade key, masks and aliases.

What a live peer decides, and how the replay follows it:

* The upgrade. Played as the client, the recorded request goes with a fresh
  ``Sec-WebSocket-Key`` (RFC 6455 4.1: one per connection), re-encoded by h11;
  the live ``Sec-WebSocket-Accept`` is checked against it by the dissector that
  judges the live run (a wrong one is a violation). Played as the server, the
  recorded 101 waits for the live client's request and answers its key.
* Masks. Every frame is re-encoded by wsproto's ``FrameProtocol``, which masks
  a client's frames with a fresh key each. A recorded frame the codec cannot
  make (reserved bits, a non-minimal length, a close code only a reader may
  see, a text fragment cut inside a character) keeps its recorded header and
  is masked again with a fresh key: the replay repeats the recording's
  violations, it does not mend them.
* Aliases. The peer's frame that names a stream (the live client's
  ``connect``, the live node's ``connect-ack``) is paired, in order, with its
  recorded counterpart; where the live alias differs, the recorded frames
  that follow are sent, and expected, on the live one.
* The closing handshake. A live peer that sends its Close where the recording
  has none yet (an error close the recording never had) is answered with a
  Close at once, as RFC 6455 5.5.1 has an endpoint do (the node waits for it
  before it hangs up), and nothing more of it is waited for: after its Close
  it sends nothing. Our recorded Close, when its turn comes, is then not sent
  again.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections import deque
from typing import Any, ClassVar

import h11
from wsproto.frame_protocol import FrameProtocol
from wsproto.utilities import generate_accept_token

from wallaroo_proto.replay import adapter

from .core import CLIENT
from .messages import (
    OPS,
    Connect,
    ConnectAck,
    Disconnect,
    DisconnectAck,
    MessageError,
    StreamMessage,
    encode,
    parse,
)
from .wsframes import BINARY, CLOSE, CONTINUATION, PING, PONG, TEXT, Frame, decode_frame, read_request, unmask

#: Close codes that may not go on the wire (RFC 6455 7.4.1): the codec would change them.
_LOCAL_ONLY = frozenset({1005, 1006, 1015})
_KEY = b"sec-websocket-key"
_ACCEPT = b"sec-websocket-accept"


class Adapter(adapter.Adapter):
    """One replay of a Tremor session as ``side`` (``client`` or ``server``)."""

    #: ``length``: a frame's or HTTP head's bytes on the wire. A head's follows its ``Host``
    #: header (the live port's digits) and its key; a frame's is its header plus
    #: ``ws_payload_len``, which is compared with ``ws_masked`` and ``ws_length_bits``.
    NOISE: ClassVar[frozenset[str]] = frozenset({"length"})

    def __init__(self, side: str) -> None:
        super().__init__(side)
        self.client = side == CLIENT
        self.codec = FrameProtocol(client=self.client, extensions=[])
        #: The key our request sent (client) or the live client's request (server).
        self.key: str | None = None
        self.live_request: bytes | None = None
        #: Recorded alias -> the live peer's, where they differ.
        self.aliases: dict[str, str] = {}
        self._recorded_names: deque[str] = deque()
        self._live_names: deque[str] = deque()
        #: Whether a fragment of the message being sent went out by hand (the codec lost track).
        self._by_hand = False
        #: The opcode of the message being sent in fragments (TEXT or BINARY), else None.
        self._fragmented: int | None = None
        #: The live peer's Close frame (its record), our own Close sent, the recording's Close
        #: of the peer reached (then the recording answers it itself).
        self._peer_close: dict | None = None
        self._closed = False
        self._recorded_close = False

    # ------------------------------------------------------------------ what we send

    def outgoing(self, frame: Any) -> bytes | adapter.Hold:
        kind = frame.type
        if kind == "UPGRADE_REQUEST":
            return self._request(frame.raw)
        if kind == "UPGRADE_RESPONSE":
            return self._response(frame.raw)
        if frame.record.get("ws_opcode") is None or not frame.raw:
            return frame.raw
        if frame.record.get("ws_opcode") == CLOSE:
            if self._closed:
                return adapter.SKIP  # the live peer's early Close was answered already
            self._closed = True
        try:
            recorded = decode_frame(frame.raw)
        except ValueError:
            return frame.raw
        payload = recorded.payload
        if recorded.opcode == TEXT and recorded.fin and self.aliases:
            payload = self._renamed(payload)
        made = self._encode(recorded, payload)
        return made if made is not None else self._by_hand_frame(frame.raw, recorded)

    def _request(self, raw: bytes) -> bytes:
        """The recorded upgrade request with a fresh key (as the recording was, if h11 cannot read it)."""
        event = _event(h11.SERVER, raw)
        if not isinstance(event, h11.Request) or event.http_version != b"1.1":
            return raw
        headers = event.headers.raw_items()
        if not any(name.lower() == _KEY for name, _ in headers):
            return raw
        key = base64.b64encode(os.urandom(16))
        self.key = key.decode()
        headers = [(name, key if name.lower() == _KEY else value) for name, value in headers]
        return h11.Connection(h11.CLIENT).send(
            h11.Request(method=event.method, target=event.target, headers=headers)
        )

    def _response(self, raw: bytes) -> bytes | adapter.Hold:
        """The recorded answer to the upgrade, accepting the live client's key."""
        if b"\r\n" + _ACCEPT not in raw.lower():
            return raw  # a refusal, or a 101 that accepted no key: nothing to follow
        if self.live_request is None:
            return adapter.Hold("the live client's upgrade request (its Sec-WebSocket-Key)")
        recorded = _response_event(raw)
        if recorded is None or self.key is None:
            return raw
        accept = generate_accept_token(self.key.encode())
        headers = [
            (name, accept if name.lower() == _ACCEPT else value)
            for name, value in recorded.headers.raw_items()
        ]
        server = h11.Connection(h11.SERVER)
        server.receive_data(self.live_request)
        try:
            server.next_event()
            return server.send(
                h11.InformationalResponse(status_code=101, headers=headers, reason=recorded.reason)
            )
        except h11.ProtocolError:
            return raw  # the live request asked for no upgrade: the recorded answer, and the judge says so

    def _encode(self, recorded: Frame, payload: bytes) -> bytes | None:
        """The frame made by the codec, or None where the codec cannot make it."""
        op = recorded.opcode
        if recorded.rsv or recorded.problems or recorded.masked != self.client:
            return None
        codec = self.codec
        if op == CLOSE:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
            reason = _text(payload[2:])
            if len(payload) == 1 or code in _LOCAL_ONLY or reason is None or len(payload) > 125:
                return None
            return bytes(codec.close(code, reason or None))
        if op in (PING, PONG):
            if len(payload) > 125 or not recorded.fin:
                return None
            return bytes(codec.ping(payload) if op == PING else codec.pong(payload))
        if op in (TEXT, BINARY):
            if self._fragmented is not None:
                return None  # a new message inside a fragmented one: the recording's own violation
            message = op
        elif op == CONTINUATION:
            if self._fragmented is None or self._by_hand:
                return None
            message = self._fragmented
        else:
            return None
        data: str | bytes | None = _text(payload) if message == TEXT else payload
        if data is None:
            return None
        self._fragmented = None if recorded.fin else message
        return bytes(codec.send_data(data, recorded.fin))

    def _by_hand_frame(self, raw: bytes, recorded: Frame) -> bytes:
        """A frame the codec cannot make: its recorded header and payload (no alias followed),
        masked again with a fresh key."""
        op = recorded.opcode
        if op in (TEXT, BINARY, CONTINUATION):
            if recorded.fin:  # the message ends: a codec that began it starts afresh
                self._fragmented, self._by_hand = None, False
                self.codec = FrameProtocol(client=self.client, extensions=[])
            else:
                self._fragmented = self._fragmented or op
                self._by_hand = True
        if not recorded.masked:
            return raw
        head = len(raw) - len(recorded.payload)
        key = os.urandom(4)
        return raw[: head - 4] + key + unmask(recorded.payload, key)

    # ------------------------------------------------------------------ what the peer sends

    def incoming(self, record: dict, raw: bytes) -> None:
        kind = record.get("type")
        if kind == "CLOSE" and self._peer_close is None:
            self._peer_close = record
        if kind == "UPGRADE_REQUEST" and not self.client:
            self.live_request = raw
            self.key = read_request(raw).key
        elif kind == self._naming and record.get("alias") is not None:
            self._live_names.append(record["alias"])
            self._pair()

    def owed(self) -> tuple[dict, bytes] | None:
        """Our Close, for a live peer's Close the recording does not have here (RFC 6455 5.5.1)."""
        if self._peer_close is None or self._closed or self._recorded_close:
            return None
        self._closed = True
        return self._peer_close, bytes(self.codec.close())

    def waits(self, frame: Any) -> bool:
        """Not once the live peer sent its Close: nothing of it comes after that."""
        return self._peer_close is None

    def expected(self, frame: Any) -> dict:
        record = frame.record
        if record.get("ws_opcode") == CLOSE:
            self._recorded_close = True
        if record.get("type") == self._naming and record.get("alias") is not None:
            self._recorded_names.append(record["alias"])
            self._pair()
            return record
        whole = record.get("ws_opcode") == TEXT and record.get("ws_fin")
        if not whole or record.get("alias") not in self.aliases:
            return record
        out = dict(record, alias=self.aliases[record["alias"]])
        text = (record.get("message_json") or "").encode()
        renamed = self._renamed(text)
        if renamed != text:  # not when the record holds only the start of a long message
            out["message_json"] = renamed.decode()
            out["ws_payload_len"] = len(renamed)
        return out

    @property
    def _naming(self) -> str:
        """The peer's message that names a stream's alias: the client's connect, the node's ack."""
        return "connect-ack" if self.client else "connect"

    def _pair(self) -> None:
        while self._recorded_names and self._live_names:
            recorded, live = self._recorded_names.popleft(), self._live_names.popleft()
            if recorded != live:
                self.aliases[recorded] = live
            else:
                self.aliases.pop(recorded, None)

    def _renamed(self, payload: bytes) -> bytes:
        """A whole text message on a recorded alias, on the live one (re-encoded by the core's
        codec); as it was if it names no mapped alias or is no message."""
        try:
            message = parse(payload.decode("utf-8"))
        except (UnicodeDecodeError, MessageError):
            return payload
        alias = getattr(message, "alias", None)
        if alias not in self.aliases or not isinstance(
            message, StreamMessage | Connect | ConnectAck | Disconnect | DisconnectAck
        ):
            return payload
        return encode(dataclasses.replace(message, alias=self.aliases[alias])).encode()


def match_key(record: dict) -> tuple:
    """A stream's frames are matched on their alias, in order; control frames in their order."""
    return () if record.get("type") in OPS else (record.get("alias"),)


def _event(role: type[h11.CLIENT] | type[h11.SERVER], raw: bytes) -> Any:
    """What h11, as ``role``, reads first in ``raw`` (None: not HTTP)."""
    conn = h11.Connection(role)
    conn.receive_data(raw)
    try:
        return conn.next_event()
    except h11.ProtocolError:
        return None


def _response_event(raw: bytes) -> h11.InformationalResponse | None:
    """A recorded 101 as h11 reads it (a client that asked for the upgrade)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(
            method="GET",
            target="/",
            headers=[("Host", "x"), ("Connection", "Upgrade"), ("Upgrade", "websocket")],
        )
    )
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.ProtocolError:
        return None
    return event if isinstance(event, h11.InformationalResponse) and event.status_code == 101 else None


def _text(payload: bytes) -> str | None:
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
