"""``replay`` of a recorded IC session to AMBROSIA's own Node.js binding (the real peer).

A first start of mock-ic with the Node binding's counter app (``tests/peers/ambrosia_node``)
is recorded; its IC side is then played by ``replay`` to a new app process, registered with
the replay's two ports, and every frame the binding sends must match the recorded ones.
The binding, its build and Azurite come as in ``test_interop_ambrosia_node.py`` (whose
fixtures these are), and skip the same way when the binding's source is absent.
"""

from __future__ import annotations

import json
import re

from support import Server, run_cli, wait_for
from test_interop_ambrosia_node import (  # noqa: F401 - the fixtures, used by name
    DEADLINE,
    PORTS,
    NodeApp,
    build,
    pytestmark,
    storage,
)

from wallaroo_proto.protocols.ambrosia.immortal import RpcSource

LISTENING = re.compile(r"listening on \S+:(\d+)")


def frames_of(capture) -> list[dict]:
    done = run_cli("dissect", str(capture), "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def log_of(folder) -> str:
    """An ended app's log (``NodeApp.tail`` reads it while the app runs)."""
    return (folder / "app.log").read_text(errors="replace")[-3000:]


def test_a_recorded_ic_session_played_to_the_node_binding(build, storage, tmp_path):  # noqa: F811
    recording = tmp_path / "node.pcap"
    ic = Server(
        "ambrosia", "mock-ic", "--format", "json", "--exit-when-done", "--rpcs", "120", "--batch", "10",
        "--checkpoint-every", "5", "--record", str(recording),
    )  # fmt: skip
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    with ic:
        app = NodeApp(build, storage, tmp_path / "recorded", "recorded", rport, sport)
        code, _, err = ic.stop(sig=None, timeout=DEADLINE)
        assert code == 0, err
        assert app.end() == 0, log_of(tmp_path / "recorded")
    recorded = frames_of(recording)

    live = tmp_path / "live.pcapng"
    player = Server(
        "replay", str(recording), "--play", "ic", "--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0",
        "--format", "json", "--record", str(live), "--answer-timeout", "30",
    )  # fmt: skip
    with player:
        wait_for(lambda: len(LISTENING.findall("".join(player.lines))) == 2, "the replay's two ports")
        rport, sport = map(int, LISTENING.findall("".join(player.lines)))
        app = NodeApp(build, storage, tmp_path / "replayed", "replayed", rport, sport)
        code, out, err = player.stop(sig=None, timeout=DEADLINE)
        app_code = app.end()
    report = json.loads(out.splitlines()[-1])
    assert code == 0, (report, err)
    assert app_code == 0, log_of(tmp_path / "replayed")
    # an RPCBatch stands for its RPCs: the binding batches as its timers fall, run by run
    lb_frames = [f for f in recorded if f["sender"] == "lb"]
    assert report["counts"]["matched"] == sum(
        f.get("rpc_count", 1) if f["type"] == "RPCBatch" else 1 for f in lb_frames
    )
    assert report["own_violations"] == []
    expected = {k: v for k, v in RpcSource(120).expected().items() if k != "digest"}
    assert {k: app.status().get(k) for k in expected} == expected  # the binding applied the replayed log
    assert run_cli("dissect", "--strict", str(live)).returncode == 0
