"""``wallaroo-proto dcp mock-consumer``: stream a bucket's vbuckets from a producer, as a DCP client."""

from __future__ import annotations

import contextlib
import os
import sys

import click
from rich.console import Console
from rich.table import Table
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    Command,
    command_log,
    examples,
    hidden_alias,
    output_option,
    plural,
    state_option,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import json_summary, on_stop_signals
from wallaroo_proto_cli.tables import stdout_console

from wallaroo_proto import runtime
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.consumer import ConsumerConfig, MockConsumer
from wallaroo_proto.protocols.dcp.store import StateError

_REASONS = {name: value for value, name in codec.END_REASONS.items()}
#: vbuckets shown in the consumer's table (a bucket's default count; a producer may claim up to 65,535).
_TABLE_ROWS = 1024


def _vbucket_list(value: str | None) -> list[int] | None:
    """``0,3,5-7`` to [0, 3, 5, 6, 7]."""
    if not value:
        return None
    out: list[int] = []
    for part in value.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise click.BadParameter(
                f"{value!r}: use numbers and ranges like 0,3,5-7", param_hint="--vbuckets"
            )
        out.extend(range(int(first), int(last if sep else first) + 1))
    return out


# --------------------------------------------------------------------------- mock-consumer


def _print_consumer_summary(s: dict, fmt: str, err: bool, verbosity: int) -> None:
    if json_summary(s, fmt, err=err):
        return
    out = Console(file=sys.stderr, highlight=False, soft_wrap=True) if err else stdout_console()
    ends = ", ".join(f"{k} {v}" for k, v in s["stream_ends"].items()) or "none"
    out.print(
        f"dcp mock-consumer summary: {plural(s['items_received'], 'item')} received "
        f"over {plural(s['connections'], 'connection')}, "
        f"{s['live_items']:,} live, {plural(s['rollbacks'], 'rollback')}, stream ends: {ends}, "
        f"{plural(s['noops_answered'], 'noop')} answered, {plural(s['buffer_acks'], 'buffer ack')}, "
        f"{plural(s['violations'], 'violation')} "
        f"({s['items_per_second']:,.0f} items/s)"
    )
    for failure in s["failures"] if verbosity < 0 else []:
        out.print(f"[bold red]FAILED[/] {failure}")
    if verbosity < 0:
        return
    rows = s["vbuckets"][:_TABLE_ROWS]
    table = Table(title="vbuckets")
    for col in ("vbucket", "status", "uuid", "seqno", "snapshot", "received", "live", "rollbacks"):
        table.add_column(col)
    for v in rows:
        table.add_row(
            str(v["vbucket"]),
            v["status"],
            f"{v['uuid']:#018x}",
            str(v["seqno"]),
            f"{v['snapshot'][0]}..{v['snapshot'][1]}",
            f"{v['items_received']:,}",
            f"{v['live_items']:,}",
            str(v["rollbacks"]),
        )
    out.print(table)
    if len(s["vbuckets"]) > len(rows):
        hidden = len(s["vbuckets"]) - len(rows)
        out.print(f"... and {hidden:,} more vbuckets (--format json lists every one)")
    for violation in s["violation_list"] if verbosity > 0 else s["violation_list"][:50]:
        out.print(f"[bold red]VIOLATION[/] {violation}")
    for failure in s["failures"]:
        out.print(f"[bold red]FAILED[/] {failure}")


async def _consume(consumer: MockConsumer) -> tuple[dict, bool]:
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        consumer.stop()

    on_stop_signals(on_signal)
    return await consumer.run(), interrupted


