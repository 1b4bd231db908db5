"""WebSocket read passively out of a capture: the HTTP upgrade, RFC 6455 frames, whole messages.

The mock peers speak WebSocket through wsproto and never touch a frame. A
capture dissector cannot: wsproto's ``FrameProtocol`` is one endpoint's
parser, so it raises ``ParseFailed`` at the first rule a frame breaks and
stops for good (a dissector must report the frame and read on), it hides
what a dissector shows (the masking key, which of the 7/16/64-bit length
forms was used, a frame's byte offset and wire length, a non-minimal
length), it hands data frames over in pieces as bytes arrive, and it cannot
resync after bytes a capture lost. So this module has a small frame parser of
its own, for the dissector only; the tests check it against wsproto's
serializer and tshark's websocket dissector. The HTTP upgrade is parsed by
h11 (wsproto's own HTTP layer) and the accept token computed by wsproto.

``FrameSplitter`` splits one direction's bytes into ``Frame`` values;
``MessageAssembler`` applies the framing rules of RFC 6455 (masking by
direction, RSV bits, reserved opcodes, control-frame limits, fragmentation,
UTF-8 of text, the close frame) and yields whole messages; ``read_request``
and ``read_response`` judge the opening handshake.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass, field

import h11
from wsproto.utilities import generate_accept_token

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
OPCODE_NAMES = {
    CONTINUATION: "CONTINUATION",
    TEXT: "TEXT",
    BINARY: "BINARY",
    CLOSE: "CLOSE",
    PING: "PING",
    PONG: "PONG",
}
#: Close codes an endpoint may send (RFC 6455 7.4.1-7.4.2): defined ones, then registered and private ranges.
_SENDABLE_CLOSE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})
#: A frame bigger than this is taken as damage (a wrong offset after a gap), not read.
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
_U16 = struct.Struct("!H").unpack_from
_U64 = struct.Struct("!Q").unpack_from


def opcode_name(opcode: int) -> str:
    return OPCODE_NAMES.get(opcode, f"RESERVED({opcode:#x})")


def unmask(payload: bytes, key: bytes) -> bytes:
    """``out[i] = in[i] XOR key[i mod 4]`` (RFC 6455 5.3), a whole buffer at a time."""
    if not payload:
        return payload
    repeated = (key * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


@dataclass(slots=True)
class Frame:
    """One frame as it was on the wire; ``payload`` is unmasked."""

    offset: int
    wire_length: int
    fin: bool
    rsv: int
    opcode: int
    masked: bool
    mask_key: bytes | None
    payload: bytes
    #: 7, 16 or 64: which payload length form the header used.
    length_bits: int
    #: Header problems: a non-minimal length, a 64-bit length with its top bit set.
    problems: list[str] = field(default_factory=list)


def parse_header(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int, int] | None:
    """(header length, payload length, length bits) of the frame at ``pos``, None if incomplete."""
    avail = len(buf) - pos
    if avail < 2:
        return None
    b1 = buf[pos + 1]
    n = b1 & 0x7F
    head = 2
    bits = 7
    if n == 126:
        if avail < 4:
            return None
        n, head, bits = _U16(buf, pos + 2)[0], 4, 16
    elif n == 127:
        if avail < 10:
            return None
        n, head, bits = _U64(buf, pos + 2)[0], 10, 64
    if b1 & 0x80:
        head += 4
    return head, n, bits


def decode_frame(data: bytes, offset: int = 0) -> Frame:
    """One whole frame's bytes as a ``Frame`` (``offset``: where it starts in its stream)."""
    head, n, bits = parse_header(data, 0) or (0, 0, 0)
    if not head or len(data) < head + n:
        raise ValueError(f"incomplete frame: {len(data)} bytes")
    b0, b1 = data[0], data[1]
    masked = bool(b1 & 0x80)
    key = bytes(data[head - 4 : head]) if masked else None
    payload = bytes(data[head : head + n])
    problems = []
    if bits == 16 and n < 126 or bits == 64 and n < 65536:
        problems.append(f"payload length {n} not in its minimal form ({bits}-bit length used)")
    if bits == 64 and n >> 63:
        problems.append("64-bit payload length with its most significant bit set")
    return Frame(
        offset,
        head + n,
        bool(b0 & 0x80),
        (b0 >> 4) & 0x7,
        b0 & 0x0F,
        masked,
        key,
        unmask(payload, key) if key else payload,
        bits,
        problems,
    )


