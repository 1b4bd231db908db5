"""mock-ic against AMBROSIA's own Node.js language binding, running a small app of ours.

The binding (``Ambrosia-Node``, by AMBROSIA's authors) lives in
``../shared/peers/ambrosia-node`` beside the project (set AMBROSIA_NODE_PEER to use
another copy). It is never copied into the project: these tests build it once from the
npm registry into a cache (AMBROSIA_NODE_BUILD, default ~/.cache/wallaroo-proto/ambrosia-node)
together with Azurite, the Azure storage emulator the binding reads its registration
from at start-up. The app, ``tests/peers/ambrosia_node/app.js``, is the counter immortal
of mock-lb written on the binding's public API, so mock-ic's ``RpcSource.expected()`` is
its exact final state. Without the peer folder, or without node and npm, they skip and
say why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server, run_cli

from wallaroo_proto.protocols.ambrosia.immortal import RpcSource

PEER = Path(
    os.environ.get("AMBROSIA_NODE_PEER", Path(__file__).resolve().parents[2] / "shared/peers/ambrosia-node")
)
APP = Path(__file__).resolve().parent / "peers" / "ambrosia_node"
AZURITE = "azurite@3.34.0"  # 3.37 and later need Node 22
PORTS = re.compile(r"receive port (\d+), send port (\d+)")
DEADLINE = 120  # generous: a loaded machine three times slower
#: Azurite's well-known development account (public, in Azure's documentation).
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

_missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not (PEER / "Ambrosia-Node" / "package.json").is_file(),
        reason=f"AMBROSIA's Node binding is not at {PEER} (set AMBROSIA_NODE_PEER)",
    ),
    pytest.mark.skipif(
        bool(_missing), reason=f"{' and '.join(_missing)} not found: the Node binding needs them"
    ),
]


def _npm(*args: str, cwd: Path) -> None:
    done = subprocess.run(["npm", *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode:
        pytest.fail(f"npm {' '.join(args)} in {cwd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


@pytest.fixture(scope="module")
def build() -> Path:
    """The binding built from the npm registry (lib/Ambrosia.js) and Azurite, once per source version."""
    source = PEER / "Ambrosia-Node"
    key = hashlib.sha256((source / "package-lock.json").read_bytes() + AZURITE.encode()).hexdigest()[:12]
    root = (
        Path(os.environ.get("AMBROSIA_NODE_BUILD", Path.home() / ".cache/wallaroo-proto/ambrosia-node")) / key
    )
    lb = root / "Ambrosia-Node"
    if not (root / "done").is_file():
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(source, lb)
        _npm("install", "--no-audit", "--no-fund", "--ignore-scripts", cwd=lb)
        done = subprocess.run(
            ["npx", "tsc", "-p", "tsconfig.json"], cwd=lb, capture_output=True, text=True, timeout=900
        )
        if done.returncode:
            pytest.fail(f"tsc failed:\n{done.stdout[-3000:]}")
        (root / "azurite").mkdir()
        _npm("install", "--no-audit", "--no-fund", AZURITE, cwd=root / "azurite")
        (root / "done").write_text(key)
    return root


@pytest.fixture(scope="module")
def storage(build: Path):
    """Azurite on free ports; the connection string the binding reads (AZURE_STORAGE_CONN_STRING)."""
    script = build / "azurite/node_modules/azurite/dist/src/azurite.js"
    proc = subprocess.Popen(
        ["node", str(script), "--silent", "--disableTelemetry", "--inMemoryPersistence", "--loose"]
        + ["--skipApiVersionCheck"]
        + [f"--{s}{o}" for s in ("blob", "queue", "table") for o in ("Host=127.0.0.1", "Port=0")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ports: dict[str, str] = {}
    deadline = time.monotonic() + DEADLINE
    while len(ports) < 3:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, f"Azurite did not start: {line!r}"
        found = re.search(r"(Blob|Queue|Table) service is successfully listening at (\S+)", line)
        if found:
            ports[found.group(1)] = found.group(2)
    yield (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_KEY};"
        + "".join(f"{kind}Endpoint={url}/devstoreaccount1;" for kind, url in ports.items())
    )
    proc.terminate()
    proc.wait(timeout=60)


class NodeApp:
    """The counter app on the Node binding, registered and configured for one mock-ic's ports."""

    def __init__(
        self, build: Path, storage: str, folder: Path, instance: str, rport: int, sport: int
    ) -> None:
        folder.mkdir(exist_ok=True)
        self.status_path = folder / "status.json"
        self.status_path.unlink(missing_ok=True)
        env = {**os.environ, "AZURE_STORAGE_CONN_STRING": storage}
        lb = build / "Ambrosia-Node"
        seeded = subprocess.run(
            ["node", str(APP / "seed.js"), str(lb / "node_modules/azure-storage"), instance]
            + [str(rport), str(sport), f"{folder}/iclog/"],
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert seeded.returncode == 0, seeded.stderr
        config = {
            "instanceName": instance,
            "icCraPort": 2500,
            "icReceivePort": rport,
            "icSendPort": sport,
            "icHostingMode": "Separated",
            "lbOptions": {
                "deleteRemoteCRAConnections": False,
                "outputLogDestination": "Console",
                "outputLoggingLevel": "Minimal",
            },
        }
        (folder / "ambrosiaConfig.json").write_text(json.dumps(config))
        self.log = open(folder / "app.log", "ab")  # noqa: SIM115 (open while the app runs)
        self.proc = subprocess.Popen(
            ["node", str(APP / "app.js"), str(lb / "lib/Ambrosia.js"), str(self.status_path)],
            cwd=folder,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.folder = folder

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except FileNotFoundError:
            return {}

    def wait_for(self, condition, what: str) -> dict:
        deadline = time.monotonic() + DEADLINE
        while True:
            status = self.status()
            if condition(status):
                return status
            assert time.monotonic() < deadline, f"{what}; the app: {status}; its log: {self.tail()}"
            time.sleep(0.02)

    def tail(self) -> str:
        self.log.flush()
        return (self.folder / "app.log").read_text(errors="replace")[-3000:]

    def end(self) -> int:
        """Wait for the app to exit (its IC went away); kill it if it does not."""
        try:
            code = self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=DEADLINE)
        self.log.close()
        return code


def _totals(status: dict) -> dict:
    return {k: status.get(k) for k in ("rpcs", "total", "bonuses", "initialized")}


def _expected(source: RpcSource) -> dict:
    return {k: v for k, v in source.expected().items() if k != "digest"}


def test_first_start_rpcs_batches_self_calls_and_checkpoints(build, storage, tmp_path):
    pcap = tmp_path / "node.pcap"
    ic = Server(
        "ambrosia", "mock-ic", "--format", "json", "--exit-when-done", "--rpcs", "300", "--batch", "10",
        "--checkpoint-every", "5", "--log-dir", str(tmp_path / "iclog"), "--record", str(pcap),
    )  # fmt: skip
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    with ic:
        app = NodeApp(build, storage, tmp_path / "app", "first", rport, sport)
        code, out, err = ic.stop(sig=None, timeout=DEADLINE)
        app_code = app.end()
    summary = json.loads(out.splitlines()[-1])
    status = app.status()
    assert code == 0 and summary["violations"] == [], err
    assert app_code == 0, app.tail()
    assert _totals(status) == _expected(RpcSource(300))
    # The IC listens on its send port only once it has accepted the receive port (the real IC
    # too), so a binding quick to connect the second port may be refused once and retry.
    events = [event for event in status["events"] if event != "WaitingToConnectToIC"]
    assert events[:3] == ["ICConnected", "CheckpointSaved", "BecomingPrimary"]
    assert "FirstStart" in status["events"] and status["checkpointsSaved"] >= 3
    assert status["impulses"] > 0  # CountReplayableRPCBatch's Impulses were read
    assert summary["first_starts"] == 1 and summary["self_calls_logged"] == status["bonuses"]
    assert _totals(summary["last_checkpoint"]["state"]) == _totals(status)  # the app's own checkpoint
    checked = run_cli("dissect", "--strict", "--summary", str(pcap))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_mock_ic_killed_mid_run_and_restarted_leaves_the_totals_of_a_run_without_crash(
    build, storage, tmp_path
):
    """RPCs come on stdin: half of them, the IC killed -9 once the app applied them all (so the
    kill lands mid-run by construction), then a restarted IC on the same log and all of them."""
    lines = [RpcSource(400).args(i) for i in range(400)]
    half = 205  # not a whole number of records: the log holds records after its last checkpoint
    log = str(tmp_path / "iclog")
    args = ["ambrosia", "mock-ic", "--format", "json", "--input", "-", "--batch", "10"]
    args += ["--checkpoint-every", "5", "--log-dir", log]

    def start_ic(*more: str) -> tuple[subprocess.Popen, int, int]:
        proc = subprocess.Popen(
            [*COMMAND, *args, *more], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        rport, sport = map(int, PORTS.search(proc.stdout.readline().decode()).groups())
        return proc, rport, sport

    ic, rport, sport = start_ic()
    app = NodeApp(build, storage, tmp_path / "app", "crash", rport, sport)
    ic.stdin.write(b"".join(line + b"\n" for line in lines[:half]))
    ic.stdin.flush()
    applied = _expected(RpcSource(lines=lines[:half]))["rpcs"]
    before = app.wait_for(lambda s: s.get("rpcs") == applied, f"the app never applied the first {half} RPCs")
    ic.send_signal(signal.SIGKILL)
    ic.wait(timeout=DEADLINE)
    app.end()
    assert before["checkpointsSaved"] >= 2

    ic, rport, sport = start_ic("--exit-when-done")
    app = NodeApp(build, storage, tmp_path / "app", "crash", rport, sport)
    ic.stdin.write(b"".join(line + b"\n" for line in lines))
    ic.stdin.close()
    ic.wait(timeout=DEADLINE)
    out, err = ic.stdout.read().decode(), ic.stderr.read().decode()
    app_code = app.end()
    summary = json.loads(out.splitlines()[-1])
    assert ic.returncode == 0 and summary["violations"] == [], err
    assert summary["recoveries"] == 1 and summary["rpcs_before"] == half
    status = app.status()
    assert app_code == 0, app.tail()
    assert status["checkpointsLoaded"] == 1 and "RecoveryComplete" in status["events"]
    assert _totals(status) == _expected(RpcSource(lines=lines))
