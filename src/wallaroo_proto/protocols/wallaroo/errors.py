"""The exception families: one for bad bytes on the wire, one for bad values to encode."""

from __future__ import annotations


class ProtocolError(Exception):
    """Bytes that are not a valid frame: says what was wrong and where.

    ``offset`` is the byte offset of the frame in its byte stream (when known),
    ``frame_index`` its position among the frames of that stream, ``frame_type``
    its type name once the type byte was read, and ``field_offset`` the offset
    inside the frame body where decoding failed.
    """

    def __init__(
        self,
        what: str,
        *,
        offset: int | None = None,
        frame_index: int | None = None,
        frame_type: str | None = None,
        field_offset: int | None = None,
    ) -> None:
        self.what = what
        self.offset = offset
        self.frame_index = frame_index
        self.frame_type = frame_type
        self.field_offset = field_offset
        # Frames decoded from the same chunk before this error, so nothing is lost.
        self.decoded: list = []
        # False when framing itself is broken and no later byte can be trusted.
        self.recoverable = True
        super().__init__(what)

    def locate(self, *, offset: int | None = None, frame_index: int | None = None) -> ProtocolError:
        """Fill in the stream position that only the caller knows."""
        if self.offset is None:
            self.offset = offset
        if self.frame_index is None:
            self.frame_index = frame_index
        return self

    def __str__(self) -> str:
        where = []
        if self.frame_index is not None:
            where.append(f"frame #{self.frame_index}")
        if self.frame_type is not None:
            where.append(f"({self.frame_type})")
        if self.offset is not None:
            where.append(f"at byte offset {self.offset}")
        if self.field_offset is not None:
            where.append(f"body offset {self.field_offset}")
        return f"{' '.join(where)}: {self.what}" if where else self.what


class FrameTooLarge(ProtocolError):
    """A length prefix above the configured maximum; framing cannot continue."""


class MalformedFrame(ProtocolError):
    """A frame whose body does not match its type's layout."""


class UnknownFrameType(ProtocolError):
    """A type byte (or 2PC tag) that no dialect defines."""


class EncodeError(ValueError):
    """A frame value that cannot be written without corrupting the wire format."""
