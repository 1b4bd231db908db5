"""AMBROSIA's IC <-> LB sockets for the proxy's fault rules: frames, fields, rewrites, the cut.

Golden bytes are the notes' worked examples (committer id 0x12345678): log records
with their header and xxHash64 check bytes, and the LB's bare messages.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import pytest
import test_interop_ambrosia_node as node_peer
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Server, run_cli
from test_interop_ambrosia_node import build, storage  # noqa: F401 (fixtures: the binding, Azurite)

from wallaroo_proto.display_filter import compile_filter
from wallaroo_proto.protocols.ambrosia.immortal import RpcSource
from wallaroo_proto.protocols.ambrosia.proxy_faults import NAMED_FAULTS, adapter
from wallaroo_proto.proxy import faults
from wallaroo_proto.proxy.faultkit import FaultError, Frame, Send

H = bytes.fromhex
TAKE_CHECKPOINT = H("78563412 1a000000 fb747b895a9033f8 ffffffffffffffff 0202")
CHECKPOINT_RECORD = H("78563412 1b000000 0000000000000000 feffffffffffffff 04080a")
BLOB = b"state"  # the 5 raw bytes the checkpoint record announces
RECORD_0 = H("78563412 26000000 fe60ab7cdfe89249 0000000000000000 0c000006017b7d 0c000006017b7d")
#: The same two RPCs numbered 1: only the sequence id differs (check bytes cover the body alone).
RECORD_1 = H("78563412 26000000 fe60ab7cdfe89249 0100000000000000 0c000006017b7d 0c000006017b7d")

SELF_RPC = H("0e 00 00 00 06 01 7b7d")
RPC_TO_SERVER = H("1a 00 0c 736572766572 00 06 01 7b7d")
ATTACH = H("0e 01 736572766572")
BATCH = H("24 05 04 0e00000006017b7d 0e00000006017b7d")
INITIAL = H("0c 09 322e302e31")
LB_CHECKPOINT = H("04 08 06")


def frames_of(a, from_client: bool, data: bytes) -> list[Frame]:
    return [Frame(f, from_client, a.fields(f, from_client)) for f in a.frames(from_client, data)]


def test_the_ics_records_and_a_checkpoints_bytes_are_frames_on_the_send_socket():
    a = adapter()
    got = frames_of(a, False, CHECKPOINT_RECORD + BLOB + TAKE_CHECKPOINT + RECORD_0)
    assert [f.data for f in got] == [CHECKPOINT_RECORD, BLOB, TAKE_CHECKPOINT, RECORD_0]
    fields = [f.fields for f in got]
    assert [f["type"] for f in fields] == ["CheckpointRecord", "CheckpointBytes", "TakeCheckpoint", "Record"]
    assert {(f["sender"], f["ambrosia_socket"]) for f in fields} == {("ic", "send")}
    assert fields[0]["seq_id"] == -2 and fields[0]["checkpoint_length"] == 5
    assert fields[0]["check_bytes"] == "0000000000000000" and fields[0]["committer_id"] == 0x12345678
    assert fields[1]["checkpoint_length"] == 5
    assert fields[2]["seq_id"] == -1 and fields[2]["record_size"] == 26
    assert (
        fields[3]["seq_id"] == 0 and fields[3]["check_bytes"] == "4992e8df7cab60fe"
    )  # little-endian on the wire
    assert fields[3]["message_count"] == 2 and fields[3]["rpc_count"] == 2
    assert fields[3]["message_types"] == ["RPC"]


def test_the_lbs_messages_are_frames_on_the_receive_socket():
    a = adapter()
    data = INITIAL + ATTACH + RPC_TO_SERVER + SELF_RPC + BATCH + LB_CHECKPOINT + b"abc"
    got = frames_of(a, True, data)
    assert [f.data for f in got] == [INITIAL, ATTACH, RPC_TO_SERVER, SELF_RPC, BATCH, LB_CHECKPOINT, b"abc"]
    fields = [f.fields for f in got]
    assert [f["type"] for f in fields] == [
        "InitialMessage",
        "AttachTo",
        "RPC",
        "RPC",
        "RPCBatch",
        "Checkpoint",
        "CheckpointBytes",
    ]
    assert {(f["sender"], f["ambrosia_socket"]) for f in fields} == {("lb", "receive")}
    assert (fields[2]["destination"], fields[2]["method_id"], fields[2]["rpc_type"]) == ("server", 3, "fork")
    assert fields[3]["destination"] == ""  # a self call
    assert fields[4]["rpc_count"] == 2
    assert fields[5]["checkpoint_length"] == 3 and fields[6]["checkpoint_length"] == 3


def test_a_checkpoints_bytes_pass_a_piece_at_a_time_never_held_whole():
    a = adapter()
    assert a.frames(False, CHECKPOINT_RECORD + BLOB[:2]) == [CHECKPOINT_RECORD, BLOB[:2]]
    assert a.frames(False, BLOB[2:] + RECORD_0[:30]) == [BLOB[2:]]
    assert a.frames(False, RECORD_0[30:]) == [RECORD_0]


def test_drop_between_records_is_a_cut_at_a_records_start_toward_the_lb():
    fault = NAMED_FAULTS["drop-between-records"]
    assert (fault.action, fault.act, fault.direction) == ("cut", None, "client")
    match = compile_filter(fault.where)
    a = adapter()
    got = frames_of(a, False, CHECKPOINT_RECORD + BLOB + TAKE_CHECKPOINT + RECORD_0 + RECORD_1)
    assert [f.fields["seq_id"] for f in got if match(dict(f.fields))] == [0, 1]


def test_a_records_header_fields_are_rewritten_and_its_body_kept():
    a = adapter()
    record = frames_of(a, False, RECORD_0)[0]
    assert a.rewrite(record, "seq_id", 1) == RECORD_1
    assert a.rewrite(record, "committer_id", 1) == b"\x01\x00\x00\x00" + RECORD_0[4:]
    assert a.rewrite(record, "check_bytes", "0000000000000001") == (
        RECORD_0[:8] + b"\x01\x00\x00\x00\x00\x00\x00\x00" + RECORD_0[16:]
    )


@pytest.mark.parametrize(
    ("from_client", "data", "field_name", "message"),
    [
        (False, RECORD_0, "rpc_count", "these can \\(a log record's header\\): committer_id, check_bytes"),
        (True, SELF_RPC, "seq_id", "seq_id is a log record's field; a RPC has none"),
        (False, RECORD_0, "check_bytes", "16 hex digits, not 'xyz'"),
        (False, RECORD_0, "committer_id", "does not fit committer_id"),
    ],
)
def test_a_rewrite_that_cannot_be_done_says_why(from_client, data, field_name, message):
    a = adapter()
    frame = frames_of(a, from_client, data)[0]
    value = {"committer_id": 1 << 40, "check_bytes": "xyz"}.get(field_name, 1)
    with pytest.raises(FaultError, match=message):
        a.rewrite(frame, field_name, value)


def test_bytes_that_cannot_be_framed_pass_as_they_come_and_none_is_lost():
    a = adapter()
    bad = H("78563412 03000000") + bytes(16)  # a record size of 3, below the 24-byte header
    assert a.frames(False, RECORD_0 + bad[:10]) == [RECORD_0]
    assert a.frames(False, bad[10:]) == [bad]
    assert a.frames(False, RECORD_1) == [RECORD_1]  # no way back to a boundary: as it comes
    assert [a.fields(f, False)["type"] for f in (RECORD_0, bad, RECORD_1)] == ["Record", "INVALID", "INVALID"]
    assert a.error_frame("x", to_client=True) is None


def sent_through_engine(*reads: tuple[bool, bytes]) -> dict[bool, bytes]:
    """What the engine sends of each side's reads once both sides end (no rules), by side."""
    engine = faults.ConnectionFaults([], "ambrosia", adapter=adapter())
    steps = [step for from_client, data in reads for step in engine.feed(from_client, data)]
    steps += engine.end(True) + engine.end(False)
    return {
        side: b"".join(s.data for s in steps if isinstance(s, Send) and s.to_upstream == side)
        for side in (True, False)
    }


