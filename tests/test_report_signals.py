"""The DCP, AMBROSIA and Tremor report signals: on hand-written records, then on the sample captures."""

from __future__ import annotations

import pytest
from report_captures import CAPTURES

from wallaroo_proto.protocols.ambrosia.report import AmbrosiaSignals
from wallaroo_proto.protocols.dcp.report import DcpSignals
from wallaroo_proto.protocols.tremor.report import TremorSignals
from wallaroo_proto.report.collect import build_report
from wallaroo_proto.report.html import render


def fed(collector, records: list[dict]):
    for r in records:
        collector.feed(r)
    return collector.finish()


def connections(name: str):
    report = build_report([CAPTURES / name])
    return [c for cap in report.captures for c in cap.connections]


def test_dcp_buffer_level_full_spells_round_trips_and_markers() -> None:
    signals = fed(
        DcpSignals(),
        [
            {
                "ts": 1.0,
                "type": "DCP_CONTROL",
                "control_key": "connection_buffer_size",
                "control_value": "100",
            },
            {"ts": 1.1, "type": "DCP_STREAM_REQ", "opaque": 7},
            {"ts": 1.3, "type": "DCP_STREAM_REQ_RESPONSE", "opaque": 7, "status": "SUCCESS"},
            {"ts": 2.0, "type": "DCP_MUTATION", "outstanding": 60},
            {"ts": 2.1, "type": "DCP_MUTATION", "outstanding": 120},  # one message may overflow
            {"ts": 2.5, "type": "DCP_BUFFER_ACKNOWLEDGEMENT", "outstanding": 20},
            {"ts": 3.0, "type": "DCP_NOOP", "opaque": 9},
            {"ts": 3.25, "type": "DCP_NOOP_RESPONSE", "opaque": 9},
            {"ts": 4.0, "type": "DCP_STREAM_REQ", "opaque": 8},
            {
                "ts": 4.5,
                "type": "DCP_STREAM_REQ_RESPONSE",
                "opaque": 8,
                "status": "ROLLBACK",
                "rollback_seqno": 20,
                "vbucket": 1,
            },  # fmt: skip
            {"ts": 5.0, "type": "DCP_STREAM_END", "vbucket": 0, "end_reason": "too_slow", "outstanding": 100},
        ],
    )
    (free,) = signals.series
    assert free.name == "buffer bytes free (of 100)"
    assert free.points == [(2.0, 40), (2.1, -20), (2.5, 80), (5.0, 0)]
    # Full from 2.1 to the acknowledgement at 2.5; full again from 5.0 to the end.
    assert [(s.start, s.end) for s in signals.spans] == [(2.1, 2.5), (5.0, 5.0)]
    dists = {d.name: d.sample for d in signals.distributions}
    assert dists["NOOP to response"] == [0.25]
    assert dists["STREAM_REQ to response"] == pytest.approx([0.2, 0.5])
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("rollback", "vb 1 rollback to 20"),
        ("end", "vb 0 end too_slow"),
    ]


def test_dcp_without_the_buffer_size_draws_no_level() -> None:
    signals = fed(DcpSignals(), [{"ts": 1.0, "type": "DCP_MUTATION", "outstanding": 60}])
    assert signals.series == [] and signals.spans == []
    assert signals.notes == ["flow control on, but the capture does not show the buffer's size: not drawn"]


def test_dcp_rollback_sample() -> None:
    (conn,) = connections("dcp-rollback.pcap")
    signals = conn.signal_values()
    # captures/README.md: ROLLBACK to 20 for vbuckets 0 and 1, NOT_MY_VBUCKET for 2, both streams
    # ended too_slow, then streamed to the end under a 600-byte buffer.
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("rollback", "vb 0 rollback to 20"),
        ("rollback", "vb 1 rollback to 20"),
        ("error", "stream request NOT_MY_VBUCKET"),
        ("end", "vb 0 end too_slow"),
        ("end", "vb 1 end too_slow"),
        ("end", "vb 0 end ok"),
        ("end", "vb 1 end ok"),
    ]
    (free,) = signals.series
    assert free.name == "buffer bytes free (of 600)"
    assert min(v for _, v in free.points) <= 0 and max(v for _, v in free.points) <= 600
    assert signals.spans and all(s.label == "buffer full" for s in signals.spans)
    assert "buffer bytes free (of 600)" in render(build_report([CAPTURES / "dcp-rollback.pcap"]))


def test_dcp_stream_sample_noops() -> None:
    (conn,) = connections("dcp-stream.pcap")
    dists = {d.name: d for d in conn.signal_values().distributions}
    # Every NOOP the producer sent was answered with its opaque; two streams were requested.
    noops = sum(1 for f in conn.head + conn.tail if f[3] == "DCP_NOOP")
    assert noops > 0 and dists["NOOP to response"].count == noops
    assert dists["STREAM_REQ to response"].count == 2


