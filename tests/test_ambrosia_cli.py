"""The ambrosia commands speak docs/cli.md: two addresses, one option each, a ready line that pastes
into mock-lb, errors that say what and where, faults that cannot fire refused, a restart that says
what it skipped, summaries in words."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

from support import COMMAND, Server, run_cli

DEADLINE = 60


def lb_options(ic: Server) -> list[str]:
    """What mock-ic's ready line says to paste into mock-lb's command line."""
    line = ic.lines[-1]
    assert "; an LB connects with " in line, line
    return line.split("; an LB connects with ")[1].split()


def run_pair(
    *ic_args: str, lb_args: tuple[str, ...] = ()
) -> tuple[int, str, str, subprocess.CompletedProcess]:
    """mock-ic (until all is in) and mock-lb pointed at it by pasting the ready line's options."""
    ic = Server("ambrosia", "mock-ic", "--exit-when-done", *ic_args)
    with ic:
        lb = run_cli("ambrosia", "mock-lb", *lb_options(ic), *lb_args, timeout=DEADLINE)
        code, out, err = ic.stop(sig=None, timeout=DEADLINE)
    return code, out, err, lb


def test_the_ready_line_pastes_into_mock_lb_and_the_summaries_are_words():
    code, out, err, lb = run_pair("--rpcs", "10", "--batch", "5")
    assert (code, lb.returncode) == (0, 0), err + lb.stderr
    assert "; 1 run: 1 first start, 0 recoveries;" in out
    assert "10 RPCs logged" in out and "1 run:" in out
    for text in (out, lb.stdout):  # a checkpoint's state in words, not a Python dict
        assert "rpcs 12, total 6800" in text and "{'" not in text and "True" not in text, text
    assert "initialized true" in lb.stdout


def test_the_send_port_may_listen_on_its_own_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    ic = Server(
        "ambrosia", "mock-ic", "--exit-when-done", "--rpcs", "3", "--send-listen", f"127.0.0.1:{free}"
    )
    with ic:
        options = lb_options(ic)
        assert options[2:] == ["--send-connect", f"127.0.0.1:{free}"]
        lb = run_cli("ambrosia", "mock-lb", *options, "--format", "json", timeout=DEADLINE)
        code, _, err = ic.stop(sig=None, timeout=DEADLINE)
    assert (code, lb.returncode) == (0, 0), err


def test_a_port_in_use_is_named_with_its_host_and_which_port_it_is():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        receive = run_cli("ambrosia", "mock-ic", "--listen", f"127.0.0.1:{port}")
        send = run_cli("ambrosia", "mock-ic", "--send-listen", f"127.0.0.1:{port}")
        older = run_cli("ambrosia", "mock-ic", "--receive-port", str(port))  # the older spelling, hidden
    assert receive.returncode == send.returncode == older.returncode == 2
    assert older.stderr == receive.stderr
    assert receive.stderr == (
        f"wallaroo-proto ambrosia mock-ic: cannot listen on 127.0.0.1:{port} (the receive port): "
        "Address already in use\n"
    )
    assert send.stderr.endswith(
        f"cannot listen on 127.0.0.1:{port} (the send port): Address already in use\n"
    )


def test_a_file_given_as_the_log_folder_is_named_as_such(tmp_path):
    five = tmp_path / "five.txt"
    five.write_text("5\n")
    done = run_cli("ambrosia", "mock-ic", "--log-dir", str(five))
    assert done.returncode == 2
    assert done.stderr == (
        f"wallaroo-proto ambrosia mock-ic: --log-dir {five} is a file; give a folder "
        "(mock-ic keeps its log and checkpoints in it)\n"
    )


def test_mock_lb_without_the_ics_addresses_is_one_line():
    done = run_cli("ambrosia", "mock-lb")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("wallaroo-proto ambrosia mock-lb: give the IC's receive port, --connect HOST:PORT")


def test_a_fault_on_a_record_the_log_already_holds_is_refused(tmp_path):
    log = str(tmp_path / "ic-log")
    code, _, err, lb = run_pair("--rpcs", "30", "--batch", "10", "--log-dir", log)
    assert (code, lb.returncode) == (0, 0), err
    again = run_cli(
        "ambrosia", "mock-ic", "--log-dir", log, "--rpcs", "60", "--batch", "10", "--crash-at", "2"
    )
    assert again.returncode == 2
    (line,) = again.stderr.splitlines()
    assert line.startswith(
        f"wallaroo-proto ambrosia mock-ic: --crash-at 2 can never fire: the log in {log} already holds "
        "records up to "
    ), line
    negative = run_cli("ambrosia", "mock-ic", "--gap-at", "-1")
    assert (
        negative.returncode == 2 and "--gap-at -1 can never fire: sequence ids start at 0" in negative.stderr
    )


