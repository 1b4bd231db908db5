"""Tremor dissect over captures our mocks recorded: the upgrade, frames, messages; checked against tshark."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.capture.dissector import dissect

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SESSION = CAPTURES / "tremor-session.pcap"
FRAMING = CAPTURES / "tremor-framing.pcap"


def _frames(path: Path) -> list[dict]:
    records, _ = dissect(path)
    return [r for r in records if r["protocol"] == "tremor"]


def test_session_capture_messages_and_the_error_close():
    records, d = dissect(SESSION)
    summaries = d.summaries()
    assert [s["protocol"] for s in summaries] == ["tremor", "tremor"]
    first, second = summaries
    assert first["violations"] == 0 and first["state"] == "closed" and first["http_status"] == 101
    assert {s["alias"]: s["end"] for s in first["streams"]} == {"echo": "disconnected", "ps": "disconnected"}
    assert first["types"]["pubsub:data"] == 3 and first["types"]["echo"] == 24
    assert second["error_close"] == "0.207: Protocol session not connected error"
    bad = [r for r in records if r["verdict"] == "violation"]
    assert [(r["type"], r["status_code"], r["sender"]) for r in bad] == [("stream", "0.207", "client")]


def test_framing_capture_lengths_fragments_control_frames_and_binary():
    frames = _frames(FRAMING)
    by_len = {r["ws_payload_len"]: r for r in frames if r.get("ws_payload_len")}
    big = [r for r in frames if r.get("ws_length_bits") == 64]
    assert len(big) == 2 and all(r["ws_payload_len"] == len('{"echo":""}') + 70_000 for r in big)
    assert any(r.get("ws_length_bits") == 16 for r in frames)
    kinds = [r["type"] for r in frames]
    i = kinds.index("TEXT")  # the first fragment, then a ping, then the rest
    assert kinds[i : i + 4] == ["TEXT", "PING", "CONTINUATION", "echo"]
    assert frames[i + 3]["message_json"].startswith('{"echo":{"fragmented"')
    assert frames[i + 3]["ws_fin"] and not frames[i]["ws_fin"] and frames[i]["ws_masked"]
    binary = [r for r in frames if r["type"] == "BINARY"]
    assert binary[0]["verdict"] == "violation" and "RFC 0019" in binary[0]["violations"][0]
    assert [r["ws_close_code"] for r in frames if r["type"] == "CLOSE"][-2:] == [1003, 1003]
    assert by_len


def _tshark_frames(path: Path, port: int) -> list[tuple]:
    out = subprocess.run(
        [
            "tshark",
            "-r",
            str(path),
            "-d",
            f"tcp.port=={port},http",
            "-Y",
            "websocket",
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "websocket.fin",
            "-e",
            "websocket.opcode",
            "-e",
            "websocket.mask",
            "-e",
            "websocket.payload_length",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        number, fins, ops, masks, lengths = line.split("\t")
        for fin, op, mask, length in zip(
            fins.split(","), ops.split(","), masks.split(","), lengths.split(","), strict=True
        ):
            rows.append((int(number), fin in ("1", "True"), int(op), mask in ("1", "True"), int(length)))
    return rows


@pytest.mark.parametrize("capture", [SESSION, FRAMING], ids=lambda p: p.name)
def test_websocket_layer_agrees_with_tshark(capture):
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    frames = [r for r in _frames(capture) if r.get("ws_payload_len") is not None]
    ports = {r["responder_port"] for r in frames}
    theirs = []
    for port in sorted(ports):
        theirs += _tshark_frames(capture, port)
    ours = [
        (
            r["packet"],
            r["ws_fin"],
            r["ws_opcode"],
            r["ws_masked"],
            {16: 126, 64: 127}.get(r["ws_length_bits"], r["ws_payload_len"]),  # the header's 7-bit field
        )
        for r in frames
    ]
    assert len(ours) > 10
    assert sorted(set(ours)) == sorted(set(theirs))
    assert len(ours) == len(theirs)
    extended = [r["ws_payload_len"] for r in frames if r["ws_length_bits"] != 7]
    assert sorted(extended) == sorted(_tshark_extended(capture, ports))


def _tshark_extended(path: Path, ports: set[int]) -> list[int]:
    """tshark's 16- and 64-bit payload lengths (its payload_length field is the 7-bit one)."""
    values = []
    for port in sorted(ports):
        out = subprocess.run(
            [
                "tshark",
                "-r",
                str(path),
                "-d",
                f"tcp.port=={port},http",
                "-Y",
                "websocket",
                "-T",
                "fields",
                "-e",
                "websocket.payload_length_ext_16",
                "-e",
                "websocket.payload_length_ext_64",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        values += [int(v) for v in out.replace("\t", ",").replace("\n", ",").split(",") if v.strip()]
    return values


def test_dissect_cli_summary_and_jsonl():
    result = run_cli("dissect", str(SESSION), "--protocol", "tremor", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows[0]["type"] == "UPGRADE_REQUEST" and rows[0]["http_target"] == "/"
    result = run_cli("dissect", str(SESSION), "--summary")
    assert "streams" in result.stdout and "0.207" in result.stdout


@pytest.mark.e2e
def test_spark_replay_builds_the_tremor_tables(replayed_everything):
    tables = replayed_everything.ok().tables
    sessions = {(r["capture"], r["conn_index"]): r for r in tables["tremor_sessions"]}
    for path in (SESSION, FRAMING):
        records, d = dissect(path)
        for s in d.summaries():
            row = sessions[(str(path), s["conn_index"])]
            assert (row["client_messages"], row["server_messages"]) == (
                s["client_messages"],
                s["server_messages"],
            )
            assert row["violations"] == s["violations"] and row["http_status"] == s["http_status"]
        messages = [r for r in tables["tremor_messages"] if r["capture"] == str(path)]
        assert len(messages) == sum(1 for r in records if r.get("message_json"))
    assert sessions[(str(SESSION), 2)]["error_close"] == (
        '{"tremor":{"close":"0.207: Protocol session not connected error"}}'
    )
    streams = {
        (r["conn_index"], r["alias"]): r for r in tables["tremor_streams"] if r["capture"] == str(SESSION)
    }
    assert streams[(1, "echo")]["protocol"] == "echo" and streams[(1, "echo")]["client_messages"] == 12
    assert streams[(1, "ps")]["disconnected"] == 1
    reasons = [r["reason"] for r in tables["tremor_violations"]]
    assert any("RFC 0019" in r for r in reasons) and "no stream 'badger' is connected" in reasons
    tremor = {str(SESSION), str(FRAMING)}  # the common views hold the Tremor rows too
    common = {(r["capture"], r["conn_index"]): r for r in tables["connections"] if r["capture"] in tremor}
    assert set(common) == set(sessions) and {r["protocol"] for r in common.values()} == {"tremor"}
    assert all(common[k]["violations"] == row["violations"] for k, row in sessions.items())


def _without_packet(source: Path, target: Path, drop: int) -> None:
    """A copy of a classic pcap without packet ``drop`` (1-based), as a capture that missed it."""
    data = source.read_bytes()
    out = bytearray(data[:24])
    pos, number = 24, 0
    while pos < len(data):
        caplen = int.from_bytes(data[pos + 8 : pos + 12], "little")
        number += 1
        if number != drop:
            out += data[pos : pos + 16 + caplen]
        pos += 16 + caplen
    target.write_bytes(bytes(out))


def test_a_lost_segment_is_reported_and_reading_resyncs(tmp_path):
    echoes = [r for r in _frames(SESSION) if r["type"] == "echo" and r["sender"] == "client"]
    lost = echoes[4]
    lossy = tmp_path / "lossy.pcap"
    _without_packet(SESSION, lossy, lost["packet"])
    records, d = dissect(lossy)
    first = d.summaries()[0]
    assert any(
        f"{lost['length']} bytes missing at stream offset {lost['offset']}" in n
        for n in first["capture_notes"]
    )
    assert first["violations"] == 0  # answers to what was lost are not held against the node
    _, whole = dissect(SESSION)
    assert first["state"] == "closed" and first["messages"] == whole.summaries()[0]["messages"] - 1
    later = [r for r in records if r["conn_index"] == 1 and r["packet"] > lost["packet"]]
    assert {"disconnect-ack", "close-ack"} <= {r["type"] for r in later}


def test_a_client_frame_before_the_101_is_a_violation_of_rfc_6455_4_1(tmp_path):
    """The client sends its first message in the same packet as the upgrade request, before the
    server's 101: that frame breaks RFC 6455 4.1 (as mock-node reports it); the next does not."""
    from test_capture import A4, B4, T, ether, ipv4, pcap_file, tcp_header

    from wallaroo_proto.capture.pcap import TCP_ACK, TCP_FIN, TCP_PSH, TCP_SYN

    upgrade = (
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )

    def masked(text: bytes) -> bytes:  # a final text frame, masked with the key 0: the payload as it is
        return b"\x81" + bytes([0x80 | len(text)]) + b"\x00\x00\x00\x00" + text

    def plain(text: bytes) -> bytes:
        return b"\x81" + bytes([len(text)]) + text

    accept = (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"  # RFC 6455 1.3's example
    )
    first = upgrade + masked(b'{"tremor":{"connect":{"protocol":"echo"}}}')
    answer = accept + plain(b'{"tremor":{"connect-ack":{"protocol":"echo","alias":"echo"}}}')
    second = masked(b'{"echo":"beep"}')
    data = TCP_PSH | TCP_ACK
    segs = [
        (True, 99, TCP_SYN, b""),
        (False, 499, TCP_SYN | TCP_ACK, b""),
        (True, 100, TCP_ACK, b""),
        (True, 100, data, first),
        (False, 500, data, answer),
        (True, 100 + len(first), data, second),
        (True, 100 + len(first) + len(second), TCP_FIN | TCP_ACK, b""),
        (False, 500 + len(answer), TCP_FIN | TCP_ACK, b""),
    ]
    packets = []
    for i, (client, seq, flags, payload) in enumerate(segs):
        sport, dport, src, dst = (40000, 9899, A4, B4) if client else (9899, 40000, B4, A4)
        packets.append((T + i * 1000, ether(ipv4(src, dst, tcp_header(sport, dport, seq, flags, payload)))))
    path = tmp_path / "early.pcap"
    path.write_bytes(pcap_file(packets))
    records, _ = dissect(path)
    judged = [(r["packet"], r["type"], r.get("violations", [])) for r in records]
    rule = (
        "sent before the server's 101 (RFC 6455 4.1: the client must wait for the handshake's answer "
        "before it sends)"
    )
    assert judged == [
        (4, "UPGRADE_REQUEST", []),
        (4, "connect", [rule]),
        (5, "UPGRADE_RESPONSE", []),
        (5, "connect-ack", []),
        (6, "echo", []),
    ]
