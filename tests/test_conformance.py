"""The conformance suites, proven both ways over real loopback.

Our own mocks pass every case (mock-worker with --strict-credits; mock-sink with a
kill -9 restart; mock-source as a connector), and the shipped Wallaroo peers run
through the suites: the cases they fail are the known deviations of the shipped
system, asserted here and listed in docs/conformance.md. The runner and reports
are checked on their own first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support import COMMAND, Server, as_foreground, run_cli

from wallaroo_proto.conformance import CaseFailed, CaseSkipped, get_suite, select, suites
from wallaroo_proto.conformance.report import as_json, junit_xml
from wallaroo_proto.conformance.runner import Case, Result, Target, run_case

TESTS = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("WALLAROO_PEERS", TESTS.parents[1] / "shared/peers/wallaroo"))
COOKIE = "Dragons-Love-Tacos"
needs_peers = pytest.mark.skipif(
    not (PEERS / "aloc_sink").is_file(),
    reason=f"the shipped Wallaroo peers are not at {PEERS} (set WALLAROO_PEERS)",
)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768 up): a server restarted on it after
    kill -9 can always take it again. In that range, a client retrying it while the server is
    down could be given the same number as its own port and connect to itself (TCP's
    simultaneous open), holding the port the server then cannot bind."""
    rng = random.Random()
    while True:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", rng.randrange(20_000, 32_768)))
            except OSError:
                continue
            return s.getsockname()[1]


def conformance(suite: str, *args: str, **kwargs) -> tuple[int, dict]:
    """``conformance SUITE --format json ARGS``: exit code and report (a connector command comes last)."""
    done = run_cli("conformance", suite, "--format", "json", *args, timeout=300, **kwargs)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def failed(report: dict) -> set[str]:
    return {c["id"] for c in report["cases"] if c["status"] == "fail"}


def every_case_passed(report: dict, suite: str) -> None:
    bad = [f"{c['id']}: {c['reason']}\n{c['seen']}" for c in report["cases"] if c["status"] != "pass"]
    assert not bad, "\n\n".join(bad)
    assert [c["id"] for c in report["cases"]] == [c.id for c in get_suite(suite).cases]


# --- the runner and its reports ---------------------------------------------------------------------


def _case(case_id: str) -> Case:
    async def run(ctx, trace) -> str:
        return "ok"

    return Case(case_id, "spec X", "it holds", run)


def test_select_takes_ids_and_dotted_prefixes_and_refuses_unknown_ones() -> None:
    cases = [_case("a.one"), _case("a.two"), _case("ab.three"), _case("b.four")]
    assert [c.id for c in select(cases, ["a"])] == ["a.one", "a.two"]
    assert [c.id for c in select(cases, (), ["a.one", "b"])] == ["a.two", "ab.three"]
    assert [c.id for c in select(cases, ["ab.three"])] == ["ab.three"]
    with pytest.raises(ValueError, match="no case 'c'"):
        select(cases, ["c"])


def test_run_case_turns_every_outcome_into_a_result() -> None:
    async def fails(ctx, trace) -> str:
        trace("c1 -> HELLO")
        raise CaseFailed("sent OK twice")

    async def skips(ctx, trace) -> str:
        raise CaseSkipped("needs --restart-cmd")

    async def hangs(ctx, trace) -> str:
        trace("   waiting for OK")
        await asyncio.sleep(60)

    async def run_all() -> list[Result]:
        return [
            await run_case(Case(name, "r", "e", fn), None, 0.2)
            for name, fn in (("f", fails), ("s", skips), ("h", hangs))
        ]

    f, s, h = asyncio.run(run_all())
    assert (f.status, f.reason, f.seen) == ("fail", "sent OK twice", "c1 -> HELLO")
    assert (s.status, s.reason) == ("skip", "needs --restart-cmd")
    assert h.status == "fail" and h.reason == "no conclusion within 0.2 s (waiting for OK)"


