"""Pieces every generated Wireshark Lua plugin shares: Lua literals, the PDU loop, tshark's command line.

Protocol-agnostic: each plug-in's own ``wireshark.py`` writes its fields and
decoding, and takes these so that reassembly and testing work one way for all.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from wallaroo_proto.protocols import get_plugin


def lua_table(items: Iterable[tuple[int, str]]) -> str:
    """A Lua table literal ``{ [n] = "name", ... }`` (a value-string table for a ProtoField)."""
    return "{ " + ", ".join(f"[{int(n)}] = {lua_string(name)}" for n, name in items) + " }"


def lua_string(text: str) -> str:
    """A double-quoted Lua string literal."""
    escaped = "".join(c if c.isalnum() or c in " _-.:/()" else f"\\{ord(c):03d}" for c in text)
    return f'"{escaped}"'


def lua_ports(ports: Iterable[int]) -> str:
    """The ports, sorted and unique, as the inside of a Lua list."""
    return ", ".join(str(int(p)) for p in sorted(set(ports)))


#: Lua: split a TCP payload into PDUs and ask TCP for the rest of a PDU cut short.
#: ``pdu_length(tvb, offset)`` returns the PDU's length in bytes; nil when more bytes are
#: needed to tell; or false and a reason when the bytes at ``offset`` cannot start a PDU
#: (``malformed(range, pinfo, tree, reason)`` then shows them, and the rest is not read).
def lua_registration(proto: str, ports: Iterable[int]) -> str:
    """The Lua that hands ``proto`` the TCP ``ports`` and lets it claim other ports by a
    ``heuristic`` (the plugin's local function of that name)."""
    return (
        'local tcp_port = DissectorTable.get("tcp.port")\n'
        f"for _, port in ipairs({{ {lua_ports(ports)} }}) do\n"
        f"    tcp_port:add(port, {proto})\n"
        "end\n"
        f'{proto}:register_heuristic("tcp", heuristic)'
    )


PDU_LOOP = r"""
local function each_pdu(tvb, pinfo, tree, pdu_length, dissect_pdu, malformed)
    local offset, total = 0, tvb:len()
    while offset < total do
        local n, why = pdu_length(tvb, offset)
        if n == false then
            malformed(tvb(offset), pinfo, tree, why)
            return total
        end
        if n == nil or offset + n > total then
            pinfo.desegment_offset = offset
            pinfo.desegment_len = n and (offset + n - total) or DESEGMENT_ONE_MORE_SEGMENT
            return total
        end
        dissect_pdu(tvb(offset, n):tvb(), pinfo, tree)
        offset = offset + n
    end
    return total
end
"""

#: tshark options that match the plugins' reassembly (out-of-order segments included).
TSHARK_OPTIONS = (
    "-o",
    "tcp.desegment_tcp_streams:TRUE",
    "-o",
    "tcp.reassemble_out_of_order:TRUE",
    "-o",
    "tcp.analyze_sequence_numbers:TRUE",
)


def tshark_command(protocol: str, plugin: str, capture: str, *fields: str) -> list[str]:
    """A tshark command line printing ``fields`` for every packet holding ``protocol``'s PDUs."""
    cmd = ["tshark", "-n", "-X", f"lua_script:{plugin}", *TSHARK_OPTIONS, "-r", capture, "-Y", protocol]
    if fields:
        cmd += ["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"]
        for name in fields:
            cmd += ["-e", name]
    return cmd


#: Protocols with a generated plugin (tshark's own couchbase and websocket dissectors read DCP and Tremor).
PROTOCOLS = ("wallaroo", "kinesis", "ambrosia")


def generate(protocol: str, ports: Iterable[int] = (), max_frame_size: int | None = None) -> str:
    """``protocol``'s plugin text, on ``ports`` (default: the plug-in's ports), with its size limit."""
    if protocol not in PROTOCOLS:
        raise KeyError(f"no Lua plugin for {protocol!r} (there is one for {', '.join(PROTOCOLS)})")
    module = importlib.import_module(f"wallaroo_proto.protocols.{protocol}.wireshark")
    ports = tuple(ports) or get_plugin(protocol).default_ports
    if max_frame_size is None:
        return module.generate(ports)
    return module.generate(ports, max_frame_size)
