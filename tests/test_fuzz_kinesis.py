"""Fuzzing the MultiLangDaemon protocol: the hooks against lines written by hand from the MLD
notes (../shared/protocols/mld.md, "Exact MLD output" and "Exact kclpy output"), their offsets
counted by hand; the replay adapter following a fuzzed conversation; and campaigns against
mock-processor (with and without its planted break) and the kclpy sample.

The planted break is a test-only switch of mock-processor: WALLAROO_PROTO_PLANT=shutdown-no-status
makes it checkpoint at a shutdownRequested and then never send its status.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import COMMAND, Server, run_cli

from wallaroo_proto.fuzz.hooks import Hooks, Owed
from wallaroo_proto.protocols.kinesis import fuzz
from wallaroo_proto.protocols.kinesis import replay as kinesis_replay
from wallaroo_proto.protocols.kinesis.codec import (
    Fatal,
    LineSplitter,
    Skipped,
    decode_from_daemon,
    decode_from_processor,
)
from wallaroo_proto.replay import adapter as adapters
from wallaroo_proto.replay.recording import Frame

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "kcl_processor.py"
PY = sys.executable

REPLY = b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":0,"error":null}'
BATCH = (
    b'{"action":"processRecords","records":[{"data":"a2l0dGVu","partitionKey":"some cats",'
    b'"sequenceNumber":"4959","approximateArrivalTimestamp":1700000000123,"subSequenceNumber":0,'
    b'"action":"record"}],"millisBehindLatest":0}'
)
STATUS = b'\n{"action": "status", "responseFor": "initialize"}\n'  # kclpy's bytes, blank lines and all
INIT = (
    b'{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON",'
    b'"subSequenceNumber":0}'
)


def by_name(raw: bytes) -> dict:
    return {f.name: (f.kind, f.value, f.offset) for f in fuzz.fields({}, raw)}


# ----------------------------------------------------------------------------- fields


def test_a_checkpoint_replys_fields_lie_where_counted_by_hand():
    assert by_name(REPLY) == {
        "action": ("enum", 6, 10),  # ACTIONS: the five requests, shutdown, then checkpoint
        "sequenceNumber": ("id", 4955, 40),
        "subSequenceNumber": ("id", 0, 67),
        "error": ("enum", 0, 77),  # null: success
    }


def test_a_batchs_fields_are_its_count_its_last_record_and_its_lag():
    assert by_name(BATCH) == {
        "action": ("enum", 1, 10),
        "records": ("count", 1, 37),
        "last.sequenceNumber": ("id", 4959, 101),
        "last.subSequenceNumber": ("id", 0, 172),
        "last.approximateArrivalTimestamp": ("uint", 1700000000123, 138),
        "millisBehindLatest": ("uint", 0, 215),
    }


def test_kclpys_status_names_its_request_and_a_sentinel_is_a_word():
    assert by_name(STATUS) == {"action": ("enum", 7, 12), "responseFor": ("enum", 0, 37)}
    assert by_name(INIT)["sequenceNumber"] == ("enum", 1, 73)  # WORDS: null, then TRIM_HORIZON
    assert fuzz.fields({}, b"a debug line") == []


def test_numbers_stay_within_a_java_long():
    field = next(f for f in fuzz.fields({}, REPLY) if f.name == "subSequenceNumber")
    assert field.bits == 63


# ----------------------------------------------------------------------------- with_value


def with_value(raw: bytes, name: str, value: int) -> bytes:
    field = next(f for f in fuzz.fields({}, raw) if f.name == name)
    return fuzz.with_value({}, raw, field, value)


def test_a_new_value_rewrites_the_line_in_the_mlds_compact_json():
    assert with_value(REPLY, "subSequenceNumber", 7) == REPLY.replace(
        b'"subSequenceNumber":0', b'"subSequenceNumber":7'
    )
    assert with_value(REPLY, "error", 1) == REPLY.replace(b"null}", b'"ThrottlingException"}')
    assert with_value(REPLY, "sequenceNumber", 4954) == REPLY.replace(b'"4955"', b'"4954"')
    assert by_name(with_value(REPLY, "subSequenceNumber", 7))["subSequenceNumber"] == ("id", 7, 67)


def test_kclpys_line_keeps_its_style_and_its_blank_lines():
    assert (
        with_value(STATUS, "responseFor", 1) == b'\n{"action": "status", "responseFor": "processRecords"}\n'
    )


def test_names_past_the_table_are_unknown_names_and_words_become_numbers():
    assert decode_from_daemon(with_value(INIT, "sequenceNumber", 4)).sequence_number == "SHARD_END"
    assert decode_from_daemon(with_value(INIT, "sequenceNumber", 99)).sequence_number == "99"
    with pytest.raises(Fatal, match="unknown action"):
        decode_from_daemon(with_value(REPLY, "action", 200))


def test_a_batchs_count_cuts_or_repeats_its_records():
    assert len(decode_from_daemon(with_value(BATCH, "records", 3)).records) == 3
    assert list(decode_from_daemon(with_value(BATCH, "records", 0)).records) == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([REPLY, BATCH, STATUS, INIT, *fuzz.templates("daemon").values()]),
    st.data(),
)
def test_any_value_in_any_field_gives_one_line_its_reader_reads_or_refuses(raw, data):
    field = data.draw(st.sampled_from(fuzz.fields({}, raw)))
    value = data.draw(st.integers(0, (1 << field.bits) + 1))
    out = fuzz.with_value({}, raw, field, value)
    lines = LineSplitter().feed(out.strip(b"\n") + b"\n")
    assert len(lines) == 1  # still one line
    try:
        decode_from_daemon(lines[0].data)
        decode_from_processor(lines[0].data)
    except (Fatal, Skipped):
        pass  # refused with a reason, as its reader refuses it


# ----------------------------------------------------------------------------- the rest


def test_templates_decode_as_the_type_named():
    for name, raw in fuzz.templates("daemon").items():
        assert decode_from_daemon(raw).action == name
    for name, raw in fuzz.templates("processor").items():
        assert decode_from_processor(raw.strip(b"\n"))[0].action == name
    assert "shutdown" not in fuzz.templates("daemon")  # V1/V2 only: kclpy 3 cannot read it


def test_a_request_is_owed_the_processors_next_step_and_a_checkpoint_its_reply():
    step = Owed(frozenset({"status", "checkpoint"}))
    assert fuzz.owed({"type": "processRecords", "sender": "daemon"}) == step
    assert fuzz.owed({"type": "checkpoint", "sender": "daemon"}) == step  # the reply: go on
    assert fuzz.owed({"type": "checkpoint", "sender": "processor"}) == Owed(frozenset({"checkpoint"}))
    assert fuzz.owed({"type": "status", "sender": "processor"}) is None


def test_only_a_checkpoint_reply_with_an_error_is_a_refusal_and_nobody_owes_an_error_reply():
    assert fuzz.refusal({"type": "checkpoint", "sender": "daemon", "checkpoint_error": "ShutdownException"})
    assert not fuzz.refusal({"type": "checkpoint", "sender": "daemon", "checkpoint_error": None})
    assert not fuzz.refusal({"type": "status", "sender": "processor"})
    hooks = Hooks("kinesis")
    assert not hooks.REPLY_BEFORE_CLOSE and hooks.fields is fuzz.fields


def test_a_pipelined_line_is_tolerated_and_a_line_out_of_any_turn_is_not():
    """Core reasons, as the dissector writes them: a line that waits behind the peer's answer is
    in turn when read; one during a checkpoint, or before initialize, never is."""
    assert fuzz.tolerated({"violations": ["processRecords while processRecords still awaits its status"]})
    assert fuzz.tolerated({"violations": ["a second checkpoint before the reply to the first"]})
    assert fuzz.tolerated({"violations": ["a status with no request pending"]})
    assert not fuzz.tolerated(
        {"violations": ["leaseLost while the processor waits for the reply to its checkpoint (it would ...)"]}
    )
    assert not fuzz.tolerated({"violations": ["processRecords before initialize"]})
    assert not fuzz.tolerated({"violations": ["a checkpoint reply with no checkpoint asked"]})


def test_an_inserted_request_holds_the_next_one_until_its_status():
    """Fuzz inserts a shutdownRequested the replay adapter never made: the next recorded
    request must wait for its status, or it would go out of turn (an illegal line of ours)."""
    played = kinesis_replay.Adapter("daemon")
    assert played.outgoing(Frame(0, {"sender": "daemon", "type": "initialize"}, INIT)) == INIT + b"\n"
    status = b'{"action": "status", "responseFor": "initialize"}'
    played.incoming({"sender": "processor", "type": "status", "length": len(status)}, status)
    inserted = fuzz.templates("daemon")["shutdownRequested"]
    played.sent(Frame(1, {"sender": "daemon", "type": "shutdownRequested"}, inserted, as_is=True), inserted)
    held = played.outgoing(Frame(2, {"sender": "daemon", "type": "processRecords"}, BATCH))
    assert isinstance(held, adapters.Hold) and "shutdownRequested" in held.reason


def test_a_reproducers_illegal_line_goes_as_recorded_with_its_line_end():
    """``fuzz --rerun`` plays a reproducer: a line recorded as breaking a rule goes as it was
    (the replay engine asks the adapter for it), its line end put back, or the next line would
    run on into it."""
    played = kinesis_replay.Adapter("daemon")
    assert played.outgoing(Frame(0, {"sender": "daemon", "type": "initialize"}, INIT)) == INIT + b"\n"
    lost = b'{"action":"leaseLost"}'
    early = Frame(1, {"sender": "daemon", "type": "leaseLost", "verdict": "violation"}, lost)
    assert played.as_recorded(early) == lost + b"\n"
    assert isinstance(
        played.outgoing(Frame(2, {"sender": "daemon", "type": "leaseLost"}, lost)), adapters.Hold
    )
    assert played.live.violations == 1  # the live conversation took it, as the processor read it


# ----------------------------------------------------------------------------- campaigns

MOCK_PROCESSOR = [*COMMAND, "kinesis", "mock-processor", "--checkpoint-every", "2"]


def record_seed(path: Path, *processor: str) -> None:
    """A mock-daemon session of one shard, 5 records in batches of 2, ending the shard."""
    result = run_cli(
        "kinesis",
        "mock-daemon",
        *("--shards", "1", "--records", "5", "--batch-size", "2", "--shard-end"),
        *("--record", str(path), "--", *processor),
    )
    assert result.returncode == 0 and path.exists(), result.stderr


def campaign(seed: Path, findings: Path, *how: str, budget: str = "60s") -> tuple[int, dict]:
    result = run_cli(
        "fuzz",
        *("--seeds", str(seed), "--play", "daemon", *how),
        *("--budget", budget, "--seed", "1", "--answer-timeout", "0.2", "--shrink-time", "10"),
        *("--findings", str(findings), "--format", "json"),
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_the_planted_forgotten_status_is_found_shrunk_and_rerun(tmp_path):
    """mock-processor over TCP (one server for every case): with the switch, a shutdownRequested
    inserted where a request may go gets a checkpoint and never its status: fuzz stops
    waiting, and says so; without it, the same campaign finds nothing of the kind."""
    seed = tmp_path / "seed.pcapng"
    record_seed(seed, *MOCK_PROCESSOR)
    planted = {**os.environ, "WALLAROO_PROTO_PLANT": "shutdown-no-status"}
    with Server(*MOCK_PROCESSOR[3:], "--listen", "127.0.0.1:0", env=planted) as server:
        # its only finding (the run below finds none of the kind), so it may end the campaign
        code, summary = campaign(seed, tmp_path / "found", "--connect", server.address, "--stop-after", "1")
        assert code == 1, summary
        silent = [f for f in summary["findings"] if f["kind"] == "silent"]
        assert silent, summary  # a shutdownRequested inserted, or a request's action changed to it
        reproducer = silent[0]["reproducer"]
        assert silent[0]["frames"] <= 6 and silent[0]["deterministic"]
        shown = run_cli("dissect", reproducer)
        assert shown.returncode in (0, 1) and "shutdownRequested" in shown.stdout, shown.stderr
        rerun = run_cli(
            "fuzz",
            *("--rerun", reproducer, "--play", "daemon", "--connect", server.address),
            *("--answer-timeout", "0.2", "--format", "json"),
        )
        assert rerun.returncode == 1, rerun.stdout + rerun.stderr
        assert "silent" in [f["kind"] for f in json.loads(rerun.stdout)["findings"]], rerun.stdout
    with Server(*MOCK_PROCESSOR[3:], "--listen", "127.0.0.1:0") as server:
        # found above within a few dozen executions; ten times that here
        code, summary = campaign(seed, tmp_path / "clean", "--connect", server.address, budget="300")
    assert summary["executions"] >= 300, summary
    assert not [f for f in summary["findings"] if f["kind"] == "silent"], summary


@pytest.mark.e2e
def test_fuzzing_the_kclpy_sample_over_its_pipes(tmp_path):
    """The real peer: the kclpy sample, started for each case as the MLD starts it. What it finds
    (docs/kinesis.md, Fuzzing) is kclpy taking lines out of turn; each finding's reproducer opens."""
    pytest.importorskip("amazon_kclpy")
    seed = tmp_path / "seed.pcapng"
    record_seed(seed, PY, str(SAMPLE))
    spawn = shlex.join([PY, str(SAMPLE)])
    code, summary = campaign(seed, tmp_path / "found", "--spawn", spawn, budget="20")
    assert summary["executions"] >= 20, summary
    assert (code == 1) == bool(summary["findings"])
    for finding in summary["findings"]:
        assert finding["kind"] in ("accepted", "violation"), finding  # kclpy never stalls or crashes
        shown = run_cli("dissect", finding["reproducer"])
        assert shown.returncode in (0, 1), shown.stderr
    steady = [f for f in summary["findings"] if f["deterministic"]]
    if steady:  # its changed lines go again as they went, out of turn or unreadable
        rerun = run_cli(
            "fuzz",
            "--rerun",
            steady[0]["reproducer"],
            "--play",
            "daemon",
            "--spawn",
            spawn,
            "--format",
            "json",
        )
        assert rerun.returncode == 1, rerun.stdout + rerun.stderr
        assert steady[0]["kind"] in [f["kind"] for f in json.loads(rerun.stdout)["findings"]]
