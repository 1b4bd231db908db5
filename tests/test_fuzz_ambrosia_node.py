"""``fuzz`` playing the IC against AMBROSIA's own Node.js binding (the real peer), a short budget.

The binding, its build and Azurite come as in ``test_interop_ambrosia_node.py`` (whose fixtures
these are), and skip the same way when the binding's source is absent. The seed is a first
start recorded with the same binding; the counter app is registered once for two fixed ports
(``{port}`` in ``--spawn`` names only the first of fuzz's listeners, and the binding reads both
from its registration) and started afresh for each case.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from support import Server, run_cli
from test_fuzz_ambrosia import free_ports
from test_interop_ambrosia_node import (  # noqa: F401 - the fixtures, used by name
    APP,
    DEADLINE,
    PORTS,
    NodeApp,
    build,
    pytestmark,
    storage,
)


def register(built, connection: str, folder, instance: str, rport: int, sport: int) -> None:
    """The app's registration in Azurite and its config, as ``NodeApp`` writes them, without starting it."""
    folder.mkdir()
    lb = built / "Ambrosia-Node"
    seeded = subprocess.run(
        ["node", str(APP / "seed.js"), str(lb / "node_modules/azure-storage"), instance]
        + [str(rport), str(sport), f"{folder}/iclog/"],
        env={**os.environ, "AZURE_STORAGE_CONN_STRING": connection},
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
        "lbOptions": {"deleteRemoteCRAConnections": False, "outputLogDestination": "Console"},
    }
    (folder / "ambrosiaConfig.json").write_text(json.dumps(config))


def test_fuzzing_the_node_binding_as_its_ic(build, storage, tmp_path):  # noqa: F811
    seed = tmp_path / "seed.pcap"
    ic = Server(
        "ambrosia", "mock-ic", "--exit-when-done", "--rpcs", "40", "--batch", "10",
        "--checkpoint-every", "2", "--record", str(seed),
    )  # fmt: skip
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    with ic:
        app = NodeApp(build, storage, tmp_path / "recorded", "recorded", rport, sport)
        code, _, err = ic.stop(sig=None, timeout=DEADLINE)
        assert code == 0, err
        assert app.end() == 0, app.tail()

    rport, sport = free_ports(2)
    folder = tmp_path / "fuzzed"
    register(build, storage, folder, "fuzzed", rport, sport)
    lib = build / "Ambrosia-Node/lib/Ambrosia.js"
    start = f"cd {shlex.quote(str(folder))} && exec node {APP / 'app.js'} {lib} status.json"
    findings = tmp_path / "findings"
    done = run_cli(
        "fuzz", "--seeds", str(seed), "--play", "ic", "--listen", f"127.0.0.1:{rport}",
        "--listen", f"127.0.0.1:{sport}", "--spawn", f"sh -c {shlex.quote(start)}", "--budget", "8",
        "--seed", "1", "--answer-timeout", "2", "--shrink-time", "20", "--confirm", "2",
        "--findings", str(findings), "--format", "json",
        timeout=900, env={**os.environ, "AZURE_STORAGE_CONN_STRING": storage},
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    print(json.dumps(summary, indent=1))
    assert summary["executions"] >= 8
    for found in summary["findings"]:
        assert run_cli("dissect", found["reproducer"]).returncode in (0, 1), found