def test_junit_xml_has_one_testcase_per_case_with_failures_and_skips() -> None:
    suite = get_suite("worker")
    a, b, c = suite.cases[:3]
    results = [
        Result(a, "pass", seen="OK with 100 credits", seconds=0.01),
        Result(b, "fail", "closed without an ERROR", "c1 <- close", 0.02),
        Result(c, "skip", "not here", seconds=0.0),
    ]
    root = ET.fromstring(junit_xml(suite, Target(address="127.0.0.1:7100"), results))
    node = root.find("testsuite")
    assert (node.get("name"), node.get("tests"), node.get("failures"), node.get("skipped")) == (
        "wallaroo.worker",
        "3",
        "1",
        "1",
    )
    cases = node.findall("testcase")
    assert [t.get("name") for t in cases] == [a.id, b.id, c.id]
    assert cases[0].find("failure") is None and cases[0].find("skipped") is None
    assert cases[1].find("failure").get("message") == "closed without an ERROR"
    assert cases[1].find("failure").text == "c1 <- close"
    assert cases[2].find("skipped").get("message") == "not here"
    summary = as_json(suite, Target(address="127.0.0.1:7100"), results)["summary"]
    assert summary == {"passed": 1, "failed": 1, "skipped": 1, "not_run": 0, "total": 3}


def test_a_report_written_after_an_interrupt_says_the_run_was_cut_short() -> None:
    suite = get_suite("worker")
    a, b, c, d = suite.cases[:4]
    results = [Result(a, "pass", seconds=0.01)]
    target = Target(address="127.0.0.1:7100")
    doc = as_json(suite, target, results, interrupted=True, not_run=[b, c, d])
    assert doc["interrupted"] is True and doc["not_run"] == [b.id, c.id, d.id]
    assert doc["summary"] == {"passed": 1, "failed": 0, "skipped": 0, "not_run": 3, "total": 4}
    assert as_json(suite, target, results)["interrupted"] is False
    node = ET.fromstring(junit_xml(suite, target, results, interrupted=True, not_run=[b, c, d])).find(
        "testsuite"
    )
    assert (node.get("tests"), node.get("failures"), node.get("errors"), node.get("skipped")) == (
        "4",
        "0",
        "1",
        "2",
    )
    assert {p.get("name"): p.get("value") for p in node.iter("property")}["interrupted"] == "true"
    cases = node.findall("testcase")
    assert [t.get("name") for t in cases] == [a.id, b.id, c.id, d.id]
    assert cases[1].find("error").get("message") == "the run was interrupted before this case concluded"
    assert [t.find("skipped").get("message") for t in cases[2:]] == ["not run: the run was interrupted"] * 2


def test_cli_lists_cases_and_refuses_bad_usage_with_exit_2() -> None:
    listed = run_cli("conformance", "sink", "--list", "--format", "json")
    assert listed.returncode == 0
    assert [c["id"] for c in json.loads(listed.stdout)] == [c.id for c in get_suite("sink").cases]
    unknown = run_cli("conformance", "worker", "127.0.0.1:1", "--case", "no.such")
    assert unknown.returncode == 2 and "no case 'no.such'" in unknown.stderr
    port = free_port()  # nothing listens there
    unreachable = run_cli("conformance", "worker", f"127.0.0.1:{port}")
    assert unreachable.returncode == 2 and f"cannot connect to 127.0.0.1:{port}" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    no_command = run_cli("conformance", "connector")
    assert no_command.returncode == 2 and "give the connector's command" in no_command.stderr
    missing = run_cli("conformance", "connector", "--", "/no/such/connector")
    assert missing.returncode == 2 and "cannot run '/no/such/connector'" in missing.stderr


def test_the_docs_list_every_case_of_every_suite() -> None:
    doc = (TESTS.parent / "docs" / "conformance.md").read_text()
    for suite in suites():  # every registered suite, so a new one cannot go undocumented
        name = suite.name
        section = doc.split(f"### `conformance {name}`")[1].split("###")[0]
        for case in suite.cases:
            assert f"| `{case.id}` | {case.ref} | {case.expect} |" in section, (name, case.id)


# --- our mocks pass every case ----------------------------------------------------------------------


@pytest.mark.e2e
def test_mock_worker_with_strict_credits_passes_every_worker_case(tmp_path) -> None:
    junit = tmp_path / "worker.xml"
    with Server(
        "mock-worker", "--port", "0", "--no-live", "--checkpoint-ms", "50", "--strict-credits"
    ) as worker:
        code, report = conformance("worker", worker.address, "--junit", str(junit))
    assert code == 0
    every_case_passed(report, "worker")
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "0" and suite.get("tests") == str(len(get_suite("worker").cases))


@pytest.mark.e2e
def test_a_worker_that_takes_frames_beyond_its_credit_fails_that_case_only() -> None:
    """mock-worker counts credits as the shipped worker does unless --strict-credits: exit 1, one failure."""
    with Server("mock-worker", "--port", "0", "--no-live", "--checkpoint-ms", "50") as worker:
        code, report = conformance("worker", worker.address)
    assert code == 1
    assert failed(report) == {"credits.overdraft"}
    case = next(c for c in report["cases"] if c["id"] == "credits.overdraft")
    assert "answered a NOTIFY sent with no credit left" in case["reason"]


