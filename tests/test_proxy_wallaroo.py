"""The Wallaroo protocol under the proxy's fault rules: framing, fields, rewrites, named faults.

Golden bytes are written by hand from the connector protocol v3 and PROTOCOL-NOTES.md:
a frame is ``u32 length`` (big endian, the bytes after it), ``u8 type``, the type's
fields; a 2PC message is the payload of a MESSAGE on stream 0 (id 0, time 0, no key)
whose first byte is its tag.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import test_interop_wallaroo as interop
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Server, run_cli

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.display_filter import compile_filter
from wallaroo_proto.protocols.wallaroo.plugin import RECORD_FIELDS
from wallaroo_proto.protocols.wallaroo.proxy_faults import NAMED_FAULTS, adapter
from wallaroo_proto.proxy import faults
from wallaroo_proto.proxy.faultkit import Close, FaultError, Frame, Send

# HELLO: type 0, version "0.0.1", cookie "c", program "p", instance "i" (each u16 length + bytes).
SOURCE_HELLO = bytes.fromhex("00000011 00 0005 302e302e31 0001 63 0001 70 0001 69")
# The same from a worker to a sink: version "v0.0.1".
SINK_HELLO = bytes.fromhex("00000012 00 0006 76302e302e31 0001 63 0001 70 0001 69")
# OK: type 1, u32 initial credits 500.
OK_500 = bytes.fromhex("00000005 01 000001f4")
# NOTIFY: type 3, stream 7, name "s", point of reference 0.
NOTIFY_7 = bytes.fromhex("00000014 03 0000000000000007 0001 73 0000000000000000")
# MESSAGE: type 5, stream 7, id 12, event time 0, no key, payload "hi".
MESSAGE_7 = bytes.fromhex("0000001d 05 0000000000000007 000000000000000c 0000000000000000 0000 6869")
# ACK: type 6, credits 10, one pair (stream 7, point of reference 8000 = 0x1f40).
ACK_7_8000 = bytes.fromhex("00000019 06 0000000a 00000001 0000000000000007 0000000000001f40")
ACK_7_0 = bytes.fromhex("00000019 06 0000000a 00000001 0000000000000007 0000000000000000")
ACK_CREDITS_0 = bytes.fromhex("00000019 06 00000000 00000001 0000000000000007 0000000000001f40")
# RESTART: type 7; the spec's form is empty, the shipped one u32 length + address.
RESTART_EMPTY = bytes.fromhex("00000001 07")
RESTART_TO = bytes.fromhex("00000013 07 0000000e") + b"127.0.0.1:7101"
# ERROR: type 2, reason "bad" (u16 length + bytes).
ERROR_BAD = bytes.fromhex("00000006 02 0003 626164")
# A stream-0 MESSAGE (27 bytes after the length before its payload) carrying 2PC payloads:
# REPLY (tag 204 = cc) and PHASE2 (205 = cd): txn id "out:c_id=4" (u16 length + bytes), u8 commit.
_TWOPC_HEAD = "05" + "00" * 24 + "0000"
REPLY_COMMIT = bytes.fromhex("00000029" + _TWOPC_HEAD + "cc 000a" + b"out:c_id=4".hex() + "01")
REPLY_ABORT = bytes.fromhex("00000029" + _TWOPC_HEAD + "cc 000a" + b"out:c_id=4".hex() + "00")
PHASE2_COMMIT = bytes.fromhex("00000029" + _TWOPC_HEAD + "cd 000a" + b"out:c_id=4".hex() + "01")
# PHASE1 (203 = cb): txn id, u32 count 1, (stream 1, start 0, end 320 = 0x140).
PHASE1 = bytes.fromhex(
    "00000044" + _TWOPC_HEAD + "cb 000a" + b"out:c_id=4".hex() + "00000001"
    "0000000000000001 0000000000000000 0000000000000140"
)

SOURCE_FROM_CLIENT = [SOURCE_HELLO, NOTIFY_7, MESSAGE_7]
SOURCE_FROM_UPSTREAM = [OK_500, ACK_7_8000, RESTART_TO]


def frame(conn, data: bytes, from_client: bool) -> Frame:
    return Frame(data, from_client, conn.fields(data, from_client))


def sink_connection():
    """An adapter that has seen a sink's HELLO from its client (the worker)."""
    conn = adapter()
    assert conn.frames(True, SINK_HELLO) == [SINK_HELLO]
    assert conn.fields(SINK_HELLO, True)["use"] == "sink"
    return conn


