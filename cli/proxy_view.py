"""How ``proxy`` speaks: a line per violation and per given-up check on stderr (through a spool
when no live view owns it), and dissect's summary on stdout at the end."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from wallaroo_proto_cli.dissect_stats import print_summary_findings, summary_console

from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.proxy.checker import mib
from wallaroo_proto.proxy.outlet import Spool, SpoolText
from wallaroo_proto.proxy.relay import Relay, RelayStats, numbered_summary

NAME = "wallaroo-proto proxy"
#: Bytes of stderr lines that may wait for a reader; past it lines are dropped and counted.
STDERR_BACKLOG = 1 << 20


def stderr_console(live: bool) -> tuple[Console, Spool | None]:
    """The console for stderr's lines, and the spool that writes them when there is no live view."""
    if live:
        # The live view's own console: a line printed on it goes above the view and stays there
        # (another console's line lands below it, and the next refresh erases it).
        return Console(stderr=True, highlight=False, emoji=False), None
    # Without the live view, stderr's lines are written by a thread of their own: a stderr
    # nobody reads costs lines (counted, and said once it is read again), never the relay.
    spool = Spool(
        sys.stderr.fileno(),
        limit=STDERR_BACKLOG,
        drop_lines=True,
        dropped_line=lambda n: f"{NAME}: {n} line(s) dropped: stderr was not read\n".encode(),
        name="stderr",
    )
    return Console(file=SpoolText(spool), highlight=False, soft_wrap=True, emoji=False), spool


def violation_line(r: dict, conn: int, side: str | None) -> str:
    """One violation as it happens: the client is always the connection's initiator. Bytes that
    are no frame (a Wallaroo frame that cannot be read) have no frame number: their packet's."""
    direction = "client→upstream" if r["direction"].startswith("initiator") else "upstream→client"
    reasons = "; ".join(r["violations"])
    leg = f" ({side} side)" if side else ""
    where = f"frame {r['frame_index']}" if r.get("frame_index") is not None else f"packet {r.get('packet')}"
    line = f"{NAME}: connection #{conn}{leg} {direction} {where} {r['type']}: {reasons}"
    if r.get("repeats_hidden"):
        line += f" (more {r['type']} this way on #{conn}: counted in the summary, not shown)"
    return line


def given_up_line(r: dict, conn: int, side: str | None, faults: bool) -> str:
    """Why a connection's live checks stopped (with fault rules each side is checked apart)."""
    leg = f" ({side} side)" if side else ""
    bound = f"--max-buffered {mib(r['limit'])}"
    if faults:
        bound = f"{mib(r['limit'])} (twice --max-buffered: each side checked apart)"
    return (
        f"connection #{conn}{leg}: live checks given up: it holds {mib(r['held'])} of frames not yet "
        f"whole, and all connections together more than {bound}; its traffic goes on"
    )


def print_summary(
    summaries: Sequence[dict], relays: list[Relay], record: str | None, rules: Sequence
) -> None:
    """As dissect --summary of the recording: the findings first, then each connection's summary,
    then what each fault rule did."""
    out = summary_console(Console(file=sys.stdout, highlight=False, soft_wrap=False))
    numbered = [numbered_summary(s, relays) for s in summaries]
    if numbered:
        print_summary_findings(
            out, numbered, record if record not in (None, "-") else "the proxy's connections"
        )
    for s in numbered:
        get_plugin(s.get("protocol", "wallaroo")).print_summary(out, s)
    for rule in rules:
        missed = f", not applied {rule.not_applied}" if rule.not_applied else ""
        out.print(escape(f"fault {rule.text}: matched {rule.seen}, applied {rule.fired}{missed}"))


def relay_counts(stats: RelayStats) -> str:
    """-v's last line: what the relay carried."""
    return (
        f"{NAME}: {stats.accepted} connection(s) relayed, {stats.bytes[True]} bytes client→upstream, "
        f"{stats.bytes[False]} bytes upstream→client"
        + (f", {stats.refused_upstream} refused by the upstream" if stats.refused_upstream else "")
    )
