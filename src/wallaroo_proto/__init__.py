"""wallaroo-proto: a toolkit for the Wallaroo connector protocol, version 3."""

from .protocols.wallaroo.codec import decode, encode, encode_body
from .protocols.wallaroo.errors import (
    EncodeError,
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    UnknownFrameType,
)
from .protocols.wallaroo.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    Ack,
    EosMessage,
    Error,
    Frame,
    FrameType,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    WorkersLeft,
)
from .protocols.wallaroo.protocol import (
    Connection,
    ConnState,
    Side,
    StreamState,
    Use,
    Verdict,
    check_hello,
)
from .protocols.wallaroo.reader import FrameReader
from .protocols.wallaroo.twopc import (
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    TwoPCWorkersLeft,
    decode_twopc,
    encode_twopc,
    twopc_frame,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "Ack",
    "ConnState",
    "Connection",
    "EncodeError",
    "EosMessage",
    "Error",
    "Frame",
    "FrameReader",
    "FrameTooLarge",
    "FrameType",
    "Hello",
    "ListUncommitted",
    "MalformedFrame",
    "Message",
    "Notify",
    "NotifyAck",
    "Ok",
    "Phase1",
    "Phase2",
    "ProtocolError",
    "Reply",
    "ReplyUncommitted",
    "Restart",
    "Side",
    "StreamState",
    "TwoPCWorkersLeft",
    "UnknownFrameType",
    "Use",
    "Verdict",
    "WorkersLeft",
    "check_hello",
    "decode",
    "decode_twopc",
    "encode",
    "encode_body",
    "encode_twopc",
    "twopc_frame",
]
