"""``wallaroo-proto mock-worker``: play a Wallaroo worker for connector sources.

Options in, ``wallaroo_proto.protocols.wallaroo.worker.MockWorker`` does the work. One ready line
on stdout, a rich live view on stderr when it is a terminal, the summary on
stdout at the end (``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio
import json
import sys

import click
from wallaroo_proto_cli.mock_worker_view import print_summary, show_live, sink_summary
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    Command,
    CommandError,
    examples,
    format_address,
    hidden_alias,
    listen_option,
    live_option,
    open_failure,
    os_reason,
    output_option,
    problem,
    protocol_version_option,
    record_option,
    shows_live,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.protocols.wallaroo.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SINK_VERSION,
    SOURCE_VERSION,
)
from wallaroo_proto.protocols.wallaroo.registry import Registry, StateError
from wallaroo_proto.protocols.wallaroo.sink_driver import (
    SinkRefused,
    SinkUnavailable,
    drive,
    input_name,
    input_run,
)
from wallaroo_proto.protocols.wallaroo.sink_forwarder import SinkForwarder
from wallaroo_proto.protocols.wallaroo.worker import JsonLinesOut, MockWorker, WorkerConfig, stream_rejecter

NAME = "mock-worker"
#: Seconds a sink never reached is tried for, and one reached once after it is lost.
SINK_FIRST_CONTACT, SINK_GIVE_UP = 10.0, 60.0


def _driver_options(opts: dict) -> dict:
    return {
        "reply_timeout": opts["sink_reply_timeout"],
        "instance_name": opts["sink_instance"],
        "cookie": opts["sink_cookie"].encode("utf-8"),
        "version": opts["sink_version"],
        "record": opts["sink_record"],
        "first_contact_within": opts["sink_wait"],
        "give_up_after": SINK_GIVE_UP,
        # Room for a whole checkpoint's output, so put() rarely has to wait for one.
        "max_buffer_messages": max(2 * opts["checkpoint_every"], 2000),
        "log": (lambda line: None)
        if opts["verbosity"] < 0
        else lambda line: click.echo(f"wallaroo-proto {NAME}: sink: {line}", err=True),
    }


def _drive_input(opts: dict) -> None:
    """``--sink-connect`` with ``--input``: no connectors, just the input through 2PC to the sink
    (with ``--state``, crash-safe: ``sink_driver.input_run``)."""
    host, port = opts["sink_connect"]
    try:
        run = input_run(
            host,
            port,
            opts["sink_input"],
            opts["state_path"],
            checkpoint_every=opts["checkpoint_every"],
            checkpoint_ms=opts["checkpoint_ms"],
            **_driver_options(opts),
        )
    except StateError as err:
        raise usage_error(str(err)) from err
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--input") from err
    except OSError as err:
        raise usage_error(f"cannot read --input {opts['sink_input']}: {err.strerror or err}") from err
    if run.offset or run.txn:
        source = input_name(opts["sink_input"])
        click.echo(
            f"wallaroo-proto {NAME}: resuming --input {source} after byte {run.offset} of it", err=True
        )
    try:
        stats = asyncio.run(drive(run.driver, run.payloads))
    except SinkUnavailable as err:
        raise CommandError(str(err), 1 if err.reached else 2) from None
    except SinkRefused as err:
        raise problem(str(err)) from None
    except OSError as err:
        raise usage_error(f"cannot read --input {opts['sink_input']}: {err.strerror or err}") from err
    summary = stats.as_dict()
    if opts["fmt"] == "json":
        click.echo(json.dumps(summary, default=str))
    else:
        click.echo(f"{NAME} sink summary: " + sink_summary(summary))


async def _run(
    config: WorkerConfig,
    registry: Registry,
    out: str | None,
    live: bool,
    sink: tuple[tuple[str, int], dict] | None = None,
) -> tuple[dict, bool]:
    try:
        worker = MockWorker(config, registry)
        resume_at = registry.resume_out(out)
        if out:
            worker.add_consumer(JsonLinesOut(out, resume_at=resume_at, executor=worker.io))
        if sink is not None:
            (host, port), driver_options = sink
            worker.set_sink(SinkForwarder(host, port, saved=registry.sink, **driver_options))
    except OSError as err:
        raise usage_error(open_failure(err)) from err
    # Handlers first: a SIGTERM sent the moment the ready line appears must still end cleanly.
    stop = on_stop_signals()
    worker.on_fatal = stop.set
    try:
        host, port = await worker.start()
    except OSError as err:
        worker.io.shutdown()
        address = format_address((config.host, config.port))
        raise usage_error(f"cannot listen on {address}: {os_reason(err)}") from err
    ready(f"wallaroo-proto {NAME}: listening on {host}:{port}")

    await (show_live(worker, stop) if live else stop.wait())
    await worker.close()
    return worker.summary(), worker.sink is not None and worker.sink.driver.never_reached


SECTIONS = {
    "Connectors": [
        "listen", "protocol_version", "cookie", "credits", "refill_at", "strict_credits", "max_frame_size",
        "max_streams", "max_connections", "handshake_timeout", "idle_timeout", "write_timeout",
    ],
    "Checkpoints and output": ["checkpoint_every", "checkpoint_ms", "state_path", "output", "record"],
    "Faults": [
        "restart_after", "restart_address", "reject_streams", "ack_delay",
        "drop_connection_after", "drop_times",
    ],
    "Sink (a connector sink fed with what connectors deliver, or with --input)": [
        "sink_connect", "sink_input", "sink_instance", "sink_cookie", "sink_version", "sink_reply_timeout",
        "sink_wait", "sink_record",
    ],
}  # fmt: skip


@click.command(
    name=NAME,
    cls=Command,
    sections=SECTIONS,
    epilog=examples(
        "wallaroo-proto mock-worker",
        "wallaroo-proto mock-worker --listen :0 --state worker.json -o delivered.jsonl",
        "wallaroo-proto mock-worker --restart-after 500 --reject-streams 'audit-.*'",
        "wallaroo-proto mock-worker --sink-connect 127.0.0.1:7200 --checkpoint-every 1000",
        "wallaroo-proto mock-worker --sink-connect 127.0.0.1:7200 --input gen:10000 --state input.json",
    ),
)
@listen_option(7100, "Address connectors connect to")
@protocol_version_option(SOURCE_VERSION, "Protocol version a HELLO must carry exactly.", "protocol_version")
@click.option("--cookie", default="", help="Cookie a HELLO must carry (compared in constant time).")
@click.option(
    "--credits",
    type=click.IntRange(1, 0xFFFF_FFFF),
    default=100,
    show_default=True,
    help="Credits granted by OK and restored by each refill ACK.",
)
@click.option(
    "--refill-at",
    type=click.IntRange(0),
    default=None,
    help="Send a refill ACK when the connector's credits fall to this.  [default: half of --credits]",
)
@click.option(
    "--strict-credits/--lenient-credits",
    default=False,
    show_default=True,
    help="ERROR a frame sent without credit (the spec), or count it in the summary as the shipped worker "
    "does, whose connector library does not count EOS_MESSAGE as spending one.",
)
@click.option(
    "--max-frame-size",
    type=click.IntRange(1),
    default=DEFAULT_MAX_FRAME_SIZE,
    show_default=True,
    help="Largest frame length accepted; a longer length prefix gets ERROR.",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(0),
    default=10_000,
    show_default=True,
    help="Checkpoint after this many delivered messages (0: off).",
)
@click.option(
    "--checkpoint-ms",
    type=click.FloatRange(0),
    default=1000.0,
    show_default=True,
    help="Checkpoint at least this often, in milliseconds (0: off).",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Durable registry and checkpoints (with --input: the input position): loaded at start, "
    "rewritten atomically at each checkpoint.",
)
@output_option(
    "Write every delivered message as a JSON line to this file (with --state: continues after the "
    "last checkpoint).",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
)
@hidden_alias("--out", "output", type=click.Path(dir_okay=False, writable=True))
@record_option("Record every connection into this pcap file")
@click.option(
    "--restart-after",
    type=click.IntRange(0),
    default=0,
    help="Send RESTART to a connection once it delivered N messages (0: never).",
)
@click.option(
    "--restart-address", default=None, help="Send the shipped RESTART form carrying this reconnect address."
)
@click.option(
    "--reject-streams",
    multiple=True,
    help="Answer NOTIFY_ACK success=0 for these stream ids (1,2,3) or names matching this regex.",
)
@click.option(
    "--ack-delay", type=click.FloatRange(0), default=0.0, help="Hold every ACK this many milliseconds."
)
@click.option(
    "--drop-connection-after",
    type=click.IntRange(0),
    default=0,
    help="Abort a connection (no ERROR) once it delivered N messages (0: never).",
)
@click.option(
    "--drop-times",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="How many connections --drop-connection-after drops (0: every one).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0),
    default=0.0,
    help="ERROR and close a connection silent this many seconds (0: never).",
)
@click.option(
    "--max-streams",
    type=click.IntRange(1),
    default=100_000,
    show_default=True,
    help="Distinct streams one connection may NOTIFY; beyond it gets ERROR.",
)
@write_timeout_option("a connection")
@click.option(
    "--handshake-timeout",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="ERROR and close a connection with no HELLO after this many seconds (0: never).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Connections beyond this get ERROR 'too many connections'.",
)
@summary_format
@click.option(
    "--sink-connect",
    type=CONNECT_ADDRESS,
    default=None,
    help="Also drive a connector sink at HOST:PORT: delivered messages go to it, one 2PC round per "
    "checkpoint.",
)
@hidden_alias("--sink", "sink_connect", type=CONNECT_ADDRESS)
@click.option(
    "--input",
    "sink_input",
    default=None,
    metavar="FILE|-|gen:N",
    help="With --sink-connect: send these lines to the sink instead of what connectors deliver "
    "(no listening).",
)
@click.option("--sink-instance", default="mock-worker", show_default=True, help="Instance name in our HELLO.")
@click.option("--sink-cookie", default="", help="Cookie in our HELLO to the sink.")
@click.option(
    "--sink-version", default=SINK_VERSION, show_default=True, help="Protocol version in our sink HELLO."
)
@click.option(
    "--sink-reply-timeout",
    type=click.FloatRange(0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds to wait for a phase-1 REPLY; no reply counts as an abort vote.",
)
@click.option(
    "--sink-wait",
    type=click.FloatRange(0),
    default=SINK_FIRST_CONTACT,
    show_default=True,
    help=f"Seconds to keep trying a sink never reached before giving up (exit 2); a sink reached once "
    f"is retried for {SINK_GIVE_UP:g} s after it is lost (exit 1).",
)
@click.option(
    "--sink-record",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Record the sink connection into this pcap file.",
)
@click.option("--strict", is_flag=True, help="Exit 1 if any connector committed a protocol violation.")
@live_option()
@verbosity(
    quiet="No live view and no sink lines: errors and the summary.",
    verbose="Every stream in the summary's table (else the first 50).",
)
def command(**opts) -> None:
    """Play a Wallaroo worker for connector sources, over real TCP.

    Handshake, credits, a stream registry across connections, checkpoints
    (an ACK's point_of_ref is the last message id the checkpoint holds),
    de-duplication of replays and fault injection, as the shipped worker behaves.
    Prints one ready line (listening on HOST:PORT), then the summary when stopped
    by Ctrl-C or SIGTERM (exit 0; 1 on a fatal problem or violations under
    --strict; 2 when the --sink-connect sink is never reached).
    """
    if opts["sink_input"] is not None:
        if opts["sink_connect"] is None:
            raise usage_error("--input feeds a sink: give --sink-connect HOST:PORT too")
        _drive_input(opts)
        return
    sink = (opts["sink_connect"], _driver_options(opts)) if opts["sink_connect"] else None
    try:
        reject = stream_rejecter(opts["reject_streams"])
        config = WorkerConfig(
            host=opts["listen"][0],
            port=opts["listen"][1],
            version=opts["protocol_version"],
            cookie=opts["cookie"].encode("utf-8"),
            credits=opts["credits"],
            refill_at=opts["refill_at"],
            lenient_credits=not opts["strict_credits"],
            max_frame_size=opts["max_frame_size"],
            checkpoint_every=opts["checkpoint_every"],
            checkpoint_ms=opts["checkpoint_ms"],
            restart_after=opts["restart_after"],
            restart_address=opts["restart_address"],
            reject_streams=reject,
            ack_delay_ms=opts["ack_delay"],
            drop_connection_after=opts["drop_connection_after"],
            drop_times=opts["drop_times"],
            idle_timeout=opts["idle_timeout"],
            write_timeout=opts["write_timeout"],
            max_streams=opts["max_streams"],
            handshake_timeout=opts["handshake_timeout"],
            max_connections=opts["max_connections"],
            record=opts["record"],
        )
    except ValueError as err:
        raise usage_error(str(err)) from err
    try:
        registry = Registry.open(opts["state_path"])
        registry.save()  # find out now, not at the first checkpoint, that it cannot be written
    except StateError as err:
        raise usage_error(str(err)) from err
    except OSError as err:
        raise usage_error(f"cannot write --state {opts['state_path']}: {err.strerror or err}") from err
    live = shows_live(opts["live"], opts["verbosity"])
    summary, unreachable = runtime.run(_run(config, registry, opts["output"], live, sink))
    print_summary(summary, opts["fmt"], rows=len(summary["streams"]) if opts["verbosity"] > 0 else 50)
    for note in config.faults_not_fired(summary):
        click.echo(f"wallaroo-proto {NAME}: {note}", err=True)
    if summary["fatal"]:
        raise CommandError(f"stopped: {summary['fatal']}", 2 if unreachable else 1)
    if opts["strict"] and summary["violations"]:
        sys.exit(1)
