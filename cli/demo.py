"""``wallaroo-proto demo``: the whole toolkit on loopback, the project's main job."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click
from rich.console import Console
from wallaroo_proto_cli.options import Command, examples, problem, verbosity

from wallaroo_proto.demo import DemoConfig, DemoFailed, Step, run_demo


@click.command(
    name="demo",
    cls=Command,
    epilog=examples(
        "wallaroo-proto demo",
        "wallaroo-proto demo --no-spark --workdir demo-run",
        "wallaroo-proto demo --streams 5 --count 2000 --master 'local[4]'",
    ),
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep inputs, recordings, sink output and logs here.  [default: a new temporary directory]",
)
@click.option(
    "--streams", type=click.IntRange(1, 50), default=3, show_default=True, help="Streams mock-source sends."
)
@click.option("--count", type=click.IntRange(1), default=400, show_default=True, help="Messages per stream.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master for spark-replay.")
@click.option("--no-spark", is_flag=True, help="Skip the spark-replay step.")
@verbosity(
    quiet="A line per step only, no tables; a failure in full.",
    verbose="Also the tail of each peer's log when a step fails.",
)
def command(
    workdir: Path | None, streams: int, count: int, master: str, no_spark: bool, verbosity: int
) -> None:
    """Run mock-source -> mock-worker -> mock-sink with a RESTART and an abort vote
    injected, record it, check exactly-once delivery, dissect the recordings, draw
    them as an HTML report (its path is printed) and audit them with spark-replay."""
    console = Console(highlight=False)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="wallaroo-proto-demo-"))
    console.print(f"[bold]wallaroo-proto demo[/] in {workdir}")

    def report(step: Step) -> None:
        mark = "[green]ok[/]" if step.ok else "[red]FAILED[/]"
        console.print(f"  {mark} [bold]{step.name}[/]: {step.detail}")
        if step.output.strip() and (verbosity >= 0 or not step.ok):
            console.out(step.output.rstrip(), highlight=False)

    config = DemoConfig(
        workdir=workdir,
        streams=streams,
        count=count,
        spark=not no_spark,
        master=master,
        columns=console.width,
    )
    try:
        run_demo(config, report)
    except DemoFailed as err:
        console.print(f"inputs, recordings, sink output and logs are in {workdir}")
        if verbosity > 0:
            for log in sorted((workdir / "logs").glob("*.log")):
                console.out(f"--- {log}\n" + "\n".join(log.read_text().splitlines()[-20:]), highlight=False)
        raise problem(f"failed: {err}") from None
    except KeyboardInterrupt:
        console.print(f"interrupted; what was done so far is in {workdir}")
        raise
    console.print(f"[green]demo passed[/]; recordings in {workdir / 'captures'}, logs in {workdir / 'logs'}")
    console.print(f"report: {workdir / 'report.html'}", soft_wrap=True)
