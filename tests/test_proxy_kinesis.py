"""The MultiLangDaemon's lines for the proxy's fault rules: frames, fields, rewrites, named faults.

Golden lines are the MLD's (Jackson, compact) and kclpy's (``json.dumps``, each line
wrapped in blank lines) exactly as docs/protocols notes show them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import Server, run_cli

from wallaroo_proto.display_filter import compile_filter
from wallaroo_proto.protocols.kinesis.proxy_faults import NAMED_FAULTS, adapter
from wallaroo_proto.proxy import faults
from wallaroo_proto.proxy.faultkit import FaultError, Frame, Send

INITIALIZE = (
    b'{"action":"initialize","shardId":"shardId-000000000001",'
    b'"sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n'
)
STATUS_INIT = b'\n{"action": "status", "responseFor": "initialize"}\n'
PROCESS = (
    b'{"action":"processRecords","records":[{"data":"a2l0dGVu","partitionKey":"some cats",'
    b'"sequenceNumber":"4955","approximateArrivalTimestamp":1700000000123,"subSequenceNumber":0,'
    b'"action":"record"}],"millisBehindLatest":0}\n'
)
CHECKPOINT = b'\n{"action": "checkpoint", "sequenceNumber": "4955", "subSequenceNumber": 0}\n'
REPLY = b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":0,"error":null}\n'
REPLY_THROTTLED = (
    b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":0,"error":"ThrottlingException"}\n'
)
STATUS_RECORDS = b'\n{"action": "status", "responseFor": "processRecords"}\n'

#: One shard's conversation, daemon (the proxy's client here, as erlmld's socat) first.
CONVERSATION = [
    (True, INITIALIZE),
    (False, STATUS_INIT),
    (True, PROCESS),
    (False, CHECKPOINT),
    (True, REPLY),
    (False, STATUS_RECORDS),
]


def run(conversation, daemon_is_client: bool = True):
    """Each line through a fresh adapter: (frames, fields) per line, in order."""
    a = adapter()
    out = []
    for from_daemon, data in conversation:
        from_client = from_daemon == daemon_is_client
        frames = a.frames(from_client, data)
        out.append([(f, a.fields(f, from_client)) for f in frames])
    return a, out


@pytest.mark.parametrize("daemon_is_client", [True, False])
def test_each_line_is_one_frame_and_kclpy_blank_lines_open_the_next(daemon_is_client):
    _, out = run(CONVERSATION, daemon_is_client)
    # kclpy's blank line before its JSON comes out with that JSON's line, as one frame.
    assert [[f for f, _ in frames] for frames in out] == [[line] for _, line in CONVERSATION]
    fields = [f for frames in out for _, f in frames]
    assert [(f["type"], f["sender"]) for f in fields] == [
        ("initialize", "daemon"),
        ("status", "processor"),
        ("processRecords", "daemon"),
        ("checkpoint", "processor"),
        ("checkpoint", "daemon"),
        ("status", "processor"),
    ]
    assert fields[0]["shard_id"] == "shardId-000000000001"
    assert fields[0]["sequence_number"] == "TRIM_HORIZON" and fields[0]["sub_sequence_number"] == 0
    assert fields[1]["response_for"] == "initialize"
    assert fields[2]["record_count"] == 1 and fields[2]["sequence_number"] == "4955"
    assert fields[2]["millis_behind_latest"] == 0
    assert "checkpoint_error" not in fields[3]  # a request has no error; only the daemon's reply does
    assert fields[4]["checkpoint_error"] is None
    assert all(f["verdict"] == "accepted" for f in fields)


def test_a_line_that_is_no_message_is_named_as_dissect_names_it():
    _, out = run([(True, INITIALIZE), (False, b"a debug print\n"), (True, b"not json\n")])
    assert [f["type"] for frames in out for _, f in frames] == ["initialize", "SKIPPED", "INVALID"]


def test_lines_split_anywhere_and_ended_by_crlf_or_a_bare_cr():
    a = adapter()
    assert a.frames(True, INITIALIZE[:10]) == []
    assert a.frames(True, INITIALIZE[10:]) == [INITIALIZE]
    # \r\n and a bare \r both end a line, as BufferedReader.readLine has it
    data = b'{"action": "status", "responseFor": "initialize"}\r\n{"action": "checkpoint"}\r'
    got = a.frames(False, data)
    assert got == [
        b'{"action": "status", "responseFor": "initialize"}\r\n',
        b'{"action": "checkpoint"}\r',
    ]
    assert [a.fields(f, False)["type"] for f in got] == ["status", "checkpoint"]


def test_a_line_ended_by_a_cr_goes_on_at_once_and_its_lf_opens_the_next_frame():
    # A frame is never held back for a byte that may not come (a bare \r ends a line too).
    a = adapter()
    a.frames(True, INITIALIZE)
    assert a.frames(False, b'{"action": "status", "responseFor": "initialize"}\r') == [
        b'{"action": "status", "responseFor": "initialize"}\r'
    ]
    assert a.frames(False, b'\n{"action": "checkpoint"}\n') == [b'\n{"action": "checkpoint"}\n']


def frame_of(a, from_client: bool, data: bytes) -> Frame:
    (got,) = a.frames(from_client, data)
    return Frame(got, from_client, a.fields(got, from_client))


def test_checkpoint_error_sends_the_daemons_reply_with_the_error_instead():
    a, _ = run(CONVERSATION[:4])
    reply = frame_of(a, True, REPLY)
    fault = NAMED_FAULTS["checkpoint-error"]
    assert compile_filter(fault.where)(dict(reply.fields))
    sent = fault.act(reply, {"error": "ThrottlingException"}, a)
    assert sent == [Send(True, REPLY_THROTTLED)]  # on toward the processor, the upstream here
    sent = fault.act(reply, {"error": "ShutdownException"}, a)
    assert sent[0].data == REPLY_THROTTLED.replace(b"ThrottlingException", b"ShutdownException")


def test_checkpoint_error_matches_only_the_daemons_reply():
    _, out = run(CONVERSATION)
    match = compile_filter(NAMED_FAULTS["checkpoint-error"].where)
    assert [f["type"] for frames in out for _, f in frames if match(f)] == ["checkpoint"]
    assert [f["sender"] for frames in out for _, f in frames if match(f)] == ["daemon"]


def test_delay_status_is_the_generic_delay_at_status_lines():
    fault = NAMED_FAULTS["delay-status"]
    assert fault.action == "delay" and fault.act is None and fault.params["ms"] == (int, 500)
    _, out = run(CONVERSATION)
    match = compile_filter(fault.where)
    assert [f["response_for"] for frames in out for _, f in frames if match(f)] == [
        "initialize",
        "processRecords",
    ]


def test_a_rewrite_keeps_the_senders_style_and_blank_lines():
    a, _ = run(CONVERSATION[:5])
    status = frame_of(a, False, STATUS_RECORDS)
    assert a.rewrite(status, "response_for", "initialize") == STATUS_INIT
    a, _ = run(CONVERSATION[:1])
    a.frames(False, b"\n")
    crlf = frame_of(a, False, b'{"action": "status", "responseFor": "initialize"}\r\n')
    assert a.rewrite(crlf, "type", "checkpoint") == (
        b'\n{"action": "checkpoint", "responseFor": "initialize"}\r\n'
    )


def test_a_v1_checkpoint_rewrites_its_checkpoint_field():
    a = adapter()
    a.frames(True, b'{"action":"initialize","shardId":"shardId-000000000001"}\n')
    v1 = frame_of(a, True, b'{"action":"checkpoint","checkpoint":"4955","error":null}\n')
    assert a.rewrite(v1, "sequence_number", "5000") == (
        b'{"action":"checkpoint","checkpoint":"5000","error":null}\n'
    )


@pytest.mark.parametrize(
    ("line", "field_name", "message"),
    [
        (INITIALIZE, "record_count", "cannot be rewritten in an MLD line; these can: type, checkpoint_error"),
        (INITIALIZE, "checkpoint_error", "checkpoint_error is not a field of a 'initialize' line"),
        (b"not json\n", "type", "line 1 is no JSON object: nothing to rewrite"),
    ],
)
def test_a_rewrite_that_cannot_be_done_says_why(line, field_name, message):
    a = adapter()
    frame = frame_of(a, True, line)
    with pytest.raises(FaultError, match=message):
        a.rewrite(frame, field_name, "x")


def test_a_line_that_never_ends_is_not_held_without_bound_and_no_byte_is_lost():
    a = adapter()
    a.sides[True].splitter.max_line = 100
    assert a.frames(True, b"{" * 60) == []
    # Past the reader's limit what was held goes on, and each later read as it comes.
    assert a.frames(True, b"{" * 41) == [b"{" * 101]
    assert a.frames(True, b'x\n{"action":"leaseLost"}\n') == [b'x\n{"action":"leaseLost"}\n']
    assert a.fields(b"{" * 101, True) == {"type": "INVALID", "sender": "daemon"}
    b = adapter()  # nor are blank lines waiting for the line they open
    b.frames(True, INITIALIZE)
    b.sides[False].splitter.max_line = 100
    assert b.frames(False, b"\n" * 101) == [b"\n" * 101]


def sent_through_engine(*reads: tuple[bool, bytes]) -> dict[bool, bytes]:
    """What the engine sends of each side's reads once both sides end (no rules), by side."""
    engine = faults.ConnectionFaults([], "kinesis", adapter=adapter())
    steps = [step for from_client, data in reads for step in engine.feed(from_client, data)]
    steps += engine.end(True) + engine.end(False)
    return {
        side: b"".join(s.data for s in steps if isinstance(s, Send) and s.to_upstream == side)
        for side in (True, False)
    }


