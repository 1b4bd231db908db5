"""``fuzz`` against our Tremor mocks over real loopback sockets: a rule broken on purpose in the node
is found, shrunk and written as a reproducer; the mocks as they are give no finding, the node
played to by our client, and the client (started for each case) played to by a node.

No real Tremor peer runs here (docs/tremor.md, "Fuzzing"): our two mocks are the peers.

The planted break is switched on by the environment variable ``WALLAROO_PROTO_PLANT`` (never a
flag): ``reack-disconnect`` has the mock node acknowledge a disconnect of a stream that is not
connected, where it must close the session with 0.207 (``protocols/tremor/node.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

pytestmark = pytest.mark.e2e

#: A short exchange of our mock client (4 echoes, 2 pub/sub events): few frames, so that each
#: case is quick and a disconnect is one frame of ours in seven.
EXCHANGE = ("--messages", "4", "--window", "2", "--payload-size", "4", "--publish", "2")
#: Executions: counted, not timed, so a slow machine runs the same number of cases.
BUDGET = "150"


def record_seed(port: int, path: Path) -> None:
    """The seed: our mock client's exchange with the very node fuzzed (its answers recorded)."""
    done = run_cli(
        "tremor", "mock-client", "--connect", f"127.0.0.1:{port}", *EXCHANGE, "-q", "--record", str(path)
    )
    assert done.returncode == 0, done.stdout + done.stderr


def fuzz(*args: str, timeout: float = 600) -> tuple[int, dict, str]:
    done = run_cli("fuzz", *args, "--format", "json", timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]  # after a ready line
    summary = json.loads(lines[-1]) if lines else {}
    return done.returncode, summary, done.stderr


def test_a_node_that_acks_a_disconnect_of_no_stream_is_found_and_shrunk(tmp_path):
    seed = tmp_path / "seed.pcap"
    with Server(
        "tremor", "mock-node", "--port", "0", env={"WALLAROO_PROTO_PLANT": "reack-disconnect"}
    ) as node:
        record_seed(node.port, seed)
        args = ("--seeds", str(seed), "--play", "client", "--connect", node.address)
        code, summary, err = fuzz(
            *args, "--budget", BUDGET, "--seed", "1", "--findings", str(tmp_path / "ff")
        )
        assert code == 1, err
        found = [f for f in summary["findings"] if f["kind"] == "no-error-reply"]
        assert found and all("disconnect" in f["detail"] for f in found), summary["findings"]
        first = min(found, key=lambda f: f["frames"])  # the same break, reached from several states
        # shrunk from the seed's session; 5 to 13 frames, by how the node's answers interleave
        assert first["deterministic"] and first["frames"] <= 15, found
        reproducer = first["reproducer"]
        assert Path(reproducer).is_file()
        assert run_cli("dissect", reproducer).returncode in (0, 1)
        rerun = run_cli("fuzz", "--rerun", reproducer, "--play", "client", "--connect", node.address)
        assert rerun.returncode == 1, rerun.stdout + rerun.stderr


def test_our_node_as_it_is_gives_no_finding(tmp_path):
    seed = tmp_path / "seed.pcap"
    with Server("tremor", "mock-node", "--port", "0") as node:
        record_seed(node.port, seed)
        args = ("--seeds", str(seed), "--play", "client", "--connect", node.address)
        code, summary, err = fuzz(
            *args, "--budget", BUDGET, "--seed", "1", "--findings", str(tmp_path / "ff")
        )
    assert code == 0 and summary["findings"] == [], summary.get("findings") or err
    assert summary["executions"] >= int(BUDGET)


def test_our_client_as_it_is_gives_no_finding(tmp_path):
    """The node's side played to our mock client, started for each case on the port fuzz listens on."""
    seed = tmp_path / "seed.pcap"
    with Server("tremor", "mock-node", "--port", "0") as node:
        record_seed(node.port, seed)
    client = " ".join(
        [sys.executable, *COMMAND[1:], "tremor", "mock-client", "--connect", "127.0.0.1:{port}"]
    )
    client += " " + " ".join(EXCHANGE) + " -q --idle-timeout 30"
    args = ("--seeds", str(seed), "--play", "server", "--listen", "127.0.0.1:0", "--spawn", client)
    code, summary, err = fuzz(*args, "--budget", "30", "--seed", "1", "--findings", str(tmp_path / "ff"))
    assert code == 0 and summary["findings"] == [], summary.get("findings") or err
    assert summary["executions"] >= 30
