"""How ``replay`` and ``diff`` show their findings: a line per frame, then the summary."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table
from wallaroo_proto_cli.tables import print_table, stdout_console

from wallaroo_proto.replay.compare import Outcome, Result

#: Outcomes shown in the text summary (all are counted, and all kept are in the JSON).
SHOWN = 20


def outcome_line(outcome: Outcome) -> str:
    return outcome.text()


def print_report(report, fmt: str, verbosity: int) -> None:
    """``report`` (an ``engine.Report`` or ``diff.DiffReport``) as text or one JSON object."""
    if fmt == "json":
        click.echo(json.dumps(report.as_dict()))
        return
    counts = report.counts
    console = stdout_console()
    head = " ".join(f"{counts.get(r.value, 0)} {r.value}" for r in Result)
    verdict = "the same" if report.ok else "DIFFERENT"
    console.print(f"{report.title()}: {verdict} ({head})", markup=False, highlight=False)
    if getattr(report, "stopped", None):
        console.print(f"stopped: {report.stopped}", markup=False, highlight=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    for line in getattr(report, "own_violations", ())[:SHOWN]:
        console.print(f"own frame broke a rule: {line}", markup=False, highlight=False)
    findings = [o for o in report.outcomes if o.result is not Result.MATCHED]
    if findings and verbosity >= 0:
        rows = [
            (
                o.result.value,
                o.type,
                str((o.recorded or {}).get("packet", "")),
                str((o.live or {}).get("packet", "")),
                _what(o),
            )
            for o in (findings if verbosity > 0 else findings[:SHOWN])
        ]
        table = Table(box=box.SIMPLE_HEAD)
        for name in ("result", "type", "recorded packet", report.other_packet, "what differs"):
            table.add_column(name, overflow="fold" if name == "what differs" else None)
        for row in rows:
            table.add_row(*row)
        print_table(console, table)
        if len(findings) > SHOWN and verbosity <= 0:
            console.print(f"... and {len(findings) - SHOWN} more (--format json lists them)", highlight=False)


def _what(outcome: Outcome) -> str:
    if outcome.fields:
        return "; ".join(f"{name}: {_short(a)} -> {_short(b)}" for name, a, b in outcome.fields[:4]) + (
            f"; {len(outcome.fields) - 4} more" if len(outcome.fields) > 4 else ""
        )
    return " ".join(x for x in (f"[{outcome.rule}]" if outcome.rule else "", outcome.reason or "") if x)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."
