"""``wallaroo-proto proxy``: stand between two real peers, forward, record and check live.

Thin: ``wallaroo_proto.proxy.relay`` forwards, ``wallaroo_proto.proxy.watch`` records
and checks; this module parses options and prints. Exit codes: 0 stopped cleanly
(SIGINT/SIGTERM), 1 the live checks stopped short, 2 bad usage or a port that cannot be bound.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import click
from rich.console import Console
from rich.markup import escape
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    LISTEN_ADDRESS,
    Command,
    examples,
    format_address,
    os_reason,
    record_option,
    usage_error,
    verbosity,
)

from wallaroo_proto.protocols import get_plugin, names
from wallaroo_proto.proxy.relay import Relay
from wallaroo_proto.proxy.watch import Watch

NAME = "wallaroo-proto proxy"


def _violation_line(r: dict) -> str:
    """One violation as it happens: the client is always the connection's initiator."""
    side = "client→upstream" if r["direction"].startswith("initiator") else "upstream→client"
    reasons = "; ".join(r["violations"])
    return f"{NAME}: connection #{r['conn_index']} {side} frame {r['frame_index']} {r['type']}: {reasons}"


async def _serve(relay: Relay) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        host, port = await relay.start()
    except OSError as err:
        raise usage_error(f"cannot listen on {format_address(relay.listen)}: {os_reason(err)}") from err
    click.echo(f"{NAME}: listening on {host}:{port}, forwarding to {format_address(relay.upstream)}")
    sys.stdout.flush()
    await stop.wait()
    await relay.stop()


@click.command(
    name="proxy",
    cls=Command,
    epilog=examples(
        "wallaroo-proto proxy --listen :7101 --upstream 127.0.0.1:7100",
        "wallaroo-proto proxy --listen :0 --upstream db:11210 --record dcp.pcap",
        "wallaroo-proto proxy --listen :7101 --upstream :7100 --record - | wallaroo-proto dissect -",
    ),
)
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    required=True,
    help="Address the client connects to (port 0: a free one).",
)
@click.option("--upstream", type=CONNECT_ADDRESS, required=True, help="The real peer's address.")
@click.option(
    "--protocol",
    type=click.Choice(names()),
    default=None,
    help="Read the conversation as this protocol [default: detected as dissect does it].",
)
@record_option("Record what passes, as seen on each side, into this pcap file")
@click.option("--summary/--no-summary", default=True, show_default=True, help="dissect's summary at the end.")
@verbosity(
    quiet="No line per violation on stderr: errors and the summary.",
    verbose="Also the relay's counts at the end: connections, bytes each way.",
)
def command(listen, upstream, protocol, record, summary, verbosity) -> None:
    """Forward TCP connections from --listen to --upstream unchanged, both ways, and check them live.

    Every frame of both directions goes through the protocol's own rules, as
    `dissect` reads a capture: a violation is printed as it happens (stderr), and
    on SIGINT or SIGTERM the proxy stops and prints `dissect --summary`'s summary.
    """
    errors = Console(stderr=True, highlight=False, soft_wrap=True)

    def on_violation(r: dict) -> None:
        if verbosity >= 0:
            errors.print(escape(_violation_line(r)))

    try:
        watch = Watch(record=record, protocol=protocol, ports=(upstream[1],), on_violation=on_violation)
    except OSError as err:
        raise usage_error(f"--record {record}: {os_reason(err)}") from err
    relay = Relay(listen, upstream, watch)
    try:
        asyncio.run(_serve(relay))
    finally:
        watch.close()
    if watch.error is not None:
        errors.print(f"[bold red]{NAME}:[/] live checks incomplete: {escape(watch.error)}")
    out = Console(file=sys.stdout, highlight=False, soft_wrap=False)
    if summary:
        for s in watch.summaries:
            get_plugin(s.get("protocol", "wallaroo")).print_summary(out, s)
    stats = relay.stats
    if verbosity > 0:
        errors.print(
            f"{NAME}: {stats.accepted} connection(s) relayed, {stats.bytes[True]} bytes client→upstream, "
            f"{stats.bytes[False]} bytes upstream→client"
            + (f", {stats.refused_upstream} refused by the upstream" if stats.refused_upstream else "")
        )
    if watch.error is not None:
        raise SystemExit(1)
