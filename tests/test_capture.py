"""capture.py: file formats, link types and headers, against captures built by hand here.

The builders below write pcap/pcapng and packet headers field by field from
the format documents (pcap(5), the pcapng draft, RFC 791/8200/9293, the Linux
cooked-capture and BSD loopback descriptions); they do not use the code under test.
"""

from __future__ import annotations

import io
import struct

import pytest

from wallaroo_proto.capture.pcap import TCP_ACK, TCP_PSH, TCP_SYN, CaptureError, read_segments

# --- hand builders (shared by the other dissector tests) ---------------------------------

A4, B4 = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
A6 = bytes.fromhex("20010db8000000000000000000000001")
B6 = bytes.fromhex("20010db8000000000000000000000002")


def tcp_header(sport: int, dport: int, seq: int, flags: int, payload: bytes = b"", ack: int = 0) -> bytes:
    # ports, seq, ack, data offset 5 words, flags, window, checksum 0 (unchecked), urgent
    return (
        struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack, 5 << 4, flags, 65535, 0, 0) + payload
    )


def ipv4(src: bytes, dst: bytes, l4: bytes, proto: int = 6, frag: int = 0x4000) -> bytes:
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 1, frag, 64, proto, 0, src, dst) + l4


def ipv6(src: bytes, dst: bytes, l4: bytes, next_header: int = 6) -> bytes:
    return struct.pack("!IHBB16s16s", 6 << 28, len(l4), next_header, 64, src, dst) + l4


def ether(ip: bytes, ethertype: int = 0x0800, vlans: tuple[int, ...] = ()) -> bytes:
    head = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01"
    for vid in vlans:
        head += struct.pack("!HH", 0x8100, vid)
    return head + struct.pack("!H", ethertype) + ip


