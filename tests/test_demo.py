"""The main job, without its Spark step (spark-replay has its own tests; CI runs the full demo)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, as_foreground, run_cli

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(300)
def test_demo_passes_and_leaves_its_recordings(tmp_path) -> None:
    wide = {**os.environ, "COLUMNS": "300"}
    result = run_cli(
        "demo", "--no-spark", "--workdir", str(tmp_path), "--count", "200", timeout=280, env=wide
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo passed" in result.stdout
    assert "the sink committed all 600 messages once each, every stream in order" in result.stdout
    assert "1 RESTART(s)" in result.stdout or "RESTART(s) sent" in result.stdout
    assert sorted(p.name for p in (tmp_path / "captures").iterdir()) == ["sink-side.pcap", "source-side.pcap"]
    report = tmp_path / "report.html"
    assert f"report: {report}" in result.stdout.replace("\n", "")
    page = report.read_text()
    assert page.count('class="ladder-box"') >= 3 and "2PC PHASE1 to REPLY" in page


def _children(pid: int) -> list[tuple[int, int]]:
    """(pid, process group) of each child of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # after the name: state, ppid, pgrp
            found.append((int(stat.parent.name), int(fields[2])))
    return found


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None if there is none, or it has
    exited and waits only to be reaped (a zombie): a pid with another start time is another
    process that was given the same number."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@pytest.mark.timeout(300)
def test_ctrl_c_stops_the_demo_and_its_peers_with_130_and_one_line(tmp_path) -> None:
    demo = subprocess.Popen(
        [*COMMAND, "demo", "--no-spark", "--workdir", str(tmp_path), "--count", "200000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
        start_new_session=True,  # as a shell runs it: a group of its own that Ctrl-C is sent to
    )
    try:
        for line in demo.stdout:
            if "mock-worker" in line:  # the sink and the worker run, the source starts next
                break
        # A peer is seen between its fork and its setsid(): wait until each leads its own group.
        deadline = time.monotonic() + 60
        peers = _children(demo.pid)
        while time.monotonic() < deadline and not (
            len(peers) >= 2 and all(group == pid for pid, group in peers)
        ):
            time.sleep(0.05)
            peers = _children(demo.pid)
        assert len(peers) >= 2, peers
        assert all(group == pid for pid, group in peers), (
            f"each peer leads a process group of its own: {peers}"
        )
        started = {pid: _started(pid) for pid, _ in peers}
        os.killpg(demo.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = demo.communicate(timeout=120)
    finally:
        demo.kill()
    assert demo.returncode == 130, out + err
    assert err == "wallaroo-proto demo: interrupted\n"
    assert "interrupted; what was done so far is in" in out
    # Pids are reused fast on a busy machine (a JVM's threads take them too): a peer outlived the
    # demo only if the process with its number is the one that started then.
    outlived = [pid for pid, _ in peers if _started(pid) is not None and _started(pid) == started[pid]]
    assert outlived == [], "a peer outlived the demo"
    for log in (tmp_path / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log
