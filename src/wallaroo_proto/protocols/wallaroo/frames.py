"""Frame values of the connector protocol v3 and of the shipped dialect.

Frames are typed named tuples: immutable, slotted and cheap to build, which is
what lets the reader decode MESSAGE frames near the speed of a bare
``struct.unpack_from`` loop (a frozen dataclass costs twice as much per frame).
Equality is strict about the type, so ``Ok(5) != Error(5)``.

Text fields (version, names, reasons, txn ids) hold ``str`` when the bytes are
UTF-8 and the raw ``bytes`` otherwise, so a bad peer's string is kept, not fatal.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple, TypeVar

Text = str | bytes

# The shipped worker and test sink version strings (PROTOCOL-NOTES.md).
SOURCE_VERSION = "0.0.1"
SINK_VERSION = "v0.0.1"

#: The spec's footnote B1: a few MiB, configurable.
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024

#: A worker's source and sink listeners in the examples: connections on these are Wallaroo's.
DEFAULT_PORTS = (7100, 7200)


class FrameType(IntEnum):
    HELLO = 0
    OK = 1
    ERROR = 2
    NOTIFY = 3
    NOTIFY_ACK = 4
    MESSAGE = 5
    ACK = 6
    RESTART = 7
    EOS_MESSAGE = 8
    WORKERS_LEFT = 9


_T = TypeVar("_T")


def _strict_equality(cls: type[_T]) -> type[_T]:
    """Make a named tuple compare equal only to values of its own type."""

    def __eq__(self, other):  # noqa: N807
        return type(self) is type(other) and tuple.__eq__(self, other)

    def __ne__(self, other):  # noqa: N807
        return not __eq__(self, other)

    cls.__eq__ = __eq__  # type: ignore[method-assign]
    cls.__ne__ = __ne__  # type: ignore[method-assign]
    cls.__hash__ = lambda self: hash((type(self).__name__, tuple(self)))  # type: ignore[method-assign]
    return cls


@_strict_equality
class Hello(NamedTuple):
    version: Text
    cookie: bytes
    program_name: Text
    instance_name: Text
    TYPE = FrameType.HELLO


@_strict_equality
class Ok(NamedTuple):
    initial_credits: int
    TYPE = FrameType.OK


@_strict_equality
class Error(NamedTuple):
    reason: Text
    TYPE = FrameType.ERROR


@_strict_equality
class Notify(NamedTuple):
    stream_id: int
    stream_name: Text
    point_of_ref: int = 0
    TYPE = FrameType.NOTIFY


@_strict_equality
class NotifyAck(NamedTuple):
    success: bool
    stream_id: int
    point_of_ref: int
    TYPE = FrameType.NOTIFY_ACK


@_strict_equality
class Message(NamedTuple):
    """Application data. ``key`` is ``b""`` when the message has no key."""

    stream_id: int
    message_id: int
    event_time: int
    key: bytes
    payload: bytes
    TYPE = FrameType.MESSAGE


@_strict_equality
class Ack(NamedTuple):
    """Credits to add, and (stream_id, point_of_ref) checkpoint pairs."""

    credits: int
    acks: tuple[tuple[int, int], ...] = ()
    TYPE = FrameType.ACK


@_strict_equality
class Restart(NamedTuple):
    """``address=None`` is the spec's empty RESTART; a string is the shipped form."""

    address: Text | None = None
    TYPE = FrameType.RESTART


@_strict_equality
class EosMessage(NamedTuple):
    """``message_id=None`` is the shipped form, which carries only the stream id."""

    stream_id: int
    message_id: int | None
    TYPE = FrameType.EOS_MESSAGE


@_strict_equality
class WorkersLeft(NamedTuple):
    """Shipped dialect only (type 9): workers that left the cluster."""

    rtag: int
    worker_names: tuple[Text, ...]
    TYPE = FrameType.WORKERS_LEFT


Frame = Hello | Ok | Error | Notify | NotifyAck | Message | Ack | Restart | EosMessage | WorkersLeft

FRAME_CLASSES: dict[FrameType, type] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Ok,
        Error,
        Notify,
        NotifyAck,
        Message,
        Ack,
        Restart,
        EosMessage,
        WorkersLeft,
    )
}


def type_name(type_byte: int) -> str:
    """A frame type's name, or ``UNKNOWN(n)`` for a byte no dialect defines."""
    try:
        return FrameType(type_byte).name
    except ValueError:
        return f"UNKNOWN({type_byte})"


def show_text(value: Text | None) -> str:
    """A text field for people: str as is, non-UTF-8 bytes escaped."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return repr(value)[2:-1]
    return value
