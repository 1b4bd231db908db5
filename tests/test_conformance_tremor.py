"""``conformance node``, proven both ways over real loopback.

tremor mock-node passes every case; a sloppy node (tests/peers/sloppy_tremor_node.py:
no greeting, acks and echoes everything, never refuses) fails exactly the cases it
breaks, each with the core's reason. The frames the suite builds by hand for the
cases wsproto refuses to send are checked against RFC 6455's own examples.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import READY, Server, run_cli

from wallaroo_proto.conformance import get_suite
from wallaroo_proto.protocols.tremor.conformance.probe import client_frame
from wallaroo_proto.protocols.tremor.wsframes import TEXT, decode_frame

PEERS = Path(__file__).resolve().parent / "peers"


def conformance(suite: str, *args: str) -> tuple[int, dict]:
    done = run_cli("conformance", suite, "--format", "json", *args, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_client_frames_are_laid_out_as_rfc_6455_shows() -> None:
    # RFC 6455 5.7: a single-frame unmasked text message "Hello", and the masked one.
    assert client_frame(TEXT, b"Hello", mask=False) == bytes.fromhex("810548656c6c6f")
    masked = client_frame(TEXT, b"Hello")
    assert masked[:2] == bytes.fromhex("8185") and len(masked) == 2 + 4 + 5
    frame = decode_frame(masked)
    assert (frame.fin, frame.opcode, frame.masked, frame.payload) == (True, TEXT, True, b"Hello")
    # RFC 6455 5.7: a 256-byte payload takes the 16-bit length, 64 KiB the 64-bit one.
    assert client_frame(0x2, bytes(256), mask=False)[:4] == bytes.fromhex("827e0100")
    assert client_frame(0x2, bytes(65536), mask=False)[:10] == bytes.fromhex("827f0000000000010000")
    # a first fragment (FIN clear) and RSV bits where asked
    assert client_frame(TEXT, b"Hel", fin=False, mask=False) == bytes.fromhex("010348656c")
    assert client_frame(TEXT, b"", rsv=4, mask=False) == bytes.fromhex("c100")


def test_the_node_suite_refuses_what_is_no_address() -> None:
    done = run_cli("conformance", "node", "no-port-here")
    assert done.returncode == 2 and "is not HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_mock_node_passes_every_node_case(tmp_path) -> None:
    junit = tmp_path / "node.xml"
    with Server("tremor", "mock-node", "--port", "0") as node:
        code, report = conformance("node", node.address, "--junit", str(junit))
        _, _, err = node.stop()
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert code == 0 and not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("node").cases]
    seen = {c["id"]: c["seen"] for c in report["cases"]}
    assert seen["stream.not-connected"].startswith(
        "error close '0.207: Protocol session not connected error', "
        "then the node sent a Close frame (no code)"
    )
    assert seen["framing.invalid-utf8"].startswith("the node sent a Close frame (1007)")
    assert seen["framing.binary"].startswith("the node sent a Close frame (1003)")
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("name"), suite.get("failures")) == ("tremor.node", "0")
    # the node logged each refused session as a violation, and stayed up to be stopped
    assert "unknown protocol" in err and "unexpected unmasked frame" in err


#: What the sloppy node breaks, with the reason each case gives (the core's, where it judged a reply).
SLOPPY_FAILURES = {
    "upgrade.version": "the node closed the connection without an HTTP response",
    "upgrade.greeting": "the first message is the connect-ack, not the version announcement",
    "control.version": "version is the client's to send",
    "connect.pubsub": 'pubsub reply "list" is not a record with one field',
    "connect.alias-taken": "connect-ack that answers nothing",
    "connect.control-alias": "connect-ack that answers nothing",
    "connect.unknown-protocol": "connect-ack that answers nothing",
    "connect.no-protocol": "server sent a malformed message: connect-ack protocol must be a string",
    "pubsub.subscribe": "unknown pubsub reply 'subscribe'",
    "pubsub.data": "unknown pubsub reply 'subscribe'",
    "pubsub.strict-unsubscribe": "unknown pubsub reply 'unsubscribe'",
    "disconnect.then-message": "message on '*', which is not connected",
    "disconnect.not-connected": "disconnect-ack that answers nothing",
    "stream.not-connected": "message on '*', which is not connected",
    "close.ack": "no conclusion within 4 s (waiting for the node to end the WebSocket)",
    "malformed.json": "no conclusion within 4 s (waiting for the error close 0.101)",
    "malformed.not-record": "server sent a malformed message: a message must be a record, not list",
    "malformed.two-keys": "server sent a malformed message: a message has 2 fields (tremor, echo)",
    "malformed.unknown-op": "server sent a malformed message: unknown control operation 'dance'",
    "framing.unmasked": "no conclusion within 4 s (waiting for the node to close the connection)",
    "framing.binary": "no conclusion within 4 s (waiting for the node to close the connection)",
    "framing.invalid-utf8": "no conclusion within 4 s (waiting for the node to close the connection)",
    "framing.reserved-opcode": "no conclusion within 4 s (waiting for the node to close the connection)",
    "framing.close": "no conclusion within 4 s (waiting for the node's Close frame)",
}


@pytest.mark.e2e
def test_a_sloppy_node_fails_exactly_the_rules_it_breaks() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(PEERS / "sloppy_tremor_node.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        match = READY.search(proc.stdout.readline())
        assert match, "the sloppy node printed no ready line"
        code, report = conformance("node", f"{match.group(1)}:{match.group(2)}", "--timeout", "4")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert code == 1
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert reasons.keys() == SLOPPY_FAILURES.keys()
    for case, reason in SLOPPY_FAILURES.items():
        head, _, tail = reason.partition("*")
        assert reasons[case].startswith(head) and reasons[case].endswith(tail), (case, reasons[case])