def test_a_last_line_without_its_line_end_still_goes_on():
    """The daemon's last line lacks its newline; the processor's blank line and half a line wait
    for a line end that never comes: every byte goes on when the sides end."""
    daemon_tail = b'{"action":"shutdownRequested"}'
    processor = STATUS_INIT + b'\n{"action": "checkpoint"'
    sent = sent_through_engine(
        (True, INITIALIZE[:30]), (True, INITIALIZE[30:] + daemon_tail[:10]), (True, daemon_tail[10:]),
        (False, processor[:5]), (False, processor[5:]),
    )  # fmt: skip
    assert sent == {True: INITIALIZE + daemon_tail, False: processor}
    # Blank lines alone, held to open the next frame, go on too.
    assert sent_through_engine((True, INITIALIZE), (False, b"\n\n")) == {True: INITIALIZE, False: b"\n\n"}


def test_there_is_no_error_message_for_strict():
    assert adapter().error_frame("any", to_client=True) is None


LINES = st.lists(
    st.sampled_from([INITIALIZE, PROCESS, REPLY, b"\n", b"\r\n", b"junk\r", b'{"action":"leaseLost"}\n']),
    max_size=12,
)


@given(LINES, st.lists(st.integers(1, 64), max_size=40))
def test_any_chunking_gives_the_same_lines_and_every_byte_of_them(lines, cuts):
    data = b"".join(lines)
    at_once = adapter()
    whole = at_once.frames(True, data)
    a = adapter()
    pieces, pos = [], 0
    for cut in cuts:
        pieces += a.frames(True, data[pos : pos + cut])
        pos += cut
    pieces += a.frames(True, data[pos:])
    # Every byte up to the last line end is in a frame, in order: none lost, none repeated...
    for frames, taker in ((whole, at_once), (pieces, a)):
        framed = b"".join(frames)
        assert framed == data[: len(framed)]
        rest = data[len(framed) :].lstrip(b"\r\n")  # a processor's blank lines wait for their line
        assert b"\r" not in rest and b"\n" not in rest
        assert framed + taker.tail(True) == data  # the rest is what the engine forwards at the end
    # ...and the lines are the same, however the bytes came (only where a \r\n's \n goes may differ).
    assert [f.strip(b"\r\n") for f in pieces] == [f.strip(b"\r\n") for f in whole]


