"""``conformance lb``, proven both ways over real loopback with real processes.

ambrosia mock-lb passes every case; a sloppy binding (tests/peers/sloppy_ambrosia_lb.py:
no state across a recovery, an InitialMessage for an upgrade's checkpoint, never exits)
fails exactly those cases, the InitialMessage with the AMBROSIA core's reason.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import COMMAND, run_cli

from wallaroo_proto.conformance import get_suite

PEERS = Path(__file__).resolve().parent / "peers"
PORTS = ["--receive-port", "{receive_port}", "--send-port", "{send_port}"]


def conformance(*args: str) -> tuple[int, dict]:
    done = run_cli("conformance", "lb", "--format", "json", *args, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_lb_suite_needs_a_command_or_both_ports() -> None:
    done = run_cli("conformance", "lb")
    assert done.returncode == 2 and "give the LB's command" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_lb_that_exits_at_once_fails_with_its_exit_code_and_output() -> None:
    code, report = conformance("--case", "first-start", "--", "sh", "-c", "echo no IC for me; exit 3")
    assert code == 1
    (case,) = report["cases"]
    assert case["reason"] == "the LB exited with code 3 before connecting to the receive port"
    assert case["seen"].endswith("no IC for me")


@pytest.mark.slow
def test_mock_lb_passes_every_lb_case() -> None:
    code, report = conformance("--", *COMMAND, "ambrosia", "mock-lb", *PORTS)
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert code == 0 and not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("lb").cases]
    seen = {c["id"]: c["seen"] for c in report["cases"]}
    assert seen["close.exits"] == "the LB exited with code 0"


@pytest.mark.slow
def test_a_sloppy_lb_fails_exactly_the_rules_it_breaks() -> None:
    sloppy = [sys.executable, str(PEERS / "sloppy_ambrosia_lb.py"), *PORTS]
    code, report = conformance("--timeout", "2", "--", *sloppy)
    assert code == 1
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert reasons == {
        "recovery.state": "the checkpoint after the recovery (1 bytes) differs from the one taken at the "
        "same point without a crash (1 bytes)",
        "recovery.upgrade": "initial-message: InitialMessage outside a first start",
        "close.exits": "no conclusion within 7 s (waiting for the LB to exit)",
    }
    state = next(c for c in report["cases"] if c["id"] == "recovery.state")
    assert state["seen"].endswith("without a crash: b'6'\nafter recovery: b'3'")