def test_a_record_or_message_cut_short_at_the_end_still_goes_on():
    """The IC's second record cut inside its body, the LB's message inside its body:
    every byte goes on when the sides end."""
    ic = RECORD_0 + RECORD_1[:30]
    lb = INITIAL + RPC_TO_SERVER[:5]
    sent = sent_through_engine((False, ic[:40]), (False, ic[40:]), (True, lb[:3]), (True, lb[3:]))
    assert sent == {True: lb, False: ic}


RECORDS = st.lists(
    st.sampled_from([TAKE_CHECKPOINT, CHECKPOINT_RECORD + BLOB, RECORD_0, RECORD_1]), max_size=8
)
MESSAGES = st.lists(
    st.sampled_from([SELF_RPC, RPC_TO_SERVER, ATTACH, BATCH, INITIAL, LB_CHECKPOINT + b"abc"]), max_size=8
)


@settings(max_examples=150, deadline=None)
@given(st.booleans(), RECORDS, MESSAGES, st.lists(st.integers(1, 40), max_size=30), st.integers(0, 30))
def test_any_chunking_passes_every_byte_in_frames_of_the_same_types(
    from_client, records, messages, cuts, short
):
    """However the bytes come, and wherever the stream stops (``short`` of its end), the frames
    and then the tail are every byte, in order."""
    data = b"".join(messages if from_client else records)
    data = data[: max(0, len(data) - short)]
    whole = adapter()
    at_once = whole.frames(from_client, data)
    assert b"".join(at_once) + whole.tail(from_client) == data
    expected = [whole.fields(f, from_client)["type"] for f in at_once]
    a = adapter()
    got, pos = [], 0
    for cut in [*cuts, len(data)]:
        got += a.frames(from_client, data[pos : pos + cut])
        pos += cut
    assert b"".join(got) + a.tail(from_client) == data
    types = [a.fields(f, from_client)["type"] for f in got]
    # A checkpoint's bytes may come in more pieces; every other frame is the same.
    assert [t for t in types if t != "CheckpointBytes"] == [t for t in expected if t != "CheckpointBytes"]


