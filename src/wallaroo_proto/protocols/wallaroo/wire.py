"""Primitive field readers and writers shared by the frame and 2PC codecs."""

from __future__ import annotations

import struct

from .errors import EncodeError, MalformedFrame
from .frames import Text

U8 = struct.Struct(">B")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
#: length, type, stream_id, message_id, event_time, key length: a MESSAGE up to its key.
MESSAGE_HEAD = struct.Struct(">IBQQqH")

_LIMITS = {
    "u8": (0, 0xFF),
    "u16": (0, 0xFFFF),
    "u32": (0, 0xFFFF_FFFF),
    "u64": (0, 0xFFFF_FFFF_FFFF_FFFF),
    "i64": (-(1 << 63), (1 << 63) - 1),
}
_PACKERS = {"u8": U8, "u16": U16, "u32": U32, "u64": U64, "i64": I64}


def as_text(raw: bytes) -> Text:
    """UTF-8 text as str; anything else is kept as the raw bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


class Writer:
    """Builds a frame body, refusing any value its field cannot hold."""

    __slots__ = ("parts", "frame_type")

    def __init__(self, frame_type: str) -> None:
        self.parts: list[bytes] = []
        self.frame_type = frame_type

    def int(self, kind: str, value: object, field: str) -> None:
        low, high = _LIMITS[kind]
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            raise EncodeError(f"{self.frame_type}.{field} must be an integer, not {type(value).__name__}")
        if not low <= value <= high:
            raise EncodeError(f"{self.frame_type}.{field}={value} is out of range for {kind} ({low}..{high})")
        self.parts.append(_PACKERS[kind].pack(value))

    def short_bytes(self, value: object, field: str) -> None:
        raw = self._bytes(value, field)
        if len(raw) > 0xFFFF:
            raise EncodeError(
                f"{self.frame_type}.{field} is {len(raw)} bytes; a u16-prefixed string holds at most 65535"
            )
        self.parts.append(U16.pack(len(raw)))
        self.parts.append(raw)

    def rest(self, value: object, field: str) -> None:
        self.parts.append(self._bytes(value, field))

    def _bytes(self, value: object, field: str) -> bytes:
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise EncodeError(f"{self.frame_type}.{field} must be str or bytes, not {type(value).__name__}")

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class Cursor:
    """Reads fields from a body, turning any overrun into MalformedFrame."""

    __slots__ = ("data", "pos", "frame_type")

    def __init__(self, data: bytes, pos: int, frame_type: str) -> None:
        self.data = data
        self.pos = pos
        self.frame_type = frame_type

    def _fail(self, what: str) -> MalformedFrame:
        return MalformedFrame(what, frame_type=self.frame_type, field_offset=self.pos)

    def _take(self, packer: struct.Struct, field: str) -> int:
        if self.pos + packer.size > len(self.data):
            raise self._fail(
                f"{field} needs {packer.size} bytes but the body has {len(self.data) - self.pos} left"
            )
        (value,) = packer.unpack_from(self.data, self.pos)
        self.pos += packer.size
        return value

    def u8(self, field: str) -> int:
        return self._take(U8, field)

    def u32(self, field: str) -> int:
        return self._take(U32, field)

    def u64(self, field: str) -> int:
        return self._take(U64, field)

    def i64(self, field: str) -> int:
        return self._take(I64, field)

    def flag(self, field: str) -> bool:
        value = self.u8(field)
        if value > 1:
            self.pos -= 1
            raise self._fail(f"{field} must be 0 or 1, not {value}")
        return value == 1

    def raw(self, size: int, field: str) -> bytes:
        if self.pos + size > len(self.data):
            raise self._fail(
                f"{field} is {size} bytes long but the body has {len(self.data) - self.pos} left"
            )
        value = self.data[self.pos : self.pos + size]
        self.pos += size
        return bytes(value)

    def short_bytes(self, field: str) -> bytes:
        return self.raw(self._take(U16, f"{field} length"), field)

    def text(self, field: str) -> Text:
        return as_text(self.short_bytes(field))

    def count(self, field: str, item_size: int) -> int:
        """A u32 list count, checked against what the body can possibly hold."""
        n = self.u32(field)
        if n * item_size > len(self.data) - self.pos:
            self.pos -= 4
            raise self._fail(
                f"{field}={n} items of at least {item_size} bytes cannot fit in the "
                f"{len(self.data) - self.pos - 4} bytes left"
            )
        return n

    def rest(self) -> bytes:
        value = bytes(self.data[self.pos :])
        self.pos = len(self.data)
        return value

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self._fail(f"{len(self.data) - self.pos} unexpected trailing bytes")
