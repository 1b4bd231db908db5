"""``wallaroo-proto diff``: two captures of one protocol's conversation compared frame by frame (thin CLI).

The work lives in ``wallaroo_proto.replay.diff``, replay's comparison without a live peer.
Exit codes: 0 the same (but for the protocol's noise and ``--ignore``); 1 a frame diverged,
broke a rule, or is in one capture only; 2 bad usage or a capture without the conversation.
"""

from __future__ import annotations

import click
from wallaroo_proto_cli.options import Command, examples, usage_error, verbosity
from wallaroo_proto_cli.replay import compiled_filter, format_option, ignore_option, picked, selection_options
from wallaroo_proto_cli.replay_view import print_report

from wallaroo_proto.replay.diff import DiffError, diff


@click.command(
    name="diff",
    cls=Command,
    epilog=examples(
        "wallaroo-proto diff yesterday.pcap today.pcap",
        "wallaroo-proto diff a.pcap b.pcap --connection 2 --ignore credits --format json",
    ),
)
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False))
@selection_options
@ignore_option
@format_option
@verbosity(quiet="The summary line only.", verbose="Every frame that is not matched (not only the first 20).")
def command(first, second, connections, display_filter, protocol, ports, ignore, fmt, verbosity) -> None:
    """Compare the conversation in FIRST with the one in SECOND: each side's frames matched by
    the protocol's own keys and compared field by field, with replay's ignore rules."""
    matches = compiled_filter(display_filter)
    one, two = (picked(c, connections, matches, protocol, ports) for c in (first, second))
    try:
        report = diff(one, two, frozenset(ignore))
    except DiffError as err:
        raise usage_error(str(err)) from None
    print_report(report, fmt, verbosity)
    raise SystemExit(0 if report.ok else 1)
