"""Write TCP sessions as classic pcap files that tshark, Wireshark and scapy open.

A live peer sees only the byte stream, not the packets, so a recording is
synthesised: Ethernet/IPv4/TCP with a three-way handshake, correct sequence and
acknowledgement numbers, IP and TCP checksums, real timestamps, and a FIN
exchange on close. Packets are written as they happen; nothing is buffered.
The target ``-`` is standard output, so a recording piped into ``dissect -`` is
a live view; when a pipe's reader goes away, recording stops (one warning) and
the peer recorded carries on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import struct
import sys
import time
from typing import BinaryIO, Protocol

LINKTYPE_ETHERNET = 1
PCAP_MAGIC_USEC = 0xA1B2C3D4
PCAP_MAGIC_NSEC = 0xA1B23C4D
#: Largest TCP payload per synthesised segment (what loopback's 64 KiB MTU allows).
DEFAULT_SEGMENT_SIZE = 65_000

_TCP_FIN, _TCP_SYN, _TCP_RST, _TCP_PSH, _TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071). As 2**16 is 1 modulo 0xFFFF, the ones' complement
    sum of the 16-bit words is the whole big-endian number modulo 0xFFFF (0xFFFF where that
    is 0 but the words are not): one C-level operation instead of a word at a time."""
    if len(data) % 2:
        data += b"\x00"
    total = int.from_bytes(data, "big") % 0xFFFF
    if total == 0 and any(data):
        total = 0xFFFF
    return ~total & 0xFFFF


def _mac(ip: bytes) -> bytes:
    return b"\x02\x00" + ip[-4:]  # locally administered, derived from the address


def _packed_pair(a: str, b: str) -> tuple[bytes, bytes]:
    """Two endpoints' addresses packed, in one family: an IPv4 one beside an IPv6 one becomes
    its IPv4-mapped IPv6 address (``::ffff:a.b.c.d``), as a dual-stack socket names it."""
    first, second = ipaddress.ip_address(a), ipaddress.ip_address(b)
    if first.version != second.version:
        first, second = (
            ipaddress.IPv6Address(f"::ffff:{x}") if x.version == 4 else x for x in (first, second)
        )
    return first.packed, second.packed


_END_OF_OPTIONS = b"\0\0\0\0"


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _option(code: int, value: bytes) -> bytes:
    value = value[:0xFFFF]  # an option's length is 16 bits: a longer comment is cut
    return struct.pack("<HH", code, len(value)) + _padded(value)


def _block(kind: int, body: bytes) -> bytes:
    """A pcapng block: type, total length, body, total length again."""
    length = 12 + len(body)
    return struct.pack("<II", kind, length) + body + struct.pack("<I", length)


