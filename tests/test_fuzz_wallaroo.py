"""fuzz for the Wallaroo connector protocol: its hooks against bytes written by hand from the
spec, and campaigns against our own mocks over loopback.

The planted break is mock-worker's, behind ``WALLAROO_PROTO_PLANT=worker-takes-connector-ack``
(a test-only switch): an ACK from a connector, which the worker must refuse with ERROR
(PROTOCOL-NOTES.md), is passed over instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import COMMAND, Server, run_cli
from test_conformance import free_port

from wallaroo_proto.fuzz.hooks import Hooks, Owed
from wallaroo_proto.fuzz.oracle import judge
from wallaroo_proto.protocols.wallaroo import fuzz as hooks
from wallaroo_proto.protocols.wallaroo.codec import decode
from wallaroo_proto.protocols.wallaroo.errors import ProtocolError

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CLI = shlex.join(COMMAND)

# Frames by hand (connector-protocol-v3.md): u32 length of what follows, u8 type, body.
OK_500 = bytes.fromhex("00000005 01 000001f4")
# NOTIFY: u64 stream id 7, u16 name length 1, "s", u64 point of reference 9.
NOTIFY_7 = bytes.fromhex("00000014 03 0000000000000007 0001 73 0000000000000009")
# ACK: u32 credits 10, u32 count 1, (u64 stream 7, u64 point 8000).
ACK_7_8000 = bytes.fromhex("00000019 06 0000000a 00000001 0000000000000007 0000000000001f40")
# MESSAGE: stream 7, id 3, event time 0, u16 key length 0, payload "x".
MESSAGE_7_3 = bytes.fromhex("0000001a 05 0000000000000007 0000000000000003 0000000000000000 0000 78")


def by_name(record: dict, raw: bytes) -> dict[str, tuple[int, int, str]]:
    return {f.name: (f.offset, f.value, f.kind) for f in hooks.fields(record, raw)}


def test_the_fields_lie_where_the_spec_puts_them() -> None:
    assert by_name({"type": "OK"}, OK_500) == {
        "length": (0, 5, "length"),
        "type": (4, 1, "enum"),
        "initial_credits": (5, 500, "credit"),
    }
    notify = by_name({"type": "NOTIFY"}, NOTIFY_7)
    assert notify["stream_id"] == (5, 7, "id")
    assert notify["stream_name_length"] == (13, 1, "length")
    assert notify["point_of_ref"] == (16, 9, "id")
    ack = by_name({"type": "ACK"}, ACK_7_8000)
    assert ack["credits"] == (5, 10, "credit") and ack["count"] == (9, 1, "count")
    assert ack["ack_stream_id"] == (13, 7, "id") and ack["ack_point_of_ref"] == (21, 8000, "id")
    message = by_name({"type": "MESSAGE"}, MESSAGE_7_3)
    assert message["message_id"] == (13, 3, "id") and message["key_length"] == (29, 0, "length")


def test_a_value_is_written_over_its_field() -> None:
    wallaroo = Hooks("wallaroo")
    credits = next(f for f in wallaroo.fields({"type": "ACK"}, ACK_7_8000) if f.name == "credits")
    assert wallaroo.with_value({}, ACK_7_8000, credits, 0xFFFFFFFF) == bytes.fromhex(
        "00000019 06 ffffffff 00000001 0000000000000007 0000000000001f40"
    )


def test_each_template_decodes_as_the_type_it_is_named() -> None:
    templates = hooks.templates("worker")
    assert set(templates) == {
        "HELLO",
        "OK",
        "ERROR",
        "NOTIFY",
        "NOTIFY_ACK",
        "MESSAGE",
        "ACK",
        "RESTART",
        "EOS_MESSAGE",
    }
    for name, raw in templates.items():
        assert int.from_bytes(raw[:4], "big") == len(raw) - 4
        assert type(decode(raw[4:])).__name__.upper().replace("_", "") == name.replace("_", "")
    assert templates["RESTART"] == bytes.fromhex("00000001 07")  # the spec's empty RESTART


def test_what_a_peer_owes_and_how_a_worker_refuses() -> None:
    assert hooks.owed({"type": "HELLO"}) == Owed(frozenset({"OK", "ERROR"}))
    assert hooks.owed({"type": "NOTIFY"}) == Owed(frozenset({"NOTIFY_ACK", "ERROR"}))
    assert hooks.owed({"type": "RESTART"}) == Owed(reconnect=True)
    assert hooks.owed({"type": "MESSAGE"}) is None
    for asked in ("PHASE1", "LIST_UNCOMMITTED"):  # their answers ride stream-0 MESSAGEs
        assert hooks.owed({"type": "MESSAGE", "twopc": asked}) == Owed(frozenset({"MESSAGE", "ERROR"}))
    assert hooks.refusal({"type": "ERROR"}) and not hooks.refusal({"type": "OK"})
    assert {"worker"} == hooks.REPLY_BEFORE_CLOSE


def test_a_frame_illegal_only_because_the_peer_s_answer_was_in_flight_is_no_finding() -> None:
    """Our MESSAGE went before the worker's NOTIFY_ACK came: illegal in our order, legal in the
    worker's (it answered before it read the MESSAGE), so it cannot refuse it. Seen against
    mock-worker and mock-sink as `accepted`. Nothing in flight: the same frame is a finding."""
    wallaroo = Hooks("wallaroo")
    notify, ack = ("ours", {"type": "NOTIFY", "verdict": "accepted"}), ("peer", {"type": "NOTIFY_ACK"})
    message = ("ours", {"type": "MESSAGE", "verdict": "violation", "violations": ["stream is Notify-Sent"]})
    ends = [("we-end", 1, "closed"), ("end", 1, "closed")]
    crossed = judge([notify, message, ack, *ends], wallaroo, "worker")
    assert crossed.findings == []
    after = judge([notify, ack, message, ("peer", {"type": "ACK"}), *ends], wallaroo, "worker")
    assert [f.kind for f in after.findings] == ["accepted"]


FRAMES = [("OK", OK_500), ("NOTIFY", NOTIFY_7), ("ACK", ACK_7_8000), ("MESSAGE", MESSAGE_7_3)]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FRAMES), st.data(), st.integers(0, 2**64 - 1))
def test_any_value_in_any_field_gives_bytes_the_codec_decodes_or_refuses(frame, data, value) -> None:
    kind, raw = frame
    wallaroo = Hooks("wallaroo")
    field = data.draw(st.sampled_from(wallaroo.fields({"type": kind}, raw)))
    changed = wallaroo.with_value({}, raw, field, value)
    assert len(changed) == len(raw)
    with contextlib.suppress(ProtocolError):  # a clear refusal: what the judge reports as malformed
        decode(changed[4:])


# --- campaigns against our mocks -----------------------------------------------------------------


def fuzz(*args: str, env: dict | None = None, timeout: float = 300) -> tuple[int, dict, str]:
    result = run_cli("fuzz", *args, "--format", "json", timeout=timeout, env={**os.environ, **(env or {})})
    lines = result.stdout.strip().splitlines()
    return result.returncode, json.loads(lines[-1]) if lines else {}, result.stderr


@pytest.fixture(scope="module")
def source_seed(tmp_path_factory) -> Path:
    """A connector's conversation recorded with mock-worker: mock-source streaming a sample."""
    folder = tmp_path_factory.mktemp("seed")
    capture = folder / "source.pcap"
    with Server("mock-worker", "--port", "0", "--no-live", "--record", str(capture)) as worker:
        done = run_cli("mock-source", str(SAMPLES / "orders.txt"), "--connect", worker.address)
        assert done.returncode == 0, done.stderr
        assert worker.stop()[0] == 0
    return capture


