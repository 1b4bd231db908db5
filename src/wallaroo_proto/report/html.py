"""A ``Report`` as one self-contained HTML file: styles, script and charts inlined, no network needed."""

from __future__ import annotations

import heapq
import html
import json
import os
import time
from collections import Counter, defaultdict
from importlib import resources

from wallaroo_proto.findings import SEVERITIES

from .charts import available, connection_chart, distribution_chart, stats
from .model import ConnectionReport, Report
from .signals import MAX_SAMPLE, Distribution, Signals

_e = html.escape


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1000:.3f}"


def _cid(capture_no: int, conn: ConnectionReport) -> str:
    return f"c{capture_no}-{conn.conn_index}"


def _table(headers: list[str], rows: list[str]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _num(value) -> str:
    return f'<td class="num">{value}</td>'


def _bounds(report: Report) -> str:
    """What the report left out to stay small, in words."""
    limits = report.limits
    conns = [c for cap in report.captures for c in cap.connections]
    sampled = [c for c in conns if c.detailed and c.ladder_sampled]
    undrawn = [c for c in conns if not c.detailed]
    lines = [
        f"The findings table lists the first {limits.findings} findings, most severe first; each connection "
        f"lists its first {limits.listed} of each severity and counts them all.",
        "Each ladder diagram opens at its connection's first finding, or else on its first and last "
        f"{limits.shown_frames} frames; the pages hold at most {limits.ladder_frames} frames per connection "
        f"(its first and last halves) and a few around each of its first {limits.listed} findings "
        "between them.",
        "Throughput is counted in at most 600 time bins per connection, drawn in at most 150 "
        "(the bin width is in each chart); "
        f"latency distributions keep a uniform sample of at most {MAX_SAMPLE} values per connection beside "
        "their exact count, minimum and maximum.",
    ]
    if sampled:
        lines.append(
            f"<strong>Sampled:</strong> {len(sampled)} connection(s) had more frames than that; "
            "the frames in between are counted in the tables but not drawn."
        )
    if undrawn:
        lines.append(
            f"<strong>Aggregated:</strong> only the first {limits.connections} connections are drawn; "
            f"{len(undrawn)} more appear in the summary tables only."
        )
    if not available():
        lines.append(
            "<strong>No charts:</strong> matplotlib is not installed (pip install 'wallaroo-proto[report]')."
        )
    if report.source == "spark":
        lines.append(
            "The figures were aggregated on Spark, one task per share of the connections, and drawn here."
        )
    paragraphs = "".join(f"<p>{line}</p>" for line in lines)
    return f'<h2 id="limits">Limits</h2><div class="bounds">{paragraphs}</div>'


def _summary_rows(capture_no: int, conns: list[ConnectionReport]) -> list[str]:
    rows = []
    for c in conns:
        cid = _cid(capture_no, c)
        name = f'<a href="#{cid}">#{c.conn_index}</a>' if c.detailed else f"#{c.conn_index}"
        duration = (c.last_ts - c.first_ts) if c.first_ts is not None else 0.0
        rows.append(
            f'<tr class="{"bad" if c.violations else ""}"><td>{name}</td><td>{_e(c.protocol)}</td>'
            f"<td>{_e(c.lanes[0])} ⇄ {_e(c.lanes[1])}</td>"
            f"{_num(c.frames_out)}{_num(c.frames - c.frames_out)}{_num(c.bytes_out)}{_num(c.bytes_in)}"
            f"{_num(f'{duration:.6f}')}{_num(c.violations)}{_num(c.notes)}</tr>"
        )
    return rows


def _link(capture_no: int, c: ConnectionReport, index: int) -> str:
    """A frame's link: the ladder opens at the frame (paging to it) when the link is followed."""
    cid = _cid(capture_no, c)
    if not c.detailed:
        return f"#{index}"
    return f'<a href="#f-{cid}-{index}" data-goto="{cid}:{index}">#{index}</a>'


def _finding_cells(capture_no: int, c: ConnectionReport, item: list, conn: str = "") -> str:
    index, packet, _ts, label, severity, text = item
    return (
        f'<td class="sev-{_e(severity)}">{_e(severity)}</td>{conn}{_num(packet)}'
        f"{_num(_link(capture_no, c, index))}<td>{_e(str(label))}</td><td>{_e(text)}</td>"
    )


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts.get(s, 0)} {s}{'s' if counts.get(s, 0) != 1 else ''}" for s in SEVERITIES)


