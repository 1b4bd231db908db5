"""AMBROSIA's promise: kill -9 of the IC or the LB at random moments, and the state ends as if none happened.

mock-ic (durable --log-dir, fsync) serves mock-lb; each seed kills one side
or the other a few times at random moments, restarting what died (an IC's
restart also needs a new LB: an LB dies with its IC). The immortal's final
state, the IC's last checkpoint, must equal a crash-free run's.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from test_ambrosia_e2e import finish, start_ic, start_lb

from wallaroo_proto.protocols.ambrosia.immortal import RpcSource

RPCS = 3000
ARGS = ("--rpcs", str(RPCS), "--batch", "15", "--checkpoint-every", "4")
LB_ARGS = ("--connect-timeout", "15")


def progress(log_dir: str) -> int:
    """Input RPCs the IC's last durable checkpoint counts: the strikes' clock (it never goes back)."""
    try:
        line = (Path(log_dir) / "checkpoint.bin").read_bytes().partition(b"\n")[0]
    except FileNotFoundError:
        return 0
    return json.loads(line)["generated"]  # replaced atomically, so never half written


def crash_free_state(tmp_path) -> dict:
    ic, rport, sport = start_ic(*ARGS, "--log-dir", str(tmp_path / "clean"))
    code, ic_sum, lb_code, lb_sum, lb_err = finish(ic, start_lb(rport, sport))
    assert (code, lb_code) == (0, 0), lb_err
    return ic_sum["last_checkpoint"]["state"]


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [1, 2])
def test_state_survives_random_kill_9(tmp_path, seed):
    rng = random.Random(seed)
    log_dir = str(tmp_path / "log")
    ic, rport, sport = start_ic(*ARGS, "--log-dir", log_dir)
    kills: list[str] = []
    lb = start_lb(rport, sport, *LB_ARGS)
    while len(kills) < 3:
        # Strike once the checkpoints have counted a random number more RPCs: progress, not
        # time, so a fast machine cannot finish the run before the first strike.
        target = progress(log_dir) + rng.randint(60, 500)
        deadline = time.monotonic() + 120
        while progress(log_dir) < target and ic.proc.poll() is None:
            assert time.monotonic() < deadline, f"the IC stopped checkpointing at {progress(log_dir)} RPCs"
            time.sleep(0.002)
        if ic.proc.poll() is not None:  # it finished before the strike
            break
        victim = rng.choice(("ic", "lb"))
        kills.append(victim)
        if victim == "ic":
            ic.kill()
            lb.kill()  # the LB dies with its IC
            lb.communicate(timeout=60)
            ic, rport, sport = start_ic(*ARGS, "--log-dir", log_dir)
        else:
            lb.kill()
            lb.communicate(timeout=60)
        lb = start_lb(rport, sport, *LB_ARGS)
    code, out, _ = ic.stop(sig=None, timeout=120)
    lb_out, lb_err = lb.communicate(timeout=120)
    assert code == 0, kills
    assert kills, "the run ended before the first strike: nothing was tested"
    ic_sum = json.loads(out.splitlines()[-1])
    assert ic_sum["violations"] == [] and ic_sum["done"]
    final = ic_sum["last_checkpoint"]["state"]
    assert final == RpcSource(RPCS).expected(), kills
    if lb.returncode == 0:
        lb_sum = json.loads(lb_out.splitlines()[-1])
        assert lb_sum["violations"] == [] and lb_sum["state"] == final
    else:  # the IC had finished just before the strike: the LB started after it found nobody
        assert "cannot reach the IC" in lb_err, lb_err
    assert final == crash_free_state(tmp_path), kills
