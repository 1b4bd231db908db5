"""dissect: the command end to end on the sample and hand-built captures, the record schema,
iter_records for Spark, and the scapy layers."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import TABLE, run_cli
from test_capture import A4, B4, T, ether, ipv4, pcap_file, pcapng_file, tcp_header
from test_reassembly import DATA, NOTIFY_1, OK_20, capture, hello, message, opening

from wallaroo_proto.capture.dissector import Dissector, dissect, iter_records
from wallaroo_proto.capture.pcap import TCP_ACK, TCP_SYN
from wallaroo_proto.protocols.schema import field_names, fields
from wallaroo_proto.records import ConnectionKey, flow_hash, to_json

pytestmark = pytest.mark.timeout(120)  # the CLI tests run the real command as a subprocess

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SOURCE = CAPTURES / "source-session.pcap"
SINK = CAPTURES / "sink-2pc.pcap"
RESTART = CAPTURES / "restart-reconnect.pcap"
LOST = CAPTURES / "lost-segment.pcap"
PCAPNG = CAPTURES / "sink-2pc-ns.pcapng"
TCPDUMP = CAPTURES / "mock-source-tcpdump.pcap"
SAMPLES = [SOURCE, SINK, RESTART, LOST, PCAPNG, TCPDUMP]


def jsonl(*args: str) -> tuple[int, list[dict], str]:
    proc = run_cli("dissect", "--format", "jsonl", *args)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


# --- the JSONL schema ----------------------------------------------------------------


def test_jsonl_records_follow_the_schema():
    code, records, _ = jsonl(str(SOURCE))
    assert code == 0
    assert [r["type"] for r in records][:6] == ["HELLO", "OK", "NOTIFY", "NOTIFY", "NOTIFY_ACK", "NOTIFY_ACK"]
    for r in records:
        assert set(r) <= set(field_names()), set(r) - set(field_names())
        for name in ("capture", "connection", "conn_index", "sender", "direction", "ts", "ts_ns", "packet"):
            assert name in r
        assert r["connection"] == "127.0.0.1:51000 > 127.0.0.1:7100"
        assert r["use"] == "source" and r["verdict"] == "accepted"
    hello_record = records[0]
    assert hello_record["version"] == "0.0.1" and hello_record["program_name"] == "sample-source"
    assert hello_record["sender"] == "connector" and hello_record["direction"] == "initiator>responder"
    assert hello_record["offset"] == 0 and hello_record["length"] == 4 + 1 + 7 + 2 + 15 + 10
    first = next(r for r in records if r["type"] == "MESSAGE")
    assert base64.b64decode(first["payload_b64"]) == b"order 1" and first["payload_len"] == 7
    assert base64.b64decode(first["key_b64"]) == b"user-1" and first["key_len"] == 6
    assert (first["stream_id"], first["message_id"]) == (11, 1)
    ack = next(r for r in records if r["type"] == "ACK")
    assert (
        ack["credits"] == 10
        and ack["acks"]
        == [
            {"stream_id": 11, "point_of_ref": 6},
            {"stream_id": 12, "point_of_ref": 102},
        ]
        and ack["sender"] == "worker"
    )
    eos = next(r for r in records if r["type"] == "EOS_MESSAGE")
    assert (eos["stream_id"], eos["message_id"]) == (12, 102)


def test_record_offsets_follow_each_direction_stream():
    records, _ = dissect(SOURCE)
    for direction in ("initiator>responder", "responder>initiator"):
        mine = [r for r in records if r["direction"] == direction]
        assert mine[0]["offset"] == 0
        for a, b in zip(mine, mine[1:], strict=False):
            assert b["offset"] == a["offset"] + a["length"]


def test_run_jsonl_writes_exactly_the_records():
    # run_jsonl writes accepted MESSAGE records as text directly; it must equal to_json(record).
    blobs = [p.read_bytes() for p in SAMPLES] + [_violating_capture()]
    for blob in blobs:
        records = list(Dissector("x").run(io.BytesIO(blob)))
        lines = list(Dissector("x").run_jsonl(io.BytesIO(blob)))
        assert records and lines == [to_json(r) for r in records]
        assert [json.loads(line) for line in lines] == records


def test_fast_message_path_gives_the_same_records_and_summaries():
    # with_raw disables the one-function MESSAGE path; everything else must be identical.
    for path in SAMPLES:
        fast, fd = dissect(path)
        slow, sd = dissect(path, with_raw=True)
        assert [{k: v for k, v in r.items() if k != "_raw"} for r in slow] == fast
        assert fd.summaries() == sd.summaries()
    segs, base = opening()
    segs.append((True, base, DATA, message(1, 5, b"a") + message(1, 5, b"again") + message(1, 9, b"b")))
    segs.append((True, base + 200, DATA, message(7, 1, b"never notified")))  # after a gap
    blob = capture(segs)
    fast, fd = dissect(io.BytesIO(blob))
    slow, sd = dissect(io.BytesIO(blob), with_raw=True)
    assert [{k: v for k, v in r.items() if k != "_raw"} for r in slow] == fast
    assert fd.summaries() == sd.summaries()
    assert [r["verdict"] for r in fast[-4:]] == ["accepted", "replayed", "accepted", "violation"]


KEYS = st.binary(max_size=6)
STREAMS = st.sampled_from([1, 1, 1, 2])  # stream 2 was never notified


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(STREAMS, st.integers(0, 12), st.binary(max_size=20), KEYS), max_size=200),
    st.lists(st.integers(1, 9000), max_size=8),
)
def test_the_message_block_path_records_what_the_frame_path_records(messages, cuts):
    """Random MESSAGEs (replayed, unnotified streams and fresh ones) cut into segments anywhere:
    rows of blocks, records from them and JSONL give what the frame-by-frame path gives."""
    segs, seq = opening()
    stream = b"".join(message(sid, mid, payload, key) for sid, mid, payload, key in messages)
    at = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut > at and at < len(stream):
            segs.append((True, seq + at, DATA, stream[at:cut]))
            at = cut
    blob = capture(segs)
    fast, fd = dissect(io.BytesIO(blob))
    slow, sd = dissect(io.BytesIO(blob), with_raw=True)
    assert [{k: v for k, v in r.items() if k != "_raw"} for r in slow] == fast
    assert [list(r) for r in fast] == [[k for k in r if k != "_raw"] for r in slow]  # key order too
    assert fd.summaries() == sd.summaries()
    assert list(Dissector("<stream>").run_jsonl(io.BytesIO(blob))) == [to_json(r) for r in fast]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(STREAMS, st.integers(0, 12), st.binary(max_size=20), KEYS), max_size=200),
    st.lists(st.integers(1, 9000), max_size=8),
)
def test_without_records_wanted_accepted_messages_are_only_counted(messages, cuts):
    """As the proxy's checker reads: no block or record for an accepted MESSAGE, the very
    same records for every other frame, and the summaries of a full reading."""
    segs, seq = opening()
    stream = b"".join(message(sid, mid, payload, key) for sid, mid, payload, key in messages)
    at = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut > at and at < len(stream):
            segs.append((True, seq + at, DATA, stream[at:cut]))
            at = cut
    blob = capture(segs)
    full, fd = dissect(io.BytesIO(blob))
    counting = Dissector("<stream>")
    counting.want_records = False
    items = list(counting.frames(io.BytesIO(blob)))
    assert all(type(item) is dict for item in items)
    assert items == [r for r in full if r["type"] != "MESSAGE" or r["verdict"] != "accepted"]
    assert counting.summaries() == fd.summaries()


def test_pcapng_nanoseconds_reach_the_records():
    records, _ = dissect(PCAPNG)
    plain, _ = dissect(SINK)
    assert [r["type"] for r in records] == [r["type"] for r in plain]
    # The pcapng was written with sub-microsecond digits a microsecond pcap cannot hold.
    assert all(r["ts_ns"] % 1000 != 0 for r in records)
    assert all(r["ts_ns"] // 1000 == p["ts_ns"] // 1000 for r, p in zip(records, plain, strict=True))


def test_schema_field_list():
    assert len(field_names()) == len(set(field_names()))
    assert {kind for _, kind, _ in fields()} <= {
        "string",
        "int",
        "long",
        "u64",
        "double",
        "boolean",
        "array<string>",
        "array<struct:ack>",
        "array<struct:where>",
    }


def test_spark_schemas_hold_the_common_fields_and_one_struct_per_protocol():
    from wallaroo_proto.protocols import names
    from wallaroo_proto.protocols.schema import spark_schema
    from wallaroo_proto.records import COMMON_FIELDS

    common = [name for name, _, _ in COMMON_FIELDS]
    assert spark_schema("frames").names == common
    everything = spark_schema()
    assert everything.names == [*common, *names()]
    assert everything["wallaroo"].dataType["acks"].dataType.elementType.names == ["stream_id", "point_of_ref"]
    assert everything["ts"].dataType.simpleString() == "timestamp"
    assert everything["dcp"].dataType["vb_uuid"].dataType.simpleString() == "bigint"  # u64: 64 bits in a long
    assert spark_schema("dcp_frames").names[:3] == ["capture", "conn_index", "frame_index"]
    with pytest.raises(ValueError, match="known: frames, wallaroo_frames"):
        spark_schema("dcp")


# --- what the protocol core finds ------------------------------------------------------


def test_sink_session_two_pc_rounds_commit_and_abort():
    records, d = dissect(SINK)
    [s] = d.summaries()
    assert s["use"] == "sink" and s["violations"] == 0
    assert records[0]["type"] == "HELLO" and records[0]["sender"] == "worker"  # the HELLO sender initiates
    rounds = {r["txn_id"]: (r["vote"], r["decision"]) for r in s["twopc_rounds"]}
    assert rounds == {"sink-out:c_id=1": ("commit", "commit"), "sink-out:c_id=2": ("abort", "abort")}
    assert s["list_uncommitted"] == 1
    [stream] = [st for st in s["streams"] if st["stream_id"] == 1]
    assert (stream["messages"], stream["first_id"], stream["last_id"], stream["gaps"]) == (6, 0, 35, 0)
    twopc = [(r["twopc"], r.get("commit")) for r in records if "twopc" in r]
    assert twopc[-3:] == [("PHASE1", None), ("REPLY", False), ("PHASE2", False)]


def test_restart_and_reconnect():
    records, d = dissect(RESTART)
    first, second = d.summaries()
    assert first["restarts"] == [{"packet": 14, "sender": "worker", "address": "127.0.0.1:7100"}]
    assert second["frames_by_type"]["MESSAGE"] == 4
    assert [st["first_id"] for st in second["streams"]] == [4]
    assert first["credits_granted"] == 15 and first["credits_spent"] == 6
    assert first["streams"][0]["last_acked"] == 3
    assert {r["conn_index"] for r in records} == {1, 2}


def test_lost_segment_sample():
    records, d = dissect(LOST)
    [s] = d.summaries()
    ids = [r["message_id"] for r in records if r["type"] == "MESSAGE"]
    assert ids == [1, 2, 7, 8, 9, 10, 11, 12]
    [st] = s["streams"]
    assert (st["gaps"], st["missing_ids"]) == (1, 4)
    assert s["tcp"]["initiator>responder"]["lost_bytes"] == 120
    assert any("120 bytes missing" in n for n in s["capture_notes"])


def _violating_capture() -> bytes:
    # A MESSAGE on a stream that was never notified: the core's "Bad/unregistered stream_id".
    segs, base = opening()
    segs.append((True, base, DATA, message(9, 1, b"x")))
    return capture(segs)


def test_strict_exit_code(tmp_path):
    path = tmp_path / "bad.pcap"
    path.write_bytes(_violating_capture())
    code, records, _ = jsonl(str(path))
    assert code == 0
    [bad] = [r for r in records if r.get("violations")]
    assert bad["verdict"] == "violation" and bad["packet"] == 8
    assert "Bad/unregistered stream_id 9" in bad["violations"][0]
    strict = run_cli("dissect", "--strict", str(path), env={**os.environ, "COLUMNS": "200"})
    assert strict.returncode == 1 and "violation" in strict.stderr
    assert "Bad/unregistered" in strict.stdout  # shown where it happened
    assert run_cli("dissect", "--strict", str(SOURCE)).returncode == 0


def test_malformed_frame_body_is_reported_and_decoding_continues():
    segs, base = opening()
    bad_ok = b"\x00\x00\x00\x03\x01\x00\x00"  # OK with a 2-byte credits field
    unknown = b"\x00\x00\x00\x01\x63"  # type 99
    segs.append((True, base, DATA, bad_ok + unknown + message(1, 1, b"after")))
    records, d = dissect(io.BytesIO(capture(segs)))
    tail = records[-3:]
    assert [r["type"] for r in tail] == ["OK", "UNKNOWN(99)", "MESSAGE"]
    assert tail[0]["verdict"] == "malformed" and "initial_credits" in tail[0]["violations"][0]
    assert d.summaries()[0]["malformed"] == 2


def test_table_and_hex_views_show_a_malformed_message(tmp_path):
    segs, base = opening()
    # A MESSAGE whose key length (50) runs past its body: malformed, so no payload field.
    body = b"\x05" + struct.pack(">QQqH", 1, 1, 0, 50) + b"k"
    segs.append((True, base, DATA, struct.pack(">I", len(body)) + body))
    path = tmp_path / "bad-message.pcap"
    path.write_bytes(capture(segs))
    wide = {**os.environ, "COLUMNS": "200"}
    for args in ((), ("-x",), ("--strict",)):
        result = run_cli("dissect", *args, str(path), env=wide)
        assert "Traceback" not in result.stderr, result.stderr
        assert "key is 50 bytes long" in result.stdout
    assert run_cli("dissect", "--strict", str(path), env=wide).returncode == 1


DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(
    "name, code, packet, sender, arrow",
    [
        # Mutated copies of the samples whose framing breaks before the connection's use is known.
        ("0191-restart-reconnect.pcap", 2, 4, "connector", "C→W"),  # a HELLO length prefix flipped
        ("0421-mock-source-tcpdump.pcap", 2, 16, "connector", "C→W"),  # bytes inserted in a packet
        ("0626-sink-2pc-ns.pcapng", 0, 4, "worker", "W→C"),  # a bit flipped in the sink's HELLO
    ],
)
def test_damaged_frame_before_the_use_is_known_is_shown_with_its_sender(name, code, packet, sender, arrow):
    path = str(DATA_DIR / name)
    wide = {**os.environ, **TABLE}
    for args in ((), ("-x",)):
        table = run_cli("dissect", *args, path, env=wide)
        assert table.returncode == code and "Traceback" not in table.stderr, table.stderr
        [row] = [line for line in table.stdout.splitlines() if " INVALID " in line]
        assert row.split()[:1] == [str(packet)] and f" {arrow} " in row
    got, records, err = jsonl(path)
    assert got == code and "Traceback" not in err
    [invalid] = [r for r in records if r["type"] == "INVALID"]
    assert (invalid["packet"], invalid["sender"]) == (packet, sender)
    assert invalid["direction"] == "initiator>responder"
    assert invalid["use"] == ("sink" if sender == "worker" else "source")


def test_table_shows_a_timestamp_beyond_the_calendar(tmp_path):
    # if_tsresol 0 counts whole seconds: 86400 * 10**14 + 3661 s is 01:01:01 on a day past year 9999.
    seconds = 86400 * 10**14 + 3661
    syn, data = tcp_header(40000, 7100, 99, TCP_SYN), tcp_header(40000, 7100, 100, DATA, hello())
    packets = [(seconds * 1_000_000_000, ether(ipv4(A4, B4, tcp))) for tcp in (syn, data)]
    path = tmp_path / "far.pcapng"
    path.write_bytes(pcapng_file(packets, tsresol=0))
    result = run_cli("dissect", str(path), env={**os.environ, **TABLE})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    [row] = [line for line in result.stdout.splitlines() if " HELLO " in line]
    assert row.split()[:2] == ["2", "01:01:01.000000"]
    piped = run_cli("dissect", str(path))
    [line] = [line for line in piped.stdout.splitlines() if "\tHELLO\t" in line]
    assert line.split("\t")[:2] == ["2", "01:01:01.000000"]


def test_framing_error_waits_for_the_use_like_a_frame():
    # The first bytes a worker sends to a sink: a zero length prefix, then its HELLO (v0.0.1 = sink).
    segs = [(True, 99, TCP_SYN, b""), (True, 100, DATA, b"\x00\x00\x00\x00" + hello(b"v0.0.1"))]
    records, d = dissect(io.BytesIO(capture(segs)))
    assert [r["type"] for r in records] == ["INVALID", "HELLO"]
    for r in records:
        assert (r["use"], r["sender"], r["direction"]) == ("sink", "worker", "initiator>responder")
    assert "length prefix 0" in records[0]["violations"][0] and "notes" not in records[0]
    assert records[1]["notes"] == ["resynced at stream offset 4, 3 bytes skipped"]
    assert d.summaries()[0]["violation_list"][0]["type"] == "INVALID"


def test_a_note_goes_only_to_the_frame_after_it_when_frames_are_held():
    # A NOTIFY (which does not tell source from sink, so it waits), 10 bytes never captured, a MESSAGE.
    segs = [
        (True, 99, TCP_SYN, b""),
        (True, 100, DATA, NOTIFY_1),
        (True, 100 + len(NOTIFY_1) + 10, DATA, message(1, 1, b"x")),
    ]
    records, _ = dissect(io.BytesIO(capture(segs)))
    assert [r["type"] for r in records] == ["NOTIFY", "MESSAGE"]
    assert "notes" not in records[0]
    assert "10 bytes missing" in records[1]["notes"][0]


# --- bad input ----------------------------------------------------------------------


def test_truncated_capture_shows_what_came_before_and_exits_1(tmp_path):
    blob = SOURCE.read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(blob[:1000])
    code, records, err = jsonl(str(path))
    assert code == 1  # a problem found, not unusable input: a capture cut short (test_capture_cut.py)
    assert records and records[0]["type"] == "HELLO"
    assert "packet" in err and "byte offset" in err and "truncated" in err and "cut short" in err
    assert "Traceback" not in err


def test_garbage_and_missing_files_exit_2(tmp_path):
    garbage = tmp_path / "notes.txt"
    garbage.write_text("this is not a capture\n")
    proc = run_cli("dissect", str(garbage), str(SOURCE))
    assert proc.returncode == 2
    assert "not a pcap or pcapng" in proc.stderr and "HELLO" in proc.stdout  # the good file still shown
    proc = run_cli("dissect", str(tmp_path / "missing.pcap"))
    assert proc.returncode == 2 and "cannot open" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_link_type_exit_2(tmp_path):
    path = tmp_path / "odd.pcap"
    path.write_bytes(pcap_file([(T, b"\x00" * 40)], linktype=147))
    proc = run_cli("dissect", str(path))
    assert proc.returncode == 2 and "unknown link type 147" in proc.stderr


# --- connection detection, filters, output forms ---------------------------------------------


def _other_port_capture(port: int, payload: bytes) -> bytes:
    packets = [
        (T, ether(ipv4(A4, B4, tcp_header(40000, port, 9, TCP_SYN)))),
        (T + 1, ether(ipv4(B4, A4, tcp_header(port, 40000, 99, TCP_SYN | TCP_ACK)))),
        (T + 2, ether(ipv4(A4, B4, tcp_header(40000, port, 10, DATA, payload)))),
        (T + 3, ether(ipv4(B4, A4, tcp_header(port, 40000, 100, DATA, OK_20)))),
    ]
    return pcap_file(packets)


def test_connection_opening_with_hello_is_found_on_any_port():
    records, _ = dissect(io.BytesIO(_other_port_capture(9999, hello())))
    assert [r["type"] for r in records] == ["HELLO", "OK"]
    assert records[0]["responder_port"] == 9999
    records, _ = dissect(io.BytesIO(_other_port_capture(9999, b"GET / HTTP/1.1\r\n\r\n")))
    assert records == []
    records, _ = dissect(io.BytesIO(_other_port_capture(9999, NOTIFY_1)), ports=[9999])
    assert [r["type"] for r in records] == ["NOTIFY", "OK"]


def test_filters(tmp_path):
    _, records, _ = jsonl("--type", "MESSAGE", "--stream", "12", str(SOURCE))
    assert [(r["type"], r["message_id"]) for r in records] == [("MESSAGE", 101), ("MESSAGE", 102)]
    _, records, _ = jsonl("--connection", "2", str(RESTART))
    assert {r["conn_index"] for r in records} == {2}
    _, records, _ = jsonl("--connection", ":53000", str(RESTART))
    assert {r["conn_index"] for r in records} == {1}
    _, records, _ = jsonl("--type", "phase2", str(SINK))
    assert [r["twopc"] for r in records] == ["PHASE2", "PHASE2"]
    _, everything, _ = jsonl(str(SOURCE))
    middle = everything[len(everything) // 2]["ts"]
    _, late, _ = jsonl("--since", repr(middle), str(SOURCE))
    _, early, _ = jsonl("--until", repr(middle), str(SOURCE))
    assert all(r["ts"] >= middle for r in late) and all(r["ts"] <= middle for r in early)
    assert len(late) + len(early) == len(everything) + sum(r["ts"] == middle for r in everything)
    _, relative, _ = jsonl("--until", "0.0015", str(SOURCE))
    assert [r["type"] for r in relative] == ["HELLO", "OK"]


def test_rich_table_hex_dump_and_summary():
    proc = run_cli("dissect", "-x", "--type", "OK", str(SOURCE), env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0
    assert "00 00 00 05 01 00 00 00 14" in proc.stdout  # OK, 20 credits
    proc = run_cli("dissect", "--summary", str(SINK))
    assert proc.returncode == 0
    assert "sink-out:c_id=2" in proc.stdout and "abort" in proc.stdout
    proc = run_cli("dissect", "--summary", "--format", "jsonl", str(RESTART))
    summaries = [json.loads(line)["summary"] for line in proc.stdout.splitlines()]
    assert [len(s["restarts"]) for s in summaries] == [1, 0]


# --- iter_records for the Spark job -------------------------------------------------------


def test_iter_records_streams_and_splits_connections():
    everything = list(iter_records(str(RESTART)))
    seen = []
    parts = [
        list(
            iter_records(str(RESTART), connection_filter=lambda key, i=i: seen.append(key) or key.port_b == i)
        )
        for i in (53000, 53001)
    ]
    assert {key.port_b for key in seen} == {53000, 53001} and {key.port_a for key in seen} == {7100}
    # Each part holds exactly one connection's records, numbered as in the unsplit run.
    for part, index in zip(parts, (1, 2), strict=True):
        assert part == [r for r in everything if r["conn_index"] == index]
    key = ConnectionKey("127.0.0.1", 7100, "127.0.0.1", 53000)
    assert flow_hash(key) == flow_hash(ConnectionKey(*key))  # stable, not Python's salted hash()
    with open(RESTART, "rb") as f:
        from_fileobj = list(iter_records(f, capture_name="restart"))
    assert [r["type"] for r in from_fileobj] == [r["type"] for r in everything]
    assert from_fileobj[0]["capture"] == "restart"


def test_iter_records_raises_after_yielding_what_came_before():
    from wallaroo_proto.capture.pcap import CaptureError

    blob = SOURCE.read_bytes()[:1000]
    got = []
    with pytest.raises(CaptureError):
        for r in iter_records(io.BytesIO(blob)):
            got.append(r)
    assert got and got[0]["type"] == "HELLO"


# --- scapy layers ----------------------------------------------------------------------------


def test_scapy_layers_build_the_wire_format():
    from scapy.packet import raw

    from wallaroo_proto.protocols.wallaroo.scapy_layers import (
        WAck,
        WAckEntry,
        WallarooFrame,
        WMessage,
        WOk,
        WRestart,
    )

    assert raw(WallarooFrame() / WOk(initial_credits=20)) == b"\x00\x00\x00\x05\x01\x00\x00\x00\x14"
    msg = WallarooFrame() / WMessage(stream_id=1, message_id=2, event_time=-1, key=b"k", data=b"hi")
    assert raw(msg) == (
        b"\x00\x00\x00\x1e\x05"
        + b"\x00" * 7
        + b"\x01"
        + b"\x00" * 7
        + b"\x02"
        + b"\xff" * 8
        + b"\x00\x01k"
        + b"hi"
    )
    ack = WallarooFrame() / WAck(credits=3, acks=[WAckEntry(stream_id=1, point_of_ref=2)])
    assert raw(ack) == b"\x00\x00\x00\x19\x06\x00\x00\x00\x03\x00\x00\x00\x01" + struct.pack(">QQ", 1, 2)
    assert raw(WallarooFrame() / WRestart()) == b"\x00\x00\x00\x01\x07"  # the spec's empty RESTART


def test_scapy_layers_dissect_the_sample_captures_like_dissect():
    from scapy.utils import rdpcap

    from wallaroo_proto.protocols.wallaroo.scapy_layers import WMessage, bind_port, frames_of

    bind_port(7200)
    packets = rdpcap(str(SINK))
    types, tags = [], []
    for pkt in packets:
        for frame in frames_of(pkt):
            types.append(frame.sprintf("%type%"))
            body = frame.payload  # frame[WMessage] would search the following frames too
            if isinstance(body, WMessage) and body.twopc() is not None:
                tags.append(body.twopc().sprintf("%tag%"))
    records, _ = dissect(SINK)
    assert types == [r["type"] for r in records]
    assert tags == [r["twopc"] for r in records if "twopc" in r]


def test_closed_connections_are_released(tmp_path):
    from wallaroo_proto.pcap_writer import PcapWriter
    from wallaroo_proto.protocols.wallaroo.codec import encode
    from wallaroo_proto.protocols.wallaroo.frames import Hello, Ok

    path = tmp_path / "many.pcap"
    with PcapWriter(path) as w:
        for i in range(300):
            s = w.tcp_session(("127.0.0.1", 20000 + i), ("127.0.0.1", 7100), timestamp=1.0 + i)
            s.send(True, encode(Hello("0.0.1", b"", "p", "i")), 1.0 + i)
            s.send(False, encode(Ok(5)), 1.0 + i)
            s.reset(True, 1.0 + i) if i % 2 else s.close(True, 1.0 + i)
    kept = Dissector("many")
    records = list(kept.run(path))
    assert len(records) == 600 and len(kept.trackers) == 300
    assert not kept._live  # every connection was settled when it closed, not at the end
    assert all(d.half is None and d.reader is None for t in kept.trackers for d in t.dirs.values())
    assert {s["closed"] for s in kept.summaries()} == {"closed", "reset"}
    streaming = Dissector("many", keep_summaries=False)
    assert len(list(streaming.run(path))) == 600
    assert not streaming.trackers and not streaming._live
    assert [r["conn_index"] for r in iter_records(str(path))][-1] == 300


# --- the command-line grammar (docs/cli.md) -------------------------------------------------------


def test_format_text_and_the_older_rich_are_one_and_verbose_adds_a_line_per_capture():
    text = run_cli("dissect", str(SOURCE), "--format", "text", "-v")
    rich = run_cli("dissect", str(SOURCE), "--format", "rich")
    assert text.returncode == rich.returncode == 0
    assert text.stdout == rich.stdout and "HELLO" in text.stdout
    assert text.stderr == f"wallaroo-proto dissect: {SOURCE}: 1 connection(s), 0 frame(s) with violations\n"
    assert rich.stderr == ""


def test_a_sinks_summary_shows_no_credits_a_sources_does():
    sink = run_cli("dissect", str(SINK), "--summary")
    source = run_cli("dissect", str(SOURCE), "--summary")
    assert sink.returncode == source.returncode == 0
    assert "(sink)" in sink.stdout and "credits" not in sink.stdout  # a sink ignores credits
    assert "credits" in source.stdout and "granted" in source.stdout
