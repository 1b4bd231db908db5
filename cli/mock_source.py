"""``wallaroo-proto mock-source``: stream files, stdin or generated data to a worker.

Thin: parses options, runs ``wallaroo_proto.protocols.wallaroo.source.MockSource`` and renders its
progress (a rich bar on stderr when it is a terminal) and final summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import click
from rich.markup import escape
from wallaroo_proto_cli.mock_source_view import progress, render, rich_console
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    EXIT_INTERRUPTED,
    Command,
    examples,
    protocol_version_option,
    record_option,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import json_summary, on_stop_signals

from wallaroo_proto import runtime
from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE, SOURCE_VERSION
from wallaroo_proto.protocols.wallaroo.inputs import InputError, build_inputs
from wallaroo_proto.protocols.wallaroo.source import MockSource, SourceFailed, SourceOptions


@click.command(
    name="mock-source",
    cls=Command,
    sections={
        "Worker": [
            "address",
            "version",
            "cookie",
            "program_name",
            "instance_name",
            "dialect",
            "max_frame_size",
        ],
        "What to send": [
            "framing",
            "streams",
            "count",
            "payload_size",
            "key",
            "stream_prefix",
            "names",
            "ids",
            "rate",
        ],
    },  # fmt: skip
    epilog=examples(
        "wallaroo-proto mock-source --streams 3 --count 1000",
        "printf 'alpha\\nbeta\\n' | wallaroo-proto mock-source - --connect 127.0.0.1:7100",
        "wallaroo-proto mock-source orders.txt returns.txt --rate 500 --record source.pcap",
    ),
)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--connect",
    "address",
    type=CONNECT_ADDRESS,
    default="127.0.0.1:7100",
    show_default=True,
    help="The worker's HOST:PORT.",
)
@protocol_version_option(SOURCE_VERSION, "Protocol version to send.")
@click.option("--cookie", default="", help="Cookie the worker expects (empty by default).")
@click.option(
    "--program-name", default="wallaroo-proto", show_default=True, help="Program name in our HELLO."
)
@click.option("--instance-name", default="mock-source", show_default=True, help="Instance name in our HELLO.")
@click.option(
    "--framing",
    type=click.Choice(["lines", "length-prefixed"]),
    default="lines",
    show_default=True,
    help="Files/stdin: one message per line, or u32 big-endian length + bytes records.",
)
@click.option("--streams", type=int, default=None, help="Generated data: number of streams [1].")
@click.option("--count", type=int, default=None, help="Generated data: messages per stream [100].")
@click.option("--payload-size", type=int, default=64, show_default=True, help="Generated payload bytes.")
@click.option("--key", default=None, help="Message key; {stream} and {n} are filled in.")
@click.option(
    "--stream-prefix", default="stream", show_default=True, help="Generated stream names: PREFIX-i."
)
@click.option("--stream-name", "names", multiple=True, help="Name of each stream, in order (repeat).")
@click.option(
    "--stream-id",
    "ids",
    type=int,
    multiple=True,
    help="Explicit id of each stream, in order (default: hash).",
)
@click.option("--rate", type=float, default=None, help="At most this many new messages a second.")
@click.option(
    "--max-unacked",
    type=click.IntRange(1),
    default=65_536,
    show_default=True,
    help="Replay buffer cap: stop reading input while this many messages await an ACK.",
)
@click.option(
    "--max-frame-size",
    type=click.IntRange(64),
    default=DEFAULT_MAX_FRAME_SIZE,
    show_default=True,
    help="Largest frame to send or accept; a longer input record is refused.",
)
@click.option(
    "--retries", type=click.IntRange(0), default=5, show_default=True, help="Reconnects without progress."
)
@click.option(
    "--idle-timeout", type=float, default=30.0, show_default=True, help="Seconds of worker silence."
)
@click.option(
    "--dialect",
    type=click.Choice(["spec", "shipped"]),
    default="spec",
    show_default=True,
    help="shipped: 8-byte EOS_MESSAGE, and an ACK at the last message id finishes the stream.",
)
@record_option("Record the session to a pcap")
@summary_format
@verbosity(
    quiet="No progress bar or log lines: errors and the summary.",
    verbose="Also a line per connection made and per stream finished.",
)
def command(
    files: tuple[str, ...],
    address: tuple[str, int],
    version: str,
    cookie: str,
    program_name: str,
    instance_name: str,
    framing: str,
    streams: int | None,
    count: int | None,
    payload_size: int,
    key: str | None,
    stream_prefix: str,
    names: tuple[str, ...],
    ids: tuple[int, ...],
    rate: float | None,
    max_unacked: int,
    max_frame_size: int,
    retries: int,
    idle_timeout: float,
    dialect: str,
    record: str | None,
    fmt: str,
    verbosity: int,
) -> None:
    """A connector source: HELLO, NOTIFY each stream, stream MESSAGEs on credit, EOS, and
    reconnect with replay after a RESTART or a drop.

    FILES are read one stream each ("-" is stdin); without FILES, data is generated.
    Exit 0 when every stream's EOS is acknowledged, 1 on a worker ERROR or when
    retries run out, 2 on bad usage or input.
    """
    host, port = address
    try:
        inputs = build_inputs(
            files=list(files),
            framing=framing,
            streams=streams,
            count=count,
            payload_size=payload_size,
            key=key,
            names=list(names) or None,
            ids=list(ids) or None,
            max_frame_size=max_frame_size,
            prefix=stream_prefix,
        )
    except InputError as err:
        raise usage_error(str(err)) from err
    options = SourceOptions(
        host=host,
        port=port,
        version=version,
        cookie=cookie.encode("utf-8"),
        program_name=program_name,
        instance_name=instance_name,
        max_frame_size=max_frame_size,
        retries=retries,
        max_unacked=max_unacked,
        rate=rate,
        record=record,
        idle_timeout=idle_timeout,
        dialect=dialect,
    )
    err_console = rich_console(stderr=True)

    def log(message: str) -> None:
        if verbosity >= 0 or "resumed" in message:  # what a rerun skips is said even with -q
            err_console.print(
                f"[dim]wallaroo-proto mock-source:[/] {escape(message)}", highlight=False, soft_wrap=True
            )

    try:
        source = MockSource(inputs, options, log=log, trace=log if verbosity > 0 else lambda _line: None)
    except InputError as err:
        raise usage_error(str(err)) from err
    show_bar = verbosity >= 0 and fmt == "text" and sys.stderr.isatty()
    code, problem = runtime.run(_run(source, err_console if show_bar else None))
    stats = source.stats
    if not json_summary({**stats.as_dict(), "exit_code": code}, fmt):
        render(stats, code)
    if problem:
        click.echo(f"wallaroo-proto mock-source: {problem}", err=True)
    sys.exit(code)


async def _run(source: MockSource, console) -> tuple[int, str | None]:
    """Run the source under a progress bar; SIGINT/SIGTERM stop it cleanly."""
    main = asyncio.create_task(source.run())
    interrupted = []

    def stop() -> None:
        interrupted.append(True)
        main.cancel()

    on_stop_signals(stop)
    progress_task = asyncio.create_task(progress(source.stats, console)) if console else None
    try:
        await main
        return 0, None
    except asyncio.CancelledError:
        if not interrupted:
            raise
        source.stats.error = "interrupted"
        return EXIT_INTERRUPTED, "interrupted"
    except SourceFailed as err:
        source.stats.error = source.stats.error or str(err)
        return err.exit_code, str(err)
    finally:
        if progress_task is not None:
            progress_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress_task
