"""The Wallaroo connector protocol v3: its codec and sans-IO core, and its dissector plug-in.

The names below are the protocol's library API (docs/library.md): frames and their codec,
the 2PC messages, the frame reader and the connection state machine.
"""

from .codec import decode, encode, encode_body
from .errors import (
    EncodeError,
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    UnknownFrameType,
)
from .frames import (
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
from .protocol import (
    Connection,
    ConnState,
    Side,
    StreamState,
    Use,
    Verdict,
    check_hello,
)
from .reader import FrameReader
from .twopc import (
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
