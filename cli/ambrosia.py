"""``wallaroo-proto ambrosia``: the AMBROSIA IC <-> language binding protocol's mock peers.

``mock-ic`` plays the Immortal Coordinator for a language binding under test;
``mock-lb`` plays a language binding (a counter immortal) for an IC being
written. Options in, ``wallaroo_proto.protocols.ambrosia`` does the work; the
summary goes to stdout (``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio
import errno
import sys

import click
from wallaroo_proto_cli.ambrosia_lb import _log, _trace, mock_lb
from wallaroo_proto_cli.ambrosia_view import IC, print_ic_summary, ready_line
from wallaroo_proto_cli.options import (
    DEFAULT_HOST,
    EXIT_INTERRUPTED,
    LISTEN_ADDRESS,
    Command,
    Group,
    examples,
    input_lines,
    input_option,
    open_failure,
    os_reason,
    record_option,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.input_spec import STDIN
from wallaroo_proto.protocols.ambrosia.ic import DIALECTS, IcConfig, ListenError, MockIC
from wallaroo_proto.protocols.ambrosia.immortal import ADD, ARG_FORMS, BATCHING, RpcSource
from wallaroo_proto.protocols.ambrosia.store import StoreError


@click.group(
    name="ambrosia",
    cls=Group,
    epilog=examples(
        "wallaroo-proto ambrosia mock-ic --rpcs 1000 --log-dir ic-log",
        "wallaroo-proto ambrosia mock-lb --connect 127.0.0.1:41234 --send-connect 127.0.0.1:41235",
    ),
)
def command() -> None:
    """AMBROSIA IC <-> language binding protocol: mock Immortal Coordinator and mock language binding.

    mock-ic's ready line ends with the two options that point mock-lb at it.
    """


# --------------------------------------------------------------------------- mock-ic


async def _serve_ic(ic: MockIC) -> tuple[dict, bool]:
    try:
        host, rport, sport = ic.bind()
    except ListenError as err:
        raise usage_error(f"cannot listen on {err.address} ({err.which}): {os_reason(err)}") from None
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

    on_stop_signals(on_signal)
    ready(ready_line(host, rport, ic.send_host, sport))
    try:
        await serve
        return ic.summary(), False
    except asyncio.CancelledError:
        return ic.summary(), True
    finally:
        ic.close()


def _ic_listen(opts: dict) -> tuple[str, int, str, int]:
    """The two listening addresses from --listen/--send-listen, or from the older --host and ports."""
    host, rport = opts.pop("listen") or (DEFAULT_HOST, 0)
    send = opts.pop("send_listen")
    old_host, old_r, old_s = opts.pop("host"), opts.pop("receive_port"), opts.pop("send_port")
    host = old_host if old_host is not None else host
    rport = old_r if old_r is not None else rport
    send_host, sport = send or (host, 0)
    return host, rport, send_host, old_s if old_s is not None else sport


@command.command(
    name="mock-ic",
    cls=Command,
    sections={
        "Addresses": ["listen", "send_listen"],
        "What to deliver": [
            "rpcs",
            "input_path",
            "arg_form",
            "batches",
            "method_id",
            "batch",
            "checkpoint_every",
            "exit_when_done",
        ],
        "The log": ["log_dir", "no_fsync", "committer", "upgrade", "dialect"],
        "Faults (N is a record's sequence id)": ["bad_check_at", "gap_at", "crash_at"],
    },
    epilog=examples(
        "wallaroo-proto ambrosia mock-ic --rpcs 10000 --checkpoint-every 20 --log-dir ic-log",
        "wallaroo-proto ambrosia mock-ic --listen 127.0.0.1:2000 --send-listen 127.0.0.1:2001",
        "printf '{\"value\":5}\\n' | wallaroo-proto ambrosia mock-ic --input - --exit-when-done",
        "wallaroo-proto ambrosia mock-ic --log-dir faults-log --bad-check-at 3 --gap-at 5 --crash-at 8",
    ),
)
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    default=None,
    help=f"The receive port, where the LB sends its messages [default: {DEFAULT_HOST}:0, a free port].",
)
@click.option(
    "--send-listen",
    type=LISTEN_ADDRESS,
    default=None,
    help="The send port, where the LB reads the log records [default: --listen's host, a free port].",
)
@click.option("--host", default=None, hidden=True)
@click.option("--receive-port", type=click.IntRange(0, 65535), default=None, hidden=True)
@click.option("--send-port", type=click.IntRange(0, 65535), default=None, hidden=True)
@click.option(
    "--rpcs",
    type=click.IntRange(0),
    default=1000,
    show_default=True,
    help="Generated RPCs the log holds in all: a restart on the same --log-dir delivers only the rest.",
)
@input_option("RPC arguments, one RPC per line, sent as they are (-: stdin, delivered as lines come).")
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
    help="Ask for a checkpoint every N records (0: once all is in).",
)
@click.option(
    "--log-dir",
    default=None,
    metavar="DIR",
    help="A folder for the durable log and checkpoints (fsync); a restart on it recovers and delivers "
    "only what the log does not hold.",
)
@click.option("--no-fsync", is_flag=True, help="Log and checkpoints without fsync (benchmarks only).")
@click.option("--committer", type=int, default=None, help="Committer id for a first start (default: random).")
@click.option(
    "--bad-check-at",
    type=int,
    default=None,
    metavar="N",
    help="Send record N with wrong check bytes (the log keeps them right).",
)
@click.option("--gap-at", type=int, default=None, metavar="N", help="Skip sequence id N.")
@click.option(
    "--crash-at", type=int, default=None, metavar="N", help="kill -9 itself right after logging record N."
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
@click.option(
    "--pair-timeout",
    type=click.FloatRange(0),
    default=5.0,
    show_default=True,
    help="Close a receive-port connection whose LB does not connect to the send port within "
    "this many seconds (0: never), so a stray client cannot hold the IC.",
)
@record_option("Write both sockets' traffic to this pcap")
@summary_format
@verbosity(
    quiet="No log lines but rule breaks, faults and what a restart skipped: errors and the summary.",
    verbose="Also a line per LB connection and per checkpoint stored.",
)
def mock_ic(**opts) -> None:
    """Play the AMBROSIA Immortal Coordinator for a language binding.

    Listens on the receive port (--listen), then, once an LB connected there, on the send
    port (--send-listen); runs a first start, or a recovery from --log-dir; delivers the
    RPCs in log records, asks for checkpoints and stores them; stays up until stopped
    (--exit-when-done: ends once every RPC and the last checkpoint are in). An LB that
    breaks a rule ends it (both sockets closed, as the real IC's OnError does). A fault
    whose record the log already holds is refused. Exit 0 (stopped by SIGINT or SIGTERM
    too), 1 if the LB broke a rule, 2 on bad usage, 130 if interrupted before
    --exit-when-done's end.
    """
    host, rport, send_host, sport = _ic_listen(opts)
    verbosity = opts["verbosity"]
    method, batching = opts["method_id"], opts["batches"]
    if opts["input_path"] == STDIN:
        source = RpcSource.streamed(method_id=method, batching=batching)
    elif opts["input_path"] is not None:
        source = RpcSource(lines=input_lines(opts["input_path"]), method_id=method, batching=batching)
    else:
        source = RpcSource(opts["rpcs"], method_id=method, arg_form=opts["arg_form"], batching=batching)
    log_dir = opts["log_dir"]
    config = IcConfig(
        source=source,
        host=host,
        receive_port=rport,
        send_port=sport,
        send_host=send_host,
        log_dir=log_dir,
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
        pair_timeout=opts["pair_timeout"],
        record=opts["record"],
        log=_log(IC, verbosity),
        trace=_trace(IC, verbosity),
    )
    try:
        ic = MockIC(config)
    except OSError as err:
        what = "--record" if opts["record"] and err.filename == opts["record"] else "--log-dir"
        if what == "--log-dir" and err.errno in (errno.EEXIST, errno.ENOTDIR):
            raise usage_error(open_failure(err, what, log_dir)) from None
        raise usage_error(open_failure(err, what)) from None
    except StoreError as err:
        raise usage_error(str(err)) from None
    refused, warned = ic.fault_reach()
    if refused:
        ic.close()
        raise usage_error(refused[0])
    note = ic.resume_note()
    for line in ([note] if note else []) + warned:
        config.log(line)
    runtime.tune_gc()
    summary, interrupted = asyncio.run(_serve_ic(ic))
    print_ic_summary(summary, opts["fmt"])
    for note in ic.unfired_notes(interrupted):
        config.log(note)
    if summary["violations"]:
        sys.exit(1)
    if interrupted and opts["exit_when_done"] and not summary["done"]:
        sys.exit(EXIT_INTERRUPTED)


command.add_command(mock_lb)
