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
import itertools
import sys
from collections import Counter
from functools import partial

import click
from rich.console import Console
from rich.markup import escape
from wallaroo_proto_cli.dissect_stats import print_summary_findings, summary_console
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
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto.protocols import get_plugin, names
from wallaroo_proto.proxy import faults as fault_rules
from wallaroo_proto.proxy.checker import mib as _mib
from wallaroo_proto.proxy.faultkit import FaultError
from wallaroo_proto.proxy.outlet import Spool, SpoolText, Throttled
from wallaroo_proto.proxy.relay import (
    Budget,
    Relay,
    RelayStats,
    close_for_violation,
    connection_of,
    numbered_summary,
    sent_by_a_peer,
)
from wallaroo_proto.proxy.view import LiveView
from wallaroo_proto.proxy.watch import Watch
from wallaroo_proto.runtime import accept_error_handler

NAME = "wallaroo-proto proxy"
#: Bytes of stderr lines that may wait for a reader; past it lines are dropped and counted.
STDERR_BACKLOG = 1 << 20
#: Seconds the last lines may wait at the end for a stderr nobody reads.
STDERR_WAIT = 2.0
#: Seconds a pair after the first tries again a connect its upstream refused.
SECOND_SOCKET_WAIT = 10.0


def _violation_line(r: dict, conn: int, side: str | None) -> str:
    """One violation as it happens: the client is always the connection's initiator. Bytes that
    are no frame (a Wallaroo frame that cannot be read) have no frame number: their packet's."""
    direction = "client→upstream" if r["direction"].startswith("initiator") else "upstream→client"
    reasons = "; ".join(r["violations"])
    leg = f" ({side} side)" if side else ""
    where = f"frame {r['frame_index']}" if r.get("frame_index") is not None else f"packet {r.get('packet')}"
    return f"{NAME}: connection #{conn}{leg} {direction} {where} {r['type']}: {reasons}"


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
@click.option(
    "--live/--no-live",
    default=None,
    help="Live view on stderr: connections, rates, protocol state  [default: when stderr is a terminal]",
)
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
    live = live if live is not None else sys.stderr.isatty() and verbosity >= 0
    # Without the live view, stderr's lines are written by a thread of their own: a stderr
    # nobody reads costs lines (counted, and said once it is read again), never the relay.
    stderr_spool = None
    if live:
        # The live view's own console: a line printed on it goes above the view and stays there
        # (another console's line lands below it, and the next refresh erases it).
        errors = Console(stderr=True, highlight=False, emoji=False)
    else:
        stderr_spool = Spool(
            sys.stderr.fileno(),
            limit=STDERR_BACKLOG,
            drop_lines=True,
            dropped_line=lambda n: f"{NAME}: {n} line(s) dropped: stderr was not read\n".encode(),
            name="stderr",
        )
        errors = Console(file=SpoolText(stderr_spool), highlight=False, soft_wrap=True, emoji=False)

    def say(line: str) -> None:
        errors.print(escape(f"{NAME}: {line}"))

    relays: list[Relay] = []
    loop_box: list[asyncio.AbstractEventLoop] = []
    violations = Counter[int]()

    def on_violation(r: dict) -> None:
        conn, side = connection_of(r, relays)
        violations[conn] += 1
        if verbosity >= 0:
            line = _violation_line(r, conn, side)
            if r.get("repeats_hidden"):
                line += f" (more {r['type']} this way on #{conn}: counted in the summary, not shown)"
            errors.print(escape(line))
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
        conn, side = connection_of(r, relays)
        leg = f" ({side} side)" if side else ""
        bound = f"--max-buffered {_mib(r['limit'])}"
        if rules:
            bound = f"{_mib(r['limit'])} (twice --max-buffered: each side checked apart)"
        say(
            f"connection #{conn}{leg}: live checks given up: it holds {_mib(r['held'])} of frames not yet "
            f"whole, and all connections together more than {bound}; its traffic goes on"
        )

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
        )
    except OSError as err:
        raise usage_error(f"--record {record}: {os_reason(err)}") from err
    numbers, stats = itertools.count(1), RelayStats()
    budget = Budget(max_buffered << 20) if rules else None  # without rules bytes pass as they come
    tap = view.wrap(watch) if live else watch  # the view counts each connection's bytes
    for n, (here, there) in enumerate(zip(listen, upstream, strict=True)):
        shaper = partial(fault_rules.ConnectionFaults, rules, protocol, there[1]) if rules else None
        # A second socket's upstream (AMBROSIA's IC send port) listens once the first is accepted.
        wait = SECOND_SOCKET_WAIT if n else 0.0
        relays.append(
            Relay(
                *(here, there, tap),
                faults=shaper,
                on_fault=on_fault,
                numbers=numbers,
                stats=stats,
                wait_for_upstream=wait,
                say=say,
                budget=budget,
            )
        )
    try:
        with view.shown(errors) if live else contextlib.nullcontext():
            asyncio.run(_serve(relays, loop_box.append, say))
    finally:
        watch.close()
    if watch.error is not None:
        errors.print(f"[bold red]{NAME}:[/] live checks incomplete: {escape(watch.error)}")
    out = summary_console(Console(file=sys.stdout, highlight=False, soft_wrap=False))
    if summary:
        numbered = [numbered_summary(s, relays) for s in watch.summaries]
        if numbered:  # as dissect --summary of the recording: the findings first
            print_summary_findings(
                out, numbered, record if record not in (None, "-") else "the proxy's connections"
            )
        for s in numbered:
            get_plugin(s.get("protocol", "wallaroo")).print_summary(out, s)
        for rule in rules:
            missed = f", not applied {rule.not_applied}" if rule.not_applied else ""
            out.print(escape(f"fault {rule.text}: matched {rule.seen}, applied {rule.fired}{missed}"))
    if verbosity > 0:
        errors.print(
            f"{NAME}: {stats.accepted} connection(s) relayed, {stats.bytes[True]} bytes client→upstream, "
            f"{stats.bytes[False]} bytes upstream→client"
            + (f", {stats.refused_upstream} refused by the upstream" if stats.refused_upstream else "")
        )
    if stderr_spool is not None:
        stderr_spool.close(STDERR_WAIT)
    if watch.error is not None or watch.recording_stopped is not None or (strict and violations):
        raise SystemExit(1)
