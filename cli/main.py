"""The ``wallaroo-proto`` command group.

Exit codes: 0 success, 1 the work found a problem (violations under --strict,
a peer's ERROR), 2 bad usage or unusable input, 3 a subcommand not built yet.
"""

from __future__ import annotations

import click

from wallaroo_proto import __version__

EXIT_NOT_BUILT = 3


def _not_built(name: str, issue: str) -> click.Command:
    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=issue,
        short_help=issue,
    )
    def command() -> None:
        click.echo(f"wallaroo-proto {name}: not built yet in this version.", err=True)
        raise SystemExit(EXIT_NOT_BUILT)

    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wallaroo-proto")
def cli() -> None:
    """A toolkit for the Wallaroo connector protocol v3: mock peers, a capture
    dissector and a Spark replay job."""


for _name, _help in [
    ("mock-worker", "Play a Wallaroo worker for connector sources (and drive a sink)."),
    ("mock-source", "A connector source that streams data to a worker."),
    ("mock-sink", "A connector sink with durable two-phase commit."),
    ("dissect", "Show, filter and validate the frames in pcap/pcapng captures."),
    ("spark-replay", "Feed captures into a PySpark batch job."),
]:
    cli.add_command(_not_built(_name, _help))


def main() -> None:
    cli()
