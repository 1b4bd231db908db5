"""The README's recipes run as written.

A block marked ``<!-- example NAME server -->`` is started and waited on until its ready line
(``listening on``); the blocks marked ``<!-- example NAME run -->`` then run one after the other
and must exit 0; the server is then stopped with Ctrl-C and must exit 0 as well. Each fixed port
in the blocks is swapped for a free one, so two test runs at once do not collide; ``wallaroo-proto``
and ``python`` are this checkout's, in a scratch folder that sees the repository's
``captures/`` and ``samples/``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = re.compile(r"<!-- example (?P<name>[\w-]+) (?P<role>server|run) -->\n```sh\n(?P<body>.*?)```", re.S)
PORT = re.compile(r"(?<=127\.0\.0\.1:)(\d{4,5})\b|(?<=--port )(\d{4,5})\b")


def examples() -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for match in EXAMPLE.finditer((ROOT / "README.md").read_text()):
        found.setdefault(match["name"], []).append((match["role"], match["body"]))
    return found


def test_the_readme_has_its_recipes_early():
    """The first recipe starts within the README's first 60 lines."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("<!-- example "))
    assert first < 60, first
    assert len(examples()) >= 5
    markers = re.findall(r"<!-- example ", (ROOT / "README.md").read_text())
    assert len(markers) == sum(len(blocks) for blocks in examples().values()), "a marker without its sh block"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_free_ports(blocks: list[tuple[str, str]]) -> list[tuple[str, str]]:
    ports: dict[str, str] = {}

    def swap(match: re.Match) -> str:
        return ports.setdefault(match[0], str(free_port()))

    return [(role, PORT.sub(swap, body)) for role, body in blocks]


def scratch(tmp_path: Path) -> dict[str, str]:
    """A folder that sees the repository's sample files, and an environment whose
    ``wallaroo-proto`` and ``python`` are this checkout's."""
    for name in ("captures", "samples"):
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shims = {"wallaroo-proto": f"{sys.executable} -m wallaroo_proto_cli", "python": sys.executable}
    for name, target in shims.items():
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def own_group_with_ctrl_c() -> None:
    """The server gets its own process group (Ctrl-C goes to the group, as a terminal sends it)
    and SIGINT at its default even when the test run was started in the background."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_ready(server: subprocess.Popen, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if "listening on" in log.read_text():
            return
        if server.poll() is not None:
            pytest.fail(f"the server exited {server.returncode} before its ready line: {log.read_text()}")
        time.sleep(0.05)
    pytest.fail(f"no ready line within the deadline: {log.read_text()}")


def run_block(body: str, cwd: Path, env: dict) -> tuple[int, str]:
    """A recipe's commands as a shell runs them, stopping at the first that fails; on a timeout
    the whole group goes (a JVM that spark-replay started too)."""
    shell = subprocess.Popen(
        ["bash", "-ec", body], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        said, _ = shell.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        said, _ = shell.communicate()
        return -1, said
    return shell.returncode, said


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(examples()))
def test_a_readme_recipe_runs_as_written(name: str, tmp_path: Path) -> None:
    blocks = with_free_ports(examples()[name])
    env = scratch(tmp_path)
    servers = [body for role, body in blocks if role == "server"]
    server = None
    log = tmp_path / ".server.log"
    if servers:
        (body,) = servers
        with open(log, "w") as out:
            server = subprocess.Popen(
                ["bash", "-c", f"exec {body.strip()}"], cwd=tmp_path, env=env, stdout=out,
                stderr=subprocess.STDOUT, preexec_fn=own_group_with_ctrl_c,
            )  # fmt: skip
    try:
        if server is not None:
            wait_ready(server, log, time.monotonic() + 120)
        for role, body in blocks:
            if role == "run":
                code, said = run_block(body, tmp_path, env)
                assert code == 0, f"{body}\nexit {code}\n{said}"
        if server is not None:
            os.killpg(server.pid, signal.SIGINT)
            assert server.wait(timeout=60) == 0, log.read_text()
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