def _findings(report: Report) -> str:
    """The page's opening: every connection's listed findings, most severe first, the first
    ``limits.findings`` of them, each linked to its frame; what is left out is counted."""
    counts: Counter = Counter()
    for capture in report.captures:
        for c in capture.connections:
            counts.update(c.finding_counts)
    total = sum(counts.values())
    if not total:
        return '<h2 id="findings">Findings</h2><p class="none">No findings: no violation, gap or event.</p>'
    rows = (
        (SEVERITIES.index(item[4]), order, capture_no, c, item)
        for order, (capture_no, c, item) in enumerate(
            (capture_no, c, item)
            for capture_no, capture in enumerate(report.captures, 1)
            for c in capture.connections
            for item in c.finding_list
        )
    )
    # Most severe first, then in capture, connection and frame order; holding no more than are shown.
    shown = heapq.nsmallest(report.limits.findings, rows, key=lambda row: row[:2])
    several = len(report.captures) > 1
    cells = []
    for _rank, _order, capture_no, c, item in shown:
        where = f"{_e(os.path.basename(c.capture))} " if several else ""
        conn = f'<a href="#{_cid(capture_no, c)}">#{c.conn_index}</a>' if c.detailed else f"#{c.conn_index}"
        conn = f"<td>{where}{conn} {_e(c.protocol)}</td>"
        cells.append(f"<tr>{_finding_cells(capture_no, c, item, conn)}</tr>")
    more = total - len(shown)
    rest = f"<p>… and {more} more (the tables below list each connection's first ones).</p>" if more else ""
    return (
        f'<h2 id="findings">Findings</h2><p>{_counts(counts)}.</p>'
        + _table(["severity", "connection", "packet", "frame", "type", "finding"], cells)
        + rest
    )


def _listed(capture_no: int, c: ConnectionReport) -> str:
    if not c.finding_list:
        return ""
    rows = [f"<tr>{_finding_cells(capture_no, c, item)}</tr>" for item in c.finding_list]
    total = sum(c.finding_counts.values())
    more = ""
    if total > len(rows):
        more = f"<p>… and {total - len(rows)} more ({_counts(c.finding_counts)} in all).</p>"
    return "<h4>Findings</h4>" + _table(["severity", "packet", "frame", "type", "finding"], rows) + more


def _types(c: ConnectionReport) -> str:
    def cell(types: dict[str, int]) -> str:
        return ", ".join(f"{_e(k)} {v}" for k, v in types.items()) or "none"

    return _table(
        ["direction", "frames by type"],
        [
            f"<tr><td>{_e(c.lanes[0])} → </td><td>{cell(c.types_out)}</td></tr>",
            f"<tr><td>{_e(c.lanes[1])} → </td><td>{cell(c.types_in)}</td></tr>",
        ],
    )