# ----------------------------------------------------------------------------- real peers through the proxy


def summary_of(result) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (exit {result.returncode}): {result.stdout}\n{result.stderr}"
    return json.loads(lines[-1])


def proxied_run(tmp_path: Path, *proxy_args: str, daemon_args: tuple[str, ...] = ()):
    """mock-daemon -> proxy -> mock-processor over loopback, as erlmld's socat connects the MLD to its node.

    Returns the daemon's and the processor's JSON summaries and the proxy's (exit code, stdout, stderr).
    """
    recording = tmp_path / "proxy.pcap"
    with Server(
        "kinesis", "mock-processor", "--listen", "127.0.0.1:0", "--format", "json", "--retry-delay", "0"
    ) as processor:
        with Server(
            "proxy", "--listen", "127.0.0.1:0", "--upstream", processor.address, "--record", str(recording),
            *proxy_args,
        ) as proxy:  # fmt: skip
            daemon = run_cli(
                *("kinesis", "mock-daemon", "--format", "json", "--connect", proxy.address),
                *("--shards", "2", "--records", "100", "--batch-size", "30", "--shard-end", *daemon_args),
                timeout=120,
            )
            proxied = proxy.stop()
        code, out, err = processor.stop()
    assert code == 0, err
    return summary_of(daemon), json.loads(out.splitlines()[-1]), proxied, recording


def proxy_summary_is_dissects(stdout: str, recording: Path) -> None:
    """What the proxy printed after its ready line is ``dissect --summary`` of its own recording."""
    dissected = run_cli("dissect", str(recording), "--summary")
    assert dissected.returncode == 0, dissected.stderr
    assert stdout.split("\n", 1)[1].strip() == dissected.stdout.strip()