def _restartable(tmp_path: Path, *command: str) -> tuple[str, Path]:
    """A --restart-cmd for ``command``, which it also starts now; (the command, its pid file)."""
    pidfile, log = tmp_path / "sink.pid", tmp_path / "sink.log"
    restart = [sys.executable, str(TESTS / "restart_by_pidfile.py"), str(pidfile), str(log), *command]
    run = " ".join(f"'{part}'" for part in restart)
    os.system(run)  # the same command the suite will run: the sink is its child, not ours
    return run, pidfile


def _wait_listening(port: int, pidfile: Path, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"the sink never listened:\n{log.read_text()}"
            time.sleep(0.05)


def _stop(pidfile: Path) -> None:
    text = pidfile.read_text().strip() if pidfile.exists() else ""
    if text.isdigit() and int(text) > 1:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(text), signal.SIGKILL)


@pytest.mark.e2e
def test_mock_sink_passes_every_sink_case_across_kill_9_restarts(tmp_path) -> None:
    port = free_port()
    sink = [*COMMAND, "mock-sink", "--port", str(port), "--out-dir", str(tmp_path / "out"), "-q"]
    restart, pidfile = _restartable(tmp_path, *sink)
    try:
        _wait_listening(port, pidfile, tmp_path / "sink.log")
        code, report = conformance("sink", f"127.0.0.1:{port}", "--restart-cmd", restart)
    finally:
        _stop(pidfile)
    every_case_passed(report, "sink")  # names a failed case and why, which the exit code cannot
    assert code == 0


@pytest.mark.e2e
def test_mock_source_passes_every_connector_case() -> None:
    source = [*COMMAND, "mock-source", "--connect", "{host}:{port}", "--streams", "2", "--count", "20"]
    code, report = conformance("connector", "--window-ms", "300", "--", *source, "-q")
    assert code == 0
    every_case_passed(report, "connector")


@pytest.mark.e2e
def test_listen_runs_a_case_on_a_connector_started_by_hand() -> None:
    port = free_port()
    tester = subprocess.Popen(
        [*COMMAND, "conformance", "connector", "--format", "json", "--listen", f"127.0.0.1:{port}"]
        + ["--case", "eos.sent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # mock-source retries a refused connection a few times by itself
            source = run_cli("mock-source", "--connect", f"127.0.0.1:{port}", "--count", "5", "-q")
            if "refused" not in source.stderr:
                break
            assert time.monotonic() < deadline, source.stderr
        out, err = tester.communicate(timeout=120)
    finally:
        if tester.poll() is None:
            tester.kill()
            tester.wait()
    assert source.returncode == 0, source.stderr
    assert tester.returncode == 0, err
    report = json.loads(out)
    assert [(c["id"], c["status"]) for c in report["cases"]] == [("eos.sent", "pass")]


# --- the shipped Wallaroo peers: their known deviations ------------------------------------------------

#: The shipped connector library cannot resume a FramedFileReader (``reset`` calls a method that
#: does not exist) and cannot follow a RESTART (``handle_restart`` raises outside its reconnect loop).
SHIPPED_CONNECTOR_FAILS = {"resume.notify-ack-point", "restart.reconnects"}

#: The shipped test sink (aloc_sink) exits the whole process on a bad HELLO, a PHASE1 past its data
#: or bytes it cannot decode, commits a PHASE1 short of its data (then exits at
#: its PHASE2), and lets a second connection of a connected instance in.
SHIPPED_SINK_FAILS = {
    "twopc.where-end-aborts",
    "twopc.where-short-aborts",
    "handshake.duplicate-instance",
    "handshake.version",
    "handshake.cookie",
    "malformed.twopc-tag",
    "malformed.unknown-type",
}


@pytest.mark.e2e
@needs_peers
def test_the_shipped_connector_library_fails_only_its_known_deviations(tmp_path) -> None:
    (tmp_path / "celsius.msg").write_bytes((PEERS / "celsius.msg").read_bytes())
    connector = [sys.executable, "-W", "ignore", str(TESTS / "peers" / "shipped_connector.py")]
    connector += ["{host}", "{port}", COOKIE, "celsius.msg"]
    code, report = conformance(
        "connector",
        "--cookie",
        COOKIE,
        "--window-ms",
        "300",
        "--timeout",
        "8",
        "--",
        *connector,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PEERS)},
    )
    assert code == 1
    assert failed(report) == SHIPPED_CONNECTOR_FAILS, json.dumps(report, indent=1)
    assert report["summary"]["skipped"] == 0
    resume = next(c for c in report["cases"] if c["id"] == "resume.notify-ack-point")
    assert "_FramedFileReader__next" in resume["seen"]  # its own traceback, from the connector's output