class PcapWriter:
    """A pcap file open for appending packets (Ethernet and microsecond timestamps unless told)."""

    def __init__(
        self,
        target: str | os.PathLike | BinaryIO,
        *,
        snaplen: int = 262_144,
        linktype: int = LINKTYPE_ETHERNET,
        nanoseconds: bool = False,
        pcapng: bool = False,
    ) -> None:
        """``pcapng``: written as pcapng, whose packets can carry comments (notes on frames)."""
        if target == "-":
            # The process's own stdout, even where the text ``sys.stdout`` was moved to stderr.
            self._file = sys.__stdout__.buffer
            self._owned = False
        elif isinstance(target, (str, os.PathLike)):
            self._file: BinaryIO = open(target, "wb")  # noqa: SIM115 - closed by close()
            self._owned = True
        else:
            self._file = target
            self._owned = False
        self.snaplen = snaplen
        self.packets = 0
        #: False once a pipe's reader went away: packets are no longer written.
        self.recording = True
        #: Logged when that happens (None: the owner reports it its own way).
        self.gone_warning: str | None = "recording stopped: its pipe's reader went away"
        self.nanoseconds = nanoseconds
        self.pcapng = pcapng
        if pcapng:
            self._write(_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1)))
            resolution = _option(9, bytes([9 if nanoseconds else 6]))
            self._write(_block(1, struct.pack("<HHI", linktype, 0, snaplen) + resolution + _END_OF_OPTIONS))
        else:
            magic = PCAP_MAGIC_NSEC if nanoseconds else PCAP_MAGIC_USEC
            self._write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))

    def write_packet(self, frame: bytes, timestamp: float | None = None, comment: str | None = None) -> None:
        """One packet; its ``comment`` is kept only in a pcapng file (pcap has no place for it)."""
        if not self.recording:
            return
        ts = time.time() if timestamp is None else timestamp
        sec = int(ts)
        usec = min(int(round((ts - sec) * 1_000_000)), 999_999)
        captured = frame[: self.snaplen]
        if self.pcapng:
            ticks = sec * 1_000_000 + usec
            if self.nanoseconds:
                ticks = int(ts * 1_000_000_000)
            options = _option(1, comment.encode()) + _END_OF_OPTIONS if comment else b""
            head = struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFF_FFFF, len(captured), len(frame))
            self._write(_block(6, head + _padded(captured) + options))
        else:
            self._write(struct.pack("<IIII", sec, usec, len(captured), len(frame)) + captured)
        self.packets += 1

    def write_raw(self, packet: bytes, ts_ns: int) -> None:
        """A packet as read from another capture (its link type the file's), timestamp in ns."""
        if not self.recording:
            return
        sec, fraction = divmod(ts_ns, 1_000_000_000)
        if not self.nanoseconds:
            fraction //= 1000
        captured = packet[: self.snaplen]
        if self.pcapng:
            ticks = sec * (1_000_000_000 if self.nanoseconds else 1_000_000) + fraction
            head = struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFF_FFFF, len(captured), len(packet))
            self._write(_block(6, head + _padded(captured)))
        else:
            self._write(struct.pack("<IIII", sec, fraction, len(captured), len(packet)) + captured)
        self.packets += 1

    def tcp_segment(
        self,
        src: tuple[bytes, int],
        dst: tuple[bytes, int],
        seq: int,
        ack: int,
        flags: int,
        payload: bytes,
        ip_id: int,
        timestamp: float | None,
        comment: str | None = None,
    ) -> None:
        """A ``TcpSession``'s segment, written as its packet."""
        self.write_packet(tcp_frame(src, dst, seq, ack, flags, payload, ip_id), timestamp, comment)

    def _write(self, data: bytes) -> None:
        try:
            self._file.write(data)
            # Each packet flushed whole as it is written (flush writes until all is out or raises):
            # a recorder killed -9 leaves a capture that reads to the moment it died, a pipe's
            # reader sees it at once.
            self._file.flush()
        except BrokenPipeError:
            self.recording = False
            if self.gone_warning:
                logging.getLogger(__name__).warning(self.gone_warning)

    def flush(self) -> None:
        if self.recording:
            self._file.flush()

    def close(self) -> None:
        if self._owned:
            self._file.close()
        elif self.recording:
            self._file.flush()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tcp_session(
        self,
        client: tuple[str, int],
        server: tuple[str, int],
        *,
        timestamp: float | None = None,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
    ) -> TcpSession:
        """Start recording one connection: writes its three-way handshake now."""
        return TcpSession(self, client, server, timestamp=timestamp, segment_size=segment_size)


class SegmentSink(Protocol):
    """Where a ``TcpSession``'s segments go: a ``PcapWriter`` writes each as a packet."""

    def tcp_segment(
        self,
        src: tuple[bytes, int],
        dst: tuple[bytes, int],
        seq: int,
        ack: int,
        flags: int,
        payload: bytes,
        ip_id: int,
        timestamp: float | None,
        comment: str | None = None,
    ) -> None: ...