def test_the_engine_finds_ambrosia_by_the_ics_first_record_and_cuts_before_the_second_record():
    rules = faults.parse_rules(["drop-between-records skip=1"])
    engine = faults.ConnectionFaults(rules, upstream_port=45678)
    steps = engine.feed(False, CHECKPOINT_RECORD + BLOB + TAKE_CHECKPOINT + RECORD_0 + RECORD_1)
    assert engine.protocol == "ambrosia"
    sent = [s.data for s in steps if type(s) is Send]
    assert sent == [CHECKPOINT_RECORD, BLOB, TAKE_CHECKPOINT, RECORD_0]
    assert type(steps[-1]) is faults.Close and not steps[-1].reset


# ------------------------------------------------------------------ the Node binding through the proxy

_NODE_PEER = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (node_peer.PEER / "Ambrosia-Node" / "package.json").is_file(),
        reason=f"AMBROSIA's Node binding is not at {node_peer.PEER} (set AMBROSIA_NODE_PEER)",
    ),
    pytest.mark.skipif(bool(node_peer._missing), reason="node and npm are needed for the Node binding"),
]


def needs_node(test):
    """Slow, and skipped (saying why) without the Node binding's sources or node and npm."""
    for mark in _NODE_PEER:
        test = mark(test)
    return test


def mock_ic(tmp_path: Path, *args: str) -> Server:
    return Server(
        *("ambrosia", "mock-ic", "--format", "json", "--exit-when-done", "--batch", "10"),
        *("--checkpoint-every", "5", "--log-dir", str(tmp_path / "iclog"), *args),
    )


def proxy_for(ic: Server, tmp_path: Path, *args: str) -> tuple[Server, int, int]:
    """The proxy before the IC's two ports, paired in the binding's order: receive, then send."""
    rport, sport = map(int, node_peer.PORTS.search(ic.lines[-1]).groups())
    proxy = Server(
        *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{rport}"),
        *("--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{sport}"),
        *("--record", str(tmp_path / "proxy.pcap"), *args),
    )
    ports = [int(p) for p in re.findall(r"listening on 127\.0\.0\.1:(\d+)", proxy.lines[-1])]
    return proxy, ports[0], ports[1]


