"""``wallaroo-proto proxy``: stand between two real peers, forward, record and check live.

Thin: ``wallaroo_proto.proxy.relay`` forwards (and finds, or under ``--strict`` ends, a
violation's connection), ``wallaroo_proto.proxy.faults`` applies fault rules,
``wallaroo_proto.proxy.watch`` records and checks; this module parses options and prints.
Exit codes: 0 stopped cleanly (SIGINT/SIGTERM), 1 the live checks stopped short or
``--strict`` found a violation, 2 bad usage or a port that cannot be bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import click
from rich.markup import escape
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    LISTEN_ADDRESS,
    Command,
    examples,
    format_address,
    live_option,
    os_reason,
    record_option,
    shows_live,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.proxy_view import (
    given_up_line,
    print_summary,
    relay_counts,
    stderr_console,
    violation_line,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto.protocols import names
from wallaroo_proto.proxy import faults as fault_rules
from wallaroo_proto.proxy.faultkit import FaultError
from wallaroo_proto.proxy.outlet import Throttled
from wallaroo_proto.proxy.relay import (
    Relay,
    close_for_violation,
    connection_of,
    proxy_relays,
    sent_by_a_peer,
)
from wallaroo_proto.proxy.view import LiveView
from wallaroo_proto.proxy.watch import Watch
from wallaroo_proto.runtime import accept_error_handler

NAME = "wallaroo-proto proxy"
#: Seconds the last lines may wait at the end for a stderr nobody reads.
STDERR_WAIT = 2.0


async def _serve(relays: list[Relay], loop_ready, say) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(accept_error_handler(Throttled(say)))
    stop = on_stop_signals()
    bound = []
    try:
        for relay in relays:
            try:
                host, port = await relay.start()
            except OSError as err:
                raise usage_error(
                    f"cannot listen on {format_address(relay.listen)}: {os_reason(err)}"
                ) from err
            bound.append(
                f"listening on {format_address((host, port))}, forwarding to {format_address(relay.upstream)}"
            )
        loop_ready(loop)
        ready(f"{NAME}: " + "; ".join(bound))
        await stop.wait()
    finally:
        for relay in relays:
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
    multiple=True,
    help="Address the client connects to (port 0: a free one). Again, with a second --upstream, "
    "for a protocol of two sockets (AMBROSIA: the IC's receive and send ports, in that order).",
)
@click.option(
    "--upstream",
    type=CONNECT_ADDRESS,
    required=True,
    multiple=True,
    help="The real peer's address; the n-th --upstream serves the n-th --listen.",
)
@click.option(
    "--protocol",
    type=click.Choice(names()),
    default=None,
    help="Read the conversation as this protocol [default: detected as dissect does it].",
)
@click.option(
    "--fault",
    "fault_options",
    multiple=True,
    metavar="'ACTION key=value ...'",
    help="A fault rule (docs/proxy-faults.md), e.g. 'drop type=ACK count=1'; repeatable, "
    "applied after --faults' rules.",
)
@click.option(
    "--faults",
    "fault_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="RULES.toml",
    help="A file of [[fault]] rules; repeatable.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Close a connection at its first violation, the sender told with the protocol's own "
    "error where it has one; exit 1 if any was found.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(0, min_open=True),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the live checker or a --record reader may take nothing while the relay waits "
    "for it, before it is given up with one line (the traffic goes on); the checker runs niced, "
    "so give a loaded machine more.",
)
@click.option(
    "--max-buffered",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    metavar="MIB",
    help="What all connections together may hold of frames not yet whole, in MiB, in the relay "
    "(with fault rules: past it, the connection asking for more is reset with one line) and in "
    "the live checker (past it, that connection is no longer checked, with one line); the "
    "others go on.",
)
@record_option(
    "Record what passes into this pcap file (with faults: pcapng, each side its own connection, "
    "each fault a comment on its frame)"
)
@click.option("--summary/--no-summary", default=True, show_default=True, help="dissect's summary at the end.")
@live_option(": connections, rates, protocol state")
@verbosity(
    quiet="No live view and no line per violation on stderr: errors and the summary.",
    verbose="Also the relay's counts at the end: connections, bytes each way.",
)
def command(
    listen,
    upstream,
    protocol,
    fault_options,
    fault_files,
    strict,
    stall_timeout,
    max_buffered,
    record,
    summary,
    live,
    verbosity,
) -> None:
    """Forward TCP connections from --listen to --upstream unchanged, both ways, and check them live.

    Every frame of both directions goes through the protocol's own rules, as
    `dissect` reads a capture: a violation is printed as it happens (stderr), and
    on SIGINT or SIGTERM the proxy stops and prints `dissect --summary`'s summary.
    """
    if len(listen) != len(upstream):
        raise usage_error(f"{len(listen)} --listen but {len(upstream)} --upstream: give them in pairs")
    try:
        rules = fault_rules.parse_rules(fault_options, fault_files, protocol)
    except FaultError as err:
        raise usage_error(f"fault rules: {err}") from err
    live = shows_live(live, verbosity)
    errors, stderr_spool = stderr_console(live)

    def say(line: str) -> None:
        errors.print(escape(f"{NAME}: {line}"))

    relays: list[Relay] = []
    loop_box: list[asyncio.AbstractEventLoop] = []
    violations = Counter[int]()

    def on_violation(r: dict) -> None:
        conn, side = connection_of(r, relays)
        violations[conn] += 1
        if verbosity >= 0:
            errors.print(escape(violation_line(r, conn, side)))
        if strict and conn not in struck and sent_by_a_peer(r, side) and loop_box:
            struck.add(conn)
            loop_box[0].call_soon_threadsafe(close_for_violation, relays, r)

    struck: set[int] = set()

    view = LiveView("forwarding to " + ", ".join(format_address(a) for a in upstream))

    def on_fault(conn: int, step: fault_rules.Applied) -> None:
        view.fault(conn, step.frame.from_client, step.rule.action)
        if verbosity >= 0:
            errors.print(escape(f"{NAME}: connection #{conn} {fault_rules.describe(step)}"))

    # With fault rules each side of a connection is checked as one of its own, both holding its frame.
    max_held = (max_buffered << 20) * (2 if rules else 1)

    def on_given_up(r: dict) -> None:
        say(given_up_line(r, *connection_of(r, relays), faults=bool(rules)))

    ports = [address[1] for address in upstream]
    try:
        watch = Watch(
            record=record,
            protocol=protocol,
            ports=ports,
            on_violation=on_violation,
            notes=bool(rules),
            on_state=view.state if live else None,
            say=say,
            max_held=max_held,
            on_given_up=on_given_up,
            stall_seconds=stall_timeout,
        )
    except OSError as err:
        raise usage_error(f"--record {record}: {os_reason(err)}") from err
    tap = view.wrap(watch) if live else watch  # the view counts each connection's bytes
    relays += proxy_relays(
        zip(listen, upstream, strict=True),
        tap,
        rules=rules,
        protocol=protocol,
        max_buffered=max_buffered << 20,
        on_fault=on_fault,
        say=say,
    )
    stats = relays[0].stats
    try:
        with view.shown(errors) if live else contextlib.nullcontext():
            asyncio.run(_serve(relays, loop_box.append, say))
    finally:
        watch.close()
    if watch.error is not None:
        errors.print(f"[bold red]{NAME}:[/] live checks incomplete: {escape(watch.error)}")
    if summary:
        print_summary(watch.summaries, relays, record, rules)
    if verbosity > 0:
        errors.print(relay_counts(stats))
    if stderr_spool is not None:
        stderr_spool.close(STDERR_WAIT)
    if watch.error is not None or watch.recording_stopped is not None or (strict and violations):
        raise SystemExit(1)
