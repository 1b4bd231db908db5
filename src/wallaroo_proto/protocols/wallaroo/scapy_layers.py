"""scapy layers for the connector protocol, for people who build and inspect packets in scapy.

    from scapy.all import IP, TCP
    from wallaroo_proto.protocols.wallaroo.scapy_layers import WallarooFrame, WMessage, bind_port
    bind_port(7100)
    pkt = IP() / TCP(dport=7100) / WallarooFrame() / WMessage(stream_id=1, message_id=7, payload=b"hi")

``WallarooFrame`` is the length prefix and type byte; the type's fields are
its payload layer (``WHello`` ... ``WWorkersLeft``), chosen by the type byte
when dissecting and filling the type byte when building. Several frames in
one TCP segment dissect as a chain (each frame's payload ends where its length
says; the next frame follows as the payload's payload). A MESSAGE on stream 0
whose payload starts with a 2PC tag dissects its payload as the 2PC layer.
The dissector (``wallaroo_proto.protocols.wallaroo.dissect``) does not use these classes: it is
the fast path; these are for interactive work and scapy-based tools.
"""

from __future__ import annotations

import struct

from scapy.fields import (
    ByteEnumField,
    ByteField,
    FieldLenField,
    IntField,
    LongField,
    PacketListField,
    SignedLongField,
    StrField,
    StrLenField,
)
from scapy.layers.inet import TCP
from scapy.packet import Packet, Raw, bind_layers

from .frames import FrameType
from .twopc import TWOPC_STREAM, TwoPCTag

FRAME_TYPES = {int(t): t.name for t in FrameType}
TWOPC_TAGS = {int(t): t.name for t in TwoPCTag}


def _short_bytes(name: str) -> list:
    """A u16-length-prefixed string, as the spec's short_bytes."""
    return [
        FieldLenField(f"{name}_len", None, length_of=name, fmt="!H"),
        StrLenField(name, b"", length_from=lambda pkt, n=name: getattr(pkt, f"{n}_len")),
    ]


class WallarooFrame(Packet):
    """u32 length (of everything after it) and u8 frame type."""

    name = "Wallaroo frame"
    fields_desc = [IntField("length", None), ByteEnumField("type", None, FRAME_TYPES)]

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.length is None:
            pkt = struct.pack(">I", len(pkt) - 4 + len(pay)) + pkt[4:]
        return pkt + pay

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        size = max((self.length or 1) - 1, 0)
        return s[:size], s[size:]

    def dissect(self, s: bytes) -> None:
        # The body is this frame's payload; bytes after it start the next frame.
        s = self.pre_dissect(s)
        s = self.do_dissect(s)
        s = self.post_dissect(s)
        body, rest = self.extract_padding(s)
        self.do_dissect_payload(body)
        if rest:
            self.add_payload(WallarooFrame(rest) if len(rest) >= 5 else Raw(rest))

    def guess_payload_class(self, payload: bytes):
        return _BY_TYPE.get(self.type, Raw)

    def mysummary(self) -> str:
        return self.sprintf("Wallaroo %type%")


class WHello(Packet):
    name = "HELLO"
    fields_desc = [
        *_short_bytes("version"),
        *_short_bytes("cookie"),
        *_short_bytes("program_name"),
        *_short_bytes("instance_name"),
    ]


class WOk(Packet):
    name = "OK"
    fields_desc = [IntField("initial_credits", 0)]


class WError(Packet):
    name = "ERROR"
    fields_desc = _short_bytes("reason")


class WNotify(Packet):
    name = "NOTIFY"
    fields_desc = [LongField("stream_id", 0), *_short_bytes("stream_name"), LongField("point_of_ref", 0)]


class WNotifyAck(Packet):
    name = "NOTIFY_ACK"
    fields_desc = [ByteField("success", 1), LongField("stream_id", 0), LongField("point_of_ref", 0)]


class WMessage(Packet):
    name = "MESSAGE"
    fields_desc = [
        LongField("stream_id", 0),
        LongField("message_id", 0),
        SignedLongField("event_time", 0),
        *_short_bytes("key"),
        # "payload" would shadow scapy's Packet.payload (the next layer), hence "data".
        StrField("data", b""),
    ]

    def twopc(self) -> Packet | None:
        """The 2PC message this MESSAGE carries (stream 0 with a known tag), else None."""
        data = bytes(self.data)
        if self.stream_id != TWOPC_STREAM or not data or data[0] not in _BY_TAG:
            return None
        return TwoPC(data)


class WAck(Packet):
    name = "ACK"
    fields_desc = [
        IntField("credits", 0),
        FieldLenField("count", None, count_of="acks", fmt="!I"),
        PacketListField("acks", [], lambda s: WAckEntry(s), count_from=lambda pkt: pkt.count),
    ]


class WAckEntry(Packet):
    name = "ack"
    fields_desc = [LongField("stream_id", 0), LongField("point_of_ref", 0)]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class WRestart(Packet):
    """Empty in the spec; the shipped form carries u32 length + address."""

    name = "RESTART"
    fields_desc = [
        FieldLenField("address_len", None, length_of="address", fmt="!I"),
        StrLenField("address", None, length_from=lambda pkt: pkt.address_len),
    ]

    def do_dissect(self, s: bytes) -> bytes:
        if not s:  # the spec's empty RESTART
            return s
        return super().do_dissect(s)

    def self_build(self) -> bytes:
        if self.address is None:
            return b""
        return super().self_build()


