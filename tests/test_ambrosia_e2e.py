"""mock-ic and mock-lb as real processes over loopback: start-up order, first start, faults, recovery."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.ambrosia.immortal import RpcSource

PORTS = re.compile(r"receive port (\d+), send port (\d+)")


def start_ic(*args: str) -> tuple[Server, int, int]:
    ic = Server("ambrosia", "mock-ic", "--format", "json", "--exit-when-done", *args)
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    assert ic.port == rport
    return ic, rport, sport


def start_lb(rport: int, sport: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *COMMAND,
            "ambrosia",
            "mock-lb",
            "--receive-port",
            str(rport),
            "--send-port",
            str(sport),
            "--format",
            "json",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(ic: Server, lb: subprocess.Popen) -> tuple[int, dict, int, dict, str]:
    """Both ended by themselves: (IC exit, IC summary, LB exit, LB summary, LB stderr)."""
    lb_out, lb_err = lb.communicate(timeout=120)
    code, out, _ = ic.stop(sig=None, timeout=120)
    return code, json.loads(out.splitlines()[-1]), lb.returncode, json.loads(lb_out.splitlines()[-1]), lb_err


def test_send_port_refuses_until_the_receive_port_is_taken():
    ic, rport, sport = start_ic("--rpcs", "1")
    with ic:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", sport), timeout=10).close()
        first = socket.create_connection(("127.0.0.1", rport), timeout=10)
        deadline = time.monotonic() + 30
        while True:  # the IC listens on the send port once it accepted the receive port
            try:
                second = socket.create_connection(("127.0.0.1", sport), timeout=10)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        second.settimeout(30)
        head = second.recv(26, socket.MSG_WAITALL)
        assert head[16:] == b"\xff" * 8 + b"\x02\x0b"  # control record: TakeBecomingPrimaryCheckpoint
        first.close()
        second.close()


def test_first_start_delivers_every_rpc_exactly_once(tmp_path):
    ic, rport, sport = start_ic(
        "--rpcs", "700", "--batch", "40", "--checkpoint-every", "4", "--log-dir", str(tmp_path)
    )
    lb = start_lb(rport, sport, "--ask-checkpoint-every", "7")
    code, ic_sum, lb_code, lb_sum, lb_err = finish(ic, lb)
    assert (code, lb_code) == (0, 0), lb_err
    expected = RpcSource(700).expected()
    assert lb_sum["state"] == expected
    assert ic_sum["last_checkpoint"]["state"] == expected
    assert lb_sum["start"] == "first start" and lb_sum["violations"] == [] and ic_sum["violations"] == []
    assert ic_sum["self_calls_logged"] == expected["bonuses"]
    assert lb_sum["requests"]["TakeBecomingPrimaryCheckpoint"] == 1
    assert (tmp_path / "checkpoint.bin").exists()


@pytest.mark.parametrize(("fault", "rule"), [("--bad-check-at", "check-bytes"), ("--gap-at", "sequence-gap")])
def test_wire_faults_are_named_by_the_lb(fault, rule):
    ic, rport, sport = start_ic("--rpcs", "300", "--batch", "50", fault, "2")
    code, _, lb_code, lb_sum, _ = finish(ic, start_lb(rport, sport))
    assert code == 0 and lb_code == 1
    assert [v for v in lb_sum["violations"] if rule in v], lb_sum["violations"]


@pytest.mark.e2e
def test_crash_at_a_record_then_recovery_from_the_log(tmp_path):
    ic, rport, sport = start_ic(
        "--rpcs",
        "600",
        "--batch",
        "30",
        "--checkpoint-every",
        "3",
        "--log-dir",
        str(tmp_path),
        "--crash-at",
        "8",
    )
    lb = start_lb(rport, sport)
    code, _, _ = ic.stop(sig=None)
    assert code == -9  # kill -9 of itself, right after logging record 8
    lb.communicate(timeout=60)
    ic, rport, sport = start_ic(
        "--rpcs", "600", "--batch", "30", "--checkpoint-every", "3", "--log-dir", str(tmp_path)
    )
    code, ic_sum, lb_code, lb_sum, lb_err = finish(ic, start_lb(rport, sport))
    assert (code, lb_code) == (0, 0), lb_err
    assert ic_sum["recoveries"] == 1 and ic_sum["records_replayed"] >= 1  # record 8 was logged, never sent
    assert lb_sum["start"] == "recovery" and lb_sum["replayed"] == ic_sum["records_replayed"]
    assert lb_sum["state"] == RpcSource(600).expected()


@pytest.mark.e2e
@pytest.mark.parametrize(("dialect", "extra"), [("current", 1), ("seed", 0)])
def test_upgrade_on_recovery(tmp_path, dialect, extra):
    ic, rport, sport = start_ic("--rpcs", "200", "--log-dir", str(tmp_path), "--crash-at", "1")
    start_lb(rport, sport).communicate(timeout=60)
    assert ic.stop(sig=None)[0] == -9
    ic, rport, sport = start_ic(
        "--rpcs", "200", "--log-dir", str(tmp_path), "--upgrade", "--dialect", dialect
    )
    code, ic_sum, lb_code, lb_sum, lb_err = finish(ic, start_lb(rport, sport))
    assert (code, lb_code) == (0, 0), lb_err
    assert lb_sum["upgraded"] and lb_sum["requests"]["UpgradeTakeCheckpoint"] == 1
    assert lb_sum["requests"].get("TakeCheckpoint", 0) == 1 + extra  # and the final one
    assert lb_sum["state"] == RpcSource(200).expected()


def test_rpcs_from_a_file(tmp_path):
    lines = [b"5", b"12", b"hello", b"20"]
    path = tmp_path / "rpcs.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ic, rport, sport = start_ic("--input", str(path))
    code, ic_sum, lb_code, lb_sum, _ = finish(ic, start_lb(rport, sport))
    assert (code, lb_code) == (0, 0)
    # "hello" counts its length, 5; each multiple of 5 comes back once more as a self call
    assert lb_sum["state"]["total"] == (5 + 12 + 5 + 20) + (5 + 5 + 20)
    assert lb_sum["state"] == RpcSource(lines=lines).expected()


def test_user_mistakes_get_clear_answers(tmp_path):
    missing = run_cli("ambrosia", "mock-ic", "--input", str(tmp_path / "nope.txt"))
    assert (
        missing.returncode == 2
        and "cannot read --input" in missing.stderr
        and "Traceback" not in missing.stderr
    )
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    lb = run_cli(
        "ambrosia",
        "mock-lb",
        "--receive-port",
        str(port),
        "--send-port",
        str(port),
        "--connect-timeout",
        "0.5",
    )
    assert lb.returncode == 2 and "Traceback" not in lb.stderr
    assert lb.stderr == (
        f"wallaroo-proto ambrosia mock-lb: cannot connect to the IC's receive port 127.0.0.1:{port}: "
        "Connection refused (tried for 0.5 s); is the IC up? (--connect-timeout)\n"
    )


def test_sigterm_stops_a_waiting_ic_cleanly():
    ic, _, _ = start_ic("--rpcs", "10")
    code, out, err = ic.stop()
    assert code == 130 and "Traceback" not in err
    assert json.loads(out.splitlines()[-1])["runs"] == 0
