"""How ``mock-source`` shows its run: the progress bar on stderr and the summary table."""

from __future__ import annotations

import asyncio

from wallaroo_proto.protocols.wallaroo.source import SourceStats


async def progress(stats: SourceStats, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]mock-source"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("send", total=stats.total, detail="")
        while True:
            elapsed = stats.elapsed or 1e-9
            bar.update(
                task,
                completed=stats.messages,
                detail=f"{stats.messages / elapsed:,.0f} msg/s  acked {stats.acknowledged:,}  "
                f"replayed {stats.replayed:,}  conns {stats.connections}",
            )
            await asyncio.sleep(0.1)


def rich_console(stderr: bool):
    from rich.console import Console

    return Console(stderr=stderr)


def render(stats: SourceStats, code: int) -> None:
    from rich.table import Table

    data = stats.as_dict()
    table = Table(title="mock-source summary", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("streams done", f"{data['streams_done']} / {data['streams']}"),
        ("messages", f"{data['messages']:,}"),
        ("replayed", f"{data['replayed']:,}"),
        ("acknowledged", f"{data['acknowledged']:,}"),
        ("payload bytes", f"{data['payload_bytes']:,}"),
        ("connections", str(data["connections"])),
        ("restarts / drops", f"{data['restarts']} / {data['drops']}"),
        ("refused NOTIFYs", str(data["refusals"])),
        *(
            (
                "resumed",
                f"{r['stream']}: {r['skipped']:,} skipped"
                + (", nothing left to send" if r["nothing_left"] else "")
                + " (the worker held them)",
            )
            for r in data["resumed"]
        ),
        ("elapsed", f"{data['elapsed_s']:.3f} s"),
        ("throughput", f"{data['messages_per_s']:,.0f} msg/s  {data['mb_per_s']:.2f} MB/s"),
        ("result", "ok" if code == 0 else f"exit {code}: {data['error']}"),
    ]
    for row in rows:
        table.add_row(*row)
    rich_console(stderr=False).print(table)
