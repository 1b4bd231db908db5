"""report: counts and protocol signals on hand-known captures, the bounds, the HTML and the CLI."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import struct
import subprocess
import sys

import pytest
from report_captures import CAPTURES, SAMPLE_FRAMES, long_session, unnotified_message
from support import COMMAND, as_foreground, run_cli

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.findings import mark
from wallaroo_proto.protocols import ProtocolPlugin, get_plugin
from wallaroo_proto.report import model
from wallaroo_proto.report.collect import build_report
from wallaroo_proto.report.html import render
from wallaroo_proto.report.model import ReportLimits
from wallaroo_proto.report.signals import Distribution, Series, Signals


def connections(*names: str, **kwargs) -> list[model.ConnectionReport]:
    report = build_report([CAPTURES / n for n in names], **kwargs)
    return [c for cap in report.captures for c in cap.connections]


@pytest.mark.e2e
def test_kinesis_latencies_checkpoints_and_lag(tmp_path) -> None:
    mld = tmp_path / "mld.pcap"
    recorded = run_cli(
        "kinesis", "mock-daemon", "--shards", "2", "--records", "30", "--batch-size", "10", "--shard-end",
        "--checkpoint-error", "ThrottlingException@1", "--record", str(mld),
        "--", sys.executable, "-m", "wallaroo_proto_cli",
        "kinesis", "mock-processor", "--checkpoint-every", "10",
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    shards = connections(mld)
    assert len(shards) == 2
    for conn in shards:
        assert conn.protocol == "kinesis" and conn.lanes[0].startswith("daemon ") and conn.frames == 20
        signals = conn.signal_values()
        # initialize, 3 processRecords and shardEnded, each answered by a status.
        (latency,) = signals.distributions
        assert latency.name == "request to status" and latency.count == 5
        kinds = [m.kind for m in signals.markers]
        # Checkpoints at 10, 20 and 30 records (the first throttled, then retried) and SHARD_END.
        assert kinds.count("checkpoint") == 5 and kinds.count("error") == 1 and kinds.count("end") == 1
        behind, batch = signals.series
        assert behind.name == "ms behind latest" and [v for _, v in batch.points] == [10.0, 10.0, 10.0]
    assert "request to status" in render(build_report([mld]))


def test_counts_and_lanes_of_a_source_session() -> None:
    (conn,) = connections("source-session.pcap")
    assert conn.frames == 18 and conn.frames_out == 13 and conn.violations == 0
    assert conn.lanes == ["connector 127.0.0.1:51000", "worker 127.0.0.1:7100"]
    assert conn.types_out == {"MESSAGE": 9, "NOTIFY": 2, "HELLO": 1, "EOS_MESSAGE": 1}
    assert conn.types_in == {"NOTIFY_ACK": 2, "ACK": 2, "OK": 1}
    assert [f[0] for f in conn.head] == list(range(18)) and conn.tail == [] and not conn.ladder_sampled
    assert [f[3] for f in conn.head[:4]] == ["HELLO", "OK", "NOTIFY", "NOTIFY"]


def test_wallaroo_credits_and_checkpoints() -> None:
    (conn,) = connections("source-session.pcap")
    signals = conn.signal_values()
    (credits,) = signals.series
    # OK grants 20; 10 frames spend (2 NOTIFY, 8 MESSAGE); ACK grants 10; EOS and the last MESSAGE spend 2.
    assert credits.points[0][1] == 20 and credits.points[-1][1] == 18
    assert min(v for _, v in credits.points) == 10
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("checkpoint", "ACK 11@6 12@102"),
        ("checkpoint", "ACK 12@102"),
    ]
    assert signals.spans == [] and signals.distributions == []


def test_restart_marker_and_two_connections() -> None:
    first, second = connections("restart-reconnect.pcap")
    assert [first.frames, second.frames] == SAMPLE_FRAMES["restart-reconnect.pcap"]
    kinds = [(m.kind, m.label) for m in first.signal_values().markers]
    assert kinds == [("checkpoint", "ACK 5@3"), ("restart", "RESTART")]
    assert [m.kind for m in second.signal_values().markers] == ["checkpoint"]


def test_twopc_latencies_of_the_sink_session() -> None:
    (conn,) = connections("sink-2pc.pcap")
    signals = conn.signal_values()
    dists = {d.name: d for d in signals.distributions}
    # make_samples.py sends each frame 1 ms after the one before: PHASE1, REPLY, PHASE2 in a row.
    for name in ("2PC PHASE1 to REPLY", "2PC REPLY to PHASE2"):
        assert dists[name].count == 2
        assert dists[name].sample == pytest.approx([0.001, 0.001], abs=1e-6)
    assert [(m.kind, m.label) for m in signals.markers] == [
        ("checkpoint", "commit sink-out:c_id=1"),
        ("abort", "abort sink-out:c_id=2"),
    ]
    # A sink's credits are not drawn: the worker ignores them (TCP backpressure instead).
    assert signals.series == [] and signals.spans == []


def test_zero_credit_spells_and_a_bounded_ladder(tmp_path) -> None:
    path = long_session(tmp_path / "long.pcap", messages=300, credits=10)
    limits = ReportLimits(ladder_frames=100, shown_frames=5)
    (conn,) = connections(path, limits=limits)
    assert conn.frames == 4 + 300 + 30
    assert len(conn.head) == 50 and len(conn.tail) == 50 and conn.ladder_sampled
    assert conn.head[0][0] == 0 and conn.tail[-1][0] == conn.frames - 1
    signals = conn.signal_values()
    assert len(signals.spans) == 30  # from every tenth MESSAGE to the ACK 3 ms later
    assert all(s.end - s.start == pytest.approx(0.003, abs=1e-6) for s in signals.spans)
    assert len([m for m in signals.markers if m.kind == "checkpoint"]) == 30
    assert len(conn.throughput["bins"]) <= model.MAX_BINS
    page = render(build_report([path], limits=limits))
    assert "<strong>Sampled:</strong> 1 connection(s)" in page


def test_violations_are_listed_and_linked(tmp_path) -> None:
    path = unnotified_message(tmp_path / "bad.pcap")
    (conn,) = connections(path)
    assert conn.violations == 1
    (listed,) = conn.finding_list
    assert listed[0] == 2 and listed[3:5] == ["MESSAGE", "error"] and "stream_id 9" in listed[5]
    assert conn.head[2][6] is True  # drawn red
    page = render(build_report([path]))
    assert 'data-goto="c1-1:2"' in page


def test_gaps_are_noted_on_the_frame_after_them() -> None:
    (conn,) = connections("lost-segment.pcap")
    # captures/README.md: 120 bytes lost at stream offset 187, resynced at the frame boundary 319.
    assert conn.notes == 1
    gap, resync = conn.finding_list
    assert gap[4] == resync[4] == "warning"
    assert "120 bytes missing at stream offset 187" in gap[5] and "resynced at stream offset 319" in resync[5]
    (frame,) = [f for f in conn.head if f[8]]
    assert frame[0] == gap[0] == resync[0] and frame[3] == "MESSAGE"


# --- findings first ------------------------------------------------------------------------------


def dcp_rollback_with_findings(limits: ReportLimits | None = None) -> model.Report:
    """captures/dcp-rollback.pcap as its plug-in marks it (each ROLLBACK and NOT_MY_VBUCKET answer,
    each too_slow STREAM_END a warning), with more marked here by hand, as ``findings.mark`` does:
    the NOT_MY_VBUCKET answer made an error, a second finding on each ROLLBACK."""
    name = str(CAPTURES / "dcp-rollback.pcap")
    limits = limits or ReportLimits()
    builder = model.ReportBuilder(limits)
    for record in Dissector(name, keep_summaries=False).run(name):
        if record.get("status") == "ROLLBACK":
            mark(record, "warning", "rollback (cause given by the plug-in)")
        elif record.get("status") == "NOT_MY_VBUCKET":
            mark(record, "error", "NOT_MY_VBUCKET")
        builder.feed(record)
    return model.Report([model.CaptureReport(name, builder.finish())], limits)


def _findings_rows(page: str) -> list[str]:
    table = page[page.index('<h2 id="findings">') :]
    table = table[: table.index("</table>")]
    return re.findall(r"<tr>(.*?)</tr>", table)[1:]  # after the header


def test_the_page_opens_on_its_findings_most_severe_first_each_linked_to_its_frame() -> None:
    page = render(dcp_rollback_with_findings())
    # The first heading after the title is the findings; limits come last, after every connection.
    assert re.findall(r"<h2[^>]*>([^<]*)</h2>", page)[0] == "Findings"
    assert page.index('class="bounds"') > page.rindex("<section")
    assert "1 error, 4 warnings, 0 notes." in page
    rows = _findings_rows(page)
    # dissect captures/dcp-rollback.pcap -T fields -e frame_index -e packet -e status -e type: the
    # ROLLBACKs are frames 21 (packet 25) and 24 (packet 27), the NOT_MY_VBUCKET frame 25 (packet 28),
    # the too_slow STREAM_ENDs frames 32 (packet 31) and 40 (packet 36).
    answer, end = "DCP_STREAM_REQ_RESPONSE", "DCP_STREAM_END"
    expected = [
        ("error", 28, 25, answer),
        ("warning", 25, 21, answer),
        ("warning", 27, 24, answer),
        ("warning", 31, 32, end),
        ("warning", 36, 40, end),
    ]
    for row, (severity, packet, frame, type_) in zip(rows, expected, strict=True):
        assert row.startswith(
            f'<td class="sev-{severity}">{severity}</td><td><a href="#c1-1">#1</a> dcp</td>'
        )
        assert f'<td class="num">{packet}</td>' in row
        assert f'<a href="#f-c1-1-{frame}" data-goto="c1-1:{frame}">#{frame}</a>' in row
        assert type_ in row
    # The ladder opens at the first finding, and draws the plug-in's finding on its arrow.
    (conn,) = [c for cap in dcp_rollback_with_findings().captures for c in cap.connections]
    assert conn.first_finding == 21 and '"first":21' in page
    severity, text = conn.head[21][9]
    assert severity == "warning" and text.startswith("vb 0 rolls back to 20: the consumer asked")
    assert text.endswith("; rollback (cause given by the plug-in)")


def test_a_report_without_findings_says_so_in_one_line() -> None:
    page = render(build_report([CAPTURES / "source-session.pcap"]))
    assert (
        '<h2 id="findings">Findings</h2><p class="none">No findings: no violation, gap or event.</p><h2'
        in page
    )


def test_a_finding_between_the_kept_halves_is_kept_with_its_neighbours(tmp_path) -> None:
    path = long_session(tmp_path / "long.pcap", messages=300, unnotified=(150,))
    limits = ReportLimits(ladder_frames=20, shown_frames=5)
    (conn,) = connections(path, limits=limits)
    bad = 4 + 149 + 149 // 10  # report_captures.long_session: MESSAGE 150's frame
    assert conn.first_finding == bad
    assert [f[0] for f in conn.middle] == list(range(bad - model.CONTEXT, bad + model.CONTEXT + 1))
    assert [f[10] for f in conn.middle] == [f[0] for f in conn.middle]  # seq: its place among the frames
    assert conn.middle[model.CONTEXT][6] is True
    page = render(build_report([path], limits=limits))
    assert f'data-goto="c1-1:{bad}"' in page and f'"first":{bad}' in page


def test_findings_stay_bounded(tmp_path) -> None:
    """Every MESSAGE of a long session carries a finding: the lists, the frames kept around them
    and the page's table keep their bounds, and the counts stay exact."""
    path = long_session(tmp_path / "long.pcap", messages=3000)
    limits = ReportLimits(ladder_frames=100, listed=40, findings=25)
    builder = model.ReportBuilder(limits)
    for record in Dissector(str(path), keep_summaries=False).run(str(path)):
        if record.get("type") == "MESSAGE":
            mark(record, "note", f"message {record['message_id']}")
        builder.feed(record)
    (conn,) = builder.finish()
    assert conn.finding_counts == {"note": 3000}
    assert len(conn.finding_list) == 40 and conn.finding_list[-1][5] == "message 40"
    assert len(conn.middle) <= limits.listed + 2 * model.CONTEXT
    page = render(model.Report([model.CaptureReport(str(path), [conn])], limits))
    assert len(_findings_rows(page)) == 25
    assert "0 errors, 0 warnings, 3000 notes." in page and "… and 2975 more" in page