@click.command(
    name="mock-consumer",
    cls=Command,
    epilog=examples(
        "wallaroo-proto dcp mock-consumer --connect 127.0.0.1:11210 --state copy.json -o items.jsonl",
        "wallaroo-proto dcp mock-consumer --vbuckets 0-3 --follow --buffer-size 4096 --format json",
    ),
)
@click.option(
    "--connect",
    type=CONNECT_ADDRESS,
    default="127.0.0.1:11210",
    show_default=True,
    help="The producer (a data node's KV port).",
)
@click.option(
    "--name", default="wallaroo-proto-mock-consumer", show_default=True, help="DCP connection name."
)
@click.option(
    "--vbuckets", default=None, metavar="LIST", help="vbuckets to stream, e.g. 0,3,5-7 (default: all)."
)
@click.option(
    "--buffer-size",
    type=click.IntRange(0),
    default=1024 * 1024,
    show_default=True,
    help="Flow-control buffer (connection_buffer_size) in bytes; 0 turns flow control off.",
)
@click.option(
    "--noop-interval",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds between the producer's noops (enable_noop); 0 leaves noops off.",
)
@click.option(
    "--follow", is_flag=True, help="Stream without end (until SIGINT/SIGTERM) instead of up to now."
)
@click.option("--stream-ids", is_flag=True, help="Open streams with stream ids (enable_stream_id).")
@state_option("Durable copy: items, vbucket uuids, seqnos and snapshot ranges; a restart resumes.")
@output_option("Write the live items as JSONL at the end (- is stdout).", default=None, metavar="FILE|-")
@hidden_alias("--out", "output")
@click.option(
    "--retries",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Reconnect this many times when the connection drops (a refused login is not retried).",
)
@click.option("--retry-delay", type=click.FloatRange(0), default=0.2, show_default=True, help="Seconds.")
@click.option(
    "--timeout",
    type=click.FloatRange(0),
    default=None,
    help="Drop the connection when the producer sends no whole packet, reads nothing of ours or "
    "leaves a request unanswered for this many seconds (0: never).  "
    "[default: twice --noop-interval, never when noops are off]",
)
@click.option(
    "--stream-retries",
    type=click.IntRange(0),
    default=10,
    show_default=True,
    help="Ask again for a vbucket's stream (after ROLLBACK or a STREAM_END other than ok) at most "
    "this many times in a row without a new seqno, pausing 10 ms, doubling up to 5 s; then give it up.",
)
@click.option(
    "--keep-going", is_flag=True, help="Go on after the producer breaks a rule (default: stop at the first)."
)
@click.option(
    "--username",
    default="Administrator",
    show_default=True,
    help="SASL account (the strongest SCRAM the producer lists, else PLAIN).",
)
@click.option("--password", default="password", show_default=True, help="Its password.")
@click.option("--bucket", default="default", show_default=True, help="The bucket to select (SELECT_BUCKET).")
@click.option(
    "--no-auth",
    is_flag=True,
    help="Neither authenticate nor select a bucket (a producer that wants neither).",
)
@summary_format
@verbosity(
    quiet="The summary line and failures only, not the vbuckets table.",
    verbose="Every violation after the table, not only the first 50.",
)
def mock_consumer(verbosity: int, **opts) -> None:
    """Stream vbuckets from a DCP producer into a durable copy, as a replica or connector does.

    Exit 0 when every stream ended ok, 1 when the producer broke the protocol
    (the first violation ends the run unless --keep-going), went silent, refused
    the login, the bucket or DCP_OPEN (not retried) or a stream could not be had
    (the summary says which), 2 on bad usage or when the
    producer could not be reached (after --retries), 130 when interrupted.
    """
    host, port = opts["connect"]
    if opts["output"] and opts["output"] != "-":
        directory = os.path.dirname(os.path.abspath(opts["output"]))
        if not os.path.isdir(directory):
            raise usage_error(f"--output {opts['output']}: no folder {directory}")
    config = ConsumerConfig(
        host=host,
        port=port,
        name=opts["name"],
        vbuckets=_vbucket_list(opts["vbuckets"]),
        buffer_size=opts["buffer_size"],
        noop_interval=opts["noop_interval"],
        follow=opts["follow"],
        stream_ids=opts["stream_ids"],
        state=opts["state_path"],
        out=opts["output"],
        retries=opts["retries"],
        retry_delay=opts["retry_delay"],
        timeout=opts["timeout"],
        keep_going=opts["keep_going"],
        stream_retries=opts["stream_retries"],
        user=None if opts["no_auth"] else opts["username"],
        password=opts["password"],
        bucket=opts["bucket"],
    )
    try:
        consumer = MockConsumer(config, command_log("dcp mock-consumer"))
    except StateError as err:
        raise usage_error(f"--state: {err}") from err
    result, interrupted = runtime.run(_consume(consumer))
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if not interrupted and result["connections"] == 0 and opts["fmt"] == "text":
        sys.exit(2)  # the producer was never reached: the log's one line says why, no empty table
    _print_consumer_summary(result, opts["fmt"], err=opts["output"] == "-", verbosity=verbosity)
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if result["connections"] == 0:
        sys.exit(2)
    if not result["ok"]:
        sys.exit(1)