def worker_campaign(
    seed: Path, tmp_path: Path, plant: str | None, budget: str, *extra: str
) -> tuple[int, dict, str]:
    env = {"WALLAROO_PROTO_PLANT": plant} if plant else {}
    with Server("mock-worker", "--port", "0", "--no-live", env=env) as worker:
        # the variable must not reach fuzz's own spawn: it is the mock's
        return fuzz(
            "--seeds", str(seed), "--play", "connector", "--connect", worker.address,
            "--budget", budget, "--seed", "7", "--findings", str(tmp_path / "found"), *extra,
        )  # fmt: skip


@pytest.mark.e2e
def test_mock_worker_has_no_finding(source_seed, tmp_path) -> None:
    graph = tmp_path / "states.dot"
    code, summary, err = worker_campaign(source_seed, tmp_path, None, "1500", "--states", str(graph))
    assert code == 0, (summary.get("findings"), err)
    assert summary["executions"] == 1500 and summary["states"] >= 20
    dot = graph.read_text()
    assert dot.startswith("digraph states {") and dot.count(" -> ") == summary["states"]
    assert '"start" -> "OK" [label="HELLO (' in dot


@pytest.mark.e2e
def test_the_planted_break_in_mock_worker_is_found_shrunk_and_replayable(source_seed, tmp_path) -> None:
    # the deterministic stage inserts the connector's ACK template in each state early on; without
    # the plant there is no finding (above), so the first is the planted one and ends the campaign
    plant = "worker-takes-connector-ack"
    code, summary, err = worker_campaign(source_seed, tmp_path, plant, "600", "--stop-after", "1")
    assert code == 1, err
    assert summary["notes"] == ["stopped after 1 finding (--stop-after)"], summary
    [finding] = summary["findings"]
    assert finding["kind"] == "accepted", finding
    assert "ACK may only be sent by the worker" in finding["detail"]
    assert finding["confirmed"] == "3 of 3" and finding["frames"] <= 6
    capture = finding["reproducer"]
    shown = run_cli("dissect", capture, "--strict", "--format", "jsonl")  # its ports are the protocol's own
    assert shown.returncode == 1, shown.stderr  # our illegal ACK is a violation: exit 1, not 2
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(r["type"] == "ACK" and r["sender"] == "connector" for r in rows)
    if shutil.which("tshark"):
        opened = subprocess.run(
            ["tshark", "-r", capture, "-c", "1"], capture_output=True, text=True, timeout=120
        )
        assert opened.returncode == 0, opened.stderr
    report = run_cli("report", capture, "-o", str(tmp_path / "report.html"))
    assert report.returncode in (0, 1), report.stderr
    with Server(
        "mock-worker", "--port", "0", "--no-live", env={"WALLAROO_PROTO_PLANT": "worker-takes-connector-ack"}
    ) as worker:
        again = run_cli("fuzz", "--rerun", capture, "--play", "connector", "--connect", worker.address)
        replayed = run_cli("replay", capture, "--play", "connector", "--connect", worker.address)
    assert again.returncode == 1 and "accepted" in again.stdout, again.stdout + again.stderr
    assert replayed.returncode in (0, 1), replayed.stderr  # replay plays it (a fresh run differs in timing)


