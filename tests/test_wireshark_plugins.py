"""The generated Kinesis and AMBROSIA Lua plugins in real tshark find what `dissect` finds.

CI installs tshark, so a missing tshark fails these tests (with the reason) rather than skipping them.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.wireshark_lua import generate, tshark_command

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
#: Per protocol: its sample captures and the fields compared with dissect's records (tshark name, record key).
CASES = {
    "kinesis": (
        ["kinesis-session.pcap"],
        [("type", "type"), ("shard_id", "shard_id"), ("sequence_number", "sequence_number"),
         ("response_for", "response_for"), ("record_count", "record_count")],
    ),
    "ambrosia": (
        ["ambrosia-first-start.pcap", "ambrosia-recovery.pcap", "ambrosia-faults.pcap"],
        [("type", "type"), ("seq_id", "seq_id"), ("method_id", "method_id"), ("rpc_type", "rpc_type"),
         ("checkpoint_length", "checkpoint_length"), ("rpc_count", "rpc_count"),
         ("check_bytes", "check_bytes")],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, str]:
    assert shutil.which("tshark"), "tshark is not installed (CI installs it: apt-get install -y tshark)"
    folder = tmp_path_factory.mktemp("lua")
    out = {}
    for protocol in CASES:
        path = folder / f"{protocol}.lua"
        proc = run_cli("wireshark-dissector", "--protocol", protocol, "-o", str(path))
        assert proc.returncode == 0, proc.stderr
        assert path.read_text() == generate(protocol)
        out[protocol] = str(path)
    return out


def tshark_rows(protocol: str, plugin: str, capture: Path, keys: list[str]) -> tuple[dict, list[str]]:
    """Per packet, each field's values in order; and every expert message tshark added."""
    fields = ["frame.number", *(f"{protocol}.{k}" for k in keys), "_ws.expert.message"]
    proc = subprocess.run(
        tshark_command(protocol, plugin, str(capture), *fields), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Lua: Error" not in proc.stderr, proc.stderr
    rows, experts = {}, []
    for line in proc.stdout.splitlines():
        number, *values = line.split("\t")
        *values, expert = (values + [""] * len(fields))[: len(fields) - 1]
        rows[int(number)] = tuple(v.split(",") if v else [] for v in values)
        experts += [e for e in expert.split(",") if e]
    return rows, experts


def dissect_rows(capture: Path, keys: list[str]) -> dict:
    records, _ = dissect(capture)
    out: dict = defaultdict(lambda: tuple([] for _ in keys))
    for r in records:
        for values, key in zip(out[r["packet"]], keys, strict=True):
            if r.get(key) is not None:
                values.append(str(r[key]))
    return dict(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("protocol", "name"), [(p, name) for p, (names, _) in CASES.items() for name in names]
)
def test_tshark_finds_the_same_messages_and_fields(plugins, protocol, name):
    theirs_keys, our_keys = zip(*CASES[protocol][1], strict=True)
    theirs, experts = tshark_rows(protocol, plugins[protocol], CAPTURES / name, list(theirs_keys))
    ours = dissect_rows(CAPTURES / name, list(our_keys))
    assert theirs, "tshark decoded nothing"
    assert experts == []
    assert theirs == ours


def _kinesis_capture(path: Path, daemon: list[bytes], processor: list[bytes], segment_size: int) -> None:
    with PcapWriter(path) as w:
        s = w.tcp_session(
            ("10.1.0.1", 51000), ("10.1.0.2", 7300), timestamp=1_763_700_000.0, segment_size=segment_size
        )
        for i, (d, p) in enumerate(zip(daemon, processor, strict=True)):
            s.send(True, d, 1_763_700_000.0 + (2 * i + 1) / 1000)
            s.send(False, p, 1_763_700_000.0 + (2 * i + 2) / 1000)


DAEMON = [
    b'{"action":"initialize","shardId":"shardId-7","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n',
    b'{"action":"processRecords","records":[{"data":"aGk=","partitionKey":"a","sequenceNumber":"101",'
    b'"approximateArrivalTimestamp":1,"subSequenceNumber":0,"action":"record"},{"data":"aG8=","partitionKey":"b",'
    b'"sequenceNumber":"102","approximateArrivalTimestamp":2,"subSequenceNumber":0,"action":"record"}],'
    b'"millisBehindLatest":5}\n',
]
PROCESSOR = [
    b'\n{"action": "status", "responseFor": "initialize"}\n',
    b'\r\n{"action": "checkpoint", "sequenceNumber": "102", "subSequenceNumber": 0}\r\n',
]


@pytest.mark.timeout(120)
def test_kinesis_lines_cut_into_small_segments_are_reassembled(plugins, tmp_path):
    path = tmp_path / "small-segments.pcap"
    _kinesis_capture(path, DAEMON, PROCESSOR, segment_size=7)
    keys = ["type", "shard_id", "sequence_number", "record_count"]
    theirs, experts = tshark_rows("kinesis", plugins["kinesis"], path, keys)
    assert experts == []
    assert sorted(sum((v[0] for v in theirs.values()), [])) == [
        "checkpoint",
        "initialize",
        "processRecords",
        "status",
    ]
    assert theirs == dissect_rows(path, keys)


@pytest.mark.timeout(120)
def test_kinesis_line_that_is_not_json_gets_the_malformed_expert(plugins, tmp_path):
    path = tmp_path / "bad-line.pcap"
    _kinesis_capture(path, DAEMON[:1], [b"Traceback (most recent call last):\n"], segment_size=65_000)
    theirs, experts = tshark_rows("kinesis", plugins["kinesis"], path, ["type"])
    assert experts == ["not a JSON object with an action"]
    assert [types for (types,) in theirs.values()] == [["initialize"], []]


def _ambrosia_record(seq: int, body: bytes) -> bytes:
    return struct.pack("<iiQq", 0x12345678, 24 + len(body), 0, seq) + body


@pytest.mark.timeout(120)
@pytest.mark.parametrize("segment_size", [5, 25])
def test_ambrosia_records_cut_small_are_reassembled_and_a_bad_size_gets_the_malformed_expert(
    plugins, tmp_path, segment_size
):
    # IC -> LB on the send port (2001): a control record asking for a checkpoint (size 26:
    # header, message 02 02), a checkpoint record (-2) announcing 3 bytes (04 08 06), the
    # bytes "abc", then a header whose size (5) is below the 24-byte header.
    take_checkpoint = _ambrosia_record(-1, bytes([0x02, 0x02]))
    checkpoint = _ambrosia_record(-2, bytes([0x04, 0x08, 0x06])) + b"abc"
    bad = struct.pack("<iiQq", 0x12345678, 5, 0, 1)
    path = tmp_path / "ambrosia.pcap"
    with PcapWriter(path) as w:
        s = w.tcp_session(
            ("127.0.0.1", 40000), ("127.0.0.1", 2001), timestamp=1_763_700_000.0, segment_size=segment_size
        )
        s.send(False, take_checkpoint, 1_763_700_000.001)
        s.send(False, checkpoint, 1_763_700_000.002)
        s.send(False, bad, 1_763_700_000.003)
    keys = ["type", "seq_id", "checkpoint_length"]
    theirs, experts = tshark_rows("ambrosia", plugins["ambrosia"], path, keys)
    found = {n: v for n, v in theirs.items() if v[0]}
    assert [v[0] for v in found.values()] == [["TakeCheckpoint"], ["CheckpointRecord", "CheckpointBytes"]]
    assert experts == ["record size 5 is below the 24-byte header"]
    if segment_size >= 25:  # dissect needs more than a few bytes to know the socket
        ours = dissect_rows(path, keys)
        assert found == {n: v for n, v in ours.items() if v[0] != ["INVALID"]}


@pytest.mark.timeout(120)
def test_ambrosia_lb_message_with_an_overlong_varint_gets_the_malformed_expert(plugins, tmp_path):
    # LB -> IC: InitialMessage "hi" (size 3: 06 09 'h' 'i'), then a size varint of six bytes.
    path = tmp_path / "lb.pcap"
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 40001), ("127.0.0.1", 41001), timestamp=1_763_700_000.0)
        s.send(True, bytes([0x06, 0x09]) + b"hi", 1_763_700_000.001)
        s.send(True, bytes([0xFF] * 6), 1_763_700_000.002)
    theirs, experts = tshark_rows("ambrosia", plugins["ambrosia"], path, ["type"])
    assert [t for (t,) in theirs.values()] == [["InitialMessage"], []]
    assert experts == ["ZigZag varint longer than 5 bytes"]


@pytest.mark.timeout(120)
def test_kinesis_on_another_port_is_claimed_by_its_initialize_and_strings_keep_commas(plugins, tmp_path):
    lua = tmp_path / "other.lua"
    lua.write_text(generate("kinesis", ports=[9]))
    keys = ["type", "shard_id", "sequence_number", "response_for"]
    theirs, experts = tshark_rows("kinesis", str(lua), CAPTURES / "kinesis-session.pcap", keys)
    assert experts == [] and theirs == dissect_rows(CAPTURES / "kinesis-session.pcap", keys)
    # A checkpoint reply whose error holds a comma, a brace and an escaped quote.
    path = tmp_path / "error.pcap"
    reply = b'{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":null,'
    reply += b'"error":"No, {\\"x\\"} here"}\n'
    _kinesis_capture(path, [DAEMON[0], reply], [PROCESSOR[0], b"\n"], segment_size=65_000)
    proc = subprocess.run(
        [*tshark_command("kinesis", str(lua), str(path)), "-V"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert 'Checkpoint error: No, {\\"x\\"} here' in proc.stdout
    assert "Sequence number: 5\n" in proc.stdout
    assert "Subsequence number" not in proc.stdout.split("Action: checkpoint")[1]
