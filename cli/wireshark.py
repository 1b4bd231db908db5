"""``wallaroo-proto wireshark-dissector``: write the Lua plugin for Wireshark/tshark.

Thin: the plugin text comes from ``wallaroo_proto.wireshark_lua.generate`` (each
protocol's own ``wireshark`` module).
"""

from __future__ import annotations

import click
from wallaroo_proto_cli.options import Command, examples, open_failure, output_option, usage_error, verbosity

from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.wireshark_lua import PROTOCOLS, generate


@click.command(
    name="wireshark-dissector",
    cls=Command,
    epilog=examples(
        "wallaroo-proto wireshark-dissector -o wallaroo.lua",
        "tshark -X lua_script:wallaroo.lua -r capture.pcap",
        "wallaroo-proto wireshark-dissector --port 9000 -o ~/.local/lib/wireshark/plugins/wallaroo.lua",
        "wallaroo-proto wireshark-dissector --protocol kinesis -o kinesis.lua",
    ),
)
@output_option(
    "Where to write the plugin ('-' = stdout).",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    show_default=True,
)
@click.option(
    "--protocol",
    type=click.Choice(PROTOCOLS),
    default="wallaroo",
    show_default=True,
    help="Whose plugin (DCP and Tremor: tshark's own couchbase and websocket dissectors, see the README).",
)
@click.option(
    "--port",
    "ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    help="TCP ports to register on (repeat) [default: the protocol's: wallaroo 7100 and 7200, "
    "kinesis 7300, ambrosia 2000 and 2001].",
)
@click.option(
    "--max-frame-size",
    type=click.IntRange(1),
    help="The plugin marks a longer frame (Kinesis: line; AMBROSIA: record or message) as malformed "
    "[default: wallaroo 4 MiB, kinesis and ambrosia 64 MiB].",
)
@verbosity(
    quiet="No 'wrote FILE' line.",
    verbose="Also the ports the plugin registers on.",
)
def command(
    output: str, protocol: str, ports: tuple[int, ...], max_frame_size: int | None, verbosity: int
) -> None:
    """Write a Lua dissector that decodes every frame type (Wallaroo: 2PC included).

    Use it with `tshark -X lua_script:FILE` or copy it to Wireshark's personal
    Lua plugins folder (Help > About > Folders).
    """
    ports = ports or get_plugin(protocol).default_ports
    text = generate(protocol, ports, max_frame_size)
    try:
        with click.open_file(output, "w", atomic=output != "-") as out:
            out.write(text)
    except OSError as err:
        raise usage_error(open_failure(err, "--output", output)) from err
    if output != "-" and verbosity >= 0:
        click.echo(f"wallaroo-proto wireshark-dissector: wrote {output}", err=True)
    if verbosity > 0:
        shown = ", ".join(map(str, ports))
        click.echo(f"wallaroo-proto wireshark-dissector: the plugin registers on TCP ports {shown}", err=True)