@needs_node
def test_the_node_binding_through_the_proxy_to_mock_ic(build, storage, tmp_path):  # noqa: F811
    with mock_ic(tmp_path, "--rpcs", "300") as ic:
        proxy, rport, sport = proxy_for(ic, tmp_path)
        with proxy:
            app = node_peer.NodeApp(build, storage, tmp_path / "app", "proxied", rport, sport)
            code, out, err = ic.stop(sig=None, timeout=node_peer.DEADLINE)
            app_code = app.end()
            pcode, stdout, stderr = proxy.stop()
    summary = json.loads(out.splitlines()[-1])
    assert code == 0 and summary["violations"] == [], err
    assert app_code == 0, app.tail()
    assert node_peer._totals(app.status()) == node_peer._expected(RpcSource(300))
    assert pcode == 0, stderr
    assert "violation" not in stderr.lower()
    # One LB's two sockets, paired as dissect pairs them, and the proxy's summary is dissect's,
    # each connection numbered as the proxy's lines number it (in the order it accepted them).
    assert re.findall(r"\(ambrosia (\w+) port\)", stdout) == ["send", "receive"]
    assert sorted(re.findall(r"connection #(\d+) ", stdout)) == ["1", "2"], stdout + stderr
    assert re.findall(r"^RPCs +(.*?) *$", stdout, re.M) == ["360 to the LB, 60 from it"] * 2
    assert set(re.findall(r"^violations +(\d+)", stdout, re.M)) == {"0"}
    dissected = run_cli("dissect", str(tmp_path / "proxy.pcap"), "--summary")
    assert dissected.returncode == 0, dissected.stderr
    unnumbered = partial(re.sub, r"#\d+ ", "#N ")  # connection headers and the findings' conn column
    assert unnumbered(stdout.split("\n", 1)[1].strip()) == unnumbered(dissected.stdout.strip())


@needs_node
def test_a_cut_between_records_by_the_proxy_ends_the_binding_after_the_records_before_it(
    build,  # noqa: F811
    storage,  # noqa: F811
    tmp_path,
):
    with mock_ic(tmp_path, "--rpcs", "300") as ic:
        proxy, rport, sport = proxy_for(ic, tmp_path, "--fault", "drop-between-records skip=10")
        with proxy:
            app = node_peer.NodeApp(build, storage, tmp_path / "app", "cut", rport, sport)
            app_code = app.end()  # the binding ends once its IC's socket is gone
            code, out, err = ic.stop(timeout=node_peer.DEADLINE)
            pcode, stdout, stderr = proxy.stop()
    # The proxy: one cut, before the 11th log record (sequence id 10), toward the LB.
    faults_seen = [line for line in stderr.splitlines() if " fault " in line]
    assert len(faults_seen) == 1, stdout + stderr + out + err
    assert re.search(
        r"fault drop-between-records at upstream→client frame \d+ Record: connection closed", faults_seen[0]
    )
    assert "violation" not in stderr.lower()
    assert re.search(r"matched 11, +applied 1", " ".join(stdout.split()))
    # Each side of the send socket as it saw it: the IC's sequence id 10 never reached the LB.
    records = re.findall(r"^records +(\d+) \(0 replayed\), last sequence id (\d+)", stdout, re.M)
    assert sorted(set(records)) == [("10", "9"), ("11", "10")]
    assert set(re.findall(r"^violations +(\d+)", stdout, re.M)) == {"0"}
    # The binding applied exactly the RPCs of the ten records it got, then ended cleanly.
    to_lb = re.findall(r"^RPCs +(\d+) to the LB", stdout, re.M)
    status = app.status()
    assert app_code == 0 and status["initialized"] and "FirstStart" in status["events"]
    assert status["rpcs"] < 300 and str(status["rpcs"]) in to_lb
    # The IC: the LB went away mid-run, no rule broken; stopped before its end, so 130.
    summary = json.loads(out.splitlines()[-1])
    assert code == 130 and not summary["done"] and summary["violations"] == [], err
    assert "the LB went away" in err and summary["records_sent"] >= 11
    assert summary["last_checkpoint"]["state"]["rpcs"] <= status["rpcs"]
