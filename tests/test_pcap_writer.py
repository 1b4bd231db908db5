"""The synthesised packets' checksums: what tshark and scapy would check."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto.pcap_writer import _checksum


def internet_checksum(data: bytes) -> int:
    """RFC 1071 as written: 16-bit big-endian words summed with end-around carry, complemented."""
    if len(data) % 2:
        data += b"\x00"
    total = 0
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@given(st.binary(max_size=3000) | st.lists(st.sampled_from([b"\x00", b"\xff"]), max_size=64).map(b"".join))
def test_checksum_is_rfc_1071s(data: bytes) -> None:
    assert _checksum(data) == internet_checksum(data)


def test_checksum_of_known_header() -> None:
    # RFC 1071's worked example bytes 00 01 f2 03 f4 f5 f6 f7: the sum is 0xddf2, its complement 0x220d.
    assert _checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0x220D
