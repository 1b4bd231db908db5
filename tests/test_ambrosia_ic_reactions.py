"""mock-ic as a real IC behaves: batches in its records, JSON arguments, sockets open until stopped,
``--rpcs`` as the log's total, ``--input -`` taken as lines come."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from support import COMMAND, Server
from test_ambrosia_e2e import PORTS, finish, start_ic, start_lb

from wallaroo_proto.protocols.ambrosia.codec import (
    COUNT_REPLAYABLE_RPC_BATCH,
    IMPULSE,
    RPC,
    RPC_BATCH,
    batch_messages,
    decode_rpc,
    record_messages,
)
from wallaroo_proto.protocols.ambrosia.immortal import ADD, Counter, RpcSource
from wallaroo_proto.protocols.ambrosia.store import DirStore

DEADLINE = 60


def _inner(body: bytes) -> list[tuple[int, int, int | None, list]]:
    """(type, count, replayable count, RPCs) of each message of a record body."""
    out = []
    for msg in record_messages(body):
        if msg.type == RPC:
            out.append((RPC, 1, None, [decode_rpc(msg.data, outgoing=False)]))
        else:
            count, replayable, inner = batch_messages(msg)
            out.append((msg.type, count, replayable, [decode_rpc(m.data, outgoing=False) for m in inner]))
    return out


def test_mixed_records_hold_plain_rpcs_rpc_batches_and_counted_batches_in_order():
    source = RpcSource(300, batching="mixed")
    groups = _inner(source.body(0, 300))
    kinds = {kind for kind, *_ in groups}
    assert kinds == {RPC, RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH}
    rpcs = [rpc for *_, inner in groups for rpc in inner]
    assert [rpc.args for rpc in rpcs] == [source.args(i) for i in range(300)]
    for kind, count, replayable, inner in groups:
        assert count == len(inner)
        if kind == COUNT_REPLAYABLE_RPC_BATCH:  # the IC counts the non-Impulse ones apart
            assert replayable == sum(rpc.rpc_type != IMPULSE for rpc in inner) < count
        if kind == RPC_BATCH:
            assert len(inner) > 1 and all(rpc.rpc_type != IMPULSE for rpc in inner)
    assert [kind for kind, *_ in _inner(RpcSource(10, batching="all").body(0, 10))] == [RPC_BATCH]
    assert {kind for kind, *_ in _inner(RpcSource(10, batching="none").body(0, 10))} == {RPC}


def test_generated_arguments_are_json_by_default_and_raw_by_option():
    assert RpcSource(3).args(1) == b'{"value":920}'  # (1 * 7919) % 1000 + 1
    assert RpcSource(3, arg_form="raw").args(1) == b"920"
    counter = Counter()
    assert counter.apply(ADD, b'{"value":920}')  # a multiple of 5: a bonus self call
    assert counter.apply(ADD, b'{"value": 7}') == b""  # any JSON spelling of it
    assert counter.total == 927


@pytest.mark.parametrize("batches", ["mixed", "all"])
def test_the_counter_gets_every_rpc_once_through_batches(batches):
    ic, rport, sport = start_ic("--rpcs", "2000", "--batch", "40", "--batches", batches)
    code, ic_sum, lb_code, lb_sum, lb_err = finish(ic, start_lb(rport, sport))
    assert (code, lb_code) == (0, 0), lb_err
    assert lb_sum["violations"] == [] and lb_sum["state"] == RpcSource(2000).expected()


def test_sockets_stay_open_when_all_is_in_until_stopped():
    ic = Server("ambrosia", "mock-ic", "--format", "json", "--rpcs", "20")
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    with ic:
        lb = start_lb(rport, sport)
        deadline = time.monotonic() + DEADLINE
        while "up until stopped" not in ic.stderr():
            assert ic.proc.poll() is None, "mock-ic ended by itself"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        code, out, err = ic.stop(signal.SIGTERM, timeout=DEADLINE)
        lb_out, _ = lb.communicate(timeout=DEADLINE)
    assert code == 0  # a server (no --exit-when-done) stopped by SIGTERM, no rule broken
    summary = json.loads(out.splitlines()[-1])
    assert summary["done"] and summary["rpcs_logged"] == 20
    assert json.loads(lb_out.splitlines()[-1])["state"] == RpcSource(20).expected()


def test_rpcs_is_the_logs_total_and_a_restart_says_so(tmp_path):
    log = str(tmp_path)
    ic, rport, sport = start_ic("--rpcs", "12", "--log-dir", log)
    assert finish(ic, start_lb(rport, sport))[:3:2] == (0, 0)
    ic = Server("ambrosia", "mock-ic", "--exit-when-done", "--rpcs", "8", "--log-dir", log)
    rport, sport = map(int, PORTS.search(ic.lines[-1]).groups())
    lb = start_lb(rport, sport)
    lb.communicate(timeout=DEADLINE)
    code, out, err = ic.stop(sig=None, timeout=DEADLINE)
    assert code == 0
    assert (
        f"resumed from {log} at record 2: 12 input RPCs already logged are skipped, 0 of 8 to deliver "
        "(nothing new: --rpcs is the log's total; raise it or use a new --log-dir)"
    ) in err
    assert "0 RPCs logged and delivered since it started (12 were in the log then; 8 in all)" in out


def test_input_from_stdin_is_delivered_as_lines_come(tmp_path):
    ic = subprocess.Popen(
        [*COMMAND, "ambrosia", "mock-ic", "--format", "json", "--exit-when-done", "--input", "-"]
        + ["--log-dir", str(tmp_path), "--batch", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    rport, sport = map(int, PORTS.search(ic.stdout.readline().decode()).groups())  # before any input
    lb = start_lb(rport, sport)

    def logged() -> int:
        records = DirStore(str(tmp_path)).load().records
        return records[-1].generated if records else 0

    lines = [b"5", b"12", b'{"value":20}', b"x", b"7"]
    for n, line in enumerate(lines, 1):
        ic.stdin.write(line + b"\n")
        ic.stdin.flush()
        deadline = time.monotonic() + DEADLINE
        while logged() < n:  # in the log (and sent) before the next line is written
            assert time.monotonic() < deadline, f"line {n} was not delivered while stdin stayed open"
            time.sleep(0.02)
    ic.stdin.close()
    lb_out, lb_err = lb.communicate(timeout=DEADLINE)
    ic.wait(timeout=DEADLINE)
    ic.stdout.read()
    err = ic.stderr.read().decode()
    assert ic.returncode == 0 and lb.returncode == 0, err
    assert json.loads(lb_out.splitlines()[-1])["state"] == RpcSource(lines=lines).expected()


@pytest.mark.parametrize(
    "blob, state",
    [
        (b'{__ACSv1__}{"rpcs":3,"total":9}', {"rpcs": 3, "total": 9}),  # the Node binding's form
        (b'{"rpcs":3}', {"rpcs": 3}),
        (b"\x00\x01", None),
        (b"[" * 100_000, None),
    ],
)
def test_the_summary_reads_a_checkpoints_state_where_it_is_json(blob, state):
    from wallaroo_proto.protocols.ambrosia.ic import IcConfig, MockIC

    ic = MockIC(IcConfig(source=RpcSource(0)))
    ic.stats.last_checkpoint = {"seq": 1, "bytes": len(blob), "blob": blob}
    assert ic.summary()["last_checkpoint"]["state"] == state
    ic.close()


def test_a_fault_that_never_fired_is_said_at_the_end_but_a_crash_a_stop_came_before_is_not():
    from wallaroo_proto.protocols.ambrosia.ic import IcConfig, MockIC

    ic = MockIC(IcConfig(source=RpcSource(0), bad_check_at=3, gap_at=5, crash_at=8))
    ic.stats.faults_fired.add("gap_at")
    unfired = "fault {} never fired: no record with that sequence id was logged"
    assert ic.unfired_notes(interrupted=False) == [
        unfired.format("--bad-check-at 3"),
        unfired.format("--crash-at 8"),
    ]
    assert ic.unfired_notes(interrupted=True) == [unfired.format("--bad-check-at 3")]
    ic.close()
