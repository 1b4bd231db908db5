"""``wallaroo-proto ambrosia mock-lb``: play an AMBROSIA language binding for an Immortal Coordinator;
the log helpers both mocks share."""

from __future__ import annotations

import asyncio
import json
import sys

import click
from rich.markup import escape
from wallaroo_proto_cli.ambrosia_view import state_words
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    DEFAULT_HOST,
    EXIT_INTERRUPTED,
    Command,
    CommandError,
    examples,
    plural,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import on_stop_signals
from wallaroo_proto_cli.tables import stdout_console

from wallaroo_proto import runtime
from wallaroo_proto.protocols.ambrosia.lb import IcUnreachable, LbConfig, MockLB

LB = "wallaroo-proto ambrosia mock-lb"
#: Words of a log line said even with -q: a rule broken, a run lost, a rerun's skip, a fault's fate.
_ALWAYS = ("violation", "broke a rule", "resumed", "fault", "lost", "failed", "reset")


def _log(prefix: str, verbosity: int):
    def log(line: str) -> None:
        if verbosity >= 0 or any(word in line for word in _ALWAYS):
            click.echo(f"{prefix}: {line}", err=True)

    return log


def _trace(prefix: str, verbosity: int):
    return (lambda line: click.echo(f"{prefix}: {line}", err=True)) if verbosity > 0 else (lambda line: None)


# --------------------------------------------------------------------------- mock-lb


async def _run_lb(lb: MockLB) -> tuple[dict, bool]:
    run = asyncio.ensure_future(lb.run())
    on_stop_signals(run.cancel)
    try:
        await run
        return lb.summary(), False
    except asyncio.CancelledError:
        return lb.summary(), True


def _lb_connect(opts: dict) -> tuple[str, int, str, int]:
    """The IC's two addresses from --connect/--send-connect, or from the older --host and ports."""
    receive, send = opts.pop("connect"), opts.pop("send_connect")
    old_host, old_r, old_s = opts.pop("host"), opts.pop("receive_port"), opts.pop("send_port")
    if receive is None and old_r is None:
        raise usage_error(
            "give the IC's receive port, --connect HOST:PORT, and its send port, --send-connect HOST:PORT "
            "(mock-ic's ready line ends with both)"
        )
    if send is None and old_s is None:
        raise usage_error(
            "give the IC's send port, --send-connect HOST:PORT (mock-ic's ready line ends with it)"
        )
    host, rport = receive or (old_host or DEFAULT_HOST, old_r)
    send_host, sport = send or (old_host or host, old_s)
    if old_host is not None:
        host = send_host = old_host
    return host, rport if old_r is None else old_r, send_host, sport if old_s is None else old_s


@click.command(
    name="mock-lb",
    cls=Command,
    sections={"The IC": ["connect", "send_connect", "connect_timeout", "write_timeout"]},
    epilog=examples(
        "wallaroo-proto ambrosia mock-lb --connect 127.0.0.1:41234 --send-connect 127.0.0.1:41235",
        "wallaroo-proto ambrosia mock-lb --connect :2000 --send-connect :2001 --ask-checkpoint-every 10 "
        "--format json",
    ),
)
@click.option(
    "--connect",
    type=CONNECT_ADDRESS,
    default=None,
    help="The IC's receive port, HOST:PORT, where the LB sends (the first connection).",
)
@click.option(
    "--send-connect",
    type=CONNECT_ADDRESS,
    default=None,
    help="The IC's send port, HOST:PORT, where the LB reads the log records (the second connection).",
)
@click.option("--host", default=None, hidden=True)
@click.option("--receive-port", type=click.IntRange(1, 65535), default=None, hidden=True)
@click.option("--send-port", type=click.IntRange(1, 65535), default=None, hidden=True)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds to keep trying an IC that is not there yet, then exit 2.",
)
@click.option(
    "--initial-message", default="wallaroo-proto mock-lb", show_default=True, help="First start's data."
)
@click.option(
    "--ask-checkpoint-every", type=click.IntRange(0), default=0, help="Send TakeCheckpoint every N records."
)
@write_timeout_option("both sockets of an IC")
@summary_format
@verbosity(
    quiet="No log lines but rule breaks and a lost socket: errors and the summary.",
    verbose="Also a line per connection made and per checkpoint sent or loaded.",
)
def mock_lb(**opts) -> None:
    """Play an AMBROSIA language binding (a counter immortal) for an IC.

    Connects to the IC's receive port (--connect), then its send port (--send-connect);
    follows first start or recovery, answers checkpoint requests with its state, applies
    RPCs and sends its self calls; ends when the IC closes. Exit 0; 1 if the IC broke a
    rule or reset a socket; 2 if it could not be reached within --connect-timeout; 130 if
    interrupted (after the summary).
    """
    host, rport, send_host, sport = _lb_connect(opts)
    verbosity = opts["verbosity"]
    config = LbConfig(
        host=host,
        receive_port=rport,
        send_port=sport,
        send_host=send_host,
        connect_timeout=opts["connect_timeout"],
        initial_message=opts["initial_message"].encode(),
        ask_checkpoint_every=opts["ask_checkpoint_every"],
        write_timeout=opts["write_timeout"],
        log=_log(LB, verbosity),
        trace=_trace(LB, verbosity),
    )
    lb = MockLB(config)
    runtime.tune_gc()
    try:
        summary, interrupted = asyncio.run(_run_lb(lb))
    except IcUnreachable as err:
        raise CommandError(f"{err}; is the IC up? (--connect-timeout)", 2) from None
    if opts["fmt"] == "json":
        click.echo(json.dumps(summary))
    else:
        out = stdout_console()
        out.print(
            f"ambrosia mock-lb summary: {summary['start']}, {plural(summary['records'], 'record')} "
            f"({summary['replayed']:,} replayed), {plural(summary['rpcs'], 'RPC')}, "
            f"{plural(summary['self_calls'], 'self call')}, "
            f"{plural(summary['checkpoints_sent'], 'checkpoint')} sent, "
            f"{summary['checkpoints_loaded']} loaded; "
            f"state {escape(state_words(summary['state']))}"
        )
        for v in summary["violations"]:
            out.print(f"[bold red]VIOLATION[/] {escape(v)}")
        if summary["lost"]:
            out.print(f"[bold red]LOST[/] {escape(summary['lost'])}")
    if interrupted:
        raise CommandError("interrupted", EXIT_INTERRUPTED)
    if summary["violations"] or summary["lost"]:
        sys.exit(1)
