"""``wallaroo-proto mock-sink``: a connector sink with durable two-phase commit, and ``--check``.

Thin: parses options, runs ``wallaroo_proto.protocols.wallaroo.sink.SinkServer`` or
``wallaroo_proto.protocols.wallaroo.txnlog.check_directory`` and renders the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import click
from rich.markup import escape
from wallaroo_proto_cli.options import (
    Command,
    examples,
    format_address,
    hidden_alias,
    listen_option,
    open_failure,
    os_reason,
    output_option,
    protocol_version_option,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.serving import on_stop_signals, ready

from wallaroo_proto import runtime
from wallaroo_proto.protocols.wallaroo.faults import NO_FAULTS, FaultFileError, load_faults
from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE, SINK_VERSION
from wallaroo_proto.protocols.wallaroo.sink import SinkServer
from wallaroo_proto.protocols.wallaroo.txnlog import COMPACT_AT, check_directory


def _console(stderr: bool):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


@click.command(
    name="mock-sink",
    cls=Command,
    epilog=examples(
        "wallaroo-proto mock-sink",
        "wallaroo-proto mock-sink --listen :0 -o sink-out --faults faults.toml",
        "wallaroo-proto mock-sink --check sink-out",
    ),
)
@listen_option(7200, "Address workers connect to")
@output_option(
    "Folder for one output file and one transaction log per worker instance.",
    type=click.Path(file_okay=False),
    default="mock-sink-out",
    show_default=True,
)
@hidden_alias("--out-dir", "output", type=click.Path(file_okay=False))
@click.option("--faults", "faults_file", type=click.Path(dir_okay=False), help="Fault file (TOML or JSON).")
@protocol_version_option(SINK_VERSION, "Protocol version to accept.")
@click.option("--cookie", default="", help="Cookie workers must send (empty by default).")
@click.option("--reply-phase2", is_flag=True, help="Also REPLY to PHASE2 (the shipped sink does not).")
@click.option(
    "--max-frame-size",
    type=click.IntRange(64),
    default=DEFAULT_MAX_FRAME_SIZE,
    show_default=True,
    help="Largest frame length accepted; a longer length prefix gets ERROR.",
)
@click.option(
    "--compact-log-at",
    type=click.IntRange(1),
    default=COMPACT_AT,
    show_default=True,
    help="Compact an instance's transaction log once it is this many bytes.",
)
@click.option(
    "--check",
    "check_dir",
    type=click.Path(),
    default=None,
    help="Do not serve: verify this output folder against its logs and exit (1 on a problem).",
)
@summary_format
@verbosity(
    quiet="No event lines on stderr: errors and the summary.",
    verbose="Also a line per PHASE1 vote and PHASE2 decision.",
)
def command(
    listen: tuple[str, int],
    output: str,
    faults_file: str | None,
    version: str,
    cookie: str,
    reply_phase2: bool,
    max_frame_size: int,
    compact_log_at: int,
    check_dir: str | None,
    fmt: str,
    verbosity: int,
) -> None:
    """A connector sink: HELLO/OK, NOTIFY_ACK, REPLY_UNCOMMITTED, data at byte offsets on the
    NOTIFYed stream, and PHASE1/PHASE2 made durable in a checksummed, fsynced transaction log.

    Survives kill -9 at any moment: on start it recovers every instance in its --output
    folder. Exit 0 on SIGINT/SIGTERM; 2 on bad usage (a bad fault file, an unusable folder).
    """
    if check_dir is not None:
        _check(check_dir, fmt)
        return
    faults = NO_FAULTS
    if faults_file:
        try:
            faults = load_faults(faults_file)
        except FaultFileError as err:
            raise usage_error(str(err)) from err
    err_console = _console(stderr=True)

    def log(line: str) -> None:
        if verbosity >= 0:
            err_console.print(f"[dim]wallaroo-proto mock-sink:[/] {escape(line)}", markup=True)

    server = SinkServer(
        output,
        version=version,
        cookie=cookie.encode("utf-8"),
        faults=faults,
        reply_phase2=reply_phase2,
        max_frame_size=max_frame_size,
        log=log,
        trace=log if verbosity > 0 else lambda line: None,
        compact_at=compact_log_at,
    )
    try:
        for note in server.recover_all():
            log(f"recovered {note}")
    except OSError as err:
        raise usage_error(open_failure(err, "--output")) from err
    try:
        runtime.run(_serve(server, *listen))
    except OSError as err:
        raise usage_error(f"cannot listen on {format_address(listen)}: {os_reason(err)}") from err
    finally:
        server.close()
    for note in faults.never_fired():
        err_console.print(f"wallaroo-proto mock-sink: {escape(note)}")
    stats = server.stats.as_dict()
    if fmt == "json":
        click.echo(json.dumps({"summary": stats}))
    else:
        err_console.print(
            f"mock-sink summary: {stats['connections']} connection(s), {stats['messages']} messages "
            f"({stats['bytes']} bytes), {stats['commits']} commit(s), {stats['aborts']} abort(s), "
            f"{stats['errors']} ERROR(s) sent"
        )


async def _serve(server: SinkServer, host: str, port: int) -> None:
    # Handlers first: a SIGTERM sent the moment the ready line appears must still end cleanly.
    stop = on_stop_signals()
    listener = await server.start(host, port)
    bound = listener.sockets[0].getsockname()
    ready(f"wallaroo-proto mock-sink: listening on {bound[0]}:{bound[1]}")
    await stop.wait()
    listener.close()
    await server.shutdown()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(listener.wait_closed(), 2)


def _check(check_dir: str, fmt: str) -> None:
    try:
        results = check_directory(check_dir)
    except OSError as err:
        raise usage_error(f"--check {check_dir}: {err.strerror or err}") from err
    ok = all(r.ok for r in results)
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "ok": ok,
                    "instances": [
                        {
                            "instance": r.instance,
                            "ok": r.ok,
                            "committed": r.committed,
                            "output_length": r.output_length,
                            "undecided": [{"txn_id": t, "start": s, "end": e} for t, s, e in r.undecided],
                            "uncommitted_tail": r.uncommitted_tail,
                            "torn_log_bytes": r.torn_bytes,
                            "problems": r.problems,
                        }
                        for r in results
                    ],
                }
            )
        )
    else:
        from rich.table import Table

        table = Table(title=f"mock-sink --check {check_dir}")
        for column in ("instance", "committed", "file", "undecided txns", "notes"):
            table.add_column(column)
        for r in results:
            notes = list(r.problems)
            if r.uncommitted_tail:
                notes.append(f"{r.uncommitted_tail} unvoted bytes past the durable end (dropped on recovery)")
            if r.torn_bytes:
                notes.append(f"torn last log record ({r.torn_bytes} bytes, ignored on recovery)")
            undecided = ", ".join(f"{t} [{s}, {e})" for t, s, e in r.undecided) or "-"
            status = "[green]ok[/]" if r.ok else "[red]FAIL[/]"
            table.add_row(
                f"{status} {r.instance}", str(r.committed), str(r.output_length), undecided, "; ".join(notes)
            )
        console = _console(stderr=False)
        console.print(table)
        console.print(f"{len(results)} instance(s): " + ("consistent" if ok else "INCONSISTENT"))
    if not ok:
        raise SystemExit(1)
