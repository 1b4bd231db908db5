"""``wallaroo-proto tremor``: the Tremor network protocol's mock node and mock client.

``mock-node`` serves sessions (echo and pub/sub) on a WebSocket port, with
faults to test clients against; ``mock-client`` runs a scripted or generated
exchange against a node and checks every reply. The work is done in
``wallaroo_proto.protocols.tremor``; the summary goes to stdout
(``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio

import click
from rich.markup import escape
from wallaroo_proto_cli.options import (
    Command,
    Group,
    command_log,
    examples,
    format_address,
    listen_option,
    os_reason,
    plural,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import json_summary, on_stop_signals, ready
from wallaroo_proto_cli.tables import stdout_console
from wallaroo_proto_cli.tremor_client import mock_client

from wallaroo_proto.protocols.tremor.peers import (
    DEFAULT_PORT,
    Faults,
    MockNode,
)


@click.group(
    name="tremor",
    cls=Group,
    epilog=examples(
        "wallaroo-proto tremor mock-node --listen :0",
        "wallaroo-proto tremor mock-client --connect 127.0.0.1:9899 --messages 1000",
    ),
)
def command() -> None:
    """Tremor network protocol (RFC 0019, JSON over WebSocket): mock node and mock client."""


# --------------------------------------------------------------------------- mock-node


async def _run_node(node: MockNode) -> bool:
    # Handlers first: a signal sent the moment the ready line appears must still end cleanly.
    stop = on_stop_signals()
    try:
        host, port = await node.start()
    except OSError as err:
        where = format_address((node.host, node.port))
        raise usage_error(f"cannot listen on {where}: {os_reason(err)}") from err
    ready(f"wallaroo-proto tremor mock-node: listening on {host}:{port}")
    await stop.wait()
    await node.stop()
    return True


@command.command(
    name="mock-node",
    cls=Command,
    sections={
        "Faults": ["refuse", "drop_after", "delay", "malformed_after"],
    },
    epilog=examples(
        "wallaroo-proto tremor mock-node",
        "wallaroo-proto tremor mock-node --listen :0 --malformed-after 5 --delay 20",
        "wallaroo-proto tremor mock-node --listen 0.0.0.0:9899 --refuse --format json",
    ),
)
@listen_option(DEFAULT_PORT, "Address to listen on (the prototype's port)")
@click.option("--refuse", is_flag=True, help="Fault: refuse every WebSocket upgrade (HTTP 503).")
@click.option(
    "--drop-after",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Fault: abort a connection at its Nth message.",
)
@click.option(
    "--delay",
    type=click.FloatRange(0),
    default=0.0,
    metavar="MS",
    help="Fault: wait this long before each reply.",
)
@click.option(
    "--malformed-after",
    type=click.IntRange(0),
    default=0,
    metavar="N",
    help="Fault: a connection's Nth message from the node is cut short (not JSON).",
)
@write_timeout_option("a connection")
@click.option(
    "--handshake-timeout",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Answer 408 and close a connection with no full upgrade request in this many seconds (0: never).",
)
@summary_format
@verbosity(
    quiet="No line per broken session on stderr: errors and the summary.",
    verbose="Every client violation in the summary (else the first 20).",
)
def mock_node(
    listen: tuple[str, int],
    refuse: bool,
    drop_after: int,
    delay: float,
    malformed_after: int,
    write_timeout: float,
    handshake_timeout: float,
    fmt: str,
    verbosity: int,
) -> None:
    """Serve Tremor network-protocol sessions: echo and pub/sub streams over one WebSocket each.

    Runs until SIGINT or SIGTERM, then prints a summary. A client that breaks
    the protocol gets the prototype's error close (``{"tremor":{"close":"0.207:
    ..."}}``) and the others carry on. Exit 0 after a signal, 2 on bad usage.
    """
    host, port = listen
    faults = Faults(refuse=refuse, drop_after=drop_after, delay=delay / 1000, malformed_after=malformed_after)
    node = MockNode(
        host,
        port,
        faults,
        log=command_log("tremor mock-node", verbosity >= 0),
        write_timeout=write_timeout,
        handshake_timeout=handshake_timeout,
    )
    asyncio.run(_run_node(node))
    stats = node.stats.as_dict()
    if json_summary(stats, fmt):
        return
    out = stdout_console()
    out.print(
        f"tremor mock-node summary: {plural(stats['connections'], 'connection')}, "
        f"{plural(stats['sessions'], 'session')}, {stats['refused']} refused, {stats['dropped']} dropped, "
        f"{plural(stats['messages_in'], 'message')} in, {stats['messages_out']:,} out, "
        f"{plural(stats['violations'], 'client violation')}, {stats['timeouts']} timed out"
    )
    violations = stats["violation_list"]
    shown = violations if verbosity > 0 else violations[:20]
    for line in shown:
        out.print(f"  [red]violation[/] {escape(line)}")
    if len(shown) < len(violations):
        out.print(f"  ... {len(violations) - len(shown)} more (-v shows every one)")


command.add_command(mock_client)
