"""dissect and spark-replay read DCP: captures recorded by the mocks, hand-built ones, and tshark's view."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.capture.pcap import read_segments
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.codec import FOREVER, StreamReq

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAMPLES = ("dcp-stream.pcap", "dcp-rollback.pcap")


def server_port(path: Path) -> int:
    """The producer's port: where the capture's first SYN goes."""
    return next(iter(read_segments(path)))[2][3]


def test_a_recorded_stream_is_summarised():
    path = CAPTURES / "dcp-stream.pcap"
    records, dissector = dissect(path, ports=[server_port(path)])
    (s,) = dissector.summaries()
    assert (
        s["protocol"] == "dcp"
        and s["name"] == "wallaroo-proto-mock-consumer"
        and s["consumer"] == "initiator"
    )
    assert s["violations"] == 0 and s["noops"] >= 1 and s["flow_control_stalls"] >= 1
    assert s["controls"]["enable_stream_id"] == "true" and s["buffer_size"] == 1500
    assert sorted(st["vbucket"] for st in s["streams"]) == [0, 1]
    for st in s["streams"]:
        assert st["last_seqno"] == 40 and st["snapshots"] == st["snapshots_complete"] == 5
    items = [r for r in records if r["type"] in ("DCP_MUTATION", "DCP_DELETION", "DCP_EXPIRATION")]
    assert items and all(r["dcp_stream_id"] == r["vbucket"] + 1 and r["dcp_magic"] == 0x08 for r in items)
    assert {r["sender"] for r in items} == {"producer"}
    assert sum(1 for r in records if r.get("dcp_event") == "snapshot complete") == 10
    noops = [r for r in records if r["type"] in ("DCP_NOOP", "DCP_NOOP_RESPONSE")]
    assert [r["opaque"] for r in noops[::2]] == [r["opaque"] for r in noops[1::2]]


def test_a_recorded_rollback_is_summarised():
    path = CAPTURES / "dcp-rollback.pcap"
    records, dissector = dissect(path, ports=[server_port(path)])
    (s,) = dissector.summaries()
    assert s["violations"] == 0
    assert s["rollbacks"] == [{"vbucket": 0, "seqno": 20}, {"vbucket": 1, "seqno": 20}]
    assert Counter(st["end"] for st in s["streams"]) == {"too_slow": 2, "ok": 2}
    statuses = Counter(r.get("status") for r in records if r["type"] == "DCP_STREAM_REQ_RESPONSE")
    assert statuses == {"ROLLBACK": 2, "NOT_MY_VBUCKET": 1, "SUCCESS": 4}


def _session(path: Path, port: int, producer_wires: list[bytes]) -> None:
    """A consumer opening a stream on vbucket 3 (opaque 7), then the producer's packets."""
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 50000), ("127.0.0.1", port), timestamp=1.0)
        s.send(True, codec.open_request("hand", opaque=1), 1.001)
        s.send(False, codec.response(codec.OPEN, opaque=1), 1.002)
        s.send(True, codec.control_request("connection_buffer_size", "100", opaque=2), 1.003)
        s.send(False, codec.response(codec.CONTROL, opaque=2), 1.004)
        s.send(True, codec.stream_req_request(3, 7, StreamReq(0, 0, FOREVER, 0, 0, 0)), 1.005)
        s.send(
            False, codec.response(codec.STREAM_REQ, opaque=7, value=codec.failover_log_value([(5, 0)])), 1.006
        )
        for n, wire in enumerate(producer_wires):
            s.send(False, wire, 1.01 + n / 1000)
        s.close(True, 1.1)


def test_violations_are_named_with_their_packet(tmp_path):
    path = tmp_path / "bad.pcap"
    _session(
        path,
        11210,
        [
            codec.snapshot_marker(3, 7, 0, 4, 1),
            codec.mutation(3, 7, 1, 1, b"a", b"x" * 40),  # 44 + 96 bytes: the buffer of 100 is full
            codec.mutation(3, 7, 5, 1, b"b", b""),  # over the buffer, and outside the snapshot
        ],
    )
    records, dissector = dissect(path)  # port 11210: DCP without looking
    bad = [r for r in records if r["verdict"] != "accepted"]
    assert len(bad) == 1 and bad[0]["packet"] == 12 and bad[0]["seqno"] == 5
    (reason,) = bad[0]["violations"]
    assert "140 bytes unacknowledged of a 100-byte buffer" in reason and "outside the snapshot 0..4" in reason
    assert dissector.summaries()[0]["violations"] == 1


