"""replay and diff: the shared engine (recording, comparison) and Wallaroo end to end.

The end-to-end tests record a conversation of our own mock pair, then play one side of it
against a fresh live peer over loopback: the same peer must match it (exit 0), a peer
started with a fault must be reported at the frame where the change first shows (exit 1).
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict

import pytest
from scapy.all import TCP, rdpcap
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.wallaroo.replay import Adapter, units
from wallaroo_proto.replay import recording
from wallaroo_proto.replay.adapter import SKIP, Hold
from wallaroo_proto.replay.compare import Matcher, Result, compare_runs, differences

CAPTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "captures"
WORKER = ("mock-worker", "--port", "0", "--no-live", "--checkpoint-every", "0", "--checkpoint-ms", "0")

# --- the comparison ---------------------------------------------------------------------------


def test_differences_pass_over_ignored_fields_and_name_the_others() -> None:
    recorded = {"type": "OK", "initial_credits": 20, "ts": 1.0}
    live = {"type": "OK", "initial_credits": 3, "ts": 2.0, "extra_field": "x"}
    assert differences(recorded, live, frozenset({"ts"})) == (
        ("initial_credits", 20, 3),
        ("extra_field", None, "x"),
    )


def test_frames_match_by_type_and_key_whatever_order_they_come_in() -> None:
    matcher = Matcher(frozenset(), key=lambda r: (r.get("vb"),))
    matcher.expect(0, {"type": "M", "vb": 1, "v": "a"})
    matcher.expect(1, {"type": "M", "vb": 2, "v": "b"})
    assert matcher.outstanding_before(5).index == 0
    assert matcher.seen({"type": "M", "vb": 2, "v": "b"}).result is Result.MATCHED
    assert matcher.seen({"type": "M", "vb": 1, "v": "changed"}).result is Result.DIVERGENT
    assert matcher.seen({"type": "M", "vb": 1, "v": "a"}) is None  # nothing like it expected yet
    assert matcher.expect(3, {"type": "M", "vb": 1, "v": "a"}).result is Result.MATCHED  # it came early
    assert matcher.seen({"type": "M", "vb": 9}) is None
    assert (
        matcher.seen({"type": "X", "verdict": "violation", "violations": ["bad"]}).result is Result.VIOLATION
    )
    matcher.expect(2, {"type": "N"})
    matcher.give_up_all("gone")
    assert (matcher.counts[Result.MISSING], matcher.counts[Result.EXTRA]) == (1, 1)
    assert matcher.outstanding_before(5) is None


def test_a_violation_that_came_early_is_told_at_the_recorded_frame_it_stands_for() -> None:
    """A live peer ahead of the walk through the recording (a burst read at once) sends a frame
    breaking a rule: it is compared with its recorded frame once that is expected, not told
    as a frame the recording does not have."""
    matcher = Matcher(frozenset(), key=lambda r: ())
    matcher.expect(0, {"type": "Record", "seq_id": 3})
    assert matcher.seen({"type": "Record", "seq_id": 3}).result is Result.MATCHED
    assert (
        matcher.seen({"type": "Record", "seq_id": 5, "verdict": "violation", "violations": ["gap"]}) is None
    )
    outcome = matcher.expect(1, {"type": "Record", "seq_id": 4})
    assert (outcome.result, outcome.recorded, outcome.fields) == (
        Result.VIOLATION,
        {"type": "Record", "seq_id": 4},
        (("seq_id", 4, 5), ("verdict", None, "violation"), ("violations", None, ["gap"])),
    )


def test_two_runs_are_matched_in_any_order() -> None:
    first = [{"type": "M", "n": i} for i in range(10)]
    matcher = compare_runs(first, list(reversed(first)), frozenset(), key=lambda r: (r["n"],))
    assert matcher.counts[Result.MATCHED] == 10
    matcher = compare_runs(first, first[:7], frozenset(), key=lambda r: (r["n"],))
    assert (matcher.counts[Result.MATCHED], matcher.counts[Result.MISSING]) == (7, 3)


# --- the recording ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capture, connection",
    [
        ("source-session.pcap", None),
        ("sink-2pc.pcap", None),
        ("dcp-stream.pcap", None),
        ("kinesis-session.pcap", "2"),
        ("tremor-session.pcap", "1"),
    ],
)
def test_a_conversations_frames_carry_exactly_the_bytes_each_side_sent(capture, connection) -> None:
    """Each direction's frame bytes, joined, are that direction's TCP payload as scapy reads it
    (a protocol of lines: but for the newlines)."""
    conversation = recording.find(CAPTURES / capture, connections=(connection,) if connection else ())
    conn = conversation.connections[0]
    sent: dict[bool, bytes] = defaultdict(bytes)
    for frame in recording.frames(conversation):
        sent[frame.record["direction"] == "initiator>responder"] += frame.raw
    payload: dict[bool, bytes] = defaultdict(bytes)
    for packet in rdpcap(str(CAPTURES / capture)):
        if TCP in packet and bytes(packet[TCP].payload):
            ports = (packet[TCP].sport, packet[TCP].dport)
            if ports == (conn.client[1], conn.server[1]):
                payload[True] += bytes(packet[TCP].payload)
            elif ports == (conn.server[1], conn.client[1]):
                payload[False] += bytes(packet[TCP].payload)
    if conversation.protocol == "kinesis":  # a line's record is the line, without its newline
        payload = {d: b.replace(b"\n", b"") for d, b in payload.items()}
    assert sent[True] == payload[True] and sent[False] == payload[False]


def test_a_capture_of_several_conversations_asks_which_one_and_lists_them() -> None:
    with pytest.raises(recording.RecordingError, match="2 conversations match.*#1 kinesis.*#2 kinesis"):
        recording.find(CAPTURES / "kinesis-session.pcap")
    conversation = recording.find(CAPTURES / "source-session.pcap")
    assert (conversation.side_named("client"), conversation.side_named("server")) == ("connector", "worker")
    with pytest.raises(ValueError, match="known: client, server, connector, worker"):
        conversation.side_named("producer")


# --- the Wallaroo adapter (sans-IO), with frames written from the spec's layouts ----------------

OK_2 = b"\x00\x00\x00\x05\x01" + (2).to_bytes(4, "big")  # OK(initial_credits=2)
ACK_5 = b"\x00\x00\x00\x09\x06" + (5).to_bytes(4, "big") + (0).to_bytes(4, "big")  # ACK(5 credits, no pairs)


def _notify_ack(stream_id: int, point: int) -> bytes:
    return b"\x00\x00\x00\x12\x04\x01" + stream_id.to_bytes(8, "big") + point.to_bytes(8, "big")


def test_a_source_connector_waits_for_credits_and_resumes_where_the_live_worker_says() -> None:
    frames = list(recording.frames(recording.find(CAPTURES / "source-session.pcap")))
    ours = [f for f in frames if f.sender == "connector"]
    adapter = Adapter("connector")
    assert adapter.outgoing(ours[0]) == ours[0].raw  # HELLO
    adapter.incoming({"type": "OK", "initial_credits": 2}, OK_2)
    notify_orders, notify_payments, first_message = ours[1], ours[2], ours[3]
    assert (notify_orders.type, notify_payments.type, first_message.record["message_id"]) == (
        "NOTIFY",
        "NOTIFY",
        1,
    )
    assert adapter.outgoing(notify_orders) == notify_orders.raw
    assert adapter.outgoing(notify_payments) == notify_payments.raw
    assert isinstance(adapter.outgoing(first_message), Hold)  # two credits, both spent
    adapter.incoming({"type": "ACK", "credits": 5}, ACK_5)
    adapter.incoming(
        {"type": "NOTIFY_ACK", "success": True, "stream_id": 11, "point_of_ref": 1}, _notify_ack(11, 1)
    )
    assert adapter.outgoing(first_message) == SKIP  # id 1 <= the live point of reference
    assert adapter.outgoing(ours[4]) == ours[4].raw  # id 2 goes


def test_an_acks_points_of_reference_are_compared_one_each_and_a_refill_not_at_all() -> None:
    both = {
        "type": "ACK",
        "credits": 0,
        "acks": [{"stream_id": 1, "point_of_ref": 5}, {"stream_id": 2, "point_of_ref": 7}],
    }
    assert [(u["stream_id"], u["point_of_ref"]) for u in units(both)] == [(1, 5), (2, 7)]
    assert units({"type": "ACK", "credits": 50, "acks": []}) == []


# --- end to end: real processes over loopback -------------------------------------------------


def _record_source_session(tmp_path, *worker_args: str) -> str:
    capture = tmp_path / "source.pcap"
    with Server(*WORKER, *worker_args) as worker:
        done = run_cli(
            "mock-source", "--connect", worker.address, "--count", "40", "--record", str(capture), "-q"
        )
        assert done.returncode == 0, done.stderr
    return str(capture)


@pytest.mark.e2e
def test_a_recorded_connector_matches_the_same_live_worker_and_a_refusal_is_found_where_it_shows(
    tmp_path,
) -> None:
    capture = _record_source_session(tmp_path)
    with Server(*WORKER) as worker:
        live = tmp_path / "live.pcapng"
        same = run_cli(
            "replay", capture, "--play", "client", "--connect", worker.address, "--record", str(live)
        )
    assert same.returncode == 0, same.stdout + same.stderr
    assert "the same" in same.stdout
    dissected = run_cli("dissect", str(live), "--strict")
    assert dissected.returncode == 0, dissected.stderr
    with Server(*WORKER, "--reject-streams", "stream-0") as worker:
        changed = run_cli(
            "replay", capture, "--play", "client", "--connect", worker.address, "--format", "json"
        )
    assert changed.returncode == 1, changed.stderr
    report = json.loads(changed.stdout)
    first = report["outcomes"][0]
    recorded_notify_ack = 7  # HELLO 4, OK 5, NOTIFY 6, its NOTIFY_ACK 7 (after the handshake's 3)
    assert (first["result"], first["type"], first["recorded_packet"]) == (
        "divergent",
        "NOTIFY_ACK",
        recorded_notify_ack,
    )
    assert first["fields"][0] == {"field": "success", "recorded": True, "live": False}


@pytest.mark.e2e
def test_a_recorded_worker_played_as_the_server_matches_a_live_mock_source(tmp_path) -> None:
    capture = _record_source_session(tmp_path)
    live = tmp_path / "live.pcapng"
    # mock-source stamps each MESSAGE with the time it sends it: a field of this source's that differs.
    args = ("--listen", "127.0.0.1:0", "--record", str(live), "--ignore", "event_time")
    replay = Server("replay", capture, "--play", "server", *args)
    with replay:
        source = run_cli("mock-source", "--connect", replay.address, "--count", "40", "-q")
        code, out, err = replay.stop(sig=None)
    assert source.returncode == 0, source.stderr
    assert code == 0, out + err
    assert "the same" in out


@pytest.mark.e2e
def test_a_recorded_worker_drives_a_live_mock_sink_to_the_recorded_votes(tmp_path) -> None:
    with Server("mock-sink", "--port", "0", "-o", str(tmp_path / "out")) as sink:
        played = run_cli(
            "replay", str(CAPTURES / "sink-2pc.pcap"), "--play", "worker", "--connect", sink.address, "-v"
        )
    assert played.returncode == 0, played.stdout + played.stderr
    assert played.stdout.count("matched MESSAGE") == 3  # REPLY_UNCOMMITTED, a commit vote, an abort vote


@pytest.mark.e2e
def test_replay_says_who_is_missing_with_exit_2(tmp_path) -> None:
    with Server(*WORKER) as worker:
        port = worker.port
    done = run_cli(
        "replay", str(CAPTURES / "source-session.pcap"), "--play", "client", "--connect", f"127.0.0.1:{port}"
    )
    assert done.returncode == 2
    assert done.stderr.startswith("wallaroo-proto replay: cannot connect to 127.0.0.1:")
    unknown = run_cli("replay", str(CAPTURES / "kinesis-session.pcap"), "--play", "daemon", "--connect", ":1")
    assert unknown.returncode == 2 and "pick one with --connection" in unknown.stderr


# --- diff --------------------------------------------------------------------------------------


def test_diff_of_a_capture_with_itself_is_the_same() -> None:
    done = run_cli("diff", str(CAPTURES / "sink-2pc.pcap"), str(CAPTURES / "sink-2pc.pcap"))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.e2e
def test_diff_finds_a_changed_answer_at_its_packet(tmp_path) -> None:
    with Server(*WORKER, "--credits", "7") as worker:
        live = tmp_path / "live.pcapng"
        source = str(CAPTURES / "source-session.pcap")
        run_cli("replay", source, "--play", "client", "--connect", worker.address, "--record", str(live))
    done = run_cli("diff", str(CAPTURES / "source-session.pcap"), str(live), "--format", "json")
    assert done.returncode == 1
    first = json.loads(done.stdout)["outcomes"][0]
    assert (first["type"], first["recorded_packet"], first["fields"][0]["field"]) == (
        "OK",
        5,
        "initial_credits",
    )
    assert first["fields"][0]["live"] == 7
    other = run_cli("diff", str(CAPTURES / "source-session.pcap"), str(CAPTURES / "dcp-stream.pcap"))
    assert other.returncode == 2 and "holds wallaroo" in other.stderr


def test_replay_help_runs() -> None:
    done = subprocess.run([*COMMAND, "replay", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--learn-noise" in done.stdout