FINDINGS = sorted((Path(__file__).resolve().parents[1] / "captures" / "findings").glob("*.pcapng"))


@pytest.mark.parametrize("capture", FINDINGS, ids=[p.name for p in FINDINGS])
def test_the_committed_findings_open_in_dissect_with_their_changed_frame_noted(capture) -> None:
    shown = run_cli("dissect", str(capture), "--format", "jsonl")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert rows and any("fuzz: " in note for r in rows for note in r.get("notes") or ()), rows[:3]


@pytest.mark.e2e
def test_a_server_that_dies_mid_campaign_is_a_crash_and_the_health_check_ends_the_campaign(
    source_seed, tmp_path
) -> None:
    from wallaroo_proto.fuzz import engine
    from wallaroo_proto.replay.recording import find

    seed = engine.load_seed(find(source_seed), "seed", 50)
    worker = Server("mock-worker", "--port", "0", "--no-live")
    settings = engine.Settings(
        side="connector",
        connect=[("127.0.0.1", worker.port)],
        budget_seconds=120,
        findings_dir=str(tmp_path / "f"),
    )

    def kill_once(summary: engine.Summary) -> None:
        if worker.proc.poll() is None:
            worker.kill()

    campaign = engine.Campaign([seed], settings, progress=kill_once)
    campaign.peer.start_timeout = 2  # the health check's wait for it to come back
    summary = campaign.run()
    assert summary.seconds < 100, summary.as_dict()  # ended by the health check, not the budget
    assert any(
        f.finding.kind == "crash" and "stopped taking connections" in f.finding.detail for f in summary.found
    )
    assert summary.notes and "no longer takes connections" in summary.notes[0]


