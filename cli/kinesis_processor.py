"""``wallaroo-proto kinesis mock-processor``: play a KCL record processor for a daemon."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from typing import TextIO

import click
from rich.console import Console
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    LISTEN_ADDRESS,
    Command,
    command_log,
    examples,
    format_address,
    hidden_alias,
    os_reason,
    output_option,
    plural,
    stderr_or_nothing,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.protocols.kinesis.processor import (
    Crash,
    ProcessorConfig,
    TcpProcessors,
    serve_stdio,
    summary,
)

# --------------------------------------------------------------------------- mock-processor


def _print_processor_summary(result: dict, fmt: str, *, err: bool, rows: int | None = None) -> None:
    """The summary on stdout, or with ``err`` on stderr if anyone still reads it (under the MLD,
    whose JVM may have exited and closed it: never on stdout, the daemon's pipe)."""
    if err:
        text = io.StringIO()
        _write_processor_summary(result, fmt, text, rows)
        stderr_or_nothing(text.getvalue())
    else:
        _write_processor_summary(result, fmt, sys.stdout, rows)


def _write_processor_summary(result: dict, fmt: str, file: TextIO, rows: int | None) -> None:
    if fmt == "json":
        file.write(json.dumps(result) + "\n")
        return
    out = Console(file=file, highlight=False, soft_wrap=True)
    out.print(
        f"kinesis mock-processor summary: {plural(result['records'], 'record')}, "
        f"{plural(result['checkpoints'], 'checkpoint')}, "
        f"{plural(result['checkpoint_errors'], 'checkpoint error')}, "
        f"{plural(len(result['conversations']), 'conversation')}"
    )
    conversations = result["conversations"]
    for c in conversations if rows is None else conversations[:rows]:
        errors = ", ".join(f"{k} {v}" for k, v in c["checkpoint_errors"].items())
        out.print(
            f"  {c['shard_id'] or 'before initialize'}: {plural(c['records'], 'record')}, "
            f"{plural(c['checkpoints'], 'checkpoint')}"
            + (f" (errors: {errors})" if errors else "")
            + f", end: {c['end']}"
        )
    if rows is not None and len(conversations) > rows:
        out.print(f"  ... {len(conversations) - rows} more (-v shows every one)")
    for failure in result["failures"]:
        out.print(f"  FAILED {failure}")


async def _run_tcp(config: ProcessorConfig, opts: dict) -> tuple[dict, bool]:
    procs = TcpProcessors(config, command_log("kinesis mock-processor", opts["verbosity"] >= 0))
    stop = on_stop_signals()
    listen = opts["listen"]
    if listen is not None:
        try:
            host, port = await procs.listen(*listen)
        except OSError as err:
            raise usage_error(f"cannot listen on {format_address(listen)}: {os_reason(err)}") from err
        ready(f"wallaroo-proto kinesis mock-processor: listening on {host}:{port}")
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(procs.crash_event.wait())]
    else:
        host, port = opts["connect"]
        work = asyncio.ensure_future(procs.connect(host, port, opts["connections"]))
        waits = [work, asyncio.ensure_future(stop.wait())]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in done:
        exc = task.exception()
        if isinstance(exc, OSError):
            raise usage_error(f"cannot connect to {format_address(opts['connect'])}: {os_reason(exc)}")
    await procs.close()
    # --connect's conversations cut short by a signal; --listen serves until one, its normal end.
    interrupted = listen is None and work not in done
    return summary(procs.results, procs.crashed), interrupted


