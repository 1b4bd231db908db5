"""Read TCP segments out of pcap and pcapng captures, fast.

A full scapy dissection costs tens of microseconds per packet; a dissector that
only needs the TCP payload does not need it. This module reads the file formats
and parses the link, IP and TCP headers with ``struct`` itself, yielding one
tuple per TCP segment::

    (packet number, timestamp in ns, (src, sport, dst, dport), seq, flags, payload)

where ``src``/``dst`` are packed addresses (4 or 16 bytes). A pipe or FIFO
(``tcpdump -U -w - | ...``) is read as its bytes come: each packet is handed
over once its bytes are there, and ``waits=True`` marks with ``WAIT`` the
moments the reader is about to wait for more, so a consumer can pass on what
it holds. pcapng is read with
scapy's ``RawPcapNgReader`` (blocks, interfaces, ``if_tsresol``); classic pcap
with a small loop of our own, because scapy's ``RawPcapReader`` cuts packets at
its MTU and turns a truncated file into a warning, and a dissector must say
where a file is damaged. Every problem is a ``CaptureError`` naming the packet
number and byte offset; packets before it have already been yielded.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import os
import select
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO, Protocol

#: Link types we decode (pcap LINKTYPE_* values).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
#: OpenBSD's and some old libpcaps' DLT_RAW values.
_RAW_ALIASES = (12, 14)
LINKTYPE_NAMES = {
    LINKTYPE_NULL: "BSD null/loopback",
    LINKTYPE_ETHERNET: "Ethernet",
    LINKTYPE_RAW: "raw IP",
    12: "raw IP",
    14: "raw IP",
    LINKTYPE_LOOP: "OpenBSD loopback",
    LINKTYPE_LINUX_SLL: "Linux cooked v1",
    LINKTYPE_IPV4: "raw IPv4",
    LINKTYPE_IPV6: "raw IPv6",
    LINKTYPE_LINUX_SLL2: "Linux cooked v2",
}

TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10

_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),  # little endian, microseconds
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),  # nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
#: A record claiming more than this is damage, not a packet (pcap's own limit is 256 KiB).
MAX_RECORD = 16 * 1024 * 1024
_CHUNK = 1 << 20
#: A pipe's reads: Linux pipes hold 64 KiB, and a larger buffer only costs its allocation.
_PIPE_CHUNK = 1 << 16
_SIGNAL_SLICE = 0.25  # seconds a pipe read waits before it looks for a pending signal

#: What a capture cut short (``CaptureError.cut``) still gives its reader.
CUT_NOTE = "(the capture is cut short there; every packet before it was read)"

Segment = tuple[int, int, tuple[bytes, int, bytes, int], int, int, bytes]
#: The flag of ``WAIT_SEGMENT``: above TCP's eight, so no segment carries it.
WAIT = 0x100
#: What ``read_segments(..., waits=True)`` yields before a live read that may block.
WAIT_SEGMENT: Segment = (0, 0, (b"", 0, b"", 0), 0, WAIT, b"")
#: With ``WAIT``: the source has nothing more now, and its reader must hand back control even
#: with nothing made (``Dissector.segment_batches``), because the source cannot block.
PAUSE = 0x200
PAUSE_SEGMENT: Segment = (0, 0, (b"", 0, b"", 0), 0, WAIT | PAUSE, b"")


class PacketTap(Protocol):
    """What ``read_segments`` hands every packet read, whole (for writing some of them out)."""

    def begin(self, linktype: int, nanoseconds: bool) -> None: ...

    def packet(self, number: int, ts_ns: int, data: bytes) -> None: ...


class CaptureError(Exception):
    """A capture file that cannot be read (further): what, and where.

    ``cut`` marks a file that simply ends mid-packet, as a recorder killed while
    writing leaves it: everything before the cut is sound, so readers report it
    as a found problem rather than as unusable input.
    """

    def __init__(
        self, what: str, *, packet: int | None = None, offset: int | None = None, cut: bool = False
    ) -> None:
        self.what = what
        self.packet = packet
        self.offset = offset
        self.cut = cut
        super().__init__(what)

    def __str__(self) -> str:
        where = []
        if self.packet is not None:
            where.append(f"packet {self.packet}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        return f"{', '.join(where)}: {self.what}" if where else self.what


def format_address(raw: bytes) -> str:
    """A packed IPv4/IPv6 address as text."""
    return str(ipaddress.ip_address(raw))


def connection_ident(capture: str, protocol: str, index: int, client: tuple, server: tuple) -> dict:
    """The fields every record of one connection carries; ``connection`` is its printed label."""
    ia, ip = format_address(client[0]), client[1]
    ra, rp = format_address(server[0]), server[1]
    fmt = lambda a, p: f"[{a}]:{p}" if ":" in a else f"{a}:{p}"  # noqa: E731
    return {
        "capture": capture,
        "protocol": protocol,
        "connection": f"{fmt(ia, ip)} > {fmt(ra, rp)}",
        "conn_index": index,
        "initiator_addr": ia,
        "initiator_port": ip,
        "responder_addr": ra,
        "responder_port": rp,
    }


def is_stream(source: str | os.PathLike | BinaryIO) -> bool:
    """Whether a capture is a pipe, FIFO or terminal, read as it is written, not a regular file."""
    try:
        if isinstance(source, (str, os.PathLike)):
            mode = os.stat(source).st_mode
        else:
            mode = os.fstat(source.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # no such file, or no descriptor (BytesIO)
        return False
    return not stat.S_ISREG(mode)


class _Stream:
    """A capture read as it is written: reads count the offset (a pipe has no ``tell``).

    ``read(n)`` waits for ``n`` bytes (fewer only at the end); ``read1(n)`` returns
    what is there, waiting only when nothing is. A buffered file is read through its raw
    file, and each read waits first in short ``select`` slices: a signal that lands just
    before a blocking ``read`` would only mark its handler to run, and the read would wait
    for bytes that may never come (Ctrl-C on ``dissect -`` fed by a writer that stays open).
    """

    __slots__ = ("_fd", "_raw", "_read1", "offset")

    def __init__(self, f: BinaryIO) -> None:
        self._fd = f.fileno()
        # The buffered file's own buffer is passed by: nothing may have been read from it yet.
        self._raw = f.raw if isinstance(f, io.BufferedReader) else None
        self._read1 = self._raw.read if self._raw is not None else getattr(f, "read1", f.read)
        self.offset = 0

    def read1(self, n: int) -> bytes:
        if self._raw is not None:
            while not select.select([self._fd], [], [], _SIGNAL_SLICE)[0]:
                pass  # each turn of the loop runs a pending signal's handler
        data = self._read1(n)
        self.offset += len(data)
        return data

    def read(self, n: int = -1) -> bytes:
        parts = []
        left = n if n >= 0 else float("inf")
        while left > 0:
            data = self.read1(int(min(left, _PIPE_CHUNK)))
            if not data:
                break
            parts.append(data)
            left -= len(data)
        return b"".join(parts)

    def tell(self) -> int:
        return self.offset

    def ready(self) -> bool:
        """Bytes are waiting (a read will not block for long)."""
        return bool(select.select([self._fd], [], [], 0)[0])


@contextmanager
def _open(source: str | os.PathLike | BinaryIO):
    if isinstance(source, (str, os.PathLike)):
        try:
            f = open(source, "rb")  # noqa: SIM115 - closed below
        except OSError as err:
            raise CaptureError(f"cannot open: {err.strerror}") from None
        try:
            yield _Stream(f) if is_stream(f) else f
        finally:
            f.close()
    else:
        yield _Stream(source) if is_stream(source) else source


def read_segments(
    source: str | os.PathLike | BinaryIO,
    stats: dict | None = None,
    *,
    waits: bool = False,
    tap: PacketTap | None = None,
) -> Iterator[Segment]:
    """Every TCP segment in a pcap or pcapng file or binary file object, in file order.

    ``stats`` (optional) is filled with counts: packets, tcp, skipped (non-TCP,
    fragments), and the file format and link types. With ``waits``, a pipe's
    reader yields ``WAIT_SEGMENT`` whenever it is about to wait for bytes. ``tap`` is
    given every packet's bytes as read (``begin`` first, and whenever the link type changes).
    """
    if stats is None:
        stats = {}
    stats.update(packets=0, tcp=0, skipped=0, format=None, linktypes=set())
    with _open(source) as f:
        magic = f.read(4)
        if len(magic) < 4:
            raise CaptureError(
                "empty file" if not magic else "file too short to be a capture (under 4 bytes)", offset=0
            )
        if magic in _PCAP_MAGICS:
            stats["format"] = "pcap"
            yield from _read_pcap(f, magic, stats, waits, tap)
        elif magic == _PCAPNG_MAGIC:
            stats["format"] = "pcapng"
            yield from _read_pcapng(f, stats, waits, tap)
        else:
            raise CaptureError(f"not a pcap or pcapng capture (starts with bytes {magic.hex(' ')})", offset=0)


def _read_more(f: _Stream, n: int, need: int) -> bytes:
    """At least ``need`` bytes of a pipe (fewer only at its end), and up to ``n``: what is there."""
    parts = []
    while need > 0:
        data = f.read1(n)
        if not data:
            break
        parts.append(data)
        need -= len(data)
    return b"".join(parts)


def _read_pcap(
    f: BinaryIO, magic: bytes, stats: dict, waits: bool, tap: PacketTap | None
) -> Iterator[Segment]:
    endian, ns_per_tick = _PCAP_MAGICS[magic]
    header = f.read(20)
    if len(header) < 20:
        raise CaptureError("truncated pcap file header (24 bytes expected)", offset=4 + len(header))
    _major, _minor, _tz, _sig, _snaplen, linktype = struct.unpack(endian + "HHiIII", header)
    linktype &= 0x0FFFFFFF  # the upper bits may carry FCS information
    parse = _link_parser(linktype, packet=None, offset=20)
    stats["linktypes"].add(linktype)
    tapped = tap.packet if tap is not None else None
    if tap is not None:
        tap.begin(linktype, ns_per_tick == 1)
    record = struct.Struct(endian + "IIII").unpack_from
    ethernet = linktype == LINKTYPE_ETHERNET
    live = type(f) is _Stream
    # Records are parsed out of 1 MiB chunks: one read per chunk, not two per packet. A pipe's
    # reads take what is there (at least the record under way), not wait for a whole chunk.
    read = (lambda n, need: _read_more(f, min(n, _PIPE_CHUNK), need)) if live else (lambda n, need: f.read(n))
    waits = waits and live
    buf = b""
    pos = 0
    base = 24  # file offset of buf[0]
    number = 0
    tcp = 0
    while True:
        if len(buf) - pos < 16:
            if waits:
                yield WAIT_SEGMENT
            buf = buf[pos:] + read(_CHUNK, 16 - (len(buf) - pos))
            base += pos
            pos = 0
            if len(buf) < 16:
                if buf:
                    raise CaptureError(
                        f"truncated record header ({len(buf)} of 16 bytes): the file ends mid-packet",
                        packet=number + 1,
                        offset=base,
                        cut=True,
                    )
                break
        number += 1
        sec, frac, caplen, _wirelen = record(buf, pos)
        if caplen > MAX_RECORD:
            raise CaptureError(
                f"record header claims {caplen} captured bytes: not a packet record (file damaged)",
                packet=number,
                offset=base + pos,
            )
        end = pos + 16 + caplen
        if end > len(buf):
            if waits:
                yield WAIT_SEGMENT
            buf = buf[pos:] + read(max(_CHUNK, 16 + caplen), end - len(buf))
            base += pos
            pos = 0
            end = 16 + caplen
            if end > len(buf):
                raise CaptureError(
                    f"truncated packet: {caplen} bytes captured, only {len(buf) - 16} left in the file",
                    packet=number,
                    offset=base,
                    cut=True,
                )
        b = pos + 16  # the packet's first byte
        pos = end
        if tapped is not None:
            tapped(number, sec * 1_000_000_000 + frac * ns_per_tick, buf[b:end])
        if (
            ethernet
            and caplen >= 54
            and buf[b + 12] == 8
            and buf[b + 13] == 0
            and buf[b + 14] == 0x45
            and buf[b + 23] == 6
            and not (buf[b + 20] & 0x3F or buf[b + 21])
        ):
            # _ethernet_ipv4 inlined: untagged Ethernet, IPv4 without options, unfragmented TCP.
            sport, dport, seq, _ack, off, flags = _TCP(buf, b + 34)
            total = (buf[b + 16] << 8) | buf[b + 17]
            stop = min(b + 14 + total, end) if total else end
            tcp += 1
            yield (
                number,
                sec * 1_000_000_000 + frac * ns_per_tick,
                (buf[b + 26 : b + 30], sport, buf[b + 30 : b + 34], dport),
                seq,
                flags,
                buf[b + 34 + (off >> 4) * 4 : stop],
            )
        else:
            seg = parse(buf[b:end])
            if seg is not None:
                tcp += 1
                yield (number, sec * 1_000_000_000 + frac * ns_per_tick, *seg)
        if number & 0x3FFF == 0:
            stats["packets"] = number
            stats["tcp"] = tcp
    stats["packets"] = number
    stats["tcp"] = tcp
    stats["skipped"] = number - tcp


@contextmanager
def _quiet_scapy():
    logger = logging.getLogger("scapy.runtime")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


#: Comments kept waiting for their packet's frame: a frame with no record of its own (a
#: summary counts it only) leaves its comment unread, so the oldest go beyond this many.
MAX_PENDING_COMMENTS = 10_000


def keep_comment(comments: dict[int, list[str]], packet: int, texts: list[str]) -> None:
    """A packet's comments, kept until a record of its frame takes them, in bounded memory."""
    comments[packet] = texts
    while len(comments) > MAX_PENDING_COMMENTS:
        del comments[next(iter(comments))]