def _connection(capture_no: int, c: ConnectionReport, t0: float, shown: int) -> str:
    cid = _cid(capture_no, c)
    frames = {
        "id": cid,
        "lanes": c.lanes,
        "t0": t0,
        "total": c.frames,
        "shown": shown,
        "head": c.head,
        "middle": c.middle,
        "tail": c.tail,
        "first": c.first_finding,
    }
    parts = [
        f'<section id="{cid}"><h3>Connection #{c.conn_index} ({_e(c.protocol)}): {_e(c.connection)}</h3>'
    ]
    parts.append(_types(c))
    parts.append(
        f'<div class="ladder-box" data-frames="frames-{cid}">'
        '<div class="ladder-controls"><button data-act="ends">first and last</button>'
        '<button data-act="prev">◀ page</button><button data-act="next">page ▶</button>'
        '<button data-act="in">zoom +</button><button data-act="out">zoom −</button>'
        '<span class="ladder-status"></span></div><svg class="ladder" xmlns="http://www.w3.org/2000/svg"></svg></div>'
    )
    parts.append(f'<script type="application/json" id="frames-{cid}">{_json(frames)}</script>')
    chart = connection_chart(c, t0)
    if chart:
        parts.append(f'<div class="chart">{chart}</div>')
    signals = c.signal_values()
    if signals is not None:
        parts.extend(f"<p><em>{_e(note)}</em></p>" for note in signals.notes)
    parts.append(_listed(capture_no, c))
    parts.append("</section>")
    return "".join(parts)


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def _latencies(report: Report) -> str:
    """Each protocol's distributions, over all its drawn connections."""
    merged: dict[str, dict[str, Distribution]] = defaultdict(dict)
    for capture in report.captures:
        for c in capture.connections:
            signals: Signals | None = c.signal_values()
            for dist in signals.distributions if signals else ():
                into = merged[c.protocol].get(dist.name)
                if into is None:
                    merged[c.protocol][dist.name] = Distribution(dist.name, dist.unit)
                    into = merged[c.protocol][dist.name]
                into.merge(dist)
    if not merged:
        return ""
    parts = ["<h2>Latencies</h2>"]
    for protocol, dists in merged.items():
        rows = []
        for dist in dists.values():
            s = stats(dist)
            rows.append(
                f"<tr><td>{_e(dist.name)}</td>{_num(s['count'])}{_num(_ms(s['min']))}{_num(_ms(s['p50']))}"
                f"{_num(_ms(s['p99']))}{_num(_ms(s['max']))}{_num(_ms(s['mean']))}"
                f"<td>{'sample of ' + str(len(dist.sample)) if dist.sampled else 'all values'}</td></tr>"
            )
        parts.append(f"<h3>{_e(protocol)}</h3>")
        parts.append(
            _table(["latency (ms)", "count", "min", "p50", "p99", "max", "mean", "percentiles from"], rows)
        )
        if available():
            parts.append(f'<div class="chart">{distribution_chart(protocol, list(dists.values()))}</div>')
    return "".join(parts)


def render(report: Report) -> str:
    """The whole page as text."""
    body = [f"<h1>{_e(report.title)}</h1>"]
    names = ", ".join(_e(os.path.basename(c.name)) for c in report.captures)
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    body.append(f"<p>{len(report.captures)} capture(s): {names}. Made {made}.</p>")
    body.append(_findings(report))
    body.append(_latencies(report))
    shown = report.limits.shown_frames
    for capture_no, capture in enumerate(report.captures, 1):
        body.append(f'<h2 id="capture-{capture_no}">{_e(capture.name)}</h2>')
        if capture.error:
            body.append(f'<p class="error">Read up to damage: {_e(capture.error)}</p>')
        if not capture.connections:
            body.append("<p>No protocol connections found.</p>")
            continue
        body.append(
            _table(
                ["conn", "protocol", "initiator ⇄ responder", "frames →", "frames ←", "bytes →", "bytes ←",
                 "seconds", "violations", "gaps/resyncs"],
                _summary_rows(capture_no, capture.connections),
            )
        )  # fmt: skip
        t0 = capture.start or 0.0
        for c in capture.connections:
            if c.detailed:
                body.append(_connection(capture_no, c, t0, shown))
    body.append(_bounds(report))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(report.title)}</title><style>{_asset('report.css')}</style></head>"
        f"<body>{''.join(body)}<script>{_asset('ladder.js')}</script></body></html>\n"
    )


def write_report(report: Report, path: str | os.PathLike) -> int:
    """Write the page durably (atomically replaced); returns its size in bytes."""
    from wallaroo_proto.durable import write_atomic

    data = render(report).encode("utf-8")
    write_atomic(os.fspath(path), data)
    return len(data)