class WEosMessage(Packet):
    name = "EOS_MESSAGE"
    fields_desc = [LongField("stream_id", 0), LongField("message_id", None)]

    def do_dissect(self, s: bytes) -> bytes:
        if len(s) == 8:  # the shipped form: stream id only
            self.stream_id = struct.unpack(">Q", s)[0]
            self.message_id = None
            return b""
        return super().do_dissect(s)

    def self_build(self) -> bytes:
        if self.message_id is None:
            return struct.pack(">Q", self.stream_id)
        return super().self_build()


# Frame type 9 and 2PC tag 206 share one body: rtag, then a counted list of names.
_WORKERS_LEFT_FIELDS = [
    LongField("rtag", 0),
    FieldLenField("count", None, count_of="worker_names", fmt="!I"),
    PacketListField("worker_names", [], lambda s: ShortBytes(s), count_from=lambda pkt: pkt.count),
]


class WWorkersLeft(Packet):
    name = "WORKERS_LEFT"
    fields_desc = _WORKERS_LEFT_FIELDS


_BY_TYPE = {
    FrameType.HELLO: WHello,
    FrameType.OK: WOk,
    FrameType.ERROR: WError,
    FrameType.NOTIFY: WNotify,
    FrameType.NOTIFY_ACK: WNotifyAck,
    FrameType.MESSAGE: WMessage,
    FrameType.ACK: WAck,
    FrameType.RESTART: WRestart,
    FrameType.EOS_MESSAGE: WEosMessage,
    FrameType.WORKERS_LEFT: WWorkersLeft,
}
for _type, _cls in _BY_TYPE.items():
    bind_layers(WallarooFrame, _cls, type=int(_type))


# --- 2PC ----------------------------------------------------------------------


class TwoPC(Packet):
    """The tag byte of a 2PC message (stream-0 MESSAGE payload of the sink protocol)."""

    name = "Wallaroo 2PC"
    fields_desc = [ByteEnumField("tag", None, TWOPC_TAGS)]

    def guess_payload_class(self, payload: bytes):
        return _BY_TAG.get(self.tag, Raw)


class TwoPCListUncommitted(Packet):
    name = "LIST_UNCOMMITTED"
    fields_desc = [LongField("rtag", 0)]


class TwoPCReplyUncommitted(Packet):
    name = "REPLY_UNCOMMITTED"
    fields_desc = [
        LongField("rtag", 0),
        FieldLenField("count", None, count_of="txn_ids", fmt="!I"),
        PacketListField("txn_ids", [], lambda s: ShortBytes(s), count_from=lambda pkt: pkt.count),
    ]


class ShortBytes(Packet):
    name = "short_bytes"
    fields_desc = _short_bytes("value")

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class WhereEntry(Packet):
    name = "where"
    fields_desc = [LongField("stream_id", 0), LongField("start_por", 0), LongField("end_por", 0)]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class TwoPCPhase1(Packet):
    name = "PHASE1"
    fields_desc = [
        *_short_bytes("txn_id"),
        FieldLenField("count", None, count_of="where", fmt="!I"),
        PacketListField("where", [], lambda s: WhereEntry(s), count_from=lambda pkt: pkt.count),
    ]


class TwoPCReply(Packet):
    name = "REPLY"
    fields_desc = [*_short_bytes("txn_id"), ByteField("commit", 1)]


class TwoPCPhase2(Packet):
    name = "PHASE2"
    fields_desc = [*_short_bytes("txn_id"), ByteField("commit", 1)]


class TwoPCWorkersLeft(Packet):
    name = "2PC WORKERS_LEFT"
    fields_desc = _WORKERS_LEFT_FIELDS


_BY_TAG = {
    TwoPCTag.LIST_UNCOMMITTED: TwoPCListUncommitted,
    TwoPCTag.REPLY_UNCOMMITTED: TwoPCReplyUncommitted,
    TwoPCTag.PHASE1: TwoPCPhase1,
    TwoPCTag.REPLY: TwoPCReply,
    TwoPCTag.PHASE2: TwoPCPhase2,
    TwoPCTag.WORKERS_LEFT: TwoPCWorkersLeft,
}
for _tag, _cls in _BY_TAG.items():
    bind_layers(TwoPC, _cls, tag=int(_tag))


def bind_port(port: int) -> None:
    """Dissect TCP payloads to or from ``port`` as protocol frames."""
    bind_layers(TCP, WallarooFrame, sport=port)
    bind_layers(TCP, WallarooFrame, dport=port)


def frames_of(pkt: Packet) -> list[Packet]:
    """Every WallarooFrame layer of a packet, in order."""
    out = []
    layer = pkt.getlayer(WallarooFrame)
    while layer is not None:
        out.append(layer)
        layer = layer.payload.getlayer(WallarooFrame) if layer.payload else None
    return out