def test_packets_around_bad_headers_in_one_segment_are_all_read(tmp_path):
    path = tmp_path / "torn.pcap"
    junk = b"\x00" * 30  # magic 0x00 is no header; a resync finds the next packet
    one_segment = b"".join(
        [
            codec.snapshot_marker(3, 7, 0, 3, 1),
            codec.mutation(3, 7, 1, 1, b"a", b"x"),
            junk,
            codec.mutation(3, 7, 2, 1, b"b", b"y"),
            junk,
            codec.deletion(3, 7, 3, 1, b"c"),
        ]
    )
    _session(path, 11210, [one_segment])
    records, _ = dissect(path)
    tail = [
        (r["type"], r.get("dcp_key"), r["offset"]) for r in records if r["packet"] == records[-1]["packet"]
    ]
    # The producer sent 88 bytes before (two 24-byte responses, the stream's with a 16-byte failover
    # log); then wire sizes from the header, extras, key and value: a marker 24 + 20, a mutation
    # 24 + 31 + 1 + 1, the junk 30.
    start = 88
    first_junk = start + 44 + 57
    second_junk = first_junk + 30 + 57
    assert tail == [
        ("DCP_SNAPSHOT_MARKER", None, start),
        ("DCP_MUTATION", "a", start + 44),
        ("INVALID", None, first_junk),
        ("DCP_MUTATION", "b", first_junk + 30),
        ("INVALID", None, second_junk),
        ("DCP_DELETION", "c", second_junk + 30),
    ]


def test_detected_by_its_first_bytes_on_any_port(tmp_path):
    path = tmp_path / "port-9000.pcap"
    _session(path, 9000, [codec.snapshot_marker(3, 7, 0, 1, 1), codec.deletion(3, 7, 1, 1, b"gone")])
    records, _ = dissect(path)  # 9000 is nobody's port: its first bytes tell
    assert records == dissect(path, ports=[9000])[0]
    assert {r["protocol"] for r in records} == {"dcp"} and {r["verdict"] for r in records} == {"accepted"}
    assert [r["type"] for r in records][-2:] == ["DCP_SNAPSHOT_MARKER", "DCP_DELETION"]
    assert records[-1]["dcp_event"] == "snapshot complete" and records[-1]["dcp_key"] == "gone"


def test_error_maps_and_bucket_configs_are_read_with_their_versions(tmp_path):
    path = tmp_path / "maps.pcap"
    # Small answers written by hand in the server's shapes: an error map (version, revision, errors
    # by lower-case hex status) and a bucket config (rev, nodeLocator, ...), both with datatype JSON.
    error_map = b'{"version":2,"revision":3,"errors":{"7":{"name":"NOT_MY_VBUCKET","attrs":[]}}}'
    config = b'{"rev":%d,"revEpoch":1,"name":"default","nodeLocator":"vbucket"}'
    json_dt = codec.DATATYPE_JSON
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 50000), ("127.0.0.1", 9000), timestamp=1.0)
        s.send(True, codec.request(codec.GET_ERROR_MAP, opaque=1, value=b"\x00\x02"), 1.001)
        s.send(False, codec.response(codec.GET_ERROR_MAP, opaque=1, value=error_map, datatype=json_dt), 1.002)
        s.send(True, codec.request(codec.GET_CLUSTER_CONFIG, opaque=2), 1.003)
        s.send(
            False,
            codec.response(codec.GET_CLUSTER_CONFIG, opaque=2, value=config % 7, datatype=json_dt),
            1.004,
        )
        s.send(True, codec.open_request("hand", opaque=3), 1.005)
        s.send(False, codec.response(codec.OPEN, opaque=3), 1.006)
        s.send(True, codec.stream_req_request(3, 4, StreamReq(0, 0, FOREVER, 0, 0, 0)), 1.007)
        nmvb = codec.response(
            codec.STREAM_REQ, codec.NOT_MY_VBUCKET, opaque=4, value=config % 8, datatype=json_dt
        )
        s.send(False, nmvb, 1.008)
        s.send(True, codec.request(codec.GET_ERROR_MAP, opaque=5, value=b"\x02"), 1.009)  # no 2-byte version
        s.close(True, 1.1)
    records, _ = dissect(path)  # port 9000: found by its first bytes, a GET_ERROR_MAP
    got = [
        (
            r["type"],
            r["verdict"],
            r.get("error_map_version"),
            r.get("error_map_revision"),
            r.get("config_rev"),
        )
        for r in records
    ]
    assert got == [
        ("GET_ERROR_MAP", "accepted", 2, None, None),
        ("GET_ERROR_MAP_RESPONSE", "accepted", 2, 3, None),
        ("GET_CLUSTER_CONFIG", "accepted", None, None, None),
        ("GET_CLUSTER_CONFIG_RESPONSE", "accepted", None, None, 7),
        ("DCP_OPEN", "accepted", None, None, None),
        ("DCP_OPEN_RESPONSE", "accepted", None, None, None),
        ("DCP_STREAM_REQ", "accepted", None, None, None),
        ("DCP_STREAM_REQ_RESPONSE", "accepted", None, None, 8),
        ("GET_ERROR_MAP", "malformed", None, None, None),
    ]
    assert "2-byte version" in records[-1]["violations"][0]