@click.command(
    name="mock-processor",
    cls=Command,
    sections={
        "Daemon (stdin and stdout without --listen or --connect)": ["listen", "connect", "connections"],
        "Faults": ["slow", "crash_after", "bad_response_after"],
    },
    epilog=examples(
        "wallaroo-proto kinesis mock-processor --listen :0 -o 'records-{shard}.jsonl'",
        "wallaroo-proto kinesis mock-processor --connect 127.0.0.1:7111 --connections 2",
        "wallaroo-proto kinesis mock-daemon --records 50 -- wallaroo-proto kinesis mock-processor --slow 20",
    ),
)
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    default=None,
    help="Accept daemon connections (port 0: a free one, named in the ready line).",
)
@click.option("--connect", type=CONNECT_ADDRESS, default=None, help="Connect to a daemon listening there.")
@click.option(
    "--connections",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="With --connect: one per shard.",
)
@output_option(
    "Append every record as a JSON line to this file ({shard} in the name: one file per shard).",
    default=None,
    metavar="FILE",
)
@hidden_alias("--out", "output")
@click.option(
    "--checkpoint-every",
    type=click.IntRange(0),
    default=100,
    show_default=True,
    help="Checkpoint at the last record once N records came since the last checkpoint (0: only at the end).",
)
@click.option("--retries", type=click.IntRange(1), default=5, show_default=True, help="Tries per checkpoint.")
@click.option(
    "--retry-delay",
    type=click.FloatRange(0),
    default=0.05,
    show_default=True,
    help="Seconds between tries of a checkpoint.",
)
@click.option("--retry-sleep", "retry_sleep_ms", type=click.FloatRange(0), default=None, hidden=True)
@click.option(
    "--slow", type=click.FloatRange(0), default=0.0, metavar="MS", help="Sleep this long per batch."
)
@click.option("--crash-after", type=click.IntRange(0), default=0, help="Exit 1 abruptly once N records came.")
@click.option(
    "--bad-response-after",
    type=click.IntRange(0),
    default=0,
    help="Answer with a wrong responseFor once N records came.",
)
@summary_format
@verbosity(
    quiet="No notes on stderr (checkpoint retries, skipped lines): errors and the summary.",
    verbose="Every conversation in the summary (else the first 20).",
)
def mock_processor(**opts) -> None:
    """Play a KCL record processor for a daemon (such as erlmld).

    Without --listen or --connect it speaks on stdin and stdout, as the MLD
    spawns it (its summary then goes to stderr). Answers as kclpy does,
    writes records out, checkpoints every N records and at shardEnded and
    shutdownRequested. Exit 0 when every conversation ended cleanly (with
    --listen: after SIGINT or SIGTERM), 1 when the daemon broke the protocol
    or a fault fired, 2 on bad usage or a daemon not reached, 130 when
    interrupted on stdin or with --connect.
    """
    if opts["listen"] and opts["connect"]:
        raise click.UsageError("give at most one of --listen and --connect")
    if opts["retry_sleep_ms"] is not None:  # the older option, in milliseconds
        opts["retry_delay"] = opts["retry_sleep_ms"] / 1000
    config = ProcessorConfig(
        out=opts["output"],
        checkpoint_every=opts["checkpoint_every"],
        retries=opts["retries"],
        retry_sleep=opts["retry_delay"],
        slow_ms=opts["slow"],
        crash_after=opts["crash_after"],
        bad_response_after=opts["bad_response_after"],
    )
    if opts["output"]:
        directory = os.path.dirname(os.path.abspath(opts["output"].replace("{shard}", "x")))
        if not os.path.isdir(directory):
            raise usage_error(f"cannot use --output {opts['output']}: its folder does not exist")
    stdio = not (opts["listen"] or opts["connect"])
    runtime.tune_gc()
    if stdio:
        # Spawned by a daemon, whose pipes may be gone by the end: notes go to stderr while read.
        def note(line: str) -> None:
            stderr_or_nothing(f"wallaroo-proto kinesis mock-processor: {line}\n")

        def log(line: str) -> None:
            if opts["verbosity"] >= 0:
                note(line)

        try:
            stats = asyncio.run(serve_stdio(config, log))
        except Crash as err:
            note(str(err))
            os._exit(1)
        except KeyboardInterrupt:
            note("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        result = summary([stats])
    else:
        result, interrupted = asyncio.run(_run_tcp(config, opts))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
    rows = None if opts["verbosity"] > 0 else 20
    _print_processor_summary(result, opts["fmt"], err=stdio, rows=rows)
    if not stdio and interrupted:
        sys.exit(EXIT_INTERRUPTED)
    if not result["ok"]:
        sys.exit(1)