def _read_pcapng(f: BinaryIO, stats: dict, waits: bool, tap: PacketTap | None) -> Iterator[Segment]:
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapNgReader

    live = type(f) is _Stream
    try:
        end = None if live else f.seek(0, io.SEEK_END)
        if not live:
            f.seek(4)
    except (OSError, ValueError):
        end = None
    with _quiet_scapy():
        try:
            # Built on our already open file (the metaclass would reopen by name).
            reader = object.__new__(RawPcapNgReader)
            reader.__init__("capture", f, _PCAPNG_MAGIC)
        except (Scapy_Exception, EOFError) as err:
            raise CaptureError(f"bad pcapng section header: {err}", offset=0) from None
    parsers: dict[int, object] = {}
    number = 0
    tcp = 0
    # A pipe's blocks are read one at a time as they come; before one not yet there, a WAIT.
    waits = waits and live
    while True:
        if waits and not f.ready():
            yield WAIT_SEGMENT
        start = f.tell()
        try:
            with _quiet_scapy():
                data, meta = reader._read_packet(size=MAX_RECORD)
        except EOFError:
            if live and f.offset > start:
                raise CaptureError(
                    f"truncated or damaged pcapng block ({f.offset - start} bytes read of it)",
                    packet=number + 1,
                    offset=start,
                    cut=True,
                ) from None
            if end is not None and start < end:
                raise CaptureError(
                    f"truncated or damaged pcapng block ({end - start} bytes left unread)",
                    packet=number + 1,
                    offset=start,
                    cut=_ends_mid_block(f, start, end, reader.endian),
                ) from None
            break
        except Scapy_Exception as err:
            raise CaptureError(f"damaged pcapng block: {err}", packet=number + 1, offset=start) from None
        number += 1
        linktype = meta.linktype
        parse = parsers.get(linktype)
        if parse is None:
            parse = parsers[linktype] = _link_parser(linktype, packet=number, offset=start)
            stats["linktypes"].add(linktype)
            if tap is not None:
                tap.begin(linktype, meta.tsresol > 1_000_000)
        seg = parse(data)
        if meta.comments:
            # A packet's comments (a proxy's faults, an analyst's remarks): notes of the frame it completes.
            texts = meta.comments if isinstance(meta.comments, list) else [meta.comments]
            keep_comment(
                stats.setdefault("comments", {}), number, [t.decode("utf-8", "replace") for t in texts]
            )
        if seg is not None or tap is not None:
            ticks = (meta.tshigh << 32) | meta.tslow
            ts_ns = ticks * 1_000_000_000 // meta.tsresol
            if tap is not None:
                tap.packet(number, ts_ns, data)
            if seg is not None:
                tcp += 1
                yield (number, ts_ns, *seg)
    stats["packets"] = number
    stats["tcp"] = tcp
    stats["skipped"] = number - tcp


