"""``wallaroo-proto ambrosia``: the AMBROSIA IC <-> language binding protocol's mock peers.

``mock-ic`` plays the Immortal Coordinator for a language binding under test;
``mock-lb`` plays a language binding (a counter immortal) for an IC being
written. Options in, ``wallaroo_proto.protocols.ambrosia`` does the work; the
summary goes to stdout (``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys

import click
from rich.console import Console
from wallaroo_proto_cli.options import EXIT_INTERRUPTED, summary_format, usage_error, write_timeout_option

from wallaroo_proto.protocols.ambrosia.ic import DIALECTS, IcConfig, MockIC
from wallaroo_proto.protocols.ambrosia.immortal import ADD, ARG_FORMS, BATCHING, RpcSource
from wallaroo_proto.protocols.ambrosia.lb import LbConfig, MockLB
from wallaroo_proto.protocols.ambrosia.store import StoreError


def _log(prefix: str):
    def log(line: str) -> None:
        click.echo(f"{prefix}: {line}", err=True)

    return log


def _tune_gc() -> None:
    """Records and messages build no cycles: keep the cyclic collector off the per-RPC path."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def _console() -> Console:
    return Console(
        file=sys.stdout, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200
    )


@click.group(name="ambrosia")
def command() -> None:
    """AMBROSIA IC <-> language binding protocol: mock Immortal Coordinator and mock language binding."""


# --------------------------------------------------------------------------- mock-ic


def _read_lines(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read().splitlines()
    except OSError as err:
        raise usage_error(f"cannot read --input {path}: {err.strerror or err}") from err


async def _serve_ic(ic: MockIC) -> tuple[dict, bool]:
    try:
        host, rport, sport = ic.bind()
    except OSError as err:
        raise usage_error(f"cannot listen on {ic.config.host}: {err.strerror or err}") from err
    loop = asyncio.get_running_loop()
    if ic.config.source.streaming:
        ic.stream_input(sys.stdin.buffer)
    serve = asyncio.ensure_future(ic.serve())
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            ic.config.log("stopping")
            ic.stop()
        serve.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    click.echo(
        f"wallaroo-proto ambrosia mock-ic: listening on {host}:{rport} "
        f"(receive port {rport}, send port {sport})"
    )
    sys.stdout.flush()
    try:
        await serve
        return ic.summary(), False
    except asyncio.CancelledError:
        return ic.summary(), True
    finally:
        ic.close()


def _print_ic_summary(s: dict, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(s))
        return
    out = _console()
    out.print(
        f"ambrosia mock-ic summary: {s['rpcs_logged']:,} RPCs logged and delivered since it started "
        f"({s['rpcs_before']:,} were in the log then; {s['rpcs_total']:,} in all), "
        f"{s['self_calls_logged']:,} self calls logged ({s['self_calls_dropped']:,} replayed ones dropped), "
        f"{s['records_sent']:,} records sent ({s['records_replayed']:,} replayed), "
        f"{s['checkpoints']} checkpoints; "
        f"{s['runs']} runs: {s['first_starts']} first start, {s['recoveries']} recoveries; "
        f"{s['rpcs_per_second']:,} RPCs/s"
    )
    last = s["last_checkpoint"]
    if last is not None:
        out.print(
            f"last checkpoint: before record {last['seq']}, {last['bytes']} bytes, state {last['state']}"
        )
    if s["stalls"]:
        out.print(f"{s['stalls']} LB connections reset for reading nothing (--write-timeout)")
    for v in s["violations"]:
        out.print(f"[bold red]VIOLATION[/] {v}")


@command.command(name="mock-ic")
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback address to listen on.")
@click.option(
    "--receive-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Where the LB sends its messages (0: free).",
)
@click.option(
    "--send-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Where the LB reads the log records (0: free).",
)
@click.option(
    "--rpcs",
    type=click.IntRange(0),
    default=1000,
    show_default=True,
    help="Generated RPCs the log holds in all: a restart on the same --log-dir delivers only the rest.",
)
@click.option(
    "--input",
    "input_path",
    default=None,
    help="RPC arguments, one RPC per line, sent as they are (-: stdin, delivered as lines come).",
)
@click.option(
    "--args",
    "arg_form",
    type=click.Choice(ARG_FORMS),
    default="json",
    show_default=True,
    help='Generated arguments: json {"value":N}, read alike by every binding, or raw N.',
)
@click.option(
    "--batches",
    type=click.Choice(BATCHING),
    default="mixed",
    show_default=True,
    help="Input RPCs in records: mixed as a busy IC logs them (plain, RPCBatch, CountReplayableRPCBatch), "
    "none, or all (one RPCBatch a record).",
)
@click.option(
    "--method-id", type=int, default=ADD, show_default=True, help="Method id of the delivered RPCs."
)
@click.option("--batch", type=click.IntRange(1), default=100, show_default=True, help="RPCs per log record.")
@click.option(
    "--checkpoint-every",
    type=click.IntRange(0),
    default=0,
    help="Ask for a checkpoint every N records (0: at end).",
)
@click.option(
    "--log-dir", default=None, help="Durable log and checkpoints (fsync); a restart recovers from it."
)
@click.option("--no-fsync", is_flag=True, help="Log and checkpoints without fsync (benchmarks only).")
@click.option("--committer", type=int, default=None, help="Committer id for a first start (default: random).")
@click.option("--bad-check-at", type=int, default=None, help="Fault: send record N with wrong check bytes.")
@click.option("--gap-at", type=int, default=None, help="Fault: skip sequence id N.")
@click.option(
    "--crash-at", type=int, default=None, help="Fault: kill -9 itself right after logging record N."
)
@click.option("--upgrade", is_flag=True, help="Recover with UpgradeTakeCheckpoint (a live upgrade).")
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default="current",
    show_default=True,
    help="current: an upgrade's checkpoint is followed by TakeCheckpoint; seed: it is not.",
)
@click.option("--keep-open", is_flag=True, hidden=True, expose_value=False)  # the default now: taken, unused
@click.option(
    "--exit-when-done",
    is_flag=True,
    help="Close both sockets and exit once every RPC and the last checkpoint are in "
    "(a real IC stays up; so does mock-ic without it).",
)
@write_timeout_option("an LB")
@click.option("--record", default=None, help="Write both sockets' traffic to this pcap.")
@summary_format
def mock_ic(**opts) -> None:
    """Play the AMBROSIA Immortal Coordinator for a language binding.

    Listens on the receive port, then (once an LB connected there) on the send
    port; runs a first start, or a recovery from --log-dir; delivers the RPCs
    in log records, asks for checkpoints and stores them; stays up until
    stopped (--exit-when-done: ends once every RPC and the last checkpoint
    are in). An LB that breaks a rule ends it (both
    sockets closed, as the real IC's OnError does). Exit 0, 1 if the LB broke a
    rule, 130 if interrupted.
    """
    method, batching = opts["method_id"], opts["batches"]
    if opts["input_path"] == "-":
        source = RpcSource.streamed(method_id=method, batching=batching)
    elif opts["input_path"] is not None:
        source = RpcSource(lines=_read_lines(opts["input_path"]), method_id=method, batching=batching)
    else:
        source = RpcSource(opts["rpcs"], method_id=method, arg_form=opts["arg_form"], batching=batching)
    config = IcConfig(
        source=source,
        host=opts["host"],
        receive_port=opts["receive_port"],
        send_port=opts["send_port"],
        log_dir=opts["log_dir"],
        fsync=not opts["no_fsync"],
        batch=opts["batch"],
        checkpoint_every=opts["checkpoint_every"],
        committer=opts["committer"],
        bad_check_at=opts["bad_check_at"],
        gap_at=opts["gap_at"],
        crash_at=opts["crash_at"],
        upgrade=opts["upgrade"],
        dialect=opts["dialect"],
        exit_when_done=opts["exit_when_done"],
        write_timeout=opts["write_timeout"],
        record=opts["record"],
        log=_log("ambrosia mock-ic"),
    )
    try:
        ic = MockIC(config)
    except OSError as err:
        raise usage_error(f"cannot open {err.filename}: {err.strerror or err}") from err
    except StoreError as err:
        raise usage_error(str(err)) from None
    _tune_gc()
    summary, interrupted = asyncio.run(_serve_ic(ic))
    _print_ic_summary(summary, opts["fmt"])
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if summary["violations"]:
        sys.exit(1)