# --- framing -------------------------------------------------------------------------------------


def test_each_direction_is_split_into_its_frames_and_a_partial_tail_waits() -> None:
    conn = adapter()
    stream = b"".join(SOURCE_FROM_CLIENT)
    assert conn.frames(True, stream[:10]) == []
    assert conn.frames(False, OK_500 + ACK_7_8000[:3]) == [OK_500]  # the other direction is its own
    assert conn.frames(True, stream[10:30]) == [SOURCE_HELLO]
    assert conn.frames(True, stream[30:]) == [NOTIFY_7, MESSAGE_7]
    assert conn.frames(False, ACK_7_8000[3:] + RESTART_TO) == [ACK_7_8000, RESTART_TO]


def test_bytes_past_an_impossible_length_go_on_unframed_and_none_is_lost() -> None:
    conn = adapter()
    broken = bytes.fromhex("00000000 0102")  # a length of 0: not even a type byte
    assert conn.frames(True, SOURCE_HELLO[:8]) == []
    assert conn.frames(True, SOURCE_HELLO[8:] + broken) == [SOURCE_HELLO, broken]
    assert conn.frames(True, MESSAGE_7) == [MESSAGE_7]  # the direction's rest, as it comes
    assert conn.fields(broken, True) == {"type": "INVALID"}
    huge = bytes.fromhex("7fffffff 05")  # above the maximum frame size
    assert adapter().frames(False, OK_500 + huge) == [OK_500, huge]


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


_ANY_FRAME = st.sampled_from(
    [SOURCE_HELLO, SINK_HELLO, OK_500, NOTIFY_7, MESSAGE_7, ACK_7_8000, RESTART_EMPTY, RESTART_TO, ERROR_BAD]
    + [REPLY_COMMIT, PHASE1, PHASE2_COMMIT]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_ANY_FRAME, max_size=12),
    st.lists(st.integers(0, 10_000), max_size=20),
    st.one_of(st.none(), st.binary(min_size=4, max_size=12)),
)
def test_any_recut_of_a_stream_gives_the_same_frames_and_every_byte(frames, points, tail) -> None:
    """However TCP cuts the bytes, the frames are the ones written; with junk after them
    (``tail``: maybe an impossible length), everything still comes out, in order."""
    data = b"".join(frames) + (tail or b"")
    whole = adapter().frames(True, data)
    conn = adapter()
    out = [f for piece in _cuts(data, points) for f in conn.frames(True, piece)]
    if tail is None:
        assert out == frames == whole
    else:
        assert out[: len(frames)] == frames == whole[: len(frames)]
        assert b"".join(out) + conn.tail(True) == data


def _framed(type_byte: int, body: bytes) -> bytes:
    return (len(body) + 1).to_bytes(4, "big") + bytes([type_byte]) + body


#: Bytes of every kind a peer may send: garbage, any body under a sound length prefix and
#: type, any 2PC payload in a stream-0 MESSAGE (its 26 bytes of ids, time and key length first).
_PEER_BYTES = st.one_of(
    st.binary(max_size=64),
    st.builds(_framed, st.integers(0, 10), st.binary(max_size=48)),
    st.builds(
        lambda tag, rest: _framed(5, bytes(26) + bytes([tag]) + rest),
        st.integers(200, 207),
        st.binary(max_size=40),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PEER_BYTES, max_size=8), st.booleans())
def test_any_bytes_are_framed_and_read_without_an_exception(chunks, from_client) -> None:
    """A peer's garbage never breaks the proxy's connection: every byte comes out, each
    frame has fields with a type (HELLO and a 2PC PHASE1 first, so both uses are read)."""
    for start in (SOURCE_HELLO, SINK_HELLO + PHASE1):
        conn = adapter()
        data = start + b"".join(chunks)
        out = [f for chunk in (start, *chunks) for f in conn.frames(from_client, chunk)]
        assert b"".join(out) + conn.tail(from_client) == data
        for raw in out:
            assert isinstance(conn.fields(raw, from_client)["type"], str)