# --- our other mocks: what fuzz found in them is fixed (docs/wallaroo.md#fuzzing) ----------------


@pytest.fixture(scope="module")
def sink_seed(tmp_path_factory) -> Path:
    """A worker's conversation with mock-sink, recorded by mock-worker driving it: three rounds."""
    folder = tmp_path_factory.mktemp("sink-seed")
    capture = folder / "sink.pcap"
    with Server("mock-sink", "--listen", "127.0.0.1:0", "-o", str(folder / "out")) as sink:
        done = run_cli(
            "mock-worker", "--no-live", "--sink-connect", sink.address, "--input", "gen:30",
            "--checkpoint-every", "10", "--sink-record", str(capture),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return capture


def clean(code: int, summary: dict, err: str, floor: int = 12) -> None:
    assert code == 0, (summary.get("findings"), err)
    assert summary["executions"] >= floor, summary


@pytest.mark.e2e
def test_mock_sink_started_afresh_for_each_case_has_no_finding(sink_seed, tmp_path) -> None:
    """Its REPLYs come late (it fsyncs first): a REPLY after the worker decided was once judged
    a violation by the core."""
    port, out = free_port(), tmp_path / "out"
    spawn = f"{CLI} mock-sink --listen 127.0.0.1:{port} -o {out} -q"
    clean(*fuzz(
        "--seeds", str(sink_seed), "--play", "worker", "--connect", f"127.0.0.1:{port}",
        "--spawn", spawn, "--reset-cmd", f"rm -rf {out}", "--budget", "12", "--seed", "3",
        "--findings", str(tmp_path / "found"),
    ))  # fmt: skip


@pytest.mark.e2e
def test_mock_source_started_for_each_case_has_no_finding(source_seed, tmp_path) -> None:
    """It once answered the bytes after a RESTART with ERROR and gave up, read in one chunk."""
    spawn = f"{CLI} mock-source {shlex.quote(str(SAMPLES / 'orders.txt'))} --connect 127.0.0.1:{{port}}"
    clean(*fuzz(
        "--seeds", str(source_seed), "--play", "worker", "--listen", "127.0.0.1:0", "--spawn", spawn,
        "--budget", "12", "--seed", "3", "--findings", str(tmp_path / "found"),
    ))  # fmt: skip


@pytest.mark.e2e
def test_mock_worker_driving_a_sink_has_no_finding(sink_seed, tmp_path) -> None:
    """It once closed on a sink's illegal frame without the ERROR a worker owes."""
    spawn = (
        f"{CLI} mock-worker --no-live --sink-connect 127.0.0.1:{{port}} --input gen:30 --checkpoint-every 10"
    )
    clean(*fuzz(
        "--seeds", str(sink_seed), "--play", "connector", "--listen", "127.0.0.1:0", "--spawn", spawn,
        "--budget", "12", "--seed", "3", "--findings", str(tmp_path / "found"),
    ))  # fmt: skip


@pytest.mark.e2e
def test_a_finding_that_was_only_late_is_dropped_at_confirmation(source_seed, tmp_path) -> None:
    """Confirmation waits four times the answer timeout: an OK that comes late is no `silent`."""
    from wallaroo_proto.fuzz import engine
    from wallaroo_proto.fuzz.oracle import Finding
    from wallaroo_proto.replay.recording import find

    seed = engine.load_seed(find(source_seed), "seed", 50)
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        settings = engine.Settings(side="connector", connect=[("127.0.0.1", worker.port)], confirm=2)
        campaign = engine.Campaign([seed], settings)
        seen_patience = []
        played = campaign.execute

        def execute(mutant, record=None):
            seen_patience.append(campaign._patience)
            return played(mutant, record)

        campaign.execute = execute
        late = Finding("silent", "start", "none", "silent", "no OK or ERROR for our HELLO")
        campaign._consider(late, engine.Mutant(0), set())
        campaign.peer.stop()
    assert seen_patience == [4.0, 4.0]  # both confirmations with 4x the 0.5 s answer timeout
    assert campaign.summary.unconfirmed == 1 and campaign.summary.found == []
    assert campaign._patience == 1.0
