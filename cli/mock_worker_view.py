"""How ``mock-worker`` shows its run: the live view on stderr and the summary on stdout."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from wallaroo_proto_cli.serving import json_summary

from wallaroo_proto.protocols.wallaroo.worker import MockWorker

NAME = "mock-worker"


def live_table(worker: MockWorker, rate: float) -> Group:
    view = worker.live()
    head = (
        f"[bold]{NAME}[/] {worker.address[0]}:{worker.address[1]}  messages {view['messages']:,}"
        f"  ({rate:,.0f}/s)  replays {view['replays']:,}  checkpoints {view['checkpoints']}"
        f"  violations {view['violations']}  streams {view['streams']}"
    )
    table = Table(expand=False)
    for col in ("conn", "peer", "instance", "state", "credits", "streams", "messages", "replays"):
        table.add_column(col)
    for c in view["connections"][:30]:
        streams = c["streams"]
        shown = ", ".join(str(s) for s in streams[:4]) + (" ..." if len(streams) > 4 else "")
        table.add_row(
            str(c["connection"]),
            c["peer"],
            c["instance"],
            c["state"],
            "" if c["credits"] is None else str(c["credits"]),
            shown,
            f"{c['messages']:,}",
            f"{c['replays']:,}",
        )
    return Group(head, table)


async def show_live(worker: MockWorker, stop: asyncio.Event) -> None:
    """The live view on stderr, redrawn four times a second until ``stop`` is set."""
    console = Console(stderr=True)
    with Live(console=console, auto_refresh=False, transient=True) as view:
        last, last_t = 0, time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.25):
                    await stop.wait()
            now = time.monotonic()
            rate = (worker.stats.messages - last) / max(now - last_t, 1e-9)
            last, last_t = worker.stats.messages, now
            view.update(live_table(worker, rate), refresh=True)


def print_summary(summary: dict, fmt: str, rows: int = 50) -> None:
    if json_summary(summary, fmt):
        return
    out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    out.print(
        f"{NAME} summary: {summary['messages']:,} messages delivered "
        f"({summary['messages_per_second']:,.0f}/s over {summary['seconds']:.1f}s), "
        f"{summary['replays_dropped']:,} replays dropped, {summary['connections']} connections, "
        f"{summary['checkpoints']} checkpoints"
    )
    out.print(
        f"  notifies {summary['notifies']} (refused {summary['notify_refused']}), eos {summary['eos']}, "
        f"acks {summary['acks_sent']}, restarts {summary['restarts_sent']}, "
        f"dropped {summary['dropped_connections']}, violations {summary['violations']}, "
        f"handshakes failed {summary['handshakes_failed']}, refused connections "
        f"{summary['refused_connections']}, timeouts {summary['timeouts']}"
    )
    for err in summary["errors_received"]:
        out.print(f"  ERROR from connection {err['connection']} ({err['peer']}): {err['reason']}")
    for err in summary["errors"]:
        if err["connection"] is not None:  # a sink's failure is the command's own last line
            to = f"connection {err['connection']} ({err['peer']})"
            out.print(f"  ERROR to {to} \\[{err['kind']}]: {err['reason']}")
    if summary["streams"]:
        table = Table(title="streams")
        for col in ("stream_id", "name", "delivered", "replays", "last_seen", "point_of_ref", "held_by"):
            table.add_column(col)
        for s in summary["streams"][:rows]:
            table.add_row(*("" if s[k] is None else str(s[k]) for k in table_columns(table)))
        out.print(table)
        if len(summary["streams"]) > rows:
            out.print(f"  ... and {len(summary['streams']) - rows} more streams (-v or --format json)")


def table_columns(table: Table) -> list[str]:
    return [str(c.header) for c in table.columns]


def sink_summary(summary: dict) -> str:
    """The driver's counts as words (what a sink does with credits is nothing: none shown)."""
    shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in summary.items() if k != "last_problem")
    return shown + (f"; last problem: {summary['last_problem']}" if summary.get("last_problem") else "")
