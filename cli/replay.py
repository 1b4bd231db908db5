"""``wallaroo-proto replay``: one side of a recorded conversation played against a live peer (thin CLI).

The work lives in ``wallaroo_proto.replay``. Exit codes: 0 every live frame matched the
recording; 1 a frame diverged, broke a rule, was missing or extra, or the replay stopped;
2 bad usage or setup (a capture without the conversation, nobody listening, no client
came); 130 interrupted.
"""

from __future__ import annotations

import click
from wallaroo_proto_cli.options import (
    CONNECT_ADDRESS,
    LISTEN_ADDRESS,
    Command,
    examples,
    format_address,
    summary_format,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.replay_view import outcome_line, print_report
from wallaroo_proto_cli.serving import ready

from wallaroo_proto.protocols import names
from wallaroo_proto.replay import engine
from wallaroo_proto.replay.links import LinkError, Listener
from wallaroo_proto.replay.recording import Conversation, RecordingError, find

NAME = "wallaroo-proto replay"


def parse_rate(text: str) -> float | None:
    """``--rate``: ``max`` (None: as fast as the peer answers), ``recorded`` (1.0) or ``xN``."""
    word = text.strip().lower()
    if word == "max":
        return None
    if word == "recorded":
        return 1.0
    if word.startswith("x"):
        try:
            speed = float(word[1:])
        except ValueError:
            speed = 0.0
        if speed > 0:
            return speed
    raise usage_error(f"--rate {text!r}: give recorded, xN (N times the recording's pace, N > 0) or max")


def selection_options(f):
    """The options that pick one conversation of a capture (``replay`` and ``diff``)."""
    f = click.option(
        "--port",
        "ports",
        type=click.IntRange(1, 65535),
        multiple=True,
        help="TCP port to read (repeat) [default: each protocol's], as dissect's.",
    )(f)
    f = click.option(
        "--protocol",
        type=click.Choice(names()),
        default=None,
        help="Read the capture's connections as this protocol [default: detected].",
    )(f)
    f = click.option(
        "-Y",
        "--display-filter",
        "display_filter",
        metavar="EXPR",
        help="The conversation holding a frame this matches (dissect's -Y grammar).",
    )(f)
    return click.option(
        "--connection",
        "connections",
        multiple=True,
        help="The conversation of this connection: its number or part of its id.",
    )(f)


#: ``--ignore FIELD`` (repeat): replay's and diff's.
ignore_option = click.option(
    "--ignore",
    multiple=True,
    metavar="FIELD",
    help="A field that may differ (repeat), beside the protocol's own (times, opaques, ...).",
)
#: ``--format text|json``: replay's and diff's summary (the peers' own option).
format_option = summary_format


def picked(capture: str, connections, matches, protocol: str | None, ports) -> Conversation:
    """The conversation the selection options pick in ``capture``; exit 2 naming the choices."""
    try:
        return find(
            capture, connections=tuple(connections), display_filter=matches, protocol=protocol,
            ports=tuple(ports) or None,
        )  # fmt: skip
    except (RecordingError, OSError) as err:
        raise usage_error(str(err)) from None


def compiled_filter(expression: str | None):
    if expression is None:
        return None
    from wallaroo_proto.display_filter import FilterError, compile_filter

    try:
        return compile_filter(expression)
    except FilterError as err:
        raise usage_error(f"-Y: {err}") from None


@click.command(
    name="replay",
    cls=Command,
    sections={
        "Which conversation": ["connections", "display_filter", "protocol", "ports"],
        "The live peer": ["play", "connect", "listen", "spawn"],
        "How": ["rate", "answer_timeout", "ignore", "learn_noise"],
        "Output": ["record", "fmt", "quiet", "verbose"],
    },
    epilog=examples(
        "wallaroo-proto replay source-session.pcap --play client --connect 127.0.0.1:7100",
        "wallaroo-proto replay sink.pcap --play server --listen 127.0.0.1:7200 --record live.pcapng",
        "wallaroo-proto replay dcp.pcap --play consumer --connect :11210 --learn-noise 2",
    ),
)
@click.argument("capture", type=click.Path(dir_okay=False))
@click.option(
    "--play",
    required=True,
    metavar="SIDE",
    help="The recording's side to play: client, server, or the protocol's name for a side "
    "(connector, worker, consumer, producer, daemon, processor, ic, lb).",
)
@click.option(
    "--connect",
    type=CONNECT_ADDRESS,
    multiple=True,
    help="The live peer to connect to, for each connection the played side opened (repeat).",
)
@click.option(
    "--listen",
    type=LISTEN_ADDRESS,
    multiple=True,
    help="Where the live peer connects, for connections it opened (repeat); port 0 binds a free "
    "one (the ready line names it).",
)
@click.option(
    "--spawn",
    metavar="CMD",
    help="Start CMD and play to it over its stdin and stdout (a Kinesis record processor).",
)
@selection_options
@click.option(
    "--rate",
    default="max",
    show_default=True,
    metavar="recorded|xN|max",
    help="max: as fast as the live peer answers, in the recording's order; recorded: at the "
    "recording's pace; xN: N times it.",
)
@click.option(
    "--answer-timeout",
    type=click.FloatRange(0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long each answer of the peer is waited for.",
)
@ignore_option
@click.option(
    "--learn-noise",
    type=click.IntRange(2),
    default=None,
    metavar="N",
    help="Replay N times first and ignore the fields that differ between those runs.",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write the live run as a pcapng, a comment on each frame that differs.",
)
@format_option
@verbosity(quiet="The summary only.", verbose="A line per frame, matched ones too.")
def command(
    capture,
    play,
    connect,
    listen,
    spawn,
    connections,
    display_filter,
    protocol,
    ports,
    rate,
    answer_timeout,
    ignore,
    learn_noise,
    record,
    fmt,
    verbosity,
) -> None:
    """Play one side of a recorded conversation against a live peer: adapt to the values it
    decides, judge each of its frames by the protocol's rules, and compare each with its
    recorded counterpart field by field."""
    speed = parse_rate(rate)
    if not connect and not listen and not spawn:
        raise usage_error("give the live peer: --connect HOST:PORT, --listen HOST:PORT or --spawn CMD")
    conversation = picked(capture, connections, compiled_filter(display_filter), protocol, ports)
    try:
        side = conversation.side_named(play)
    except ValueError as err:
        raise usage_error(f"--play: {err}") from None
    listeners = []
    try:
        for address in listen:
            listeners.append(Listener(address))
    except LinkError as err:
        raise usage_error(str(err)) from None
    for listener in listeners:
        ready(f"{NAME}: listening on {format_address(listener.address)}")
    options = engine.Options(
        side,
        connect=list(connect),
        listeners=listeners,
        spawn=spawn,
        answer_timeout=answer_timeout,
        speed=speed,
        ignore=frozenset(ignore),
        record=record,
    )
    try:
        if learn_noise:
            learned = engine.learn_noise(conversation, options, learn_noise)
            options.ignore |= learned
            if verbosity >= 0 and fmt == "text":
                shown = ", ".join(sorted(learned)) or "none"
                click.echo(f"{NAME}: learnt from {learn_noise} runs, ignored: {shown}", err=True)
        show = (lambda o: click.echo(outcome_line(o))) if verbosity > 0 and fmt == "text" else None
        report = engine.run(conversation, options, show)
    except (engine.ReplayError, LinkError) as err:
        raise usage_error(str(err)) from None
    finally:
        for listener in listeners:
            listener.close()
    print_report(report, fmt, verbosity)
    raise SystemExit(0 if report.ok else 1)