def tshark_view(path: Path, port: int) -> dict[int, tuple[list, list, list, list]]:
    """Per packet: opcodes, opaques, request vbuckets and keys as tshark's couchbase dissector reads them."""
    fields = ("frame.number", "couchbase.opcode", "couchbase.opaque", "couchbase.vbucket", "couchbase.key")
    command = ["tshark", "-r", str(path), "-d", f"tcp.port=={port},couchbase", "-T", "fields"]
    for f in fields:
        command += ["-e", f]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    view = {}
    for line in out.splitlines():
        number, opcodes, opaques, vbuckets, keys = (line.split("\t") + [""] * 5)[:5]
        if not opcodes:
            continue
        split = lambda text: text.split(",") if text else []  # noqa: E731
        view[int(number)] = (
            [int(x, 16) for x in split(opcodes)],
            # tshark shows the opaque's four bytes as a little-endian number
            [int.from_bytes(int(x, 16).to_bytes(4, "little"), "big") for x in split(opaques)],
            [int(x) for x in split(vbuckets)],
            split(keys),
        )
    return view


@pytest.mark.parametrize("name", SAMPLES)
def test_tshark_sees_the_same_opcodes_opaques_vbuckets_and_keys(name):
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: no independent decoder to compare with")
    path = CAPTURES / name
    port = server_port(path)
    theirs = tshark_view(path, port)
    records, _ = dissect(path, ports=[port])
    ours: dict[int, tuple[list, list, list, list]] = {}
    for r in records:
        opcodes, opaques, vbuckets, keys = ours.setdefault(r["packet"], ([], [], [], []))
        opcodes.append(r["dcp_opcode"])
        opaques.append(r["opaque"])
        if r["dcp_magic"] in (codec.REQ, codec.ALT_REQ):
            vbuckets.append(r["vbucket"])
        if r.get("dcp_key"):
            keys.append(r["dcp_key"])
    assert len(records) > 80 and theirs
    assert ours == theirs


@pytest.mark.e2e
def test_spark_replay_builds_the_dcp_tables(replayed_everything):
    stream, rollback = (CAPTURES / n for n in SAMPLES)  # read on their producers' ports
    rows = replayed_everything.ok().rows
    vbs = {(r["capture"], r["vbucket"]): r for r in rows if r["table"] == "dcp_vbuckets"}
    assert vbs[(str(stream), 0)]["last_seqno"] == 40 and vbs[(str(stream), 0)]["snapshots_complete"] == 5
    assert vbs[(str(rollback), 0)]["rollbacks"] == 1 and "too_slow" in vbs[(str(rollback), 0)]["stream_ends"]
    flow = [r for r in rows if r["table"] == "dcp_flow_control"]
    assert {r["buffer_size"] for r in flow} == {"1500", "600"} and all(r["stalls"] > 0 for r in flow)
    assert not [r for r in rows if r["table"] == "dcp_violations"]


def test_fields_column_takes_spark_decimals():
    """spark-replay --report hands describe() Spark rows: a u64 column arrives as a Decimal."""
    from decimal import Decimal

    from wallaroo_proto.protocols.dcp.plugin import PLUGIN

    row = {"opaque": 7, "vbucket": 3, "start_seqno": Decimal(0), "vb_uuid": Decimal(2**64 - 2)}
    text = PLUGIN.describe(row)
    assert "uuid=0xfffffffffffffffe" in text and "start=0" in text, text