def test_connections_past_the_limit_get_a_summary_row_only() -> None:
    report = build_report([CAPTURES / "restart-reconnect.pcap"], limits=ReportLimits(connections=1))
    first, second = report.captures[0].connections
    assert first.detailed and not second.detailed
    assert second.head == [] and second.signals is None and second.frames == 9
    page = render(report)
    assert "<strong>Aggregated:</strong> only the first 1 connections are drawn; 1 more" in page
    assert page.count('class="ladder-box"') == 1


def test_a_plugin_without_report_signals_still_reports(monkeypatch) -> None:
    assert ProtocolPlugin.__dataclass_fields__["report_signals"].default is None
    bare = dataclasses.replace(get_plugin("wallaroo"), report_signals=None)
    monkeypatch.setattr(model, "get_plugin", lambda name: bare)
    (conn,) = connections("source-session.pcap")
    assert conn.signals is None and conn.frames == 18
    assert 'class="ladder-box"' in render(build_report([CAPTURES / "source-session.pcap"]))


def test_series_and_distributions_stay_bounded() -> None:
    series = Series("level")
    for i in range(100_000):
        series.add(float(i), float(i % 7))
    assert len(series.points) <= 4000 and series.thinned > 0
    assert min(v for _, v in series.points) == 0  # a fall to the lowest level survives thinning
    dist = Distribution("d")
    for i in range(50_000):
        dist.add(i / 1000)
    assert dist.count == 50_000 and len(dist.sample) == 5000 and dist.sampled
    assert (dist.low, dist.high) == (0.0, 49.999)
    other = Distribution("d")
    other.add(100.0)
    dist.merge(other)
    assert dist.count == 50_001 and dist.high == 100.0 and len(dist.sample) <= 5000
    back = Signals.from_dict(Signals(series=[series], distributions=[dist]).to_dict())
    assert back.series[0].points == series.points and back.distributions[0].count == 50_001