@pytest.mark.e2e
@needs_peers
def test_the_shipped_aloc_sink_fails_only_its_known_deviations(tmp_path) -> None:
    port = free_port()
    sink = [sys.executable, "-W", "ignore", str(PEERS / "aloc_sink"), str(tmp_path / "out")]
    sink += [str(tmp_path / "rules"), str(port)]
    restart, pidfile = _restartable(tmp_path, "env", f"PYTHONPATH={PEERS}", *sink)
    try:
        _wait_listening(port, pidfile, tmp_path / "sink.log")
        code, report = conformance(
            "sink", f"127.0.0.1:{port}", "--cookie", COOKIE, "--restart-cmd", restart, "--timeout", "8"
        )
    finally:
        _stop(pidfile)
    assert code == 1
    assert failed(report) == SHIPPED_SINK_FAILS, json.dumps(report, indent=1)
    assert report["summary"]["skipped"] == 0
    by_id = {c["id"]: c for c in report["cases"]}
    assert "got OK" in by_id["handshake.duplicate-instance"]["reason"]
    assert "stopped serving" in by_id["handshake.version"]["reason"]
    assert by_id["restart.lists-undecided"]["status"] == "pass"


# --- Kinesis: the processor suite -------------------------------------------------------------------


@pytest.mark.e2e
def test_mock_processor_passes_every_processor_case_and_a_faulty_one_fails_with_the_cores_reason() -> None:
    processor = [*COMMAND, "kinesis", "mock-processor", "--checkpoint-every", "2"]
    code, report = conformance("processor", "--", *processor)
    assert code == 0
    every_case_passed(report, "processor")
    code, report = conformance("processor", "--", *processor, "--bad-response-after", "2")
    assert code == 1
    assert failed(report) == {
        "records.status",
        "shard-ended.checkpoint",
        "lease-lost.status",
        "shutdown-requested.status",
    }
    reasons = {c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert reasons == {"status with responseFor 'processRecordz', expected 'processRecords'"}


@pytest.mark.e2e
def test_a_kclpy_record_processor_passes_every_processor_case(tmp_path) -> None:
    pytest.importorskip("amazon_kclpy")
    from test_kinesis_e2e import KCLPY_PROCESSOR

    app = tmp_path / "app.py"
    app.write_text(KCLPY_PROCESSOR)
    env = {**os.environ, "KCL_TEST_LOG": str(tmp_path / "events.jsonl")}
    code, report = conformance("processor", "--", sys.executable, str(app), env=env)
    assert code == 0
    every_case_passed(report, "processor")
    logged = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "checkpoint" in logged and "shardEnded" in logged


@pytest.mark.e2e
@pytest.mark.parametrize("end", [[], ["--shard-end"]], ids=["graceful-stop", "shard-end"])
def test_mock_daemon_passes_every_daemon_case_and_ends_every_shard_cleanly(end) -> None:
    shards = str(len(get_suite("daemon").cases))
    args = ["--listen", "127.0.0.1:0", "--shards", shards, "--records", "7", "--batch-size", "3", *end]
    with Server("kinesis", "mock-daemon", *args, "--format", "json") as daemon:
        code, report = conformance("daemon", daemon.address)
        exit_code, out, err = daemon.stop(None)  # it ends by itself once every shard's lease ended
    assert code == 0
    every_case_passed(report, "daemon")
    summary = json.loads(out.strip().splitlines()[-1])
    assert exit_code == 0 and summary["failures"] == [], err


@pytest.mark.e2e
def test_a_daemon_refusing_good_checkpoints_fails_that_case() -> None:
    args = [
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "1",
        "--records",
        "4",
        "--checkpoint-error",
        "ThrottlingException",
    ]
    with Server("kinesis", "mock-daemon", *args) as daemon:
        code, report = conformance("daemon", daemon.address, "--case", "checkpoint.last-record")
    assert code == 1
    assert report["cases"][0]["reason"] == "a checkpoint at the last record delivered got ThrottlingException"


# --- the command-line grammar (docs/cli.md) -------------------------------------------------------


@pytest.mark.e2e
def test_protocol_version_and_the_older_version_are_taken_and_errors_are_one_line() -> None:
    port = free_port()  # nothing listens there: the words parse, then the target is unreachable
    for words in (["--protocol-version", "0.0.1"], ["--version", "0.0.1"]):
        result = run_cli("conformance", "worker", f"127.0.0.1:{port}", *words)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"wallaroo-proto conformance worker: cannot connect to 127.0.0.1:{port}")
    bad = run_cli("conformance", "connector", "--listen", "nowhere")
    assert bad.returncode == 2 and "'nowhere' is not HOST:PORT" in bad.stderr