# --- fields --------------------------------------------------------------------------------------


def test_fields_are_dissects_names_and_say_who_sent_the_frame() -> None:
    conn = adapter()
    assert conn.fields(SOURCE_HELLO, True) == {
        "type": "HELLO",
        "use": "source",
        "sender": "connector",
        "version": "0.0.1",
        "cookie_b64": "Yw==",
        "cookie_len": 1,
        "program_name": "p",
        "instance_name": "i",
    }
    assert conn.fields(OK_500, False) == {
        "type": "OK",
        "use": "source",
        "sender": "worker",
        "initial_credits": 500,
    }
    assert conn.fields(MESSAGE_7, True) == {
        "type": "MESSAGE",
        "use": "source",
        "sender": "connector",
        "stream_id": 7,
        "message_id": 12,
        "event_time": 0,
        "key_b64": "",
        "key_len": 0,
        "payload_b64": "aGk=",
        "payload_len": 2,
    }
    ack = conn.fields(ACK_7_8000, False)
    assert ack["credits"] == 10 and ack["acks"] == [{"stream_id": 7, "point_of_ref": 8000}]
    assert conn.fields(RESTART_TO, False)["address"] == "127.0.0.1:7101"
    assert "address" not in conn.fields(RESTART_EMPTY, False)
    assert conn.fields(ERROR_BAD, True)["reason"] == "bad"


def test_2pc_fields_on_a_sink_connection_and_the_worker_is_its_client() -> None:
    conn = sink_connection()
    reply = conn.fields(REPLY_COMMIT, False)
    assert reply["sender"] == "connector"  # the sink
    assert (reply["type"], reply["twopc"]) == ("MESSAGE", "REPLY")
    assert (reply["txn_id"], reply["commit"]) == ("out:c_id=4", True)
    phase1 = conn.fields(PHASE1, True)
    assert phase1["sender"] == "worker"
    assert phase1["where"] == [{"stream_id": 1, "start_por": 0, "end_por": 320}]
    assert conn.fields(PHASE2_COMMIT, True)["twopc"] == "PHASE2"


def test_a_stream_0_message_is_plain_data_on_a_source_connection() -> None:
    conn = adapter()
    conn.fields(SOURCE_HELLO, True)
    assert "twopc" not in conn.fields(REPLY_COMMIT, True)


def test_a_2pc_message_before_any_hello_settles_the_sink_use() -> None:
    conn = adapter()
    assert conn.fields(PHASE2_COMMIT, True)["twopc"] == "PHASE2"
    assert conn.use == "sink"


def test_every_field_name_is_one_the_display_filter_knows() -> None:
    conn = sink_connection()
    for data, from_client in [(PHASE1, True), (REPLY_COMMIT, False), (OK_500, False)]:
        for name in conn.fields(data, from_client):
            compile_filter(name)  # raises for a name outside dissect's record schema
    conn = adapter()
    for data in SOURCE_FROM_CLIENT + SOURCE_FROM_UPSTREAM:
        for name in conn.fields(data, data in SOURCE_FROM_CLIENT):
            compile_filter(name)


CAPTURES = Path(__file__).resolve().parent.parent / "captures"


@pytest.mark.parametrize("name", ["source-session.pcap", "sink-2pc.pcap", "restart-reconnect.pcap"])
def test_a_captures_frames_have_the_fields_of_dissects_records(name: str) -> None:
    """Frame by frame, the adapter's fields are the record's own: a rule's ``where`` means
    what the same filter means to ``dissect -Y``."""
    names = {field for field, _, _ in RECORD_FIELDS} | {"type", "use", "sender"}
    records, _ = dissect(CAPTURES / name, with_raw=True)
    conns: dict[int, object] = {}
    compared = set()
    for record in records:
        conn = conns.setdefault(record["conn_index"], adapter())
        from_client = record["direction"] == "initiator>responder"  # the client sent HELLO
        assert conn.frames(from_client, record["_raw"]) == [record["_raw"]]
        expected = {k: v for k, v in record.items() if k in names}
        assert conn.fields(record["_raw"], from_client) == expected, record
        compared.add(record.get("twopc") or record["type"])
    assert len(compared) >= 4, compared


# --- rewrite and the error frame -----------------------------------------------------------------