def test_a_fault_beyond_the_inputs_records_is_warned_and_said_when_it_never_fired():
    code, _, err, lb = run_pair("--rpcs", "10", "--batch", "5", "--bad-check-at", "40", "-q")
    assert (code, lb.returncode) == (0, 0), err
    assert (
        "fault --bad-check-at 40 fires only if the LB's self calls fill records beyond the input's: "
        "--rpcs/--input and --batch make records 0-1"
    ) in err
    assert "fault --bad-check-at 40 never fired: no record with that sequence id was logged" in err


def test_a_restart_says_what_the_log_held_and_skipped_even_with_quiet(tmp_path):
    log = str(tmp_path / "ic-log")
    assert run_pair("--rpcs", "20", "--batch", "10", "--log-dir", log)[0] == 0
    code, out, err, lb = run_pair("--rpcs", "50", "--batch", "10", "--log-dir", log, "-q")
    assert (code, lb.returncode) == (0, 0), err
    assert "resumed from " + log + " at record " in err
    assert "20 input RPCs already logged are skipped, 30 of 50 to deliver" in err
    assert "30 RPCs logged and delivered since it started (20 were in the log then; 50 in all)" in out
    code, out, err, lb = run_pair("--rpcs", "50", "--log-dir", log, "--format", "json")
    assert (code, lb.returncode) == (0, 0), err
    resumed = json.loads(out.splitlines()[-1])["resumed"]
    assert resumed.startswith(f"resumed from {log} at record ") and "50 input RPCs already logged" in resumed


def test_an_unreachable_ic_is_one_line_and_exit_2_within_the_connect_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lb = subprocess.run(
        [*COMMAND, "ambrosia", "mock-lb", "--connect", f":{port}", "--send-connect", f":{port}",
         "--connect-timeout", "1"],
        capture_output=True, text=True, timeout=DEADLINE,
    )  # fmt: skip
    assert lb.returncode == 2 and lb.stdout == ""
    assert lb.stderr == (
        f"wallaroo-proto ambrosia mock-lb: cannot connect to the IC's receive port 127.0.0.1:{port}: "
        "Connection refused (tried for 1 s); is the IC up? (--connect-timeout)\n"
    )


def test_the_help_shows_one_option_per_address_and_hides_the_older_ones():
    ic = run_cli("ambrosia", "mock-ic", "--help").stdout
    lb = run_cli("ambrosia", "mock-lb", "--help").stdout
    assert "--listen HOST:PORT" in ic and "--send-listen HOST:PORT" in ic
    assert "--connect HOST:PORT" in lb and "--send-connect HOST:PORT" in lb
    for text in (ic, lb):
        assert "--receive-port" not in text and "--send-port" not in text and "--host" not in text
        assert text.rstrip().split("\n\n")[-1].lstrip().startswith("Examples:")


def test_sigterm_stops_mock_lb_with_its_summary_and_130_and_the_ic_with_0():
    ic = Server("ambrosia", "mock-ic", "--rpcs", "10")  # a server: it stays up when all is in
    with ic:
        lb = subprocess.Popen(
            [*COMMAND, "ambrosia", "mock-lb", *lb_options(ic)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + DEADLINE
        while "up until stopped" not in ic.stderr():
            assert time.monotonic() < deadline and lb.poll() is None
            time.sleep(0.05)
        lb.send_signal(signal.SIGTERM)
        out, err = lb.communicate(timeout=DEADLINE)
        code, ic_out, ic_err = ic.stop(signal.SIGTERM, timeout=DEADLINE)
    assert lb.returncode == 130 and "ambrosia mock-lb summary: first start" in out
    assert err.splitlines()[-1] == "wallaroo-proto ambrosia mock-lb: interrupted"
    assert code == 0 and "ambrosia mock-ic summary" in ic_out and "Traceback" not in ic_err


def test_a_mistyped_ambrosia_command_is_one_line_with_the_nearest_names():
    done = run_cli("ambrosia", "mock-ix")
    assert done.returncode == 2
    assert done.stderr == (
        "wallaroo-proto ambrosia: No such command 'mock-ix'. (Did you mean one of: 'mock-ic', 'mock-lb'?)\n"
    )


def test_a_receive_port_connection_without_its_send_port_one_is_closed_and_the_next_lb_served():
    ic = Server("ambrosia", "mock-ic", "--exit-when-done", "--rpcs", "5", "--pair-timeout", "1")
    with ic:
        with socket.create_connection(("127.0.0.1", ic.port), timeout=DEADLINE) as stray:
            assert stray.recv(1) == b""  # a port scanner's connection, closed at the pair timeout
        lb = run_cli("ambrosia", "mock-lb", *lb_options(ic), timeout=DEADLINE)
        code, _, err = ic.stop(sig=None, timeout=DEADLINE)
    assert (code, lb.returncode) == (0, 0), err + lb.stderr
    assert "to the receive port had no send-port connection within 1 s; closed it, waiting for an LB" in err
