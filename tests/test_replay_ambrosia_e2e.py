"""``replay`` of an AMBROSIA conversation over real loopback sockets: a session of mock-ic and
mock-lb is recorded, then each side is played against a live mock of the other, plain and
with a planted change (a mock's own fault options) that must show at its recorded frame.

mock-lb sends the self calls of one read in one RPCBatch, so how its reads fall decides its
batches, run by run: the replay compares its RPCs one by one.
"""

from __future__ import annotations

import json
import re
import select
import shutil
import signal
import subprocess

import pytest
from support import COMMAND, Server, run_cli, wait_for

from wallaroo_proto.replay import engine, links
from wallaroo_proto.replay.recording import find

pytestmark = pytest.mark.e2e

PORTS = re.compile(r"receive port (\d+), send port (\d+)")
SESSION = ("--rpcs", "200", "--batch", "10", "--checkpoint-every", "3")


def start_ic(*args: str) -> tuple[Server, int, int]:
    ic = Server("ambrosia", "mock-ic", "--format", "json", "--exit-when-done", *SESSION, *args)
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    return ic, rport, sport


def start_lb(rport: int, sport: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *COMMAND,
            "ambrosia",
            "mock-lb",
            "--connect",
            f"127.0.0.1:{rport}",
            "--send-connect",
            f"127.0.0.1:{sport}",
            "-q",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def frames_of(capture) -> list[dict]:
    done = run_cli("dissect", str(capture), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, list[dict]]:
    """A first start of mock-ic and mock-lb, recorded by mock-ic: (capture, its frames)."""
    capture = tmp_path_factory.mktemp("ambrosia-replay") / "session.pcap"
    ic, rport, sport = start_ic("--record", str(capture))
    lb = start_lb(rport, sport)
    _, lb_err = lb.communicate(timeout=120)
    code, _, ic_err = ic.stop(sig=None, timeout=120)
    assert (code, lb.returncode) == (0, 0), ic_err + lb_err
    frames = frames_of(capture)
    assert not [f for f in frames if f.get("verdict") == "violation"]
    return str(capture), frames


def replay(capture: str, *args: str) -> tuple[int, dict, str]:
    done = run_cli("replay", capture, "--format", "json", *args)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def sent_by(frames: list[dict], side: str) -> list[dict]:
    return [f for f in frames if f["sender"] == side]


def packet_of(frames: list[dict], seq: int) -> int:
    return next(f["packet"] for f in frames if f.get("seq_id") == seq and f["type"] == "Record")


def compared_of(frames: list[dict], side: str) -> int:
    """How many of ``side``'s frames are compared: an LB's RPCBatch stands for its RPCs."""
    return sum(f["rpc_count"] if f["type"] == "RPCBatch" else 1 for f in sent_by(frames, side))


def not_matched(report: dict) -> list[dict]:
    return [o for o in report["outcomes"] if o["result"] != "matched"]


def test_the_lb_side_against_a_live_mock_ic(recorded, tmp_path):
    capture, frames = recorded
    ic, rport, sport = start_ic()  # its own committer id, drawn at random
    with ic:
        live = tmp_path / "live.pcapng"
        code, report, err = replay(
            capture,
            "--play",
            "lb",
            "--connect",
            f"127.0.0.1:{rport}",
            "--connect",
            f"127.0.0.1:{sport}",
            "--record",
            str(live),
        )
        assert code == 0, (report, err)
        assert ic.stop(sig=None, timeout=120)[0] == 0
    assert report["counts"]["matched"] == len(sent_by(frames, "ic"))
    assert report["sent"] == len(sent_by(frames, "lb"))
    live_frames = frames_of(live)
    committers = {f["committer_id"] for f in sent_by(live_frames, "ic") if "committer_id" in f}
    assert len(committers) == 1 and committers != {frames[0]["committer_id"]}  # the live IC's, adapted to
    assert run_cli("dissect", str(live), "--strict").returncode == 0


def play_ic(capture: str, tmp_path, *lb_args: str) -> tuple[int, dict, int, str, list[dict]]:
    """The recording's IC played to a live mock-lb: (replay exit, its report, mock-lb exit, its
    stderr, the live run's frames)."""
    live = tmp_path / "live.pcapng"
    player = Server(
        "replay",
        capture,
        "--play",
        "ic",
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--format",
        "json",
        "--record",
        str(live),
    )
    with player:
        wait_for(lambda: len(re.findall(r"listening on \S+:(\d+)", "".join(player.lines))) == 2, "both ports")
        rport, sport = map(int, re.findall(r"listening on \S+:(\d+)", "".join(player.lines)))
        lb = start_lb(rport, sport, *lb_args)
        _, lb_err = lb.communicate(timeout=120)
        code, out, err = player.stop(sig=None, timeout=120)
    report = json.loads(out.splitlines()[-1])
    assert run_cli("dissect", str(live), "--strict").returncode == 0, "the live recording does not dissect"
    return code, report, lb.returncode, lb_err + err, frames_of(live)


def test_the_ic_side_to_a_live_mock_lb(recorded, tmp_path):
    capture, frames = recorded
    code, report, lb_code, err, _ = play_ic(capture, tmp_path)
    assert (code, lb_code) == (0, 0), (report, err)
    assert report["counts"]["matched"] == compared_of(frames, "lb")
    assert report["sent"] == len(sent_by(frames, "ic"))


def test_a_changed_lb_shows_at_its_initial_message_and_the_echo_follows_it(recorded, tmp_path):
    capture, frames = recorded
    changed_to = "another binding, v2"
    code, report, lb_code, err, live = play_ic(capture, tmp_path, "--initial-message", changed_to)
    assert code == 1
    # mock-lb checks every record's check bytes: the record echoing its InitialMessage was re-encoded
    assert lb_code == 0, err
    assert report["own_violations"] == []
    initial = next(f for f in frames if f["type"] == "InitialMessage")
    [changed] = not_matched(report)
    assert (changed["result"], changed["type"], changed["recorded_packet"]) == (
        "divergent",
        "InitialMessage",
        initial["packet"],
    )
    assert [f["field"] for f in changed["fields"]] == ["length"]
    # record 0 echoes the live InitialMessage: longer by as much (a one-byte size either way)
    grown = initial["length"] - 2
    grown = len(changed_to) - grown
    record_0 = next(f for f in frames if f.get("seq_id") == 0)
    live_0 = next(f for f in live if f.get("seq_id") == 0)
    assert live_0["record_size"] == record_0["record_size"] + grown


def test_wrong_check_bytes_at_the_live_ic_show_at_their_record(recorded, tmp_path):
    capture, frames = recorded
    ic, rport, sport = start_ic("--bad-check-at", "3")
    with ic:
        code, report, _ = replay(
            capture, "--play", "lb", "--connect", f"127.0.0.1:{rport}", "--connect", f"127.0.0.1:{sport}"
        )
    assert code == 1
    first = not_matched(report)[0]
    assert (first["result"], first["type"], first["recorded_packet"]) == (
        "violation",
        "Record",
        packet_of(frames, 3),
    )
    assert first["reason"].startswith("check-bytes:")
    assert report["counts"]["violation"] == 1


def test_a_sequence_gap_at_the_live_ic_shows_at_the_skipped_record(recorded, tmp_path):
    capture, frames = recorded
    ic, rport, sport = start_ic("--gap-at", "4")
    with ic:
        code, report, _ = replay(
            capture, "--play", "lb", "--connect", f"127.0.0.1:{rport}", "--connect", f"127.0.0.1:{sport}"
        )
    assert code == 1
    first = not_matched(report)[0]
    assert (first["type"], first["recorded_packet"]) == ("Record", packet_of(frames, 4))
    assert first["reason"].startswith("sequence-gap:")
    assert {"field": "seq_id", "recorded": 4, "live": 5} in first["fields"]


@pytest.fixture(scope="module")
def recovery(tmp_path_factory) -> tuple[str, list[dict], str]:
    """The IC killed -9 after logging record 3, then restarted on its log and recorded: the
    checkpoint record and its bytes, the replayed records, TakeBecomingPrimaryCheckpoint.
    (capture, its frames, a copy of the log as the crash left it)."""
    tmp_path = tmp_path_factory.mktemp("ambrosia-recovery")
    log, copy, capture = tmp_path / "log", tmp_path / "copy", str(tmp_path / "recovery.pcap")
    ic, rport, sport = start_ic("--log-dir", str(log), "--crash-at", "3")
    start_lb(rport, sport).communicate(timeout=120)
    assert ic.stop(sig=None, timeout=120)[0] == -signal.SIGKILL
    shutil.copytree(log, copy)
    ic, rport, sport = start_ic("--log-dir", str(log), "--record", capture)
    lb = start_lb(rport, sport)
    lb.communicate(timeout=120)
    assert (ic.stop(sig=None, timeout=120)[0], lb.returncode) == (0, 0)
    frames = frames_of(capture)
    assert [f["type"] for f in frames[:2]] == ["CheckpointRecord", "CheckpointBytes"]
    assert any(f.get("verdict") == "replayed" for f in frames)
    return capture, frames, str(copy)


def test_a_recovery_replays_both_ways(recovery, tmp_path):
    """The IC side is played to a new mock-lb; the LB side to a mock-ic on a copy of the log as
    the crash left it."""
    capture, frames, copy = recovery
    code, report, lb_code, err, _ = play_ic(capture, tmp_path)
    assert (code, lb_code) == (0, 0), (report, err)
    assert report["counts"]["matched"] == compared_of(frames, "lb")

    ic, rport, sport = start_ic("--log-dir", copy)
    with ic:
        code, report, err = replay(
            capture, "--play", "lb", "--connect", f"127.0.0.1:{rport}", "--connect", f"127.0.0.1:{sport}"
        )
    assert code == 0, (report, err)
    assert report["counts"]["matched"] == compared_of(frames, "ic")


def test_checkpoints_a_changed_lb_asks_for_are_extra_where_it_sent_them(recorded, tmp_path):
    """mock-lb asking for a checkpoint every 4 records (the recording's never asked): each
    TakeCheckpoint it sends is extra, at its live packet, and nothing else differs."""
    capture, frames = recorded
    code, report, lb_code, err, live = play_ic(capture, tmp_path, "--ask-checkpoint-every", "4")
    assert (code, lb_code) == (1, 0), err
    asked = [f for f in live if f["sender"] == "lb" and f["type"] == "TakeCheckpoint"]
    extras = not_matched(report)
    assert asked and {o["result"] for o in extras} == {"extra"}
    assert [(o["type"], o["live_packet"]) for o in extras] == [("TakeCheckpoint", f["packet"]) for f in asked]
    assert report["counts"]["matched"] == compared_of(frames, "lb")


class _SlowToTakeCheckpoint(engine.Player):
    """A player slow to make its TakeBecomingPrimaryCheckpoint: the live LB's answer to the
    replayed record before it is in by then, as on a loaded machine."""

    def _outgoing(self, frame, link):
        if frame.type == "TakeBecomingPrimaryCheckpoint":
            receive = self._live_order[0]  # the LB opens its receive socket first
            assert select.select([receive.read_fd], [], [], 60)[0], (
                "the LB never answered the replayed record"
            )
        return super()._outgoing(frame, link)


def test_an_lb_answering_at_once_is_read_after_what_the_ic_sent_before_it_was_answered(recovery):
    """The recorded IC sent TakeBecomingPrimaryCheckpoint right after the replayed record, before
    the LB's self calls answering that record came: played, its answer is read after it too, so
    the self calls are judged in the same phase (normal, not replay) as recorded."""
    capture, frames, _ = recovery
    kinds = [(f["sender"], f["type"]) for f in frames]
    assert kinds.index(("ic", "TakeBecomingPrimaryCheckpoint")) < kinds.index(("lb", "RPCBatch"))
    listeners = [links.Listener(("127.0.0.1", 0)) for _ in range(2)]
    lb = start_lb(*(listener.address[1] for listener in listeners))
    try:
        options = engine.Options("ic", listeners=listeners)
        report = _SlowToTakeCheckpoint(find(capture), options).run()
        _, lb_err = lb.communicate(timeout=120)
    finally:
        for listener in listeners:
            listener.close()
        if lb.poll() is None:
            lb.kill()
            lb.communicate()
    assert report.ok, ([o.text() for o in report.outcomes], lb_err)
    assert report.counts["matched"] == compared_of(frames, "lb")