def test_an_acks_point_of_reference_and_credits_are_rewritten() -> None:
    conn = adapter()
    ack = frame(conn, ACK_7_8000, False)
    assert conn.rewrite(ack, "point_of_ref", 0) == ACK_7_0
    assert conn.rewrite(ack, "acks.point_of_ref", 0) == ACK_7_0
    assert conn.rewrite(ack, "credits", 0) == ACK_CREDITS_0


def test_a_2pc_vote_is_rewritten() -> None:
    conn = sink_connection()
    assert conn.rewrite(frame(conn, REPLY_COMMIT, False), "commit", False) == REPLY_ABORT
    with pytest.raises(FaultError, match="true or false"):
        conn.rewrite(frame(conn, REPLY_COMMIT, False), "commit", 0)


def test_other_fields_are_rewritten_by_the_codec_and_bad_values_refused() -> None:
    conn = adapter()
    ok = frame(conn, OK_500, False)
    assert conn.rewrite(ok, "initial_credits", 1) == bytes.fromhex("00000005 01 00000001")
    restart = frame(conn, RESTART_TO, False)
    assert conn.rewrite(restart, "address", "") == RESTART_EMPTY
    with pytest.raises(FaultError, match=r"out of range for u32"):
        conn.rewrite(ok, "initial_credits", -1)
    with pytest.raises(FaultError, match=r"'commit' of a ACK cannot be rewritten; these can: .*point_of_ref"):
        conn.rewrite(frame(conn, ACK_7_8000, False), "commit", False)


def test_the_error_frame_is_the_protocols_error() -> None:
    assert adapter().error_frame("bad", to_client=True) == ERROR_BAD
    assert adapter().error_frame("bad", to_client=False) == ERROR_BAD


# --- named faults --------------------------------------------------------------------------------


def matches(name: str, fields: dict) -> bool:
    return bool(compile_filter(NAMED_FAULTS[name].where)(fields))


def test_restart_sends_the_frame_on_then_a_restart_to_the_client() -> None:
    fault = NAMED_FAULTS["restart"]
    conn = adapter()
    conn.fields(SOURCE_HELLO, True)
    ack = frame(conn, ACK_7_8000, False)
    assert fault.direction == "client" and matches("restart", ack.fields)
    assert not matches("restart", conn.fields(OK_500, False))
    # The ACK, the RESTART, then the connection closed as the worker's side would be.
    restart = [Send(False, ACK_7_8000), Send(False, RESTART_EMPTY), Close(reset=False)]
    assert fault.act(ack, {"address": ""}, conn) == restart
    assert fault.act(ack, {"address": "127.0.0.1:7101"}, conn)[1] == Send(False, RESTART_TO)
    assert fault.params == {"address": (str, "")}


def test_abort_vote_turns_a_commit_reply_into_an_abort() -> None:
    fault = NAMED_FAULTS["abort-vote"]
    conn = sink_connection()
    reply = frame(conn, REPLY_COMMIT, False)
    assert fault.direction == "client" and matches("abort-vote", reply.fields)
    assert not matches("abort-vote", conn.fields(REPLY_ABORT, False))
    assert not matches("abort-vote", conn.fields(PHASE2_COMMIT, True))
    assert fault.act(reply, {}, conn) == [Send(False, REPLY_ABORT)]
    with pytest.raises(FaultError, match="a 2PC REPLY, not at a PHASE2"):
        fault.act(frame(conn, PHASE2_COMMIT, True), {}, conn)


def test_withhold_phase2_drops_a_workers_phase2() -> None:
    fault = NAMED_FAULTS["withhold-phase2"]
    conn = sink_connection()
    assert (fault.action, fault.act, fault.direction) == ("drop", None, "upstream")
    assert matches("withhold-phase2", conn.fields(PHASE2_COMMIT, True))
    assert not matches("withhold-phase2", conn.fields(PHASE1, True))
    assert not matches("withhold-phase2", conn.fields(REPLY_COMMIT, False))


# --- end to end: the shipped peers through the proxy ------------------------------------------------