def test_the_page_is_self_contained() -> None:
    page = render(build_report([CAPTURES / "source-session.pcap", CAPTURES / "sink-2pc.pcap"]))
    # Nothing is fetched: no src= or stylesheet links, every URL is an XML namespace.
    assert not re.search(r"""\bsrc\s*=|<link\b|@import|url\((?!#)""", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }
    assert page.count('class="ladder-box"') == 2 and page.count("<svg") >= 2 + 3


def test_cli_writes_the_report_and_prints_its_path(tmp_path) -> None:
    out = tmp_path / "r.html"
    result = run_cli("report", str(CAPTURES / "source-session.pcap"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert "1 capture(s), 1 connection(s), 18 frames, 0 with violations; findings: none;" in result.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    # captures/dcp-rollback.pcap: two rollbacks, a NOT_MY_VBUCKET, two too_slow stream ends
    rollback = run_cli("report", str(CAPTURES / "dcp-rollback.pcap"), "-o", str(tmp_path / "d.html"))
    assert "0 with violations; findings: 5 warnings;" in rollback.stderr


def test_cli_on_a_damaged_capture_still_writes_what_it_read(tmp_path) -> None:
    damaged = tmp_path / "cut.pcap"
    damaged.write_bytes((CAPTURES / "source-session.pcap").read_bytes()[:-30])
    out = tmp_path / "r.html"
    result = run_cli("report", str(damaged), "-o", str(out))
    assert result.returncode == 1  # cut short: a problem found, what came before is drawn
    assert "cut.pcap" in result.stderr and "Traceback" not in result.stderr
    assert "Read up to damage" in out.read_text()


# --- the command-line grammar (docs/cli.md) -------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_report_is_one_line_and_130(tmp_path, sig) -> None:
    fifo = tmp_path / "capture.pcap"
    os.mkfifo(fifo)  # the report reads it as the capture, and waits in the middle of it
    proc = subprocess.Popen(
        [*COMMAND, "report", str(fifo), "-o", str(tmp_path / "r.html")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_foreground,
    )
    try:
        with open(fifo, "wb") as writer:  # returns once the report opened its end
            writer.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
            writer.flush()
            proc.send_signal(sig)
            # The writer stays open: a signal that lands while the report is between two reads
            # (not blocked in one) only sets Python's flag, and a read that then blocked for the
            # next bytes would never see it; the reads of a pipe wait in short slices instead.
            out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "wallaroo-proto report: interrupted"
    assert "Aborted!" not in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()