def pcap_file(packets: list[tuple[int, bytes]], linktype: int = 1, nano: bool = False) -> bytes:
    """packets: (timestamp in ns, link-layer bytes)."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 262144, linktype)
    for ts, data in packets:
        frac = ts % 1_000_000_000 if nano else (ts % 1_000_000_000) // 1000
        out += struct.pack("<IIII", ts // 1_000_000_000, frac, len(data), len(data)) + data
    return out


def pcapng_file(packets: list[tuple[int, bytes]], linktype: int = 1, tsresol: int = 9) -> bytes:
    def block(kind: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        return struct.pack("<II", kind, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    options = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
    out += block(1, struct.pack("<HHI", linktype, 0, 262144) + options)
    for ts, data in packets:
        ticks = ts * 10**tsresol // 1_000_000_000
        out += block(
            6, struct.pack("<IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(data)) + data
        )
    return out


def segments(blob: bytes) -> list:
    return list(read_segments(io.BytesIO(blob)))


SEG = tcp_header(40000, 7100, 1000, TCP_PSH | TCP_ACK, b"hello")
KEY4 = (A4, 40000, B4, 7100)
T = 1_700_000_000_123_456_000


# --- link types and IP versions ---------------------------------------------------------


def test_ethernet_ipv4_segment_fields():
    [(number, ts, key, seq, flags, payload)] = segments(pcap_file([(T, ether(ipv4(A4, B4, SEG)))]))
    assert (number, ts, key, seq, flags, payload) == (1, T, KEY4, 1000, TCP_PSH | TCP_ACK, b"hello")


def test_ethernet_padding_is_not_payload():
    # A minimum-size Ethernet frame is padded to 60 bytes; the IP total length says where data ends.
    frame = ether(ipv4(A4, B4, tcp_header(40000, 7100, 5, TCP_ACK, b"x"))) + b"\x00" * 20
    [seg] = segments(pcap_file([(T, frame)]))
    assert seg[5] == b"x"


@pytest.mark.parametrize("vlans", [(100,), (100, 200)])
def test_vlan_tags(vlans):
    [seg] = segments(pcap_file([(T, ether(ipv4(A4, B4, SEG), vlans=vlans))]))
    assert seg[2] == KEY4 and seg[5] == b"hello"


def test_ipv6():
    [seg] = segments(pcap_file([(T, ether(ipv6(A6, B6, SEG), ethertype=0x86DD))]))
    assert seg[2] == (A6, 40000, B6, 7100) and seg[5] == b"hello"


def test_ipv6_extension_header_skipped():
    hop_by_hop = bytes([6, 0]) + b"\x00" * 6  # next header TCP, length 0 -> 8 bytes
    [seg] = segments(pcap_file([(T, ether(ipv6(A6, B6, hop_by_hop + SEG, next_header=0), ethertype=0x86DD))]))
    assert seg[5] == b"hello"


def test_linux_cooked_v1():
    # packet type, ARPHRD, address length, 8 address bytes, protocol
    sll = struct.pack("!HHH8sH", 0, 772, 6, b"\x00" * 8, 0x0800)
    [seg] = segments(pcap_file([(T, sll + ipv4(A4, B4, SEG))], linktype=113))
    assert seg[2] == KEY4 and seg[5] == b"hello"


def test_linux_cooked_v2():
    # protocol, reserved, interface index, ARPHRD, packet type, address length, 8 address bytes
    sll2 = struct.pack("!HHIHBB8s", 0x86DD, 0, 1, 772, 0, 6, b"\x00" * 8)
    [seg] = segments(pcap_file([(T, sll2 + ipv6(A6, B6, SEG))], linktype=276))
    assert seg[2] == (A6, 40000, B6, 7100)


@pytest.mark.parametrize("family", [struct.pack("<I", 2), struct.pack(">I", 2), struct.pack("<I", 30)])
def test_bsd_null_loopback(family):
    ip = ipv4(A4, B4, SEG) if family != struct.pack("<I", 30) else ipv6(A6, B6, SEG)
    [seg] = segments(pcap_file([(T, family + ip)], linktype=0))
    assert seg[5] == b"hello"


@pytest.mark.parametrize("linktype", [101, 228, 12])
def test_raw_ip(linktype):
    [seg] = segments(pcap_file([(T, ipv4(A4, B4, SEG))], linktype=linktype))
    assert seg[2] == KEY4


def test_non_tcp_and_fragments_skipped():
    udp = ipv4(A4, B4, b"\x00" * 8, proto=17)
    fragment = ipv4(A4, B4, SEG, frag=0x2000)  # more-fragments bit
    stats: dict = {}
    blob = pcap_file([(T, ether(udp)), (T, ether(fragment)), (T, ether(ipv4(A4, B4, SEG)))])
    got = list(read_segments(io.BytesIO(blob), stats))
    assert [g[0] for g in got] == [3]
    assert stats["packets"] == 3 and stats["tcp"] == 1 and stats["skipped"] == 2


# --- timestamps and formats -----------------------------------------------------------------


def test_pcap_nanosecond_magic():
    [seg] = segments(pcap_file([(T + 789, ether(ipv4(A4, B4, SEG)))], nano=True))
    assert seg[1] == T + 789


def test_pcapng_nanosecond_timestamps():
    [seg] = segments(pcapng_file([(T + 789, ether(ipv4(A4, B4, SEG)))], tsresol=9))
    assert seg[1] == T + 789 and seg[5] == b"hello"


def test_pcapng_microsecond_default_and_other_link_type():
    sll = struct.pack("!HHH8sH", 0, 772, 6, b"\x00" * 8, 0x0800)
    [seg] = segments(pcapng_file([(T, sll + ipv4(A4, B4, SEG))], linktype=113, tsresol=6))
    assert seg[1] == T and seg[2] == KEY4


def test_file_path_and_big_endian_pcap(tmp_path):
    data = ether(ipv4(A4, B4, SEG))
    blob = struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    blob += struct.pack(">IIII", 5, 6, len(data), len(data)) + data
    path = tmp_path / "be.pcap"
    path.write_bytes(blob)
    [seg] = list(read_segments(path))
    assert seg[1] == 5_000_006_000


# --- damage -------------------------------------------------------------------------------


def _packets(n: int) -> list[tuple[int, bytes]]:
    return [(T + i, ether(ipv4(A4, B4, tcp_header(40000, 7100, 1000 + i, TCP_ACK, b"a")))) for i in range(n)]


def test_truncated_pcap_reports_packet_and_offset_after_yielding_the_rest():
    blob = pcap_file(_packets(3))
    got = []
    with pytest.raises(CaptureError) as info:
        for seg in read_segments(io.BytesIO(blob[:-10])):
            got.append(seg)
    assert [g[0] for g in got] == [1, 2]
    record = 16 + len(_packets(1)[0][1])
    assert info.value.packet == 3 and info.value.offset == 24 + 2 * record
    assert "truncated" in str(info.value) and "packet 3" in str(info.value)


def test_truncated_record_header():
    blob = pcap_file(_packets(1))
    with pytest.raises(CaptureError) as info:
        segments(blob + b"\x01\x02\x03")
    assert info.value.packet == 2 and "record header" in str(info.value)


def test_garbage_after_packets_is_a_damaged_record():
    blob = pcap_file(_packets(2)) + b"\xff" * 40
    with pytest.raises(CaptureError) as info:
        segments(blob)
    assert info.value.packet == 3 and "damaged" in str(info.value)


def test_truncated_pcapng_block():
    blob = pcapng_file(_packets(2))
    got = []
    with pytest.raises(CaptureError) as info:
        for seg in read_segments(io.BytesIO(blob[:-7])):
            got.append(seg)
    assert len(got) == 1 and info.value.packet == 2 and info.value.offset is not None


@pytest.mark.parametrize(
    "blob, words",
    [
        (b"", "empty"),
        (b"PK\x03", "too short"),
        (b"GIF89a is not a capture", "not a pcap or pcapng"),
        (b"\xd4\xc3\xb2\xa1\x02\x00", "truncated pcap file header"),
    ],
)
def test_not_a_capture(blob, words):
    with pytest.raises(CaptureError) as info:
        segments(blob)
    assert words in str(info.value) and info.value.offset is not None


def test_unknown_link_type():
    with pytest.raises(CaptureError) as info:
        segments(pcap_file(_packets(1), linktype=147))
    assert "unknown link type 147" in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(CaptureError) as info:
        list(read_segments(tmp_path / "nope.pcap"))
    assert "cannot open" in str(info.value)


def test_syn_flags_pass_through():
    [seg] = segments(pcap_file([(T, ether(ipv4(A4, B4, tcp_header(40000, 7100, 99, TCP_SYN))))]))
    assert seg[4] == TCP_SYN and seg[5] == b""
