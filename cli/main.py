"""The ``wallaroo-proto`` command group.

Each subcommand lives in its own module and is imported only when run, so
``--help`` stays fast and a slow import (scapy, pyspark) is paid only by the
command that needs it. A subcommand whose module is not there yet says so.

Exit codes: 0 success; 1 the work found a problem (violations under --strict,
a peer's ERROR, a failed check); 2 bad usage or unusable input; 3 a subcommand
that is not built in this version; 130 interrupted.
"""

from __future__ import annotations

import importlib

import click
from wallaroo_proto_cli.options import Group

from wallaroo_proto import __version__

EXIT_NOT_BUILT = 3

# name -> (module in this package, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "mock-worker": ("mock_worker", "Play a Wallaroo worker for connector sources (and drive a sink)."),
    "mock-source": ("mock_source", "A connector source that streams data to a worker."),
    "mock-sink": ("mock_sink", "A connector sink with durable two-phase commit."),
    "dissect": ("dissect", "Show, filter and validate the frames in pcap/pcapng captures."),
    "wireshark-dissector": ("wireshark", "Write a Wireshark Lua plugin for the protocol."),
    "report": ("report", "Draw captures as one offline HTML report: ladders, time series, latencies."),
    "spark-replay": ("spark_replay", "Feed captures into a PySpark batch job."),
    "kinesis": ("kinesis", "Kinesis MultiLangDaemon: a mock daemon and a mock record processor."),
    "conformance": (
        "conformance",
        "Test an implementation against a protocol's rules, one suite per role.",
    ),
    "dcp": ("dcp", "Couchbase DCP: a mock producer and a mock consumer."),
    "ambrosia": ("ambrosia", "AMBROSIA IC <-> language binding: a mock IC and a mock language binding."),
    "tremor": ("tremor", "Tremor network protocol (WebSocket): a mock node and a mock client."),
    "proxy": ("proxy", "Stand between two real peers: forward, record and check their conversation live."),
    "replay": ("replay", "Play one side of a recorded conversation against a live peer and compare."),
    "fuzz": ("fuzz", "Fuzz a live peer with mutants of recorded conversations; the core judges."),
    "diff": ("diff", "Compare two captures of one protocol's conversation, frame by frame."),
    "demo": ("demo", "Run the whole toolkit on loopback: the main job."),
}


def _not_built(name: str, help_text: str) -> click.Command:
    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=f"{help_text} (Not built yet in this version.)",
        short_help=help_text,
        add_help_option=False,
    )
    def command() -> None:
        click.echo(f"wallaroo-proto {name}: not built yet in this version.", err=True)
        raise SystemExit(EXIT_NOT_BUILT)

    return command


class LazyGroup(Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The one-line helps from ``SUBCOMMANDS``: ``--help`` imports no subcommand (scapy, pyspark)."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in sorted(SUBCOMMANDS.items())])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SUBCOMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, help_text = entry
        try:
            module = importlib.import_module(f"{__package__}.{module_name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__package__}.{module_name}":
                raise
            return _not_built(cmd_name, help_text)
        command = module.command
        command.short_help = help_text
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="wallaroo-proto")
def cli() -> None:
    """A toolkit for streaming-connector protocols (Wallaroo connector v3, Kinesis
    MLD, Couchbase DCP, AMBROSIA, Tremor): mock peers, a capture dissector, a Spark
    replay job, reports and conformance suites."""


def main() -> None:
    cli()
