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
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    Command,
    CommandError,
    Group,
    command_log,
    examples,
    format_address,
    hidden_alias,
    listen_option,
    open_failure,
    os_reason,
    plural,
    problem,
    record_option,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

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
    if fmt == "json":
        click.echo(json.dumps(stats))
        return
    out = _console()
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


# --------------------------------------------------------------------------- mock-client


def _print_client(result: dict, fmt: str, verbosity: int) -> None:
    if fmt == "json":
        click.echo(json.dumps(result))
        return
    out = _console()
    verdict = "[green]ok[/]" if result["ok"] else "[bold red]FAILED[/]"
    out.print(
        f"tremor mock-client summary: {verdict}: {result['sent']:,} sent, {result['received']:,} received, "
        f"{plural(result['echoes'], 'echo', 'echoes')}, "
        f"{result['delivered']}/{result['published']} published events back, "
        f"{result['seconds']:.3f}s ({result['messages_per_second']:,.0f} messages/s)"
    )
    if result["steps"] and verbosity >= 0:
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
    for note in result["notes"] if verbosity >= 0 else ():
        out.print(f"note: {escape(note)}")
    for failure in result["failures"]:
        out.print(f"[bold red]FAILED[/] {failure}")


@command.command(
    name="mock-client",
    cls=Command,
    sections={
        "Generated exchange (without --script)": ["messages", "window", "payload_size", "publish"],
    },
    epilog=examples(
        "wallaroo-proto tremor mock-client --connect 127.0.0.1:9899 --messages 10000 --window 64",
        "wallaroo-proto tremor mock-client --script session.jsonl --record session.pcap",
        'printf \'{"tremor":"version"}\\n\' | wallaroo-proto tremor mock-client --script -',
    ),
)
@click.option(
    "--connect",
    "address",
    type=CONNECT_ADDRESS,
    default=f"127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    help="The node's HOST:PORT.",
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
    "--idle-timeout",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Fail the run when the node sends no reply, or reads none of our bytes, for this many seconds.",
)
@hidden_alias("--timeout", "idle_timeout", type=click.FloatRange(0.1))
@record_option("Record the connection into this pcap")
@summary_format
@verbosity(
    quiet="The summary line and failures only: no exchange table, no notes.",
    verbose="Also a line on stderr once the node is reached and once it accepts the upgrade.",
)
def mock_client(
    address: tuple[str, int],
    script,
    messages: int,
    window: int,
    payload_size: int,
    publish: int,
    idle_timeout: float,
    record: str | None,
    fmt: str,
    verbosity: int,
) -> None:
    """Open a session with a node, run an exchange, check each reply, print a summary.

    Generated (the default): connect an echo and a pub/sub stream, echo
    --messages values with --window in flight, publish --publish events to a
    URL the stream subscribes to, list, unsubscribe, disconnect, close. With
    --script: each line is sent in turn and what comes back is judged before
    the next. Exit 0 when every reply was right, 1 when one was not or the
    node failed the exchange, 2 on bad usage or an unreachable node, 130
    on SIGINT or SIGTERM.
    """
    host, port = address
    try:
        lines = None if script is None else read_script(script)
    except ValueError as err:
        raise usage_error(f"--script {script.name}: {err}") from err
    try:
        writer = PcapWriter(record) if record else None
    except OSError as err:
        raise usage_error(open_failure(err, "--record")) from err
    client = MockClient(host, port, timeout=idle_timeout, record=writer)
    if verbosity > 0:
        client.trace = command_log("tremor mock-client")
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
            raise usage_error(str(err)) from None
        raise problem(f"FAILED: {err}") from None
    except KeyboardInterrupt:
        if client.sock is not None:
            client.sock.close()
        if writer is not None:
            writer.close()  # what was recorded up to here stays readable
        raise CommandError("interrupted", EXIT_INTERRUPTED) from None
    if writer is not None:
        writer.close()
    summary = result.as_dict()
    _print_client(summary, fmt, verbosity)
    if not summary["ok"]:
        sys.exit(1)