class FrameSplitter:
    """One direction's bytes in, whole frames out; resyncs after lost bytes.

    After a gap the next frame boundary is unknown: bytes are skipped until a
    position where a FIN text frame with the direction's masking starts whose
    whole payload is a JSON record. Control frames are not resynced on: their
    few bytes turn up by chance inside masked data (a ping or close between
    the gap and the next message is lost with it).
    """

    def __init__(self, *, client: bool, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.client = client
        self.max_frame = max_frame
        self.buf = bytearray()
        self.offset = 0  # stream offset of buf[0]
        self.resyncing = False
        self.skipped = 0
        self.broken: str | None = None

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        frames: list[Frame] = []
        buf = self.buf
        pos = 0
        while not self.broken:
            if self.resyncing:
                found, keep = self._resync_at(pos)
                if found is None:
                    self.skipped += keep - pos
                    pos = keep
                    break
                self.skipped += found - pos
                pos = found
                self.resyncing = False
            header = parse_header(buf, pos)
            if header is None:
                break
            head, n, _ = header
            if n > self.max_frame:
                self.broken = (
                    f"frame at offset {self.offset + pos} claims {n} payload bytes (limit {self.max_frame})"
                )
                break
            if len(buf) - pos < head + n:
                break
            frames.append(decode_frame(bytes(buf[pos : pos + head + n]), self.offset + pos))
            pos += head + n
        if self.broken:
            pos = len(buf)
        del buf[:pos]
        self.offset += pos
        return frames

    def gap(self, missing: int) -> None:
        """``missing`` bytes were lost before what comes next."""
        self.offset += len(self.buf) + missing
        self.buf.clear()
        self.resyncing = True
        self.broken = None

    def _resync_at(self, start: int) -> tuple[int | None, int]:
        """(where the next frame starts, or None; where to look again when more bytes come)."""
        buf = self.buf
        want_mask = 0x80 if self.client else 0
        for pos in range(start, len(buf) - 1):
            if buf[pos] != 0x81 or buf[pos + 1] & 0x80 != want_mask:
                continue
            header = parse_header(buf, pos)
            if header is None:
                return None, pos  # undecided: wait for the rest of the header
            head, n, _ = header
            if n > self.max_frame:
                continue
            if len(buf) < pos + head + n:
                return None, pos  # undecided: wait for the whole candidate
            payload = bytes(buf[pos + head : pos + head + n])
            if want_mask:
                payload = unmask(payload, bytes(buf[pos + head - 4 : pos + head]))
            if _is_json_record(payload):
                return pos, pos
        return None, max(start, len(buf) - 1)


def _is_json_record(payload: bytes) -> bool:
    if not payload.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(payload), dict)
    except ValueError:
        return False


@dataclass(slots=True)
class WsMessage:
    """A whole data message: its opcode, its payload, and the frames it took."""

    opcode: int
    payload: bytes
    frames: int
    text: str | None = None


class MessageAssembler:
    """One direction's framing rules (RFC 6455 section 5) and message reassembly.

    ``frame(f)`` returns (whole message or None, violations). Control frames
    may come between a message's fragments; the text of a message must be
    UTF-8 as a whole; after its close frame an endpoint sends nothing.
    """

    def __init__(self, *, client: bool, extensions: bool = False) -> None:
        self.client = client
        self.extensions = extensions
        self.opcode: int | None = None  # the fragmented message in progress
        self.parts: list[bytes] = []
        self.count = 0
        self.closed = False
        self.close_code: int | None = None
        self.close_reason: str | None = None

    def frame(self, f: Frame) -> tuple[WsMessage | None, list[str]]:
        problems = list(f.problems)
        who = "client" if self.client else "server"
        if self.client and not f.masked:
            problems.append("client frame not masked (RFC 6455 5.1: the server must close, 1002)")
        elif not self.client and f.masked:
            problems.append("server frame masked (RFC 6455 5.1: the client must close, 1002)")
        if f.rsv and not self.extensions:
            problems.append(f"RSV bits {f.rsv:03b} set with no extension negotiated")
        if self.closed:
            problems.append(f"{who} sent a frame after its close frame")
        op = f.opcode
        if op & 0x8:
            if op not in (CLOSE, PING, PONG):
                problems.append(f"reserved control opcode {op:#x}")
            if not f.fin:
                problems.append("control frame fragmented (FIN not set)")
            if len(f.payload) > 125:
                problems.append(f"control frame payload of {len(f.payload)} bytes (at most 125)")
            if op == CLOSE:
                problems.extend(self._close(f.payload))
            return None, problems
        if op not in (CONTINUATION, TEXT, BINARY):
            return None, [*problems, f"reserved data opcode {op:#x}"]
        if op == CONTINUATION:
            if self.opcode is None:
                return None, [*problems, "continuation frame with no fragmented message to continue"]
        else:
            if self.opcode is not None:
                problems.append(f"new {opcode_name(op)} message before the fragmented message ended")
                self.parts.clear()
                self.count = 0
            self.opcode = op
        self.parts.append(f.payload)
        self.count += 1
        if not f.fin:
            return None, problems
        payload = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        message = WsMessage(self.opcode, payload, self.count)
        self.opcode = None
        self.parts = []
        self.count = 0
        if message.opcode == TEXT:
            try:
                message.text = payload.decode("utf-8")
            except UnicodeDecodeError as err:
                problems.append(f"text message not UTF-8 at byte {err.start} (RFC 6455 8.1: close 1007)")
        return message, problems

    def _close(self, payload: bytes) -> list[str]:
        self.closed = True
        if not payload:
            return []
        if len(payload) == 1:
            return ["close frame with a 1-byte payload (a status code takes 2)"]
        self.close_code = _U16(payload, 0)[0]
        problems = []
        code = self.close_code
        if code not in _SENDABLE_CLOSE and not 3000 <= code <= 4999:
            problems.append(f"close code {code} may not be sent (RFC 6455 7.4)")
        try:
            self.close_reason = payload[2:].decode("utf-8")
        except UnicodeDecodeError:
            problems.append("close reason not UTF-8")
        return problems


