"""Findings: each plug-in names what a frame shows went wrong or explains what follows, with its cause.

The expectations are read off the captures by hand (the frames `dissect` lists, docs/dissect.md's
fields): the request a DCP answer follows, the checkpoint a Kinesis daemon refused, and so on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.capture.stats import ExpertStats, add_item, make
from wallaroo_proto.findings import mark, of_record, of_summary
from wallaroo_proto.pcap_writer import PcapWriter

CAPTURES = Path(__file__).resolve().parent.parent / "captures"


def by_packet(name: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for record in iter_records(CAPTURES / name):
        out.setdefault(record["packet"], []).append(record)
    return out


def test_mark_keeps_one_finding_a_frame_the_more_severe_first():
    record: dict = {"packet": 3, "frame_index": 2, "type": "X"}
    kept: list[dict] = []
    mark(record, "note", "first", kept)
    mark(record, "error", "second", kept)
    assert (record["severity"], record["finding"]) == ("error", "second; first")
    mark(record, "warning", "third")
    assert (record["severity"], record["finding"]) == ("error", "second; first; third")
    assert [k["finding"] for k in kept] == ["first", "second"] and kept[0]["packet"] == 3
    with pytest.raises(ValueError, match="known: error, warning, note"):
        mark(record, "fatal", "x")


def test_a_records_findings_are_its_violations_notes_and_plug_in_finding():
    record = {"violations": ["v"], "notes": ["gap"], "severity": "note", "finding": "f"}
    assert list(of_record(record)) == [("error", "v"), ("warning", "gap"), ("note", "f")]
    assert list(of_record({"type": "OK"})) == []


def test_dcp_rollback_says_what_was_asked_and_where_the_history_ends():
    frames = by_packet("dcp-rollback.pcap")
    # packet 24 asked vb 0 to resume at 30 with uuid 0x571e80c511df62e9; packet 25 answers ROLLBACK 20.
    (rollback,) = frames[25]
    assert rollback["severity"] == "warning"
    assert rollback["finding"].startswith("vb 0 rolls back to 20: the consumer asked to resume at 30")
    assert "uuid 0x571e80c511df62e9" in rollback["finding"]
    assert "history with that uuid goes no further than 20" in rollback["finding"]


def test_dcp_answers_carry_the_vbucket_of_the_request_they_answer():
    frames = by_packet("dcp-rollback.pcap")
    # Packet 26 holds the requests of opaque 0xc (vb 1) and 0xd (vb 2); 28 answers 0xd, 30 and 33
    # answer the requests of packets 29 (vb 0) and 32 (vb 1).
    (refused,) = frames[28]
    assert refused["status"] == "NOT_MY_VBUCKET" and refused["vbucket"] == 2
    assert refused["severity"] == "warning" and "NOT_MY_VBUCKET" in refused["finding"]
    assert "vb 2" in refused["finding"]
    assert [r["vbucket"] for r in frames[30]] == [0] and [r["vbucket"] for r in frames[33]] == [1]
    # SELECT_BUCKET's answer: its request's header vbucket, 0, as the request's record shows it
    assert [r["vbucket"] for r in frames[13]] == [r["vbucket"] for r in frames[12]] == [0]


def test_dcp_sasl_continue_and_routine_stream_ends_are_no_findings():
    frames = by_packet("dcp-rollback.pcap")
    assert "finding" not in frames[9][0]  # AUTH_CONTINUE: the SASL exchange's next step
    assert all("finding" not in r for r in frames[46])  # mutations of an open stream


def test_wallaroo_abort_vote_and_restart_are_findings():
    frames = by_packet("sink-2pc.pcap")
    vote = [r for r in frames[18] if r.get("finding")]
    assert vote and vote[0]["severity"] == "warning"
    assert "votes to abort transaction sink-out:c_id=2" in vote[0]["finding"]
    restart = [r for r in by_packet("restart-reconnect.pcap")[14] if r["type"] == "RESTART"]
    assert restart and "restart at 127.0.0.1:7100" in restart[0]["finding"]


def test_ambrosia_recovery_is_a_note_where_the_checkpoint_record_comes():
    frames = by_packet("ambrosia-recovery.pcap")
    (checkpoint,) = [r for r in frames[7] if r["type"] == "CheckpointRecord"]
    assert checkpoint["severity"] == "note"
    assert checkpoint["finding"].startswith("recovery: the IC restores the LB from a checkpoint of 93 bytes")


def test_tremor_error_close_is_a_finding_and_an_echoed_close_is_not():
    session = [r for rs in by_packet("tremor-session.pcap").values() for r in rs if r.get("finding")]
    assert [(r["packet"], r["type"]) for r in session] == [(57, "error-close")]
    assert "Protocol session not connected error" in session[0]["finding"]
    framing = [r for rs in by_packet("tremor-framing.pcap").values() for r in rs if r.get("finding")]
    assert [(r["packet"], r["ws_close_code"]) for r in framing] == [(32, 1003)]  # 33 echoes it


def write_refused_checkpoint(path: Path) -> None:
    """An MLD conversation, written by hand: record 11 delivered, the processor checkpoints 12."""
    turns = [
        (True, b'{"action":"initialize","shardId":"shardId-7","sequenceNumber":"5","subSequenceNumber":0}\n'),
        (False, b'\n{"action": "status", "responseFor": "initialize"}\n'),
        (
            True,
            b'{"action":"processRecords","records":[{"action":"record","data":"YQ==","partitionKey":"k",'
            b'"sequenceNumber":"11","subSequenceNumber":0,"approximateArrivalTimestamp":1}],'
            b'"millisBehindLatest":0}\n',
        ),
        (False, b'\n{"action": "checkpoint", "sequenceNumber": "12", "subSequenceNumber": 0}\n'),
        (
            True,
            b'{"action":"checkpoint","sequenceNumber":"12","subSequenceNumber":0,'
            b'"error":"IllegalArgumentException"}\n',
        ),
    ]
    with PcapWriter(path) as w:
        s = w.tcp_session(("10.1.0.1", 51000), ("10.1.0.2", 9999), timestamp=1_763_700_000.0)
        for i, (from_client, data) in enumerate(turns):
            s.send(from_client, data, 1_763_700_000.0 + (i + 1) / 1000)


def test_a_refused_kinesis_checkpoint_says_the_number_and_the_allowed_range(tmp_path):
    path = tmp_path / "refused.pcap"
    write_refused_checkpoint(path)
    (reply,) = [r for r in iter_records(path) if r.get("checkpoint_error")]
    assert reply["severity"] == "warning"
    assert reply["finding"] == (
        "checkpoint at 12 refused: IllegalArgumentException; allowed: from the last checkpoint (5) "
        "to the largest record delivered (11)"
    )


def test_expert_stats_count_findings_by_severity_and_list_each_once():
    stats = ExpertStats()
    for item in iter_records(CAPTURES / "lost-segment.pcap", blocks=True):
        add_item([stats], item)
    result = stats.result()
    assert result["counts"] == {"error": 0, "warning": 2, "note": 0}
    assert [row["packet"] for row in result["rows"]] == [9, 9]
    assert "120 bytes missing" in result["rows"][0]["finding"]
    assert make("expert").kind == "expert"


def test_expert_stats_stay_bounded():
    stats = ExpertStats(max_findings=2)
    for i in range(5):
        stats.add({"protocol": "p", "conn_index": 1, "connection": "c", "packet": i, "violations": [f"v{i}"]})
    result = stats.result()
    assert len(result["rows"]) == 2 and result["left_out"] == {"error": 3} and result["counts"]["error"] == 5


def test_a_summary_lists_violations_and_plug_in_findings_in_frame_order():
    summary = {
        "conn_index": 1,
        "protocol": "dcp",
        "violation_list": [{"packet": 9, "type": "T", "reason": "late"}],
        "findings": [{"severity": "warning", "packet": 4, "type": "U", "finding": "early"}],
        "capture_notes": ["a gap"],
    }
    assert [(row["severity"], row["finding"]) for row in of_summary(summary)] == [
        ("warning", "early"),
        ("error", "late"),
        ("warning", "a gap"),
    ]


def test_dissect_summary_opens_on_the_findings_and_stats_expert_lists_them():
    path = str(CAPTURES / "dcp-rollback.pcap")
    summary = run_cli("dissect", "--summary", path)
    assert summary.returncode == 0, summary.stderr
    first = summary.stdout.splitlines()[0]
    assert first.startswith("findings: ") and "warnings 5" in first
    assert "NOT_MY_VBUCKET" in summary.stdout.split("connection #1")[0]
    expert = run_cli("dissect", "-q", "--stats", "expert", path)
    assert expert.returncode == 0, expert.stderr
    lines = expert.stdout.splitlines()
    assert lines[0] == f"expert: {path} (errors 0, warnings 5, notes 0)"
    # Not a terminal: rows at their full width, never cut mid-word.
    assert any(
        line.rstrip().endswith("(where its failover log moves to a newer uuid, or its last seqno)")
        for line in lines
    )
    fields = run_cli("dissect", "-T", "fields", "-e", "packet", "-e", "opaque", "-e", "vb_uuid", path)
    assert "24\t0x0000000b\t0x571e80c511df62e9" in fields.stdout.splitlines()


def test_a_piped_summary_keeps_every_cell_whole():
    """`dissect --summary capture | head` cut the plug-ins' tables at 80 columns, with an ellipsis."""
    for name in ("dcp-rollback.pcap", "sink-2pc.pcap"):
        summary = run_cli("dissect", "--summary", str(CAPTURES / name))
        assert summary.returncode == 0, summary.stderr
        assert "…" not in summary.stdout, name
