"""The promise DCP makes, on real processes: whatever failovers and kill -9s happen, a consumer that
finally streams to the end holds the producer's latest state of every vbucket.

Each seed plays rounds. A round starts the producer from its --state (after the first round it may
fail over, losing its newest items, and it adds new ones), starts the consumer from its own --state,
and kills one of them with SIGKILL. The last round runs to the end; then the consumer's items must
equal the producer's.

The strike lands mid-run by construction: until the last round the consumer follows (--follow, so
it never ends by itself), and the strike waits for observed progress, not for a time: the
consumer's first save of the round (a completed snapshot, or a rollback's truncation).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, Server
from test_dcp_e2e import consumer_items, producer_items

pytestmark = pytest.mark.e2e

SEEDS = (11, 42, 1)
ROUNDS = 4


@pytest.mark.parametrize("seed", SEEDS)
def test_copy_equals_the_producer_after_failovers_and_kills(tmp_path, seed):
    rng = random.Random(seed)
    pstate, cstate, out = tmp_path / "p.json", tmp_path / "c.json", tmp_path / "items.jsonl"
    story = []
    for round_ in range(ROUNDS):
        last = round_ == ROUNDS - 1
        args = ["--vbuckets", "3", "--items", str(rng.randint(40, 400)), "--keys", "60"]
        args += [
            "--state",
            str(pstate),
            "--seed",
            str(seed * 100 + round_),
            "--snapshot-size",
            str(rng.randint(3, 50)),
        ]
        if round_ and rng.random() < 0.7:
            args += ["--failover", str(rng.randint(0, 80))]
        server = Server("dcp", "mock-producer", "--port", "0", *args)
        before = saved(cstate)
        consumer = subprocess.Popen(
            [
                *COMMAND,
                "dcp",
                "mock-consumer",
                "--connect",
                server.address,
                "--state",
                str(cstate),
                "--buffer-size",
                str(rng.choice([0, 2000, 50_000])),
                "--format",
                "json",
                *(["--out", str(out)] if last else ["--follow"]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        victim = None if last else rng.choice(["producer", "consumer"])
        story.append((args, victim))
        try:
            if victim is not None:
                deadline = time.monotonic() + 120
                while saved(cstate) == before:
                    assert consumer.poll() is None, (story, consumer.communicate()[1])
                    assert time.monotonic() < deadline, "the consumer saved nothing in 120 s"
                    time.sleep(0.005)
                if victim == "producer":
                    server.kill()
                else:
                    consumer.send_signal(signal.SIGKILL)
            stdout, stderr = consumer.communicate(timeout=120)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait(timeout=30)
            server.kill()
        if victim is None:
            assert consumer.returncode == 0, (story, stderr)
            summary = json.loads(stdout.splitlines()[-1])
            assert summary["violations"] == 0, summary["violation_list"]
        elif consumer.returncode not in (0, 1, -signal.SIGKILL):
            pytest.fail(f"consumer exit {consumer.returncode}: {stderr}")
        if consumer.returncode == 1:  # lost its producer: it says so, nothing else
            assert "connection lost" in stdout or "connection" in stderr, stderr
    assert consumer_items(out) == producer_items(pstate), story


def saved(cstate: Path) -> str | None:
    """The consumer's saved copy (replaced atomically, so never half written); None before the first."""
    try:
        return cstate.read_text()
    except FileNotFoundError:
        return None