# --------------------------------------------------------------------------- the opening handshake


@dataclass(slots=True)
class Handshake:
    """One side of the HTTP upgrade: what it said, what was wrong, and how many bytes it took."""

    length: int
    status: int | None = None  # the response's
    target: str | None = None  # the request's
    key: str | None = None
    accept: str | None = None
    subprotocol: str | None = None
    extensions: str | None = None
    problems: list[str] = field(default_factory=list)


def _headers(items) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in items:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


def head_length(buf: bytes) -> int | None:
    """Bytes up to and including the blank line that ends an HTTP head, or None if not all here."""
    end = buf.find(b"\r\n\r\n")
    return None if end < 0 else end + 4


def looks_like_upgrade(first: bytes) -> bool:
    """Does a connection open with an HTTP GET that asks for a WebSocket?"""
    return first.startswith(b"GET ") and b"websocket" in first[:4096].lower()


def read_request(head: bytes) -> Handshake:
    """The client's upgrade request (RFC 6455 4.1), judged."""
    hs = Handshake(len(head))
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as err:
        hs.problems.append(f"not an HTTP request: {err}")
        return hs
    if not isinstance(event, h11.Request):
        hs.problems.append("incomplete HTTP request")
        return hs
    hs.target = event.target.decode("latin-1")
    h = _headers(event.headers)
    if event.method != b"GET":
        hs.problems.append(f"upgrade request method {event.method.decode()} (must be GET)")
    if event.http_version != b"1.1":
        hs.problems.append(f"HTTP/{event.http_version.decode()} (must be 1.1)")
    if "websocket" not in h.get("upgrade", "").lower():
        hs.problems.append("no 'Upgrade: websocket' header")
    if "upgrade" not in [t.strip() for t in h.get("connection", "").lower().split(",")]:
        hs.problems.append("no 'Connection: Upgrade' header")
    if h.get("sec-websocket-version", "").strip() != "13":
        hs.problems.append(f"Sec-WebSocket-Version {h.get('sec-websocket-version')!r} (must be 13)")
    hs.key = h.get("sec-websocket-key", "").strip() or None
    try:
        if hs.key is None or len(base64.b64decode(hs.key, validate=True)) != 16:
            raise ValueError
    except (ValueError, binascii.Error):
        hs.problems.append(f"Sec-WebSocket-Key {hs.key!r} is not the base64 of 16 bytes")
    hs.subprotocol = h.get("sec-websocket-protocol")
    hs.extensions = h.get("sec-websocket-extensions")
    return hs


def read_response(head: bytes, request: Handshake | None) -> Handshake:
    """The server's answer (RFC 6455 4.2.2): 101 with the right accept token, or a refusal."""
    hs = Handshake(len(head))
    status_line, _, rest = head.partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        hs.problems.append(f"not an HTTP response: {status_line[:60]!r}")
        return hs
    hs.status = int(parts[1])
    items = []
    for line in rest.split(b"\r\n"):
        if line:
            name, sep, value = line.partition(b":")
            if not sep:
                hs.problems.append(f"malformed header line {line[:60]!r}")
                continue
            items.append((name.strip(), value.strip()))
    h = _headers(items)
    hs.accept = h.get("sec-websocket-accept")
    hs.subprotocol = h.get("sec-websocket-protocol")
    hs.extensions = h.get("sec-websocket-extensions")
    if hs.status != 101:
        return hs  # a refusal: no WebSocket follows
    if "websocket" not in h.get("upgrade", "").lower():
        hs.problems.append("101 without 'Upgrade: websocket'")
    if "upgrade" not in [t.strip() for t in h.get("connection", "").lower().split(",")]:
        hs.problems.append("101 without 'Connection: Upgrade'")
    if request is not None and request.key:
        expected = generate_accept_token(request.key.encode()).decode()
        if hs.accept != expected:
            hs.problems.append(
                f"Sec-WebSocket-Accept {hs.accept!r}, expected {expected!r} for the client's key"
            )
    if hs.extensions and (request is None or not request.extensions):
        hs.problems.append(f"extension {hs.extensions!r} the client did not offer")
    return hs
