"""replay and diff: the shared engine (recording, comparison) and Wallaroo end to end.

The end-to-end tests record a conversation of our own mock pair, then play one side of it
against a fresh live peer over loopback: the same peer must match it (exit 0), a peer
started with a fault must be reported at the frame where the change first shows (exit 1).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
from collections import defaultdict

import pytest
from scapy.all import TCP, rdpcap
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.wallaroo.replay import Adapter, units
from wallaroo_proto.replay import live, recording
from wallaroo_proto.replay.adapter import SKIP, Hold
from wallaroo_proto.replay.compare import Matcher, Result, differences
from wallaroo_proto.replay.live import Transcript

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
    bad = {"type": "X", "verdict": "violation", "violations": ["bad"]}
    assert matcher.seen(bad) is None  # its recorded frame may still be walked to
    assert matcher.expect(4, {"type": "X"}).result is Result.VIOLATION
    assert matcher.seen(dict(bad)) is None
    matcher.expect(2, {"type": "N"})
    matcher.give_up_all("gone")
    counts = matcher.counts
    assert (counts[Result.MISSING], counts[Result.EXTRA], counts[Result.VIOLATION]) == (1, 1, 2)
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


def _matched(first: list[dict], second: list[dict]) -> Matcher:
    matcher = Matcher(frozenset(), key=lambda r: (r["n"],))
    for index, record in enumerate(first):
        matcher.expect(index, record)
    for record in second:
        matcher.seen(record)
    matcher.give_up_all("not in the second")
    return matcher


def test_two_runs_are_matched_in_any_order_and_what_one_lacks_is_missing() -> None:
    first = [{"type": "M", "n": i} for i in range(10)]
    assert _matched(first, list(reversed(first))).counts[Result.MATCHED] == 10
    matcher = _matched(first, first[:7])
    assert (matcher.counts[Result.MATCHED], matcher.counts[Result.MISSING]) == (7, 3)


def test_a_frame_given_up_is_forgotten_so_keys_never_seen_hold_nothing() -> None:
    matcher = Matcher(frozenset(), key=lambda r: (r["n"],))
    for n in range(1000):
        matcher.expect(n, {"type": "M", "n": n})
    matcher.give_up_all("gone")
    assert matcher.counts[Result.MISSING] == 1000
    assert not matcher._by_key


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


# --- the live transcript --------------------------------------------------------------------

#: HELLO(version "0.0.1", no cookie, program "p", instance "i") and OK(100), from the spec's layouts:
#: u32 length, u8 type, then each text a u16 length and its bytes.
HELLO = b"\x00\x00\x00\x10\x00" + b"\x00\x050.0.1" + b"\x00\x00" + b"\x00\x01p" + b"\x00\x01i"
OK_100 = b"\x00\x00\x00\x05\x01\x00\x00\x00\x64"


def test_the_live_recording_keeps_a_comment_decided_after_later_packets_were_judged(tmp_path) -> None:
    path = tmp_path / "live.pcapng"
    transcript = Transcript("wallaroo", [7100], str(path))
    transcript.open(1, ("127.0.0.1", 5000), ("127.0.0.1", 7100))
    transcript.sent(1, True, HELLO)
    transcript.sent(1, False, OK_100)
    records = transcript.records()
    assert [r["type"] for r in records] == ["HELLO", "OK"]
    ok_packet = records[1]["packet"]
    transcript.flush(before=ok_packet)  # the OK waits to be matched: its packet is held
    transcript.comment(ok_packet, "decided late")
    transcript.close()
    done = run_cli("dissect", str(path), "-T", "jsonl")
    ok = [json.loads(line) for line in done.stdout.splitlines() if '"OK"' in line]
    assert ok[0]["notes"] == ["decided late"], done.stdout


def test_the_live_recording_holds_a_bounded_number_of_packets_for_late_comments(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(live, "MAX_HELD", 2)
    path = tmp_path / "live.pcapng"
    transcript = Transcript("wallaroo", [7100], str(path))
    transcript.open(1, ("127.0.0.1", 5000), ("127.0.0.1", 7100))  # the handshake: packets 1-3
    transcript.sent(1, True, HELLO)  # packet 4
    transcript.sent(1, False, OK_100)  # packet 5
    transcript.records()
    transcript.flush(before=1)  # a frame of packet 1 still waits: only the bound lets packets go
    assert len(transcript._tee.held) == 2
    transcript.comment(1, "decided late")  # its packet is written already
    transcript.close()
    done = run_cli("dissect", str(path), "-T", "jsonl")
    hello = [json.loads(line) for line in done.stdout.splitlines() if '"HELLO"' in line]
    assert hello[0]["notes"] == ["(live packet 1) decided late"], done.stdout  # the next written


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
    changed_live = tmp_path / "changed.pcapng"
    with Server(*WORKER, "--reject-streams", "stream-0") as worker:
        args = ("--connect", worker.address, "--format", "json", "--record", str(changed_live))
        changed = run_cli("replay", capture, "--play", "client", *args)
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
    # the live recording opens in tshark, with the comment on the packet that differs, and in report
    shown = subprocess.run(
        ["tshark", "-r", str(changed_live), "-T", "fields", "-e", "frame.number", "-e", "frame.comment"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    comments = dict(line.split("\t", 1) for line in shown.stdout.splitlines() if "\t" in line)
    assert "divergent NOTIFY_ACK" in comments[str(first["live_packet"])]
    page = run_cli("report", str(changed_live), "-o", str(tmp_path / "report.html"))
    assert page.returncode == 0, page.stderr


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
def test_learnt_noise_is_what_differs_between_runs_against_the_same_peer(tmp_path) -> None:
    """Without --ignore: two learning runs find mock-source's send times (event_time) differ, and
    the replay proper passes over them."""
    capture = _record_source_session(tmp_path)
    with Server(
        "replay", capture, "--play", "server", "--listen", "127.0.0.1:0", "--learn-noise", "2"
    ) as replay:
        for _ in range(3):  # two learning runs, then the replay
            source = run_cli("mock-source", "--connect", replay.address, "--count", "40", "-q")
            assert source.returncode == 0, source.stderr
        code, out, err = replay.stop(sig=None)
    assert code == 0, out + err
    assert "learnt from 2 runs, ignored: event_time" in err
    assert "the same" in out


@pytest.mark.e2e
def test_rate_recorded_keeps_the_recordings_pace(tmp_path) -> None:
    capture = tmp_path / "paced.pcap"
    with Server(*WORKER) as worker:
        args = ("--connect", worker.address, "--count", "30", "--rate", "100", "--record", str(capture), "-q")
        assert run_cli("mock-source", *args).returncode == 0
    times = [frame.record["ts"] for frame in recording.frames(recording.find(capture))]
    span = max(times) - min(times)
    assert span > 0.2  # 30 messages at 100 a second
    with Server(*WORKER) as worker:
        paced = run_cli("replay", str(capture), "--play", "client", "--connect", worker.address,
                        "--rate", "recorded", "--format", "json")  # fmt: skip
    assert paced.returncode == 0, paced.stdout + paced.stderr
    assert json.loads(paced.stdout)["seconds"] >= 0.9 * span
    bad = run_cli("replay", str(capture), "--play", "client", "--connect", ":1", "--rate", "fast")
    assert bad.returncode == 2 and "give recorded, xN" in bad.stderr


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
    with socket.socket() as taken:  # a port held, never listening: nobody accepts on it
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        source = str(CAPTURES / "source-session.pcap")
        done = run_cli("replay", source, "--play", "client", "--connect", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert done.stderr.startswith("wallaroo-proto replay: cannot connect to 127.0.0.1:")
    unknown = run_cli("replay", str(CAPTURES / "kinesis-session.pcap"), "--play", "daemon", "--connect", ":1")
    assert unknown.returncode == 2 and "pick one with --connection" in unknown.stderr


@pytest.mark.e2e
def test_an_interrupted_replay_says_so_in_one_line_with_130(tmp_path) -> None:
    args = ("--play", "server", "--listen", "127.0.0.1:0", "--answer-timeout", "600")
    with Server("replay", str(CAPTURES / "source-session.pcap"), *args) as replay:
        code, _, err = replay.stop(signal.SIGINT)
    assert code == 130
    assert err.strip() == "wallaroo-proto replay: interrupted"


class FakePeer:
    """A TCP peer written here, for what no mock does on purpose: it accepts one connection, then
    ``script(conn)`` runs in a thread (answering, keeping silent, chattering)."""

    def __init__(self, script) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()

        def serve() -> None:
            conn, _ = self.server.accept()
            with conn:
                script(conn, self.stop)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def __enter__(self) -> FakePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.close()
        self.thread.join(timeout=30)


def _answers_hello_then_chatters(conn: socket.socket, stop: threading.Event) -> None:
    """OK(20) to the HELLO, then a refill ACK (0 credits, no points) every 0.2 s: frames that
    are never compared, and never the NOTIFY_ACK the recording holds."""
    conn.recv(1 << 16)
    conn.sendall(b"\x00\x00\x00\x05\x01\x00\x00\x00\x14")
    while not stop.wait(0.2):
        try:
            conn.sendall(ACK_0)
        except OSError:
            return


ACK_0 = b"\x00\x00\x00\x09\x06" + bytes(8)  # ACK(0 credits, 0 points of reference)


@pytest.mark.e2e
def test_frames_that_are_never_compared_do_not_keep_an_answer_waiting() -> None:
    with FakePeer(_answers_hello_then_chatters) as peer:
        args = ("--connect", f"127.0.0.1:{peer.port}", "--answer-timeout", "1", "--format", "json")
        done = run_cli("replay", str(CAPTURES / "source-session.pcap"), "--play", "client", *args, timeout=60)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert [o["type"] for o in report["outcomes"] if o["result"] == "missing"][:1] == ["NOTIFY_ACK"]


@pytest.mark.e2e
def test_a_peer_that_stops_answering_costs_two_deadlines_not_one_an_answer() -> None:
    def silent(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait(60)

    with FakePeer(silent) as peer:
        args = ("--connection", "1", "--connect", f"127.0.0.1:{peer.port}", "--answer-timeout", "1")
        done = run_cli("replay", str(CAPTURES / "tremor-session.pcap"), "--play", "client", *args,
                       "--format", "json", timeout=60)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    reasons = [o.get("reason", "") for o in report["outcomes"] if o["result"] == "missing"]
    assert sum("no answer within 1 s" in r for r in reasons) == 2  # then no more waits
    assert sum("sent nothing through two answers' deadlines" in r for r in reasons) > 10


def test_a_connector_before_the_live_ok_holds_its_notify() -> None:
    frames = list(recording.frames(recording.find(CAPTURES / "source-session.pcap")))
    adapter = Adapter("connector")
    ours = [f for f in frames if f.sender == "connector"]
    assert adapter.outgoing(ours[0]) == ours[0].raw  # the HELLO goes
    assert isinstance(adapter.outgoing(ours[1]), Hold)  # its NOTIFY waits for the OK


@pytest.mark.e2e
def test_bad_output_and_command_lines_are_one_line_with_exit_2(tmp_path) -> None:
    capture = str(CAPTURES / "source-session.pcap")
    with Server(*WORKER) as worker:
        unwritable = run_cli("replay", capture, "--play", "client", "--connect", worker.address,
                             "--record", str(tmp_path / "no-such-folder" / "x.pcapng"))  # fmt: skip
    assert unwritable.returncode == 2
    assert unwritable.stderr.startswith("wallaroo-proto replay: cannot write --record"), unwritable.stderr
    kinesis = str(CAPTURES / "kinesis-session.pcap")
    quote = run_cli("replay", kinesis, "--connection", "1", "--play", "daemon", "--spawn", "python 'unclosed")
    assert quote.returncode == 2 and "Traceback" not in quote.stderr, quote.stderr


@pytest.mark.e2e
def test_a_recording_with_a_lost_segment_stops_where_its_bytes_were_not_captured() -> None:
    with Server(*WORKER) as worker:
        args = ("--connect", worker.address, "--format", "json", "--answer-timeout", "3")
        done = run_cli("replay", str(CAPTURES / "lost-segment.pcap"), "--play", "client", *args)
    assert done.returncode == 1, done.stderr
    assert "lies past a lost segment" in json.loads(done.stdout)["stopped"]


def test_diff_of_a_capture_cut_short_compares_what_came_before_and_says_so(tmp_path) -> None:
    cut = tmp_path / "cut.pcap"
    cut.write_bytes((CAPTURES / "source-session.pcap").read_bytes()[:1500])  # inside packet 15
    done = run_cli("diff", str(cut), str(cut), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "packet 15" in report["notes"][0] and report["counts"]["matched"] == 13


def test_diff_reads_each_capture_once() -> None:
    capture = str(CAPTURES / "sink-2pc.pcap")  # 18 frames
    done = run_cli("diff", capture, capture, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["frames"] == [18, 18]


# --- diff --------------------------------------------------------------------------------------


def test_diff_of_a_capture_with_itself_is_the_same() -> None:
    done = run_cli("diff", str(CAPTURES / "sink-2pc.pcap"), str(CAPTURES / "sink-2pc.pcap"))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.e2e
def test_diff_finds_a_changed_answer_at_its_packet(tmp_path) -> None:
    with Server(*WORKER, "--credits", "7") as worker:
        live = tmp_path / "live.pcapng"
        source = str(CAPTURES / "source-session.pcap")
        args = ("--connect", worker.address, "--record", str(live), "--answer-timeout", "3")
        run_cli("replay", source, "--play", "client", *args)  # the sample's later answers never come
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