def test_ambrosia_replay_spell_records_and_checkpoints() -> None:
    signals = fed(
        AmbrosiaSignals(),
        [
            {
                "ts": 1.0,
                "type": "CheckpointRecord",
                "sender": "ic",
                "checkpoint_length": 93,
                "phase": "replay",
            },
            {"ts": 1.1, "type": "Record", "sender": "ic", "rpc_count": 14, "phase": "replay"},
            {"ts": 1.2, "type": "Record", "sender": "ic", "rpc_count": 10, "phase": "replay"},
            {"ts": 1.5, "type": "TakeBecomingPrimaryCheckpoint", "sender": "ic", "phase": "normal"},
            {"ts": 2.0, "type": "Record", "sender": "ic", "rpc_count": 3, "phase": "normal"},
            {"ts": 2.5, "type": "UpgradeService", "sender": "ic", "phase": "upgrade-test"},
            {"ts": 3.0, "type": "Record", "sender": "ic", "rpc_count": 1, "phase": "upgrade-test"},
        ],
    )
    (per_record,) = signals.series
    assert per_record.points == [(1.1, 14.0), (1.2, 10.0), (2.0, 3.0), (3.0, 1.0)]
    assert [(s.start, s.end, s.label) for s in signals.spans] == [
        (1.0, 1.5, "replay"),
        (2.5, 3.0, "upgrade test"),
    ]
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("restart", "recovery from a checkpoint of 93 bytes"),
        ("checkpoint", "TakeBecomingPrimaryCheckpoint"),
        ("restart", "UpgradeService"),
    ]


def test_ambrosia_recovery_sample() -> None:
    ic_socket, lb_socket = sorted(connections("ambrosia-recovery.pcap"), key=lambda c: c.frames)
    ic, lb = ic_socket.signal_values(), lb_socket.signal_values()
    # captures/README.md: the checkpoint record, records 2 and 3 replayed, TakeBecomingPrimaryCheckpoint.
    assert [m.label for m in ic.markers][:2] == [
        "recovery from a checkpoint of 93 bytes",
        "TakeBecomingPrimaryCheckpoint",
    ]
    (spell,) = ic.spans
    assert spell.label == "replay" and spell.end == ic.markers[1].ts
    assert [v for _, v in ic.series[0].points][:2] == [14.0, 10.0]
    # Every TakeCheckpoint of the IC is answered by a Checkpoint from the LB.
    assert len(lb.markers) == len(ic.markers) - 1
    assert all(m.label.startswith("Checkpoint of ") for m in lb.markers)


def test_tremor_streams_echoes_and_closes() -> None:
    signals = fed(
        TremorSignals(),
        [
            {
                "ts": 1.0,
                "type": "connect-ack",
                "alias": "e",
                "tremor_protocol": "echo",
                "verdict": "accepted",
            },
            {"ts": 1.1, "type": "echo", "alias": "e", "sender": "client", "message_json": '{"e":1}'},
            {"ts": 1.2, "type": "echo", "alias": "e", "sender": "client", "message_json": '{"e":2}'},
            {"ts": 1.4, "type": "echo", "alias": "e", "sender": "server", "message_json": '{"e":2}'},
            {"ts": 1.6, "type": "echo", "alias": "e", "sender": "server", "message_json": '{"e":1}'},
            {"ts": 1.7, "type": "echo", "alias": "e", "sender": "server", "message_json": '{"e":3}'},
            {
                "ts": 1.9,
                "type": "connect-ack",
                "alias": "p",
                "tremor_protocol": "pubsub",
                "verdict": "accepted",
            },
            {"ts": 2.0, "type": "disconnect-ack", "alias": "e", "verdict": "accepted"},
            {"ts": 2.1, "type": "error-close", "status_code": "0.207", "verdict": "accepted"},
        ],
    )
    (streams,) = signals.series
    assert streams.points == [(1.0, 1), (1.9, 2), (2.0, 1), (2.1, 0)]  # the close ends the streams left
    (echo,) = signals.distributions
    assert echo.sample == pytest.approx([0.2, 0.5])  # matched by content; an unasked answer is left out
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("connect", "connected e (echo)"),
        ("connect", "connected p (pubsub)"),
        ("end", "disconnected e"),
        ("error", "closed with 0.207"),
    ]


def test_tremor_session_sample() -> None:
    first, second = connections("tremor-session.pcap")
    signals = first.signal_values()
    # captures/README.md: an echo and a pub/sub stream connected, 12 echoes, both disconnected, close.
    assert [v for _, v in signals.series[0].points] == [1, 2, 1, 0]
    (echo,) = signals.distributions
    assert echo.count == 12 and echo.low > 0
    assert [m.kind for m in signals.markers] == ["connect", "connect", "end", "end", "end"]
    assert [(m.kind, m.label) for m in second.signal_values().markers][-1] == ("error", "closed with 0.207")
    assert [v for _, v in second.signal_values().series[0].points] == [1, 0]