def _ends_mid_block(f: BinaryIO, start: int, end: int, endian: str) -> bool:
    """Whether the block at ``start`` declares a sound length that runs past the file's end: a cut."""
    try:
        f.seek(start)
        head = f.read(8)
    except (OSError, ValueError):
        return False
    if len(head) < 8:
        return True
    _kind, length = struct.unpack(endian + "II", head)
    return length >= 12 and length % 4 == 0 and start + length > end


# --- link, IP and TCP headers ------------------------------------------------

_U16 = struct.Struct("!H").unpack_from
_TCP = struct.Struct("!HHIIBB").unpack_from  # ports, seq, ack, data offset, flags
_IPV6_EXT = {0, 43, 60}  # hop-by-hop, routing, destination options
_VLAN = (0x8100, 0x88A8, 0x9100)


def _ip(data: bytes, pos: int):
    """TCP segment of the IP packet at ``pos``: ((src, sport, dst, dport), seq, flags, payload) or None."""
    if len(data) < pos + 20:
        return None
    version = data[pos] >> 4
    if version == 4:
        ihl = (data[pos] & 0x0F) * 4
        if data[pos + 9] != 6 or ihl < 20:
            return None
        if _U16(data, pos + 6)[0] & 0x3FFF:  # more fragments or a fragment offset
            return None
        total = _U16(data, pos + 2)[0]
        end = pos + total if total else len(data)  # 0: TSO, length unknown
        src = data[pos + 12 : pos + 16]
        dst = data[pos + 16 : pos + 20]
        pos += ihl
    elif version == 6:
        if len(data) < pos + 40:
            return None
        nxt = data[pos + 6]
        plen = _U16(data, pos + 4)[0]
        end = pos + 40 + plen if plen else len(data)
        src = data[pos + 8 : pos + 24]
        dst = data[pos + 24 : pos + 40]
        pos += 40
        while nxt in _IPV6_EXT and len(data) >= pos + 8:
            nxt, hlen = data[pos], (data[pos + 1] + 1) * 8
            pos += hlen
        if nxt != 6:
            return None  # not TCP, or a fragment (44)
    else:
        return None
    if len(data) < pos + 20:
        return None
    sport, dport, seq, _ack, off, flags = _TCP(data, pos)
    start = pos + (off >> 4) * 4
    return (src, sport, dst, dport), seq, flags, data[start:end]