@pytest.mark.e2e
def test_the_mock_daemon_through_the_proxy_to_the_mock_processor(tmp_path):
    daemon, processor, (code, stdout, stderr), recording = proxied_run(tmp_path)
    assert code == 0, stderr
    assert daemon["ok"] and daemon["records_delivered"] == 200
    assert [s["checkpoint"] for s in daemon["shards"]] == ["SHARD_END", "SHARD_END"]
    assert processor["records"] == 200 and {c["end"] for c in processor["conversations"]} == {"shardEnded"}
    assert "violation" not in stderr.lower() and "fault" not in stderr.lower()
    proxy_summary_is_dissects(stdout, recording)
    assert re.findall(r"^shard +(\S+)", stdout, re.M) == ["shardId-000000000000", "shardId-000000000001"]
    assert re.findall(r"^violations +(\d+)", stdout, re.M) == ["0", "0"]


@pytest.mark.e2e
def test_a_checkpoint_error_injected_by_the_proxy_reaches_the_processor(tmp_path):
    rule = "checkpoint-error error=ThrottlingException count=1"
    daemon, processor, (code, stdout, stderr), recording = proxied_run(tmp_path, "--fault", rule)
    assert code == 0, stderr
    # The processor was told ThrottlingException once, retried, and both shards still ended cleanly.
    assert processor["checkpoint_errors"] == 1 and processor["failures"] == []
    assert sorted(
        c["checkpoint_errors"].get("ThrottlingException", 0) for c in processor["conversations"]
    ) == [
        0,
        1,
    ]
    assert processor["records"] == 200 and {c["end"] for c in processor["conversations"]} == {"shardEnded"}
    # The daemon answered every checkpoint without an error: the proxy changed one answer on the way.
    assert daemon["ok"] and daemon["checkpoint_errors"] == 0 and daemon["records_delivered"] == 200
    assert [s["checkpoint"] for s in daemon["shards"]] == ["SHARD_END", "SHARD_END"]
    assert sum(s["checkpoint_requests"] for s in daemon["shards"]) == 5  # the retry is a request more
    # The proxy said where it acted, and its recording shows each side what it saw.
    faults = [line for line in stderr.splitlines() if " fault " in line]
    assert len(faults) == 1, stderr
    assert re.search(r"fault checkpoint-error at client→upstream frame \d+ checkpoint: ", faults[0])
    assert "violation" not in stderr.lower()
    assert re.findall(r"^checkpoints +\d+, errors (\d+)", stdout, re.M).count("1") == 1
    assert "ThrottlingException 1" in stdout
    assert re.search(rf"fault --fault '{rule}': matched \d+, +applied 1", " ".join(stdout.split()))
    assert set(re.findall(r"^violations +(\d+)", stdout, re.M)) == {"0"}


def sends(steps) -> list[tuple[bool, bytes]]:
    return [(s.to_upstream, s.data) for s in steps if type(s) is Send]


def test_the_engine_finds_kinesis_by_its_first_line_and_applies_checkpoint_error():
    rules = faults.parse_rules(["checkpoint-error error=ShutdownException"])
    engine = faults.ConnectionFaults(rules, upstream_port=45678)  # not a Kinesis port: the bytes tell
    out = []
    for from_daemon, data in CONVERSATION:
        out += sends(engine.feed(from_daemon, data))
    assert engine.protocol == "kinesis"
    expected = [(from_daemon, data) for from_daemon, data in CONVERSATION]
    expected[4] = (True, REPLY_THROTTLED.replace(b"ThrottlingException", b"ShutdownException"))
    assert out == expected
    assert (rules[0].seen, rules[0].fired) == (1, 1)


def test_rules_of_kinesis_words_are_checked_by_the_engine():
    (rule,) = faults.parse_rules(["delay-status"], protocol="kinesis")
    assert rule.params == {"ms": 500}
    with pytest.raises(FaultError, match="error must be str"):
        faults.parse_rules(["checkpoint-error error=3"], protocol="kinesis")


@pytest.mark.parametrize(("rule", "seconds"), [("delay-status", 0.5), ("delay-status ms=50", 0.05)])
def test_delay_status_holds_each_status_line_and_only_those(rule, seconds):
    engine = faults.ConnectionFaults(faults.parse_rules([rule], protocol="kinesis"), "kinesis")
    steps = [step for from_daemon, data in CONVERSATION for step in engine.feed(from_daemon, data)]
    waits = [i for i, step in enumerate(steps) if type(step) is faults.Wait]
    assert [steps[i].seconds for i in waits] == [seconds, seconds]
    assert [steps[i + 1] for i in waits] == [Send(False, STATUS_INIT), Send(False, STATUS_RECORDS)]