# The shipped connector library, its test sink aloc_sink and their inputs (tests/test_interop_wallaroo.py
# says where they live and how they are started).
shipped = pytest.mark.skipif(
    not (interop.PEERS / "wallaroo" / "experimental" / "connectors.py").is_file(),
    reason=f"the shipped Wallaroo peers are not at {interop.PEERS} (set WALLAROO_PEERS)",
)
#: Credits for a whole run of the shipped connector over both files. Its library does not count
#: an EOS_MESSAGE as spending one, as the worker does: when the run drains its credits it may
#: send one frame too many, a violation the proxy rightly reports, and whether it does is a
#: matter of timing. Here the credits never run out.
ENOUGH_CREDITS = 5000
#: The proxy's line for a violation, or for an applied fault: "connection #N client→upstream frame K ...".
_FRAME_LINE = re.compile(r"connection #\d+ .*(client→upstream|upstream→client) frame \d+ ")


def proxy(upstream: str, recording: Path, *more: str) -> Server:
    """``wallaroo-proto proxy`` on a free port, recording what passes."""
    return Server(
        "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream, "--record", str(recording), *more
    )


@pytest.fixture
def inputs(tmp_path: Path) -> list[str]:
    """The shipped example's two framed files, 1,000 records each, in the test's folder."""
    for name in ("celsius.msg", "celsius.msg.2"):
        (tmp_path / name).write_bytes((interop.PEERS / name).read_bytes())
    return ["celsius.msg", "celsius.msg.2"]


def proxy_lines(stderr: str) -> list[str]:
    """The proxy's per-frame lines (violations and faults), without its ready and shutdown talk."""
    return [line for line in stderr.splitlines() if _FRAME_LINE.search(line)]


def assert_summary_is_dissects(stdout: str, recording: Path) -> str:
    """The summary the proxy printed at its end is ``dissect --summary`` of its own recording."""
    summary = run_cli("dissect", str(recording), "--summary")
    assert summary.returncode == 0, summary.stderr
    shown = stdout.split("\n", 1)[1]  # after the ready line
    assert shown.strip() == summary.stdout.strip()
    return shown


def recorded(recording: Path, where: str | None = None) -> list[dict]:
    """``dissect``'s records of the proxy's recording (those ``where`` matches)."""
    out = run_cli("dissect", str(recording), "--format", "json", *(["-Y", where] if where else []))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@contextlib.contextmanager
