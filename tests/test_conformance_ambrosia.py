"""``conformance lb`` and ``conformance ic``, proven both ways over real loopback with real processes.

ambrosia mock-lb passes every lb case; a sloppy binding (tests/peers/sloppy_ambrosia_lb.py:
no state across a recovery, an InitialMessage for an upgrade's checkpoint, never exits)
fails exactly those cases, the InitialMessage with the AMBROSIA core's reason. ambrosia
mock-ic passes every ic case, on a first start and on a recovery; with its record faults
(a skipped sequence id, wrong check bytes) it fails the case that meets them, with the
core's reason.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.conformance import get_suite

PEERS = Path(__file__).resolve().parent / "peers"
PORTS = ["--receive-port", "{receive_port}", "--send-port", "{send_port}"]  # the older spellings
ADDRESSES = ["--connect", "{host}:{receive_port}", "--send-connect", "{send_host}:{send_port}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conformance_of(suite: str, *args: str) -> tuple[int, dict]:
    done = run_cli("conformance", suite, "--format", "json", *args, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def conformance(*args: str) -> tuple[int, dict]:
    return conformance_of("lb", *args)


def test_the_lb_suite_needs_a_command_or_both_ports() -> None:
    done = run_cli("conformance", "lb")
    assert done.returncode == 2 and "give the LB's command" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ic", "127.0.0.1:2000"], "give the IC's send port too: --send-connect HOST:PORT"),
        (["ic", "127.0.0.1:2000", "--send-connect", "nowhere"], "'nowhere' is not HOST:PORT"),
        (["lb", "--listen", "127.0.0.1:2000"], "give the LB's command (-- COMMAND ARGS...), or --listen"),
    ],
)
def test_the_suites_want_both_of_the_ics_addresses(args: list[str], message: str) -> None:
    done = run_cli("conformance", *args)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"wallaroo-proto conformance {args[0]}: {message}"), line


def test_the_lb_suite_says_which_address_it_cannot_listen_on() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = run_cli("conformance", "lb", "--listen", f"127.0.0.1:{port}", "--", "true")
    assert done.returncode == 2
    assert (
        f"cannot listen on 127.0.0.1:{port} (the receive port) and 127.0.0.1:0 (the send port)" in done.stderr
    )


def test_an_lb_that_exits_at_once_fails_with_its_exit_code_and_output() -> None:
    code, report = conformance("--case", "first-start", "--", "sh", "-c", "echo no IC for me; exit 3")
    assert code == 1
    (case,) = report["cases"]
    assert case["reason"] == "the LB exited with code 3 before connecting to the receive port"
    assert case["seen"].endswith("no IC for me")


@pytest.mark.e2e
def test_mock_lb_passes_every_lb_case() -> None:
    code, report = conformance("--", *COMMAND, "ambrosia", "mock-lb", *ADDRESSES)
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert code == 0 and not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("lb").cases]
    seen = {c["id"]: c["seen"] for c in report["cases"]}
    assert seen["close.exits"] == "the LB exited with code 0"


@pytest.mark.e2e
def test_a_sloppy_lb_fails_exactly_the_rules_it_breaks() -> None:
    sloppy = [sys.executable, str(PEERS / "sloppy_ambrosia_lb.py"), *PORTS]
    code, report = conformance("--timeout", "4", "--", *sloppy)
    assert code == 1
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert reasons == {
        "recovery.state": "the checkpoint after the recovery (1 bytes) differs from the one taken at the "
        "same point without a crash (1 bytes)",
        "recovery.upgrade": "initial-message: InitialMessage outside a first start",
        "close.exits": "no conclusion within 9 s (waiting for the LB to exit)",
    }
    state = next(c for c in report["cases"] if c["id"] == "recovery.state")
    assert state["seen"].endswith("without a crash: b'6'\nafter recovery: b'3'")


# --- the IC suite -------------------------------------------------------------------------------------


def ic_addresses(ic: Server) -> list[str]:
    """The IC's receive port and --send-connect, as mock-ic's ready line gives them to paste."""
    receive, option, send = ic.lines[-1].split("an LB connects with --connect ")[1].split()
    assert option == "--send-connect"
    return [receive, option, send]


def ic_address(ic: Server) -> str:
    """The older single argument, HOST:RECEIVE_PORT:SEND_PORT."""
    match = re.search(r"receive port (\d+), send port (\d+)", "".join(ic.lines))
    assert match, ic.lines
    return f"{ic.host}:{match.group(1)}:{match.group(2)}"


@pytest.mark.e2e
def test_mock_ic_passes_every_ic_case_first_started_and_then_recovered() -> None:
    with Server("ambrosia", "mock-ic", "--rpcs", "0") as ic:
        for start, where in (("a first start", ic_addresses(ic)), ("a recovery", [ic_address(ic)])):
            code, report = conformance_of("ic", *where)
            bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
            assert code == 0 and not bad, "\n\n".join(bad)
            assert report["cases"][0]["seen"].startswith(start)
        assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite("ic").cases]
        _, _, err = ic.stop()
    assert "violation" not in err


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("fault", "reason"),
    [("--gap-at", "sequence-gap: record 3 after 1"), ("--bad-check-at", "check-bytes: check bytes 0x")],
)
def test_an_ic_that_breaks_the_record_rules_fails_with_the_cores_reason(fault, reason) -> None:
    with Server("ambrosia", "mock-ic", "--rpcs", "0", fault, "2") as ic:
        code, report = conformance_of("ic", ic_address(ic), "--timeout", "3")
    assert code == 1
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert list(reasons) == ["records.self-calls"] and reasons["records.self-calls"].startswith(reason)


@pytest.mark.e2e
def test_lb_cases_run_on_a_binding_started_by_hand_at_the_ports_given() -> None:
    receive, send = free_port(), free_port()
    ports = ["--receive-port", str(receive), "--send-port", str(send)]  # older spellings, both commands
    listen = ["--listen", f"127.0.0.1:{receive}", "--send-listen", f"127.0.0.1:{send}"]
    suite = subprocess.Popen(
        [*COMMAND, "conformance", "lb", "--format", "json", "--case", "first-start", *listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lb = run_cli("ambrosia", "mock-lb", *ports, timeout=120)  # it retries until the suite listens
        out, err = suite.communicate(timeout=120)
    finally:
        suite.kill()
    assert suite.returncode == 0, err
    (case,) = json.loads(out)["cases"]
    assert case["status"] == "pass" and case["seen"].startswith("InitialMessage of 22 bytes")
    assert "first start" in lb.stdout