def _ethernet(data: bytes):
    if len(data) < 34:
        return None
    ethertype = (data[12] << 8) | data[13]
    pos = 14
    while ethertype in _VLAN and len(data) >= pos + 4:
        ethertype = (data[pos + 2] << 8) | data[pos + 3]
        pos += 4
    if ethertype == 0x0800 or ethertype == 0x86DD:
        return _ip(data, pos)
    return None


def _ethernet_ipv4(data: bytes):
    """The common case inlined: untagged Ethernet, IPv4 without options, TCP."""
    if len(data) >= 54 and data[12] == 8 and data[13] == 0 and data[14] == 0x45 and data[23] == 6:
        if data[20] & 0x3F or data[21]:
            return None  # fragment
        total = (data[16] << 8) | data[17]
        sport, dport, seq, _ack, off, flags = _TCP(data, 34)
        end = 14 + total if total else len(data)
        return (data[26:30], sport, data[30:34], dport), seq, flags, data[34 + (off >> 4) * 4 : end]
    return _ethernet(data)


def _null(data: bytes):
    # The 4-byte address family is in the capturing host's byte order; the IP version tells.
    return _ip(data, 4)


def _raw(data: bytes):
    return _ip(data, 0)


def _sll(data: bytes):
    if len(data) < 16:
        return None
    proto = _U16(data, 14)[0]
    return _ip(data, 16) if proto in (0x0800, 0x86DD) else None


def _sll2(data: bytes):
    if len(data) < 20:
        return None
    proto = _U16(data, 0)[0]
    return _ip(data, 20) if proto in (0x0800, 0x86DD) else None


_PARSERS = {
    LINKTYPE_ETHERNET: _ethernet_ipv4,
    LINKTYPE_NULL: _null,
    LINKTYPE_LOOP: _null,
    LINKTYPE_RAW: _raw,
    12: _raw,
    14: _raw,
    LINKTYPE_IPV4: _raw,
    LINKTYPE_IPV6: _raw,
    LINKTYPE_LINUX_SLL: _sll,
    LINKTYPE_LINUX_SLL2: _sll2,
}


def _link_parser(linktype: int, *, packet: int | None, offset: int | None):
    parse = _PARSERS.get(linktype)
    if parse is None:
        known = ", ".join(sorted(set(LINKTYPE_NAMES.values())))
        raise CaptureError(f"unknown link type {linktype} (supported: {known})", packet=packet, offset=offset)
    return parse