def aloc_sink(tmp_path: Path, rules: str = ""):
    """The shipped test sink on a free port, voting as ``rules`` says ("" = always commit)."""
    port = interop.free_port()
    (tmp_path / "rules.mock-worker").write_text(rules)
    log = tmp_path / "aloc_sink.log"
    command = [sys.executable, "-W", "ignore", str(interop.PEERS / "aloc_sink"), str(tmp_path / "out")]
    command += [str(tmp_path / "rules"), str(port)]
    with open(log, "w") as sink_log:
        sink = subprocess.Popen(
            command, cwd=interop.PEERS, env=interop.peer_env(), stdout=sink_log, stderr=sink_log
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sink.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "aloc_sink never listened"
                time.sleep(0.05)
        yield port
    finally:
        sink.kill()
        sink.wait()


@shipped
@pytest.mark.e2e
def test_the_shipped_connector_through_the_proxy_delivers_every_record_once(tmp_path, inputs) -> None:
    out, recording = tmp_path / "out.jsonl", tmp_path / "proxy.pcap"
    args = ["--cookie", interop.COOKIE, "--out", str(out), "--checkpoint-every", "100", "--format", "json"]
    args += ["--credits", str(ENOUGH_CREDITS)]
    with Server("mock-worker", "--port", "0", "--no-live", *args) as worker:
        with proxy(worker.address, recording) as relay:
            interop.finish_connector(interop.start_connector(relay.port, tmp_path, *inputs))
            code, stdout, stderr = relay.stop()
        worker_code, worker_out, worker_err = worker.stop()
    assert code == 0 and worker_code == 0, stderr + worker_err
    # What the worker saw: every record of both files once, in order; no violation, no error.
    interop.assert_each_record_once(out, tmp_path, inputs)
    seen = json.loads(worker_out.strip().splitlines()[-1])
    assert seen["violations"] == 0 and seen["errors"] == []
    # What the proxy saw: no violation, and the summary dissect makes of its recording.
    assert proxy_lines(stderr) == []
    assert "(source)" in assert_summary_is_dissects(stdout, recording)
    frames = recorded(recording)
    assert not any(r.get("violations") for r in frames)
    assert sum(r["type"] == "MESSAGE" for r in frames) == 2000  # 1,000 records a file
    assert {r["use"] for r in frames} == {"source"}


@shipped
@pytest.mark.e2e
def test_mock_worker_through_the_proxy_drives_the_shipped_sink_to_its_whole_output(tmp_path, inputs) -> None:
    recording = tmp_path / "proxy.pcap"
    with aloc_sink(tmp_path) as sink_port, proxy(f"127.0.0.1:{sink_port}", recording) as relay:
        args = ["--cookie", interop.COOKIE, "--sink", relay.address, "--sink-cookie", interop.COOKIE]
        args += ["--checkpoint-every", "200", "--format", "json"]
        with Server("mock-worker", "--port", "0", "--no-live", *args) as worker:
            interop.finish_connector(
                interop.start_connector(worker.port, tmp_path, inputs[0]), servers=(worker, relay)
            )
            worker_code, _, worker_err = worker.stop()
        code, stdout, stderr = relay.stop()
    assert code == 0 and worker_code == 0, stderr + worker_err
    # What the sink kept: the file's records, byte for byte.
    assert (tmp_path / "out.mock-worker").read_bytes() == b"".join(interop.records(tmp_path / inputs[0]))
    assert proxy_lines(stderr) == []
    assert "(sink)" in assert_summary_is_dissects(stdout, recording)
    frames = recorded(recording)
    assert not any(r.get("violations") for r in frames)
    votes = [r["commit"] for r in frames if r.get("twopc") == "REPLY"]
    decisions = [r["commit"] for r in frames if r.get("twopc") == "PHASE2"]
    assert votes and all(votes) and decisions == votes


# --- end to end: --strict answers with Wallaroo's ERROR ------------------------------------------


@pytest.mark.e2e
def test_strict_tells_the_violating_client_why_with_an_error_frame() -> None:
    """A MESSAGE on a stream never notified: the client gets an ERROR whose reason is the
    violation the proxy reports, then the end of the connection."""
    upstream = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    waiter = threading.Thread(target=lambda: accepted.append(upstream.accept()[0]), daemon=True)
    waiter.start()
    with Server(
        *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.getsockname()[1]}"),
        *("--protocol", "wallaroo", "--strict", "--no-summary"),
    ) as relay:
        client = socket.create_connection((relay.host, relay.port), timeout=60)
        client.sendall(SOURCE_HELLO + MESSAGE_7)  # stream 7 was never notified
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := client.recv(65536):
                got += chunk
        client.close()
        code, _, stderr = relay.stop()
    waiter.join(60)
    for conn in accepted:
        conn.close()
    upstream.close()
    assert code == 1, stderr
    [line] = proxy_lines(stderr)
    reason = line.split(" MESSAGE: ", 1)[1]
    # ERROR, by hand: u32 length, type 2, u16 reason length, the reason.
    text = reason.encode()
    assert got == (3 + len(text)).to_bytes(4, "big") + b"\x02" + len(text).to_bytes(2, "big") + text


# --- end to end: faults the shipped peers must live through -----------------------------------------

FOLLOWING_CONNECTOR = Path(__file__).resolve().parent / "peers" / "restart_following_connector.py"
#: dissect of a recording with faults in it: what is not a plain MESSAGE (2PC messages are kept).
NOT_DATA = 'twopc or type != "MESSAGE"'


def fault_lines(stderr: str, action: str) -> list[str]:
    return [line for line in proxy_lines(stderr) if f" fault {action} at " in line]


def sides(frames: list[dict], client_port: int, upstream_port: int) -> tuple[list[dict], list[dict]]:
    """A recording's frames of the client's side (to the proxy) and of the upstream's side."""
    client = [r for r in frames if r["responder_port"] == client_port]
    upstream = [r for r in frames if r["responder_port"] == upstream_port]
    return client, upstream


def connection_blocks(summary: str) -> dict[str, list[str]]:
    """A summary's connections, by their endpoints, without their number (and side) and packet range."""
    blocks: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in summary.splitlines():
        line = line.rstrip()
        head = re.search(r"connection #\d+(?: \((?:client|upstream) side\))?\s+(.*?)\s*─*$", line)
        if head:
            lines = blocks.setdefault(head.group(1), [])
        elif line and not line.startswith("packets "):
            lines.append(line)
    return blocks