class TcpSession:
    """One TCP connection inside a PcapWriter (or another ``SegmentSink``); ``send`` records
    payload in either direction."""

    def __init__(
        self,
        writer: SegmentSink,
        client: tuple[str, int],
        server: tuple[str, int],
        *,
        timestamp: float | None,
        segment_size: int,
        client_isn: int = 1_000,
        server_isn: int = 500_000,
    ) -> None:
        self.writer = writer
        self.segment_size = segment_size
        client_ip, server_ip = _packed_pair(client[0], server[0])
        self._ends = {True: (client_ip, client[1]), False: (server_ip, server[1])}
        self._seq = {True: client_isn, False: server_isn}
        self._ip_id = {True: 1, False: 1}
        self.closed = False
        self._fins: set[bool] = set()
        self._segment(True, _TCP_SYN, b"", timestamp)
        self._seq[True] += 1
        self._segment(False, _TCP_SYN | _TCP_ACK, b"", timestamp)
        self._seq[False] += 1
        self._segment(True, _TCP_ACK, b"", timestamp)

    def send(
        self, from_client: bool, payload: bytes, timestamp: float | None = None, comment: str | None = None
    ) -> None:
        """Record ``payload`` sent by the client (True) or the server (False); a ``comment``
        goes on its last segment, the one that completes it."""
        if self.closed or not payload:
            return
        view = memoryview(payload)
        last = (len(view) - 1) // self.segment_size * self.segment_size
        for start in range(0, len(view), self.segment_size):
            chunk = bytes(view[start : start + self.segment_size])
            self._segment(
                from_client, _TCP_PSH | _TCP_ACK, chunk, timestamp, comment if start == last else None
            )
            self._seq[from_client] = (self._seq[from_client] + len(chunk)) & 0xFFFF_FFFF

    def ack(self, from_client: bool, timestamp: float | None = None) -> None:
        """Record a bare ACK (no payload), as a receiving kernel sends for data it got."""
        if not self.closed:
            self._segment(from_client, _TCP_ACK, b"", timestamp)

    def close(self, from_client: bool = True, timestamp: float | None = None) -> None:
        """Record an orderly close started by one side: FIN, FIN, last ACK."""
        if self.closed:
            return
        self._segment(from_client, _TCP_FIN | _TCP_ACK, b"", timestamp)
        self._seq[from_client] += 1
        self._segment(not from_client, _TCP_FIN | _TCP_ACK, b"", timestamp)
        self._seq[not from_client] += 1
        self._segment(from_client, _TCP_ACK, b"", timestamp)
        self.closed = True

    def fin(self, from_client: bool, timestamp: float | None = None) -> None:
        """Record one side's half-close (its FIN, acknowledged); the session ends once both sent one."""
        if self.closed or from_client in self._fins:
            return
        self._segment(from_client, _TCP_FIN | _TCP_ACK, b"", timestamp)
        self._seq[from_client] += 1
        self._segment(not from_client, _TCP_ACK, b"", timestamp)
        self._fins.add(from_client)
        self.closed = len(self._fins) == 2

    def reset(self, from_client: bool = True, timestamp: float | None = None) -> None:
        """Record an abortive close (RST), as when a peer dies."""
        if not self.closed:
            self._segment(from_client, _TCP_RST | _TCP_ACK, b"", timestamp)
            self.closed = True

    def _segment(
        self,
        from_client: bool,
        flags: int,
        payload: bytes,
        timestamp: float | None,
        comment: str | None = None,
    ) -> None:
        src_ip, src_port = self._ends[from_client]
        dst_ip, dst_port = self._ends[not from_client]
        ack = self._seq[not from_client] if flags & _TCP_ACK else 0
        ip_id = self._ip_id[from_client]
        self._ip_id[from_client] = (ip_id + 1) & 0xFFFF
        self.writer.tcp_segment(
            (src_ip, src_port),
            (dst_ip, dst_port),
            self._seq[from_client],
            ack,
            flags,
            payload,
            ip_id,
            timestamp,
            comment,
        )


def tcp_frame(
    src: tuple[bytes, int],
    dst: tuple[bytes, int],
    seq: int,
    ack: int,
    flags: int,
    payload: bytes,
    ip_id: int = 1,
) -> bytes:
    """One Ethernet/IPv4 or IPv6/TCP packet (packed addresses, 4 or 16 bytes) with correct checksums."""
    (src_ip, src_port), (dst_ip, dst_port) = src, dst
    tcp = struct.pack("!HHIIBBHHH", src_port, dst_port, seq, ack, 5 << 4, flags, 65535, 0, 0)
    length = len(tcp) + len(payload)
    v6 = len(src_ip) == 16
    pseudo = src_ip + dst_ip + (struct.pack("!IxxxB", length, 6) if v6 else struct.pack("!BBH", 0, 6, length))
    checksum = _checksum(pseudo + tcp + payload)
    tcp = tcp[:16] + struct.pack("!H", checksum) + tcp[18:]
    if v6:
        ip = struct.pack("!IHBB16s16s", 0x6000_0000, length, 6, 64, src_ip, dst_ip)
        return _mac(dst_ip) + _mac(src_ip) + b"\x86\xdd" + ip + tcp + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + length, ip_id, 0x4000, 64, 6, 0, src_ip, dst_ip)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return _mac(dst_ip) + _mac(src_ip) + b"\x08\x00" + ip + tcp + payload
