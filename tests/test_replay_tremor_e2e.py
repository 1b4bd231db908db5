"""Tremor replay over real loopback sockets: the recorded session's client played to mock-node, its
server played to our mock client, each against a peer changed on purpose, and a node whose
accept answers the recording's key instead of ours."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.tremor.node import NodeSession
from wallaroo_proto.protocols.tremor.peers import MockClient, MockNode, scripted_exchange
from wallaroo_proto.replay import engine, links
from wallaroo_proto.replay.recording import find, frames

pytestmark = pytest.mark.e2e

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SESSION = CAPTURES / "tremor-session.pcap"
#: The mock client's exchange the sample capture's first session was recorded from (make_samples.py).
RECORDED_EXCHANGE = ("--messages", "12", "--window", "4", "--payload-size", "8", "--publish", "3")
#: Seconds an answer is waited for: a loaded machine's, not a quick one's.
ANSWER = 30.0
#: Seconds an answer is waited for where a planted change means one never comes (the wait is the
#: test's time): still ample for a loopback answer.
NEVER = 5.0


def recorded(sender: str) -> list:
    """The recorded session's frames of one side (the answers a replay expects of that side)."""
    return [f for f in frames(find(SESSION, connections=("1",))) if f.sender == sender]


def play_client(port: int, capture: Path = SESSION, **options) -> engine.Report:
    conversation = find(capture, connections=("1",))
    opts = {"answer_timeout": ANSWER, **options}
    return engine.run(conversation, engine.Options(side="client", connect=[("127.0.0.1", port)], **opts))


