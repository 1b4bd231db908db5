"""``wallaroo-proto kinesis``: the KCL MultiLangDaemon protocol's mock peers.

``mock-daemon`` plays the MLD for a record processor being written;
``mock-processor`` plays a record processor for a daemon being written (such
as erlmld). Options in, ``wallaroo_proto.protocols.kinesis`` does the work;
the summary goes to stdout (``--format json`` for scripts).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time

import click
from wallaroo_proto_cli.kinesis_processor import mock_processor
from wallaroo_proto_cli.kinesis_view import print_daemon_summary
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    LISTEN_ADDRESS,
    Command,
    Group,
    command_log,
    examples,
    format_address,
    hidden_alias,
    input_lines,
    input_option,
    open_failure,
    os_reason,
    plural,
    record_option,
    state_option,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.protocols.kinesis.codec import DIALECTS
from wallaroo_proto.protocols.kinesis.daemon import DaemonConfig, Faults, MockDaemon, parse_checkpoint_error
from wallaroo_proto.protocols.kinesis.leases import LeaseTable, StateError
from wallaroo_proto.protocols.kinesis.records import (
    RESHARDS,
    check_key_template,
    from_lines,
    generated,
    reshard,
)


@click.group(
    name="kinesis",
    cls=Group,
    epilog=examples(
        "wallaroo-proto kinesis mock-daemon --shards 2 --records 1000 -- python samples/kcl_processor.py",
        "wallaroo-proto kinesis mock-processor --listen :0 -o 'records-{shard}.jsonl'",
    ),
)
def command() -> None:
    """Kinesis MultiLangDaemon (KCL multi-language protocol): mock daemon and mock record processor."""


# --------------------------------------------------------------------------- mock-daemon


async def _run_daemon(daemon: MockDaemon) -> tuple[dict, bool]:
    try:
        address = await daemon.start()
    except OSError as err:
        if err.filename is not None or daemon.config.listen is None:
            raise usage_error(open_failure(err, "--record")) from err
        where = format_address(daemon.config.listen)
        raise usage_error(f"cannot listen on {where}: {os_reason(err)}") from err
    run = asyncio.ensure_future(daemon.run())
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            how = (
                f"shutdownRequested, leaseLost to every shard (grace {daemon.config.shutdown_grace:g} s)"
                if daemon.config.shutdown_grace
                else "every processor's input closed (no --shutdown-grace)"
            )
            daemon.log(f"stopping: {how}")
            daemon.stop()
        else:
            run.cancel()

    on_stop_signals(on_signal)
    if address is not None:
        ready(f"wallaroo-proto kinesis mock-daemon: listening on {address[0]}:{address[1]}")
    try:
        return await run, False
    except asyncio.CancelledError:
        return daemon.summary(), True


@command.command(
    name="mock-daemon",
    cls=Command,
    context_settings={"allow_interspersed_args": False},
    sections={
        "Processors (one of -- COMMAND, --listen, --connect)": ["listen", "connect"],
        "Records": ["inputs", "shards", "records", "key", "batch_size", "aggregate", "reshard", "state_path"],
        "Faults": [
            "checkpoint_errors",
            "lease_lost_after",
            "shutdown_requested_after",
            "shard_end",
            "kill_after",
            "idle_timeout",
        ],
    },  # fmt: skip
    epilog=examples(
        "wallaroo-proto kinesis mock-daemon --shards 2 --records 1000 -- python samples/kcl_processor.py",
        "wallaroo-proto kinesis mock-daemon --shards 2 --state leases.json --shard-end \\",
        "    --checkpoint-error ThrottlingException@1 --kill-after 30 \\",
        "    -- wallaroo-proto kinesis mock-processor",
        "wallaroo-proto kinesis mock-daemon --listen :0 --shards 2 --record mld.pcap",
    ),
)
@click.argument("processor_command", nargs=-1, metavar="[-- COMMAND...]")
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    default=None,
    help="Wait for one processor connection per shard (port 0: a free one, named in the ready line).",
)
@click.option(
    "--connect",
    type=CONNECT_ADDRESS,
    default=None,
    help="Open one connection per shard to a processor listening there (erlmld's bridge).",
)
@input_option(
    "Records: one per line (repeatable; - is stdin). Without it, records are generated.",
    "inputs",
    multiple=True,
)
@click.option(
    "--shards", type=click.IntRange(1, 10_000), default=1, show_default=True, help="Number of shards."
)
@click.option(
    "--records", type=click.IntRange(0), default=100, show_default=True, help="Generated records per shard."
)
@click.option(
    "--key",
    default="{n}",
    show_default=True,
    help="Partition key of an input line ({n}: line number from 0, {line}: its text); it picks the shard.",
)
@click.option(
    "--batch-size", type=click.IntRange(1), default=100, show_default=True, help="Records per batch."
)
@state_option("Lease table (shard -> checkpoint), written durably at each checkpoint; shards resume from it.")
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default="current",
    show_default=True,
    help="current: KCL 2.1+; v2: KCL 1.7.2-2.0 (shutdown with a reason); v1: KCL 1.7.1 and older.",
)
@click.option(
    "--checkpoint-error",
    "checkpoint_errors",
    multiple=True,
    metavar="NAME[@N[-M]]",
    help="Answer a shard's checkpoint requests N..M (no @: all) with this error, e.g. ThrottlingException@1.",
)
@click.option(
    "--lease-lost-after", type=click.IntRange(0), default=0, help="leaseLost once a shard got N records."
)
@click.option(
    "--shutdown-requested-after",
    type=click.IntRange(0),
    default=0,
    help="shutdownRequested then leaseLost once a shard got N records.",
)
@click.option(
    "--shard-end", is_flag=True, help="End each shard's records with shardEnded (a checkpoint is due)."
)
@click.option(
    "--kill-after",
    type=click.IntRange(0),
    default=0,
    help="Kill a shard's processor once it got N records; a new one resumes from the checkpoint.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0),
    default=0.0,
    help="Fail a shard whose processor sends no line for this many seconds (0: wait forever, as the MLD).",
)
@hidden_alias("--timeout", "idle_timeout", type=click.FloatRange(0))
@click.option(
    "--exit-grace",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds a processor has to exit once its input is closed.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds a stop gives the processors (the KCL's shutdownGraceMillis): shutdownRequested, "
    "leaseLost, then their input closed; 0 closes it at once, as the KCL's default.",
)
@click.option(
    "--aggregate",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    metavar="K",
    help="KPL aggregation: every K records of a shard share a sequence number, subsequence numbers "
    "0..K-1, as the KCL delivers aggregated records.",
)
@click.option(
    "--reshard",
    type=click.Choice(RESHARDS),
    default=None,
    help="The shards' records end with the shard (shardEnded), and child shards with --records "
    "generated records each start at TRIM_HORIZON once their parents ended: split gives each two, "
    "merge gives each pair one.",
)
@click.option(
    "--wait-at-end",
    is_flag=True,
    help="After a shard's last record send nothing until stopped, as the KCL on an open shard "
    "(default: end its lease with shutdownRequested, leaseLost).",
)
@click.option(
    "--empty-batches",
    type=click.FloatRange(0),
    default=0.0,
    metavar="S",
    help="With --wait-at-end: an empty processRecords every S seconds "
    "(the KCL's callProcessRecordsEvenForEmptyRecordList).",
)
@record_option("Record every shard's conversation as a loopback TCP connection into this pcap")
@summary_format
@verbosity(
    quiet="No notes of the daemon's on stderr (the processors' stderr still shows): errors, the summary.",
    verbose="Also a line per processor started and per shard's end.",
)
def mock_daemon(processor_command: tuple[str, ...], **opts) -> None:
    """Play the KCL MultiLangDaemon for a record processor.

    Spawns COMMAND once per shard, in a process group of its own, and speaks the
    protocol on its stdin and stdout (stderr is echoed with the shard's name),
    or talks over TCP with --listen/--connect. SIGINT or SIGTERM stops it as a
    KCL worker stops (a second one at once, exit 130). Exit 0 when every shard
    ended cleanly, also at a stop, 1 when a processor broke the protocol, went
    away or had to be killed (the report says where), 2 on bad usage or when
    --connect reached no processor.
    """
    transports = sum(bool(x) for x in (processor_command, opts["listen"], opts["connect"]))
    if transports != 1:
        raise click.UsageError("give exactly one of: -- COMMAND..., --listen HOST:PORT, --connect HOST:PORT")
    if opts["empty_batches"] and not opts["wait_at_end"]:
        raise click.UsageError("--empty-batches needs --wait-at-end (they are sent while waiting)")
    command_ = list(processor_command)
    if command_ and shutil.which(command_[0]) is None:
        raise usage_error(f"COMMAND {command_[0]!r} is not an executable file or on PATH")
    try:
        faults = Faults(
            checkpoint_errors=[parse_checkpoint_error(spec) for spec in opts["checkpoint_errors"]],
            lease_lost_after=opts["lease_lost_after"],
            shutdown_requested_after=opts["shutdown_requested_after"],
            kill_after=opts["kill_after"],
            shard_end=opts["shard_end"],
        )
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--checkpoint-error") from err
    try:
        leases = LeaseTable.open(opts["state_path"])
        leases.save()  # find out now, not at the first checkpoint, that it cannot be written
    except StateError as err:
        raise usage_error(str(err)) from err
    except OSError as err:
        raise usage_error(open_failure(err, "--state", opts["state_path"])) from err
    if opts["inputs"]:
        try:
            check_key_template(opts["key"])
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--key") from None
        now_ms = int(time.time() * 1000)  # the records "arrived" when read
        shards = from_lines(
            input_lines(*opts["inputs"]),
            opts["shards"],
            key_template=opts["key"],
            now_ms=now_ms,
            aggregate=opts["aggregate"],
        )
    else:
        shards = generated(opts["shards"], opts["records"], opts["aggregate"])
    if opts["reshard"]:
        shards = reshard(shards, opts["reshard"], opts["records"], opts["aggregate"])
    config = DaemonConfig(
        command=command_ or None,
        listen=opts["listen"],
        connect=opts["connect"],
        batch_size=opts["batch_size"],
        dialect=opts["dialect"],
        timeout=opts["idle_timeout"],
        exit_grace=opts["exit_grace"],
        shutdown_grace=opts["shutdown_grace"],
        wait_at_end=opts["wait_at_end"],
        empty_batches=opts["empty_batches"],
        record=opts["record"],
        faults=faults,
    )
    daemon = MockDaemon(config, shards, leases, command_log("kinesis mock-daemon", opts["verbosity"] >= 0))
    for shard, skipped in daemon.resumed():
        if skipped:
            click.echo(
                f"wallaroo-proto kinesis mock-daemon: {shard.shard_id} resumed from its checkpoint in "
                f"--state {opts['state_path']}: {skipped:,} of {plural(len(shard), 'record')} skipped",
                err=True,
            )
    refusal = daemon.fault_reach()
    if refusal:
        raise usage_error(refusal)
    if opts["verbosity"] > 0:
        daemon.trace = daemon.log
    runtime.tune_gc()
    try:
        result, interrupted = asyncio.run(_run_daemon(daemon))
    except OSError as err:
        raise usage_error(open_failure(err)) from err
    print_daemon_summary(result, opts["fmt"])
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if opts["connect"] and not any(shard["spawns"] for shard in result["shards"]):
        sys.exit(2)  # no processor was ever reached
    if not result["ok"]:
        sys.exit(1)


command.add_command(mock_processor)
