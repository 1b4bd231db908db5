"""``wallaroo-proto tremor mock-client``: play a Tremor client against a node, scripted or generated."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    Command,
    CommandError,
    command_log,
    examples,
    hidden_alias,
    open_failure,
    plural,
    problem,
    record_option,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import json_summary
from wallaroo_proto_cli.tables import stdout_console

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.tremor.peers import (
    DEFAULT_PORT,
    ClientError,
    MockClient,
    generated_exchange,
    read_script,
    scripted_exchange,
)

# --------------------------------------------------------------------------- mock-client


def _print_client(result: dict, fmt: str, verbosity: int) -> None:
    if json_summary(result, fmt):
        return
    out = stdout_console()
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


@click.command(
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