def _children(pid: int) -> list[tuple[int, int]]:
    """(pid, process group) of each child of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:  # after the name: state, ppid, pgrp
                found.append((int(stat.parent.name), int(fields[2])))
    return found


@pytest.mark.timeout(120)
def test_the_json_and_junit_of_an_interrupted_run_say_it_was_cut_short(tmp_path) -> None:
    junit = tmp_path / "connector.xml"
    suite = subprocess.Popen(
        [*COMMAND, "conformance", "connector", "--timeout", "0.5", "-v", "--format", "json"]
        + ["--junit", str(junit), "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
        start_new_session=True,
    )
    try:
        first = suite.stderr.readline()  # -v: the first case has ended; the second is under way
        os.killpg(suite.pid, signal.SIGINT)
        out, err = suite.communicate(timeout=60)
    finally:
        suite.kill()
    assert suite.returncode == 130, err
    doc = json.loads(out)
    ran = [c["id"] for c in doc["cases"]]
    assert doc["interrupted"] is True and first.split()[-1] == ran[0]
    assert doc["not_run"] and doc["summary"]["not_run"] == len(doc["not_run"])
    assert ran + doc["not_run"] == [
        c["id"] for c in json.loads(run_cli("conformance", "connector", "--list", "--format", "json").stdout)
    ]
    node = ET.parse(junit).getroot().find("testsuite")
    assert node.get("errors") == "1" and node.get("tests") == str(len(ran) + len(doc["not_run"]))
    assert {p.get("name"): p.get("value") for p in node.iter("property")}["interrupted"] == "true"


@pytest.mark.timeout(120)
def test_ctrl_c_reaches_the_suite_not_the_command_under_test() -> None:
    suite = subprocess.Popen(
        [*COMMAND, "conformance", "connector", "--timeout", "0.5", "-v", "--", "sleep", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
        start_new_session=True,  # as a shell runs it: a group of its own that Ctrl-C is sent to
    )
    try:
        first = suite.stderr.readline()  # -v: a line per case as it ends (a connector that never connects)
        deadline = time.monotonic() + 60
        while not _children(suite.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        children = _children(suite.pid)
        assert children and all(group == pid for pid, group in children), children
        os.killpg(suite.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = suite.communicate(timeout=60)
    finally:
        suite.kill()
    assert suite.returncode == 130, err
    assert err.splitlines()[-1] == "wallaroo-proto conformance connector: interrupted"
    case = first.split()[-1]
    assert case in out and re.search(r"\d+ failed", out), out  # the cases that ended, as at the end of a run
    assert not any(Path(f"/proc/{pid}").exists() for pid, _ in children), "the command under test outlived it"


def test_an_unwritable_junit_path_is_one_line_before_any_case(tmp_path) -> None:
    result = run_cli(
        "conformance", "worker", "127.0.0.1:1", "--junit", str(tmp_path / "no" / "such" / "x.xml")
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said = f"cannot use --junit {tmp_path}/no/such/x.xml: its folder does not exist"
    assert result.stderr.splitlines() == [f"wallaroo-proto conformance worker: {said}"]


@pytest.mark.e2e
def test_an_answer_that_took_what_was_to_be_refused_decides_the_case_at_once() -> None:
    """A worker that answers OK to a bad HELLO (tests/peers/sloppy_wallaroo_worker.py) fails those
    cases with the answer, not with 'no conclusion within N s (waiting for ERROR and a close)'."""
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "peers" / "sloppy_wallaroo_worker.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        match = re.search(r"listening on (\S+):(\d+)", proc.stdout.readline())
        assert match, "the sloppy worker printed no ready line"
        code, report = conformance(
            "worker", f"{match.group(1)}:{match.group(2)}", "--case", "handshake", "--timeout", "30"
        )
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert code == 1
    reasons = {c["id"]: c["reason"] for c in report["cases"] if c["status"] == "fail"}
    assert reasons == {
        "handshake.version": "got OK where ERROR was due",
        "handshake.cookie": "got OK where ERROR was due",
        "handshake.hello-first": "got NOTIFY_ACK where ERROR was due",
        "handshake.once": "got OK where ERROR was due",
    }
