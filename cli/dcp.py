"""``wallaroo-proto dcp``: Couchbase DCP's mock peers, a producer (the server) and a consumer.

Options in, ``wallaroo_proto.protocols.dcp`` does the work; the summary goes to
stdout (``--format json`` for scripts).
"""

from __future__ import annotations

import random
import sys
import time

import click
from wallaroo_proto_cli.dcp_consumer import mock_consumer
from wallaroo_proto_cli.dcp_view import print_producer_summary
from wallaroo_proto_cli.options import (
    Command,
    Group,
    command_log,
    examples,
    format_address,
    input_option,
    listen_option,
    os_reason,
    record_option,
    state_option,
    summary_format,
    usage_error,
    verbosity,
    write_timeout_option,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.durable import write_atomic
from wallaroo_proto.input_spec import open_input
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.producer import Faults, MockProducer, ProducerConfig, parse_stream_end
from wallaroo_proto.protocols.dcp.store import Bucket, StateError, items_of


@click.group(
    name="dcp",
    cls=Group,
    epilog=examples(
        "wallaroo-proto dcp mock-producer --listen :0 --vbuckets 64 --items 1000",
        "wallaroo-proto dcp mock-consumer --connect 127.0.0.1:11210 --state copy.json -o items.jsonl",
    ),
)
def command() -> None:
    """Couchbase DCP (Database Change Protocol): mock producer and mock consumer."""


# --------------------------------------------------------------------------- mock-producer


def _read_items(path: str) -> list[dict]:
    try:
        f = open_input(path)
    except OSError as err:
        raise usage_error(f"cannot read --input {path}: {err.strerror or err}") from err
    with f:
        try:
            return items_of(f)
        except StateError as err:
            raise usage_error(f"--input {path} {err}") from None


async def _serve(producer: MockProducer) -> bool:
    try:
        host, port = await producer.start()
    except OSError as err:
        address = format_address((producer.config.host, producer.config.port))
        raise usage_error(f"cannot listen on {address}: {os_reason(err)}") from err
    stop = on_stop_signals()
    if len(producer.ports) > 1:
        second = format_address((host, producer.ports[1]))
        click.echo(f"wallaroo-proto dcp mock-producer: second node on {second}")
    ready(f"wallaroo-proto dcp mock-producer: listening on {format_address((host, port))}")
    await stop.wait()
    await producer.stop()
    return True


@command.command(
    name="mock-producer",
    cls=Command,
    epilog=examples(
        "wallaroo-proto dcp mock-producer --listen :0 --vbuckets 64 --items 1000 --record dcp.pcap",
        "wallaroo-proto dcp mock-producer --state p.json --failover 30 --not-my-vbucket 2",
    ),
)
@listen_option(11210, "Address consumers connect to (a data node's KV port)")
@click.option(
    "--vbuckets",
    type=click.IntRange(1, 1024),
    default=1024,
    show_default=True,
    help="vbuckets of a new bucket (a --state file keeps its own).",
)
@click.option(
    "--items",
    type=click.IntRange(0),
    default=100,
    show_default=True,
    help="New items generated per vbucket at start-up (added to the history).",
)
@click.option(
    "--keys",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Keys per vbucket the generated items use (fewer keys: more updates).",
)
@click.option(
    "--value-size",
    type=click.IntRange(0),
    default=64,
    show_default=True,
    help="Bytes of a generated JSON value (padded).",
)
@input_option("Items as JSONL: key, value, vbucket, op (mutation, deletion, expiration).")
@click.option("--seed", type=int, default=None, help="Seed of the generated items.")
@state_option("Durable history: failover logs and every item; a restart keeps them.")
@click.option(
    "--failover",
    type=click.IntRange(0),
    default=None,
    metavar="LOST",
    help="At start-up every vbucket fails over: its newest LOST items are gone and a new "
    "vbucket uuid begins (consumers past that point roll back).",
)
@click.option(
    "--snapshot-size",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Items per memory snapshot.",
)
@click.option(
    "--not-my-vbucket",
    "not_mine",
    multiple=True,
    type=click.IntRange(0),
    help="Answer stream requests for this vbucket NOT_MY_VBUCKET (repeatable).",
)
@click.option(
    "--move-vbucket",
    "move",
    multiple=True,
    type=click.IntRange(0),
    help="This vbucket moves to a second node (a second port) at its first stream request, as in a "
    "rebalance: NOT_MY_VBUCKET with a newer bucket config, then that node serves it (repeatable).",
)
@click.option(
    "--stream-end",
    default=None,
    metavar="REASON@N",
    help="End each vbucket's stream once after N items with REASON "
    f"({', '.join(codec.END_REASONS.values())}).",
)
@click.option(
    "--drop-after",
    type=click.IntRange(0),
    default=0,
    help="Drop a connection abruptly after sending it N items.",
)
@click.option(
    "--drop-times",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="How many connections --drop-after drops.",
)
@record_option("Record every connection into this pcap")
@write_timeout_option("a connection")
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0),
    default=360.0,
    show_default=True,
    help="Close a connection with noops on that sends nothing for this many seconds, as the "
    "server's dcp_idle_timeout (0: never).",
)
@click.option(
    "--username", default="Administrator", show_default=True, help="The account SASL (SCRAM, PLAIN) checks."
)
@click.option("--password", default="password", show_default=True, help="Its password.")
@click.option("--bucket", default="default", show_default=True, help="The bucket's name (SELECT_BUCKET).")
@click.option(
    "--require-auth/--no-require-auth",
    default=True,
    show_default=True,
    help="Refuse all but HELLO and SASL before authentication (EACCESS) and DCP before SELECT_BUCKET "
    "(NO_BUCKET), as a data node does; --no-require-auth: a connection starts authenticated on the bucket.",
)
@summary_format
@verbosity(
    quiet="The summary line only, not the vbuckets table.",
    verbose="Every violation after the table, not only the first 50.",
)
def mock_producer(listen: tuple[str, int], verbosity: int, **opts) -> None:
    """Play a Couchbase data node's DCP producer for DCP consumers.

    Serves until SIGINT or SIGTERM, then prints its summary. Exit 0, or 1 when
    a consumer broke the protocol, 2 on bad usage, 130 when interrupted twice.
    """
    faults = Faults(
        not_my_vbucket=frozenset(opts["not_mine"]),
        move=frozenset(opts["move"]),
        drop_after=opts["drop_after"],
        drop_times=opts["drop_times"],
    )
    if opts["stream_end"]:
        try:
            faults.end_reason, faults.end_after = parse_stream_end(opts["stream_end"])
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--stream-end") from None
    uuids = random.SystemRandom()
    try:
        bucket = Bucket.open(opts["state_path"], opts["vbuckets"], uuids)
    except StateError as err:
        raise usage_error(str(err)) from err
    if opts["failover"] is not None:
        bucket.fail_over(uuids, opts["failover"])
    bucket.clock = time.time_ns
    rng = random.Random(opts["seed"])
    bucket.generate(opts["items"], rng, opts["keys"], opts["value_size"])
    if opts["input_path"]:
        try:
            bucket.load(_read_items(opts["input_path"]))
        except StateError as err:
            raise usage_error(f"--input {opts['input_path']}: {err}") from err
    if opts["state_path"]:
        try:
            write_atomic(opts["state_path"], bucket.to_json())
        except OSError as err:
            raise usage_error(f"cannot write --state {opts['state_path']}: {err.strerror or err}") from err
    config = ProducerConfig(
        listen[0],
        listen[1],
        opts["snapshot_size"],
        opts["record"],
        faults,
        write_timeout=opts["write_timeout"],
        idle_timeout=opts["idle_timeout"],
        username=opts["username"],
        password=opts["password"],
        bucket=opts["bucket"],
        require_auth=opts["require_auth"],
    )
    try:
        producer = MockProducer(config, bucket, command_log("dcp mock-producer"))
    except OSError as err:
        raise usage_error(f"cannot write --record {opts['record']}: {err.strerror or err}") from err
    runtime.run(_serve(producer))
    summary = producer.summary()
    print_producer_summary(summary, opts["fmt"], verbosity)
    if summary["violations"]:
        sys.exit(1)


command.add_command(mock_consumer)
