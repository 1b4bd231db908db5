"""``wallaroo-proto wireshark-dissector``: write the Lua plugin for Wireshark/tshark.

Thin: the plugin text comes from ``wallaroo_proto.protocols.wallaroo.wireshark.generate``.
"""

from __future__ import annotations

import click
from wallaroo_proto_cli.options import Command, examples, open_failure, output_option, usage_error, verbosity

from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE
from wallaroo_proto.protocols.wallaroo.wireshark import generate
from wallaroo_proto.records import DEFAULT_PORTS


@click.command(
    name="wireshark-dissector",
    cls=Command,
    epilog=examples(
        "wallaroo-proto wireshark-dissector -o wallaroo.lua",
        "tshark -X lua_script:wallaroo.lua -r capture.pcap",
        "wallaroo-proto wireshark-dissector --port 9000 -o ~/.local/lib/wireshark/plugins/wallaroo.lua",
    ),
)
@output_option(
    "Where to write the plugin ('-' = stdout).",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    show_default=True,
)
@click.option(
    "--port",
    "ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    help="TCP ports to register on (repeat) [default: 7100 and 7200].",
)
@click.option(
    "--max-frame-size",
    type=click.IntRange(1),
    default=DEFAULT_MAX_FRAME_SIZE,
    show_default=True,
    help="The plugin marks a longer frame length prefix as malformed.",
)
@verbosity(
    quiet="No 'wrote FILE' line.",
    verbose="Also the ports the plugin registers on.",
)
def command(output: str, ports: tuple[int, ...], max_frame_size: int, verbosity: int) -> None:
    """Write a Lua dissector that decodes every frame type, 2PC included.

    Use it with `tshark -X lua_script:FILE` or copy it to Wireshark's personal
    Lua plugins folder (Help > About > Folders).
    """
    text = generate(ports or DEFAULT_PORTS, max_frame_size)
    try:
        with click.open_file(output, "w", atomic=output != "-") as out:
            out.write(text)
    except OSError as err:
        raise usage_error(open_failure(err, "--output", output)) from err
    if output != "-" and verbosity >= 0:
        click.echo(f"wallaroo-proto wireshark-dissector: wrote {output}", err=True)
    if verbosity > 0:
        shown = ", ".join(map(str, ports or DEFAULT_PORTS))
        click.echo(f"wallaroo-proto wireshark-dissector: the plugin registers on TCP ports {shown}", err=True)
