"""``wallaroo-proto tremor``: the Tremor network protocol's mock node and mock client.

``mock-node`` serves sessions (echo and pub/sub) on a WebSocket port, with
faults to test clients against; ``mock-client`` runs a scripted or generated
exchange against a node and checks every reply. The work is done in
``wallaroo_proto.protocols.tremor``; the summary goes to stdout
(``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import click
from rich.console import Console
from rich.table import Table
from wallaroo_proto_cli.options import EXIT_INTERRUPTED, summary_format, usage_error, write_timeout_option

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.tremor.peers import (
    DEFAULT_PORT,
    ClientError,
    Faults,
    MockClient,
    MockNode,
    generated_exchange,
    read_script,
    scripted_exchange,
)


def _console() -> Console:
    return Console(
        file=sys.stdout, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200
    )


@click.group(name="tremor")
def command() -> None:
    """Tremor network protocol (RFC 0019, JSON over WebSocket): mock node and mock client."""


# --------------------------------------------------------------------------- mock-node


async def _run_node(node: MockNode) -> bool:
    try:
        host, port = await node.start()
    except OSError as err:
        raise usage_error(f"cannot listen on {node.host}:{node.port}: {err.strerror or err}") from err
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    click.echo(f"wallaroo-proto tremor mock-node: listening on {host}:{port}")
    sys.stdout.flush()
    await stop.wait()
    await node.stop()
    return True


@command.command(name="mock-node")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port (the prototype's 9899; 0: a free one, named in the ready line).",
)
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
def mock_node(
    host: str,
    port: int,
    refuse: bool,
    drop_after: int,
    delay: float,
    malformed_after: int,
    write_timeout: float,
    handshake_timeout: float,
    fmt: str,
) -> None:
    """Serve Tremor network-protocol sessions: echo and pub/sub streams over one WebSocket each.

    Runs until SIGINT or SIGTERM, then prints a summary. A client that breaks
    the protocol gets the prototype's error close (``{"tremor":{"close":"0.207:
    ..."}}``) and the others carry on. Exit 0 after a signal, 2 on bad usage.
    """
    faults = Faults(refuse=refuse, drop_after=drop_after, delay=delay / 1000, malformed_after=malformed_after)
    node = MockNode(
        host,
        port,
        faults,
        log=lambda line: click.echo(f"tremor mock-node: {line}", err=True),
        write_timeout=write_timeout,
        handshake_timeout=handshake_timeout,
    )
    asyncio.run(_run_node(node))
    stats = node.stats.as_dict()
    if fmt == "json":
        click.echo(json.dumps(stats))
        return
    out = _console()
    out.print(
        f"tremor mock-node summary: {stats['connections']} connections, {stats['sessions']} sessions, "
        f"{stats['refused']} refused, {stats['dropped']} dropped, {stats['messages_in']:,} messages in, "
        f"{stats['messages_out']:,} out, {stats['violations']} client violations, "
        f"{stats['timeouts']} timed out"
    )
    for line in stats["violation_list"]:
        out.print(f"  [red]violation[/] {line}")


# --------------------------------------------------------------------------- mock-client


def _address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param_hint="--connect")
    return host.strip("[]") or "127.0.0.1", int(port)


def _print_client(result: dict, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    out = _console()
    verdict = "[green]ok[/]" if result["ok"] else "[bold red]FAILED[/]"
    out.print(
        f"tremor mock-client summary: {verdict}: {result['sent']:,} sent, {result['received']:,} received, "
        f"{result['echoes']:,} echoes, {result['delivered']}/{result['published']} published events back, "
        f"{result['seconds']:.3f}s ({result['messages_per_second']:,.0f} messages/s)"
    )
    if result["steps"]:
        table = Table(title="exchange")
        for col in ("sent", "judged", "replies", "problems"):
            table.add_column(col, overflow="fold")
        for step in result["steps"]:
            table.add_row(
                step["sent"], step["verdict"], "\n".join(step["replies"]), "\n".join(step["problems"])
            )
        out.print(table)
    if result["error_close"]:
        out.print(f"the node closed the session: {result['error_close']}")
    for note in result["notes"]:
        out.print(f"note: {note}")
    for failure in result["failures"]:
        out.print(f"[bold red]FAILED[/] {failure}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@command.command(name="mock-client")
@click.option(
    "--connect", "address", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True, metavar="HOST:PORT"
)
@click.option(
    "--script",
    type=click.File("rb"),
    default=None,
    help="Send these messages instead (one JSON message a line, sent as written; - is stdin).",
)
@click.option(
    "--messages", type=click.IntRange(0), default=100, show_default=True, help="Generated: echo messages."
)
@click.option(
    "--window", type=click.IntRange(1), default=32, show_default=True, help="Generated: echoes in flight."
)
@click.option(
    "--payload-size", type=click.IntRange(0), default=16, show_default=True, help="Generated: filler bytes."
)
@click.option(
    "--publish", type=click.IntRange(0), default=10, show_default=True, help="Generated: pub/sub events."
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for a reply.",
)
@click.option(
    "--record", type=click.Path(dir_okay=False), default=None, help="Record the connection into this pcap."
)
@summary_format
def mock_client(address: str, script, messages, window, payload_size, publish, timeout, record, fmt) -> None:
    """Open a session with a node, run an exchange, check each reply, print a summary.

    Generated (the default): connect an echo and a pub/sub stream, echo
    --messages values with --window in flight, publish --publish events to a
    URL the stream subscribes to, list, unsubscribe, disconnect, close. With
    --script: each line is sent in turn and what comes back is judged before
    the next. Exit 0 when every reply was right, 1 when one was not or the
    node failed the exchange, 2 on bad usage or an unreachable node.
    """
    host, port = _address(address)
    try:
        lines = None if script is None else read_script(script)
    except ValueError as err:
        raise usage_error(f"--script {script.name}: {err}") from err
    try:
        writer = PcapWriter(record) if record else None
    except OSError as err:
        raise usage_error(f"cannot write --record {record}: {err.strerror or err}") from err
    client = MockClient(host, port, timeout=timeout, record=writer)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends the run as SIGINT does
    try:
        if lines is not None:
            result = scripted_exchange(client, lines)
        else:
            result = generated_exchange(client, messages, window, payload_size, publish)
    except ClientError as err:
        client.close()
        if writer is not None:
            writer.close()
        if not client.reached:
            click.echo(f"tremor mock-client: {err}", err=True)
            sys.exit(2)
        click.echo(f"tremor mock-client: FAILED: {err}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        if client.sock is not None:
            client.sock.close()
        if writer is not None:
            writer.close()  # what was recorded up to here stays readable
        click.echo("tremor mock-client: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if writer is not None:
        writer.close()
    summary = result.as_dict()
    _print_client(summary, fmt)
    if not summary["ok"]:
        sys.exit(1)