def assert_summary_is_dissects_and_rules(stdout: str, recording: Path, rule: str, applied: int) -> None:
    """The proxy's summary holds dissect's of its recording, connection by connection, then
    the rule's counts. (With faults, the recording holds each side as a connection of its
    own, which the proxy lists in another order and numbers its packets otherwise.)"""
    *shown, counts = stdout.rstrip().split("\n")
    assert re.fullmatch(rf"fault --fault '{re.escape(rule)}': matched \d+, applied {applied}", counts), counts
    summary = run_cli("dissect", str(recording), "--summary")
    assert summary.returncode == 0, summary.stderr
    ours = connection_blocks("\n".join(shown[1:]))  # after the ready line
    assert len(ours) >= 2 and ours == connection_blocks(summary.stdout)


@shipped
@pytest.mark.e2e
def test_a_vote_turned_to_abort_is_rolled_back_and_the_shipped_sink_keeps_every_record_once(
    tmp_path, inputs
) -> None:
    recording, rule = tmp_path / "proxy.pcap", "abort-vote count=1"
    with (
        aloc_sink(tmp_path) as sink_port,
        proxy(f"127.0.0.1:{sink_port}", recording, "--protocol", "wallaroo", "--fault", rule) as relay,
    ):
        args = ["--cookie", interop.COOKIE, "--sink", relay.address, "--sink-cookie", interop.COOKIE]
        args += ["--checkpoint-every", "200", "--format", "json"]
        with Server("mock-worker", "--port", "0", "--no-live", *args) as worker:
            interop.finish_connector(
                interop.start_connector(worker.port, tmp_path, inputs[0]), servers=(worker, relay)
            )
            worker_code, _, worker_err = worker.stop()
        code, stdout, stderr = relay.stop()
    assert code == 0 and worker_code == 0, stderr + worker_err
    # The sink: every record once, byte for byte. It voted commit on the first round, was told
    # abort and truncated; later rounds committed up to the end of the output.
    output = (tmp_path / "out.mock-worker").read_bytes()
    assert output == b"".join(interop.records(tmp_path / inputs[0]))
    log = [
        ast.literal_eval(line)[1:] for line in (tmp_path / "out.mock-worker.txnlog").read_text().splitlines()
    ]
    first = next(entry[1] for entry in log if entry[0] == "1-ok")
    assert [entry[0] for entry in log if entry[1] == first] == ["1-ok", "2-rollback"]
    assert not any(entry[0] == "1-rollback" for entry in log)
    assert [entry for entry in log if entry[0] == "2-ok"][-1][2] == len(output)
    # The worker: it took the vote as an abort, rolled the round back and sent its bytes again.
    [rolled_back] = re.findall(r"sink: (\S+) \[(\d+), \d+\) aborted: re-sending from (\d+)", worker_err)
    assert rolled_back == (first, "0", "0")
    # The proxy: one fault, at the sink's first REPLY; no violation on either side.
    [line] = fault_lines(stderr, "abort-vote")
    assert re.search(
        r"connection #1 fault abort-vote at upstream→client frame \d+ REPLY: the frame not forwarded, "
        r"then the REPLY with its vote set to abort \(\d+ bytes\) sent to the client$",
        line,
    )
    assert proxy_lines(stderr) == [line]
    assert_summary_is_dissects_and_rules(stdout, recording, rule, 1)
    # The recording: the sink's REPLY as it sent it (commit, with the fault's note), as the worker
    # got it (abort), and the worker's abort decision on both sides.
    frames = recorded(recording, NOT_DATA)
    client, upstream = sides(frames, relay.port, sink_port)
    assert not any(r.get("violations") for r in frames)

    def round_of(side: list[dict]) -> list[tuple]:
        return [(r["twopc"], r["commit"]) for r in side if r.get("txn_id") == first and "commit" in r]

    assert round_of(upstream) == [("REPLY", True), ("PHASE2", False)]
    assert round_of(client) == [("REPLY", False), ("PHASE2", False)]
    [noted] = [r for r in frames if r.get("notes")]
    assert (
        noted in upstream and noted["twopc"] == "REPLY" and noted["notes"] == [line[line.index("fault ") :]]
    )