# --------------------------------------------------------------------------- mock-lb


async def _run_lb(lb: MockLB) -> tuple[dict, bool]:
    loop = asyncio.get_running_loop()
    run = asyncio.ensure_future(lb.run())
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.cancel)
    try:
        await run
        return lb.summary(), False
    except asyncio.CancelledError:
        return lb.summary(), True


@command.command(name="mock-lb")
@click.option("--host", default="127.0.0.1", show_default=True, help="The IC's address.")
@click.option("--receive-port", type=click.IntRange(1, 65535), required=True, help="The IC's receive port.")
@click.option("--send-port", type=click.IntRange(1, 65535), required=True, help="The IC's send port.")
@click.option(
    "--connect-timeout", type=float, default=30.0, show_default=True, help="Seconds to keep trying."
)
@click.option(
    "--initial-message", default="wallaroo-proto mock-lb", show_default=True, help="First start's data."
)
@click.option(
    "--ask-checkpoint-every", type=click.IntRange(0), default=0, help="Send TakeCheckpoint every N records."
)
@write_timeout_option("both sockets of an IC")
@summary_format
def mock_lb(**opts) -> None:
    """Play an AMBROSIA language binding (a counter immortal) for an IC.

    Connects to the IC's receive port, then its send port; follows first
    start or recovery, answers checkpoint requests with its state, applies
    RPCs and sends its self calls; ends when the IC closes. Exit 0, 1 if the
    IC broke a rule, could not be reached or reset a socket, 130 if interrupted.
    """
    config = LbConfig(
        host=opts["host"],
        receive_port=opts["receive_port"],
        send_port=opts["send_port"],
        connect_timeout=opts["connect_timeout"],
        initial_message=opts["initial_message"].encode(),
        ask_checkpoint_every=opts["ask_checkpoint_every"],
        write_timeout=opts["write_timeout"],
        log=_log("ambrosia mock-lb"),
    )
    lb = MockLB(config)
    _tune_gc()
    try:
        summary, interrupted = asyncio.run(_run_lb(lb))
    except OSError as err:
        click.echo(f"ambrosia mock-lb: cannot reach the IC: {err.strerror or err}", err=True)
        sys.exit(1)
    if opts["fmt"] == "json":
        click.echo(json.dumps(summary))
    else:
        out = _console()
        out.print(
            f"ambrosia mock-lb summary: {summary['start']}, {summary['records']:,} records "
            f"({summary['replayed']:,} replayed), {summary['rpcs']:,} RPCs, "
            f"{summary['self_calls']:,} self calls, "
            f"{summary['checkpoints_sent']} checkpoints sent, {summary['checkpoints_loaded']} loaded; "
            f"state {summary['state']}"
        )
        for v in summary["violations"]:
            out.print(f"[bold red]VIOLATION[/] {v}")
        if summary["lost"]:
            out.print(f"[bold red]LOST[/] {summary['lost']}")
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if summary["violations"] or summary["lost"]:
        sys.exit(1)