# What fuzz sent our mock-producer, and its answers, as hand-written wire bytes (header fields:
# magic, opcode, key length, extras length, datatype, vbucket or status, body length, opaque, cas).
H = bytes.fromhex
#: SELECT_BUCKET "default" (opaque 5) with its key length set to 0x8000: past its 7-byte body.
SELECT_KEY_PAST_BODY = H("80 89 8000 00 00 0000 00000007 00000005 0000000000000000 64656661756c74")
#: The producer's EINVAL (0x0004) to it.
SELECT_EINVAL = H("81 89 0000 00 00 0004 00000000 00000005 0000000000000000")
#: BUFFER_ACK of 100 bytes (opaque 0), well formed, and with key length 0x0100 (past its body).
BUFFER_ACK = H("80 5d 0000 04 00 0000 00000004 00000000 0000000000000000 00000064")
BUFFER_ACK_KEY_PAST_BODY = H("80 5d 0100 04 00 0000 00000004 00000000 0000000000000000 00000064")
#: The producer's EINVAL to a BUFFER_ACK; and its SUCCESS to SELECT_BUCKET opaque 5.
BUFFER_ACK_EINVAL = H("81 5d 0000 00 00 0004 00000000 00000000 0000000000000000")
SELECT_SUCCESS = H("81 89 0000 00 00 0000 00000000 00000005 0000000000000000")
#: A request of opcode 0x88 (none DCP knows), opaque 9, and the producer's UNKNOWN_COMMAND (0x81).
UNKNOWN = H("80 88 0000 00 00 0000 00000000 00000009 0000000000000000")
UNKNOWN_ANSWER = H("81 88 0000 00 00 0081 00000000 00000009 0000000000000000")
#: A NOOP reply (opaque 0) with no NOOP sent; and HELLO "fuzz" (opaque 1).
NOOP_REPLY = H("81 5c 0000 00 00 0000 00000000 00000000 0000000000000000")
HELLO = H("80 1f 0004 00 00 0000 00000004 00000001 0000000000000000 66757a7a")


def _conversation(path: Path, wires: list[tuple[bool, bytes]]) -> list[dict]:
    """The records of a connection to 11210 carrying ``wires`` (True: from the client)."""
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 50000), ("127.0.0.1", 11210), timestamp=1.0)
        for n, (client, wire) in enumerate(wires):
            s.send(client, wire, 1.001 + n / 1000)
        s.close(True, 1.1)
    return dissect(path)[0]


def _judged(records: list[dict]) -> list[tuple[str, str, str]]:
    return [(r["sender"], r["type"], r["verdict"]) for r in records]


def test_an_error_answer_to_a_request_malformed_past_its_body_answers_that_request(tmp_path):
    records = _conversation(tmp_path / "m.pcap", [(True, SELECT_KEY_PAST_BODY), (False, SELECT_EINVAL)])
    assert _judged(records) == [
        ("consumer", "INVALID", "malformed"),
        ("producer", "SELECT_BUCKET_RESPONSE", "accepted"),
    ]
    again = _conversation(tmp_path / "s.pcap", [(True, SELECT_KEY_PAST_BODY), (False, SELECT_SUCCESS)])
    assert again[1]["verdict"] == "violation"
    assert again[1]["violations"] == ["SELECT_BUCKET SUCCESS to a malformed request"]


def test_a_buffer_ack_is_answered_only_when_refused(tmp_path):
    malformed = [(True, BUFFER_ACK_KEY_PAST_BODY), (False, BUFFER_ACK_EINVAL)]
    before_open = [(True, BUFFER_ACK), (False, BUFFER_ACK_EINVAL)]
    for name, wires in (("m", malformed), ("b", before_open)):
        records = _conversation(tmp_path / f"{name}.pcap", wires)
        assert records[1]["type"] == "DCP_BUFFER_ACKNOWLEDGEMENT_RESPONSE"
        assert records[1]["verdict"] == "accepted", records[1]
    # a refusal with no BUFFER_ACK to refuse (here after a SELECT_BUCKET): answers no request
    records = _conversation(tmp_path / "u.pcap", [(True, HELLO), (False, BUFFER_ACK_EINVAL)])
    assert records[1]["violations"] == ["response opaque 0x00000000 answers no request"]


def test_an_unknown_command_s_answer_answers_it(tmp_path):
    records = _conversation(tmp_path / "u.pcap", [(True, UNKNOWN), (False, UNKNOWN_ANSWER)])
    assert _judged(records) == [
        ("consumer", "UNKNOWN(0x88)", "malformed"),
        ("producer", "UNKNOWN(0x88)_RESPONSE", "accepted"),
    ]


def test_a_client_whose_first_packet_is_a_noop_reply_is_the_consumer(tmp_path):
    records = _conversation(tmp_path / "n.pcap", [(True, NOOP_REPLY), (True, HELLO)])
    assert _judged(records) == [
        ("consumer", "DCP_NOOP_RESPONSE", "violation"),
        ("consumer", "HELLO", "accepted"),
    ]
    assert records[0]["violations"] == ["NOOP reply with no NOOP outstanding"]
