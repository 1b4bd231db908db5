"""A ``Report`` as one self-contained HTML file: styles, script and charts inlined, no network needed."""

from __future__ import annotations

import html
import json
import os
import time
from collections import defaultdict
from importlib import resources

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
        f"Each ladder diagram opens on the first and last {limits.shown_frames} frames of its connection; "
        f"the pages hold at most {limits.ladder_frames} frames per connection (its first and last halves).",
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
    return '<div class="bounds">' + "".join(f"<p>{line}</p>" for line in lines) + "</div>"


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


def _listed(capture_no: int, c: ConnectionReport, items: list[list], t0: float, what: str, total: int) -> str:
    if not items:
        return ""
    cid = _cid(capture_no, c)
    rows = []
    for index, packet, ts, label, text in items:
        link = (
            f'<a href="#f-{cid}-{index}" data-goto="{cid}:{index}">#{index}</a>'
            if c.detailed
            else f"#{index}"
        )
        rows.append(
            f"<tr><td>{link}</td>{_num(packet)}{_num(f'{ts - t0:.6f}')}<td>{_e(str(label))}</td>"
            f"<td>{_e(text)}</td></tr>"
        )
    more = f"<p>… and more: {total} frames in all.</p>" if total > len(items) else ""
    return f"<h4>{what}</h4>" + _table(["frame", "packet", "s", "type", what.lower()], rows) + more


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
        "tail": c.tail,
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
    parts.append(_listed(capture_no, c, c.violation_list, t0, "Violations", c.violations))
    parts.append(_listed(capture_no, c, c.note_list, t0, "Gaps and resyncs", c.notes))
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
    body.append(_bounds(report))
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
