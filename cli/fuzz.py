"""``wallaroo-proto fuzz``: stateful fuzzing of a live peer, the protocol's core as oracle (thin CLI).

The work lives in ``wallaroo_proto.fuzz``. Exit codes: 0 no findings; 1 findings (each
written as a capture under ``--findings``); 2 bad usage or setup (nobody listening, no
client came, a seed without the conversation); 3 the peer answered the same conversation
differently each time, too non-deterministic to trust; 130 interrupted.
"""

from __future__ import annotations

import re
import sys

import click
from rich.console import Console
from rich.table import Table
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    LISTEN_ADDRESS,
    Command,
    examples,
    format_address,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.replay import compiled_filter, picked, selection_options
from wallaroo_proto_cli.serving import json_summary, ready

from wallaroo_proto.fuzz import engine
from wallaroo_proto.fuzz.peer import PeerError
from wallaroo_proto.replay.links import LinkError

NAME = "wallaroo-proto fuzz"


def parse_budget(text: str) -> tuple[float | None, int | None]:
    """``--budget``: a time (``90s``, ``5m``, ``1h``) or a number of executions (``500``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise usage_error(f"--budget {text!r}: give a time (90s, 5m, 1h) or a number of executions (500)")
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        if not number.is_integer():
            raise usage_error(f"--budget {text!r}: a number of executions is whole")
        return None, int(number)
    return number * {"s": 1, "m": 60, "h": 3600}[unit], None


@click.command(
    name="fuzz",
    cls=Command,
    sections={
        "Seeds": ["seeds", "captures", "connections", "display_filter", "protocol", "ports", "max_frames"],
        "The live peer": ["play", "connect", "listen", "spawn", "reset_cmd", "max_rss"],
        "How": ["budget", "seed", "answer_timeout", "confirm", "shrink_time", "rerun"],
        "Output": ["findings", "states", "fmt", "quiet", "verbose"],
    },
    epilog=examples(
        "wallaroo-proto fuzz --seeds source-session.pcap --play connector --connect 127.0.0.1:7100",
        "wallaroo-proto fuzz --seeds worker.pcap --play worker --listen :0 --spawn 'connector.py {port}'",
        "wallaroo-proto fuzz --rerun fuzz-findings/wallaroo-001-silent.pcapng --play worker --listen :0",
    ),
)
@click.argument("captures", nargs=-1, type=click.Path(dir_okay=False))
@click.option(
    "--seeds",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="CAPTURE",
    help="A capture whose conversation is a seed (repeat; captures after the options are seeds too).",
)
@click.option("--play", required=True, metavar="SIDE", help="The side fuzz plays, as replay's --play.")
@click.option(
    "--connect", type=CONNECT_ADDRESS, multiple=True, help="The live peer to connect to (a server)."
)
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    multiple=True,
    help="Where the live peer connects (a client); port 0 binds a free one (the ready line names it).",
)
@click.option(
    "--spawn",
    metavar="CMD",
    help="Start the peer: with --listen, a client started for each case ({port} in CMD is the "
    "port, {port2} the second --listen's); with --connect, a server, started again when it "
    "exits; alone, over its stdin and stdout.",
)
@click.option("--reset-cmd", metavar="CMD", help="Run between cases (restart a peer, wipe its state).")
@click.option(
    "--max-rss",
    type=click.FloatRange(0, min_open=True),
    metavar="MIB",
    help="With --spawn: a peer process whose memory grows beyond this is a finding.",
)
@selection_options
@click.option(
    "--max-frames",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    metavar="N",
    help="The frames of each seed played (its first N).",
)
@click.option(
    "--budget", default="60s", show_default=True, metavar="TIME|N", help="How long: 90s, 5m, or executions."
)
@click.option(
    "--stop-after",
    type=click.IntRange(1),
    metavar="N",
    help="End the campaign once N findings are written, as libFuzzer ends at its first "
    "[default: the whole budget].",
)
@click.option(
    "--seed", "rng_seed", type=int, default=0, show_default=True, metavar="S", help="The random seed."
)
@click.option(
    "--answer-timeout",
    type=click.FloatRange(0, min_open=True),
    default=0.5,
    show_default=True,
    metavar="SECONDS",
    help="How long each answer is waited for; a peer silent for longer stopped answering.",
)
@click.option(
    "--confirm",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    metavar="K",
    help="Play each finding K times; found fewer times, it is labelled non-deterministic.",
)
@click.option(
    "--shrink-time",
    type=click.FloatRange(0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long each finding is shrunk for.",
)
@click.option(
    "--rerun",
    type=click.Path(dir_okay=False),
    metavar="FINDING",
    help="Play a finding's capture once, as recorded, and say what it finds now.",
)
@click.option(
    "--findings",
    default="fuzz-findings",
    show_default=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Where each finding's reproducer capture is written.",
)
@click.option(
    "--states", type=click.Path(dir_okay=False), metavar="FILE.dot", help="Write the state graph seen."
)
@summary_format
@verbosity(quiet="The summary only.", verbose="A line per finding as it is found.")
def command(
    captures,
    seeds,
    play,
    connect,
    listen,
    spawn,
    reset_cmd,
    max_rss,
    connections,
    display_filter,
    protocol,
    ports,
    max_frames,
    budget,
    stop_after,
    rng_seed,
    answer_timeout,
    confirm,
    shrink_time,
    rerun,
    findings,
    states,
    fmt,
    verbosity,
) -> None:
    """Play mutants of recorded conversations against a live peer: field values at their
    boundaries, frames out of state, sequence edits; the protocol's core judges every frame, and a
    peer that breaks a rule, accepts an illegal frame, refuses without its error reply, stops
    answering or crashes is a finding, shrunk to a capture that replay plays and dissect reads."""
    if not connect and not listen and not spawn:
        raise usage_error("give the live peer: --connect HOST:PORT, --listen HOST:PORT or --spawn CMD")
    seconds, runs = parse_budget(budget)
    paths = [rerun] if rerun else [*seeds, *captures]
    if not paths:
        raise usage_error("give the seeds: --seeds CAPTURE (repeat), or --rerun FINDING")
    matches = compiled_filter(display_filter)
    loaded = []
    for path in paths:
        conversation = picked(path, connections, matches, protocol, ports)
        loaded.append(engine.load_seed(conversation, path, max_frames))
    try:
        side = loaded[0].conversation.side_named(play)
    except ValueError as err:
        raise usage_error(f"--play: {err}") from None
    settings = engine.Settings(
        side=side,
        connect=list(connect),
        listen=list(listen),
        spawn=spawn,
        reset_cmd=reset_cmd,
        answer_timeout=answer_timeout,
        confirm=confirm,
        budget_seconds=seconds,
        budget_runs=runs,
        stop_after=stop_after,
        seed=rng_seed,
        max_rss=max_rss,
        shrink_seconds=shrink_time,
        findings_dir=findings,
        states=states,
    )
    if rerun:
        _rerun(loaded[0], settings, fmt)
    progress = _progress() if verbosity >= 0 and fmt == "text" and sys.stderr.isatty() else None
    try:
        campaign = engine.Campaign(loaded, settings, progress)
        for port in campaign.ports:
            ready(f"{NAME}: listening on {format_address(('127.0.0.1', port))}")
        summary = campaign.run()
    except (engine.FuzzError, PeerError, LinkError) as err:
        raise usage_error(str(err)) from None
    _print(summary, fmt, verbosity)
    if len(summary.unsteady) == len(loaded):
        raise SystemExit(3)
    raise SystemExit(1 if summary.found else 0)


def _rerun(seed: engine.Seed, settings: engine.Settings, fmt: str) -> None:
    try:
        found, summary = engine.rerun(seed, settings)
    except (engine.FuzzError, PeerError, LinkError) as err:
        raise usage_error(str(err)) from None
    shown = {"protocol": summary.protocol, "played": summary.side, "findings": [f.as_dict() for f in found]}
    if not json_summary(shown, fmt):
        if not found:
            click.echo(f"{NAME}: {seed.name} finds nothing now")
        for finding in found:
            click.echo(f"{finding.kind}: {finding.detail} (after {finding.state})")
    raise SystemExit(1 if found else 0)


def _progress():
    console = Console(stderr=True)

    def show(summary: engine.Summary) -> None:
        console.print(
            f"{summary.executions} executions, {summary.rate:.1f}/s, {summary.states} states, "
            f"{len(summary.found)} findings",
            end="\r",
            highlight=False,
        )

    return show


def _print(summary: engine.Summary, fmt: str, verbosity: int) -> None:
    if json_summary(summary.as_dict(), fmt):
        return
    console = Console()
    console.print(
        f"fuzz of the {summary.protocol} {summary.side}: {summary.executions} executions in "
        f"{summary.seconds:.1f} s ({summary.rate:.1f}/s), {summary.states} states, "
        f"{len(summary.found)} findings",
        highlight=False,
    )
    for name in summary.unsteady:
        console.print(
            f"[yellow]seed {name}: the peer answered it differently in two plays[/]", highlight=False
        )
    for note in summary.notes:
        console.print(f"[yellow]{note}[/]", highlight=False)
    if summary.unconfirmed:
        console.print(
            f"{summary.unconfirmed} findings seen once and not again in --confirm plays", highlight=False
        )
    if not summary.found:
        return
    table = Table("kind", "after", "mutation", "reaction", "confirmed", "reproducer")
    for found in summary.found:
        f = found.finding
        confirmed = f"{found.confirmed}/{found.tries}" + (
            "" if found.deterministic else " (non-deterministic)"
        )
        table.add_row(
            f.kind, f.state, found.label, f.detail, confirmed, f"{found.capture} ({found.frames} frames)"
        )
    console.print(table)
