"""``wallaroo-proto wireshark-dissector``: write the Lua plugin for Wireshark/tshark.

Thin: the plugin text comes from ``wallaroo_proto.protocols.wallaroo.wireshark.generate``.
"""

from __future__ import annotations

import click

from wallaroo_proto.protocols.wallaroo.frames import DEFAULT_MAX_FRAME_SIZE
from wallaroo_proto.protocols.wallaroo.wireshark import generate
from wallaroo_proto.records import DEFAULT_PORTS


@click.command(name="wireshark-dissector")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    show_default=True,
    help="Where to write the plugin ('-' = stdout).",
)
@click.option(
    "--port",
    "ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    help="TCP ports to register on (repeat) [default: 7100 and 7200].",
)
@click.option("--max-frame-size", type=click.IntRange(1), default=DEFAULT_MAX_FRAME_SIZE, show_default=True)
def command(output: str, ports: tuple[int, ...], max_frame_size: int) -> None:
    """Write a Lua dissector that decodes every frame type, 2PC included.

    Use it with `tshark -X lua_script:FILE` or copy it to Wireshark's personal
    Lua plugins folder (Help > About > Folders).
    """
    text = generate(ports or DEFAULT_PORTS, max_frame_size)
    try:
        with click.open_file(output, "w", atomic=output != "-") as out:
            out.write(text)
    except OSError as err:
        failure = click.ClickException(f"cannot write {output}: {err.strerror or err}")
        failure.exit_code = 2
        raise failure from err
    if output != "-":
        click.echo(f"wallaroo-proto wireshark-dissector: wrote {output}", err=True)