def play_server_to_mock_client(
    *client_args: str, connection: str = "1", **options
) -> tuple[engine.Report, int, str]:
    """The recorded node played on a free port to ``tremor mock-client`` started as a process."""
    conversation = find(SESSION, connections=(connection,))
    listener = links.Listener(("127.0.0.1", 0))
    client = subprocess.Popen(
        [*COMMAND, "tremor", "mock-client", "--connect", f"127.0.0.1:{listener.address[1]}"]
        + ["--format", "json", "--idle-timeout", str(ANSWER), *client_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        opts = {"answer_timeout": ANSWER, **options}
        report = engine.run(conversation, engine.Options(side="server", listeners=[listener], **opts))
        out, _ = client.communicate(timeout=120)
    finally:
        listener.close()
        if client.poll() is None:
            client.kill()
            client.communicate()
    return report, client.returncode, out


def test_fragments_a_ping_between_them_and_long_lengths_replay_through_the_codec(tmp_path):
    """The framing sample: 16- and 64-bit lengths, a message in three fragments with a ping
    between them; each frame re-encoded (fresh masks) and every answer matched."""
    capture = CAPTURES / "tremor-framing.pcap"
    live = tmp_path / "live.pcapng"
    with Server("tremor", "mock-node", "--port", "0") as node:
        report = play_client(node.port, capture, record=str(live))
    assert report.ok, [o.text() for o in report.outcomes]
    assert report.counts["matched"] == 9 and report.sent == 10
    sent = live.read_bytes()
    ours = [f for f in frames(find(capture, connections=("1",))) if f.sender == "client"]
    assert not [f.packet for f in ours if len(f.raw) < 1000 and f.raw in sent]  # none as recorded


def test_a_client_that_sends_other_echoes_is_reported_at_its_first_echo():
    """The mock client with 9 filler bytes a message where the recording's had 8."""
    first_echo = next(f for f in recorded("client") if f.type == "echo")
    changed = ("--payload-size", "9", "--idle-timeout", str(NEVER))
    report, code, _ = play_server_to_mock_client(*RECORDED_EXCHANGE, *changed, answer_timeout=NEVER)
    assert not report.ok and code == 1  # and the client, given the recorded echoes, fails too
    first = report.outcomes[0]
    assert first.result.value == "divergent" and first.recorded["packet"] == first_echo.packet
    changed = {name for name, _, _ in first.fields}
    assert changed == {"message_json", "ws_payload_len"}, first.text()


def test_a_node_whose_accept_answers_the_recordings_key_is_a_violation():
    """The played client checks the live accept against its own fresh key: a node that answers
    with the recording's 101 (the accept for the recorded key) broke the handshake."""
    answer = next(f for f in frames(find(SESSION, connections=("1",))) if f.type == "UPGRADE_RESPONSE").raw
    server = socket.create_server(("127.0.0.1", 0))

    def stale_node() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(answer)

    thread = threading.Thread(target=stale_node, daemon=True)
    thread.start()
    try:
        report = play_client(server.getsockname()[1], answer_timeout=NEVER)
    finally:
        thread.join(timeout=60)
        server.close()
    first = report.outcomes[0]
    assert first.type == "UPGRADE_RESPONSE" and first.result.value == "violation", first.text()
    assert "Sec-WebSocket-Accept" in first.reason


def test_the_played_node_answers_on_the_alias_the_live_client_chose(tmp_path):
    """The recording's second session connected alias "e"; the live client connects "mine": the
    connect differs (reported), and the node's ack and echo follow the live alias."""
    script = tmp_path / "script.jsonl"
    script.write_text(
        '{"tremor":{"connect":{"protocol":"echo","alias":"mine"}}}\n{"mine":"beep"}\n{"badger":"badger"}\n'
    )
    report, code, out = play_server_to_mock_client("--script", str(script), connection="2")
    assert code == 0, out  # the client took every answer: on its own alias
    steps = json.loads(out.splitlines()[-1])["steps"]
    assert steps[0]["replies"][-1] == '{"tremor":{"connect-ack":{"protocol":"echo","alias":"mine"}}}'
    assert steps[1]["replies"] == ['{"mine":"beep"}']
    connect, badger = report.outcomes[:2]
    assert connect.result.value == "divergent" and ("alias", "e", "mine") in connect.fields
    assert badger.result.value == "violation" and badger.type == "stream"  # as recorded: never connected
    assert report.counts["matched"] == 3  # the upgrade, the echo on the live alias, the Close


def test_a_message_the_recording_never_had_is_extra_at_the_end(tmp_path, monkeypatch):
    """Recorded against a node that did not announce its version, played to mock-node, which
    does: its greeting is in no recorded frame (it comes before anything like it is expected,
    and nothing ever is), so it is extra, not lost; all the rest matches."""
    capture = tmp_path / "quiet-node.pcap"
    monkeypatch.setattr(NodeSession, "opened", lambda self: [])
    loop = asyncio.new_event_loop()
    quiet = MockNode(port=0)
    _, port = loop.run_until_complete(quiet.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with PcapWriter(capture) as pcap:
            lines = [
                '{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}',
                '{"e":"beep"}',
                '{"tremor":"close"}',
            ]
            result = scripted_exchange(MockClient("127.0.0.1", port, record=pcap), list(enumerate(lines, 1)))
    finally:
        asyncio.run_coroutine_threadsafe(quiet.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
    assert result.failures == []
    monkeypatch.undo()
    with Server("tremor", "mock-node", "--port", "0") as node:
        report = play_client(node.port, capture)
    (extra,) = report.outcomes
    assert extra.result.value == "extra" and extra.type == "version-info", extra.text()
    assert not report.ok and report.counts["matched"] == 5  # the 101, 3 answers, the Close


# --------------------------------------------------------------------------- the command


def test_replay_command_plays_the_client_to_mock_node_every_answer_matched(tmp_path):
    live = tmp_path / "live.pcapng"
    with Server("tremor", "mock-node", "--port", "0", "--format", "json") as node:
        result = run_cli(
            "replay",
            str(SESSION),
            "--play",
            "client",
            "--connect",
            node.address,
            "--connection",
            "1",
            "--record",
            str(live),
            "--format",
            "json",
        )
        code, out, _ = node.stop(signal.SIGTERM)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"]["matched"] == len(recorded("server")) == 25
    assert summary["sent"] == len(recorded("client")) and summary["own_violations"] == []
    stats = json.loads(out.splitlines()[-1])
    assert code == 0 and stats["violations"] == 0 and stats["sessions"] == 1
    # the live run's key and masks are its own: the node saw none of the recording's bytes again
    sent = live.read_bytes()
    keys = [line for line in sent.split(b"\r\n") if line.startswith(b"Sec-WebSocket-Key: ")]
    assert len(keys) == 1 and keys[0] not in SESSION.read_bytes()
    assert recorded("client")[1].raw not in sent  # the connect frame, masked afresh
    dissected = run_cli("dissect", str(live))
    assert dissected.returncode == 0 and "VIOLATION" not in dissected.stdout, dissected.stdout
    compared = run_cli("diff", str(SESSION), str(live), "--connection", "1")
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_replay_command_plays_the_node_on_a_port_it_names_to_the_mock_client(tmp_path):
    live = tmp_path / "live.pcapng"
    replay = Server(
        "replay",
        str(SESSION),
        "--play",
        "server",
        "--listen",
        "127.0.0.1:0",
        "--connection",
        "1",
        "--record",
        str(live),
        "--format",
        "json",
    )
    with replay:
        client = run_cli(
            "tremor", "mock-client", "--connect", replay.address, "--format", "json", *RECORDED_EXCHANGE
        )
        code, out, err = replay.stop(None)
    assert client.returncode == 0, client.stdout + client.stderr
    exchange = json.loads(client.stdout.splitlines()[-1])
    assert exchange["ok"] and exchange["echoes"] == 12 and exchange["delivered"] == 3
    assert code == 0, out + err
    summary = json.loads(out.splitlines()[-1])
    assert summary["ok"] and summary["counts"]["matched"] == len(recorded("client")) == 24
    dissected = run_cli("dissect", str(live))
    assert dissected.returncode == 0 and "VIOLATION" not in dissected.stdout, dissected.stdout


def test_replay_command_reports_a_cut_greeting_at_its_recorded_frame_exit_1(tmp_path):
    """mock-node --malformed-after 1: the node's first message (its version greeting) is not JSON;
    all else it says is as recorded."""
    greeting = next(f for f in recorded("server") if f.record.get("ws_opcode") == 1)
    assert greeting.type == "version-info"
    live = tmp_path / "live.pcapng"
    with Server("tremor", "mock-node", "--port", "0", "--malformed-after", "1") as node:
        result = run_cli(
            "replay",
            str(SESSION),
            "--play",
            "client",
            "--connect",
            node.address,
            "--connection",
            "1",
            "--answer-timeout",
            str(NEVER),
            "--record",
            str(live),
            "--format",
            "json",
        )
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"]["matched"] == len(recorded("server")) - 1
    cut, missing = summary["outcomes"]  # the cut message as it came, then the greeting it should have been
    assert (cut["result"], cut["type"]) == ("violation", "INVALID")
    assert (missing["result"], missing["type"], missing["recorded_packet"]) == (
        "missing",
        "version-info",
        greeting.packet,
    )
    assert b"not JSON" in live.read_bytes()  # the recording's comment on the live packet
    assert run_cli("dissect", str(live)).returncode == 0