@shipped
@pytest.mark.e2e
def test_a_restart_sent_to_the_shipped_connector_is_followed_and_every_record_arrives_once(
    tmp_path, inputs
) -> None:
    out, recording, rule = tmp_path / "out.jsonl", tmp_path / "proxy.pcap", "restart skip=2 count=1"
    args = ["--cookie", interop.COOKIE, "--out", str(out), "--checkpoint-every", "100", "--format", "json"]
    args += ["--credits", str(ENOUGH_CREDITS)]
    with Server("mock-worker", "--port", "0", "--no-live", *args) as worker:
        with proxy(worker.address, recording, "--protocol", "wallaroo", "--fault", rule) as relay:
            command = [sys.executable, "-W", "ignore", str(FOLLOWING_CONNECTOR), "--fixed-reset"]
            command += ["127.0.0.1", str(relay.port), interop.COOKIE, *inputs]
            connector = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=interop.peer_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            said = interop.finish_connector(connector)
            code, stdout, stderr = relay.stop()
        worker_code, worker_out, worker_err = worker.stop()
    assert code == 0 and worker_code == 0, stderr + worker_err
    # The worker: every record of both files once, in order, over two connections.
    interop.assert_each_record_once(out, tmp_path, inputs)
    seen = json.loads(worker_out.strip().splitlines()[-1])
    assert (seen["connections"], seen["violations"], seen["errors"], seen["restarts_sent"]) == (2, 0, [], 0)
    # The connector: one RESTART (the spec's, with no address), followed.
    assert said.count("RESTART followed: address None") == 1, said
    # The proxy: one fault, after the third ACK to the connector, and the connection closed
    # there, so no frame follows the RESTART on either side and the checks find nothing.
    [line] = fault_lines(stderr, "restart")
    assert re.search(
        r"connection #1 fault restart at upstream→client frame \d+ ACK: the frame forwarded to the client, "
        r"then a RESTART \(5 bytes\) sent to the client, then the connection closed on both sides$",
        line,
    )
    assert proxy_lines(stderr) == [line]
    assert_summary_is_dissects_and_rules(stdout, recording, rule, 1)
    # The recording: the RESTART only on the client's side of the first connection, right
    # after the third ACK; the worker's side has the fault's note on that ACK.
    frames = recorded(recording, NOT_DATA)
    client, upstream = sides(frames, relay.port, seen_port(worker_out))
    first = client[0]["conn_index"]
    [restart] = [r for r in frames if r["type"] == "RESTART"]
    assert restart["conn_index"] == first and restart["sender"] == "worker"
    from_worker = [r["type"] for r in client if r["conn_index"] == first and r["sender"] == "worker"]
    assert from_worker[: from_worker.index("RESTART")].count("ACK") == 3
    [noted] = [r for r in frames if r.get("notes")]
    assert noted in upstream and noted["type"] == "ACK" and noted["notes"] == [line[line.index("fault ") :]]
    assert [r["type"] for r in upstream if r["conn_index"] == noted["conn_index"]].count("HELLO") == 1


def seen_port(worker_out: str) -> int:
    """The worker's port, from its ready line."""
    return int(re.search(r"listening on \S+:(\d+)", worker_out).group(1))


def test_a_fault_line_says_what_was_done_to_which_side_at_which_frame() -> None:
    def line(rule: str, from_client: bool, data: bytes) -> str:
        engine = faults.ConnectionFaults(faults.parse_rules([rule]), "wallaroo")
        [applied] = [s for s in engine.feed(from_client, data) if type(s) is faults.Applied]
        return faults.describe(applied)

    assert line("restart count=1", False, ACK_7_8000) == (
        "fault restart at upstream→client frame 1 ACK: the frame forwarded to the client, then a RESTART "
        "(5 bytes) sent to the client, then the connection closed on both sides"
    )
    assert line("drop type=ACK", False, ACK_7_8000) == (
        "fault drop at upstream→client frame 1 ACK: dropped: not forwarded to the client"
    )
    assert line("delay type=MESSAGE ms=20", True, MESSAGE_7) == (
        "fault delay at client→upstream frame 1 MESSAGE: delayed 20 ms (and the frames behind it), "
        "then forwarded to the upstream"
    )
