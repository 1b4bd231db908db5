"""The main job: the whole toolkit on loopback, as real processes, in one go.

mock-sink (with an abort vote injected) behind mock-worker (``--sink``, a RESTART
injected, every connection recorded), mock-source streaming into the worker;
then the sink's output is checked against its logs and against the input
(exactly once, each stream in order), the recordings are dissected and
validated and drawn as an HTML report (``report.html``), and spark-replay runs
its audit over them.

Each step is a ``Step``; ``run_demo`` reports them through a callback as they
finish, so the CLI only renders.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .main_thread_signals import signals_deferred

COMMAND = [sys.executable, "-m", "wallaroo_proto_cli"]
READY = re.compile(r"listening on (\S+):(\d+)")


@dataclass
class Step:
    name: str
    ok: bool
    detail: str = ""
    #: Output worth showing (a summary table), already rendered by the command.
    output: str = ""


@dataclass
class DemoConfig:
    workdir: Path
    streams: int = 3
    count: int = 400
    restart_after: int = 350
    checkpoint_every: int = 100
    spark: bool = True
    master: str = "local[2]"
    columns: int = 120
    steps: list[Step] = field(default_factory=list)


class DemoFailed(Exception):
    """A step failed; the message says which and why."""


class _Server:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        # Its own process group: a Ctrl-C at the terminal reaches the demo, which stops it.
        proc = None
        try:
            with signals_deferred():
                proc = subprocess.Popen(
                    [*COMMAND, *args],
                    stdout=subprocess.PIPE,
                    stderr=self.log,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            line = proc.stdout.readline()
        except BaseException:
            if proc is not None:
                _stop_group(proc)
            self.log.close()
            raise
        self.proc = proc
        match = READY.search(line)
        if not match:
            _stop_group(self.proc)
            self.log.close()
            raise DemoFailed(f"{args[0]} did not start: {line.strip() or log.read_text()[-500:]}")
        self.address = f"{match.group(1)}:{match.group(2)}"

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _stop_group(self.proc)
            out = ""
        except BaseException:  # Ctrl-C while it stops: stop it for good, and stop the demo too
            _stop_group(self.proc)
            self.log.close()
            raise
        self.log.close()
        return self.proc.returncode, out


def _run_child(argv: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a step to its end in its own process group; stopped with SIGTERM (then SIGKILL) when the
    demo is interrupted or the step overruns, so it never outlives the demo."""
    proc = None
    try:
        with signals_deferred():
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,
            )
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        if proc is not None:
            _stop_group(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue


def _input_lines(stream: int, count: int) -> list[str]:
    return [f"s{stream}-{i:05d};" for i in range(count)]


def run_demo(config: DemoConfig, report: Callable[[Step], None]) -> list[Step]:
    """Run every step, reporting each; raises DemoFailed at the first failure."""
    work = config.workdir
    captures, sink_dir, logs = work / "captures", work / "sink", work / "logs"
    for d in (captures, sink_dir, logs):
        d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": str(config.columns), "PYTHONUNBUFFERED": "1"}
    steps: list[Step] = []

    def done(step: Step) -> None:
        steps.append(step)
        report(step)
        if not step.ok:
            raise DemoFailed(f"{step.name}: {step.detail}")

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return _run_child([*COMMAND, *args], timeout, env)

    inputs = []
    for s in range(config.streams):
        path = work / f"input-{s}.txt"
        path.write_text("\n".join(_input_lines(s, config.count)) + "\n")
        inputs.append(path)
    faults = work / "sink-faults.json"
    faults.write_text(json.dumps({"abort_vote": [{"txn_id": "c_id=2$"}]}))

    sink = _Server(
        ["mock-sink", "--listen", ":0", "-o", str(sink_dir), "--faults", str(faults), "--format", "json"],
        env,
        logs / "mock-sink.log",
    )
    worker = None
    try:
        done(Step("mock-sink", True, f"listening on {sink.address}, voting abort on txn c_id=2"))
        worker = _Server(
            [
                "mock-worker",
                "--listen",
                ":0",
                "--no-live",
                "--format",
                "json",
                "--sink-connect",
                sink.address,
                "--state",
                str(work / "worker-state.json"),
                "--checkpoint-every",
                str(config.checkpoint_every),
                "--checkpoint-ms",
                "200",
                "--restart-after",
                str(config.restart_after),
                "--record",
                str(captures / "source-side.pcap"),
                "--sink-record",
                str(captures / "sink-side.pcap"),
            ],  # fmt: skip
            env,
            logs / "mock-worker.log",
        )
        done(
            Step("mock-worker", True, f"listening on {worker.address}, RESTART after {config.restart_after}")
        )
        source = run(
            "mock-source", "--connect", worker.address, "--key", "{stream}", "--format", "json", "-q",
            *map(str, inputs),
        )  # fmt: skip
        if source.returncode != 0:
            done(Step("mock-source", False, source.stderr.strip()[-800:] or source.stdout[-800:]))
        stats = json.loads(source.stdout.strip().splitlines()[-1])
        done(
            Step(
                "mock-source",
                True,
                f"{stats['messages']} messages on {stats['streams']} streams, "
                f"{stats['restarts']} RESTART(s), {stats['replayed']} replayed, all acknowledged",
            )
        )
        code, out = worker.stop()
        worker = None
        if code != 0:
            done(
                Step(
                    "mock-worker stop", False, f"exit {code}: {(logs / 'mock-worker.log').read_text()[-800:]}"
                )
            )
        summary = json.loads(out.strip().splitlines()[-1])
        done(
            Step(
                "mock-worker stop",
                True,
                f"{summary['messages']} delivered, {summary['replays_dropped']} replays dropped, "
                f"{summary['checkpoints']} checkpoints, {summary['restarts_sent']} RESTART(s) sent",
            )
        )
    finally:
        if worker is not None:
            worker.stop()
        code, out = sink.stop()
    sink_summary = json.loads(out.strip().splitlines()[-1]).get("summary", {}) if out.strip() else {}
    done(
        Step(
            "mock-sink stop",
            code == 0,
            f"{sink_summary.get('commits', '?')} commits, {sink_summary.get('aborts', '?')} aborts"
            if code == 0
            else f"exit {code}",
        )
    )

    check = run("mock-sink", "--check", str(sink_dir))
    done(
        Step(
            "mock-sink --check", check.returncode == 0, "output agrees with the transaction log", check.stdout
        )
    )

    (output,) = sink_dir.glob("*.out")
    records = output.read_text().split(";")[:-1]
    for s in range(config.streams):
        mine = [r.strip() for r in records if r.strip().startswith(f"s{s}-")]
        if mine != [line[:-1] for line in _input_lines(s, config.count)]:
            done(
                Step("exactly once", False, f"stream {s}: the sink's committed output differs from the input")
            )
    done(
        Step(
            "exactly once",
            len(records) == config.streams * config.count,
            f"the sink committed all {len(records)} messages once each, every stream in order",
        )
    )

    pcaps = sorted(str(p) for p in captures.glob("*.pcap"))
    dissect = run("dissect", "--summary", "--strict", *pcaps)
    done(
        Step(
            "dissect --strict",
            dissect.returncode == 0,
            "no protocol violations in the recordings" if dissect.returncode == 0 else dissect.stderr[-800:],
            dissect.stdout,
        )
    )

    report_path = work / "report.html"
    drawn = run("report", *pcaps, "-o", str(report_path), "--title", "wallaroo-proto demo")
    done(
        Step(
            "report",
            drawn.returncode == 0,
            f"ladder diagrams, credits and 2PC latencies of the recordings: {report_path}"
            if drawn.returncode == 0
            else drawn.stderr[-800:],
        )
    )

    if config.spark:
        replay = run("spark-replay", str(captures), "--master", config.master, "--rows", "10", timeout=900)
        done(
            Step(
                "spark-replay",
                replay.returncode == 0,
                f"audit of {len(pcaps)} captures on Spark {config.master}"
                if replay.returncode == 0
                else replay.stderr[-1500:],
                replay.stdout,
            )
        )
    return steps
