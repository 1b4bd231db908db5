"""Captures cut short, as a recorder killed mid-write leaves them: every packet before the cut
is read, the cut is a note naming where, and the exit code says a problem was found (1, not
the 2 of unusable input). For every protocol's sample, classic pcap and pcapng alike."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from support import Server, packet_spans, run_cli

from wallaroo_proto.capture.dissector import dissect

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAMPLES = sorted(p.name for p in CAPTURES.glob("*.pcap*"))


def cut_in_last_data_packet(data: bytes) -> tuple[bytes, int]:
    """The capture cut in the middle of its last packet that carries a TCP payload; its number."""
    spans = packet_spans(data)
    ethernet_ip_tcp = 14 + 20 + 20 + (16 if data[:4] != b"\x0a\x0d\x0d\x0a" else 28)
    number, (start, end) = max((i, s) for i, s in enumerate(spans, 1) if s[1] - s[0] > ethernet_ip_tcp + 4)
    return data[: (start + end) // 2], number


def frames(records: list[dict]) -> list[tuple]:
    """Each record's frame: where it is and what it is (a gap's notes may differ at a cut)."""
    return sorted((r["conn_index"], r["direction"], r["offset"], r["type"], r.get("length")) for r in records)


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_cut_capture_keeps_every_packet_before_the_cut(tmp_path, sample):
    data = (CAPTURES / sample).read_bytes()
    cut, number = cut_in_last_data_packet(data)
    path = tmp_path / sample
    path.write_bytes(cut)

    result = run_cli("dissect", "--format", "jsonl", str(path))
    assert result.returncode == 1, result.stderr
    assert f"packet {number}" in result.stderr and "cut short" in result.stderr
    assert "Traceback" not in result.stderr
    got = [json.loads(line) for line in result.stdout.splitlines()]
    full, _ = dissect(io.BytesIO(data))
    before = [r for r in full if r["packet"] < number]
    assert before, "the sample has frames before its last data packet"
    # Every frame completed before the cut is there, as in the whole capture.
    assert frames([r for r in got if r["packet"] < number]) == frames(before)
    assert all(r["packet"] < number for r in got)

    summary = run_cli("dissect", "--summary", str(path))
    assert summary.returncode == 1 and "cut short" in summary.stderr


def test_damage_inside_a_capture_is_still_unusable_input(tmp_path):
    data = bytearray((CAPTURES / "dcp-stream.pcap").read_bytes())
    start, _ = packet_spans(bytes(data))[3]
    data[start + 8 : start + 12] = (0x7FFF_FFFF).to_bytes(4, "little")  # a record claiming 2 GiB
    path = tmp_path / "damaged.pcap"
    path.write_bytes(bytes(data))
    result = run_cli("dissect", str(path))
    assert result.returncode == 2 and "cut short" not in result.stderr


def test_a_cut_inside_a_record_header_is_a_cut(tmp_path):
    data = (CAPTURES / "tremor-session.pcap").read_bytes()
    start, _ = packet_spans(data)[10]
    path = tmp_path / "header-cut.pcap"
    path.write_bytes(data[: start + 7])  # 7 of the 16 bytes of packet 11's record header
    result = run_cli("dissect", "--format", "jsonl", str(path))
    assert result.returncode == 1 and "packet 11" in result.stderr and "cut short" in result.stderr


def test_report_draws_a_cut_capture_and_exits_1(tmp_path):
    cut, number = cut_in_last_data_packet((CAPTURES / "ambrosia-first-start.pcap").read_bytes())
    path = tmp_path / "cut.pcap"
    path.write_bytes(cut)
    result = run_cli("report", str(path), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 1, result.stderr
    assert f"packet {number}" in result.stderr and "cut short" in result.stderr
    assert (tmp_path / "r.html").stat().st_size > 0


PORTS = re.compile(r"receive port (\d+), send port (\d+)")


@pytest.mark.e2e
def test_a_recorder_killed_9_leaves_a_capture_that_reads_to_its_death(tmp_path):
    """mock-ic kills itself -9 right after logging record 3: its recording holds what it sent."""
    pcap = tmp_path / "ic.pcap"
    ic = Server(
        "ambrosia", "mock-ic", "--rpcs", "60", "--batch", "10", "--checkpoint-every", "2",
        "--log-dir", str(tmp_path / "log"), "--record", str(pcap), "--crash-at", "3",
    )  # fmt: skip
    with ic:
        rport, sport = PORTS.search(ic.lines[-1]).groups()
        lb = run_cli("ambrosia", "mock-lb", "--receive-port", rport, "--send-port", sport, timeout=120)
        assert ic.stop(sig=None, timeout=120)[0] == -9, lb.stderr
    result = run_cli("dissect", "--format", "jsonl", str(pcap))
    assert result.returncode in (0, 1), result.stderr  # whole packets, or a cut note: never unusable
    types = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert types.count("TakeBecomingPrimaryCheckpoint") == 1 and "RPCBatch" in types or "RPC" in types, types
