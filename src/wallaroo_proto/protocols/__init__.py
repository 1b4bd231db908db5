"""The protocols the capture dissector and spark-replay read: one plug-in each, and their registry.

A plug-in is one ``ProtocolPlugin`` value, made by its package's ``plugin``
module. The shared machinery (``capture``: capture reading, TCP reassembly,
connection detection, output; ``spark``) knows protocols only through it, and
no plug-in imports another. To add a protocol: a package here with its codec
and sans-IO core, a ``plugin.py`` making a ``PLUGIN`` (which declares the
protocol's record fields with their types and meanings, in ``record_fields``, and what it
offers the other tools (Spark reports, conformance suites, proxy faults) as fields too:
``schema.fields()`` is the common fields joined with every plug-in's, so new
columns come last), and its module name in ``_PLUGIN_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from wallaroo_proto.records import join_fields

#: The frame-length limit every protocol was read with before its plug-in declared its own, and
#: ``dissect --max-frame-size``'s default (which applies to every protocol at once).
DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024


def own_connection(key: Any) -> tuple:
    """The default ``part_key``: a connection's dissection needs no other connection's."""
    return key


#: The registry, in detection order: a connection's first bytes go to each detector in turn.
_PLUGIN_MODULES = (
    "wallaroo_proto.protocols.wallaroo.plugin",
    "wallaroo_proto.protocols.kinesis.plugin",
    "wallaroo_proto.protocols.dcp.plugin",
    "wallaroo_proto.protocols.ambrosia.plugin",
    "wallaroo_proto.protocols.tremor.plugin",
)


@dataclass(frozen=True)
class ProtocolPlugin:
    """What a protocol gives the shared dissector and spark-replay.

    The framer, decoder and judge are the protocol's sans-IO pieces; the
    tracker puts them together for one TCP connection, as the driver's
    reassembler feeds it (``tracker(driver, index, client, server, client_known)``
    with ``dirs`` {True: client's, False: server's} consumers of
    ``capture.reassembly.HalfStream``, ``summary``, ``finish()``, ``release()``).
    """

    #: ``--protocol`` value and every record's ``protocol`` field.
    name: str
    #: Connections on these ports are this protocol's without looking at their bytes.
    default_ports: tuple[int, ...]
    #: ``detect(first_bytes, max_frame_size, final)``: do a connection's first bytes open this
    #: protocol? ``None`` (only when not ``final``): these bytes cannot tell yet, more may.
    #: The driver waits for more bytes rather than decide on a short first segment.
    detect: Callable[[bytes, int, bool], bool | None]
    #: Its frame-length limit: a longer length prefix is a violation. ``detect`` is given it, and
    #: the tracker asks the driver (``Dissector.frame_limit``), which gives the user's limit if one.
    max_frame_size: int
    #: One direction's splitter: ``feed(bytes)`` gives frames, ``gap(n)`` resyncs after lost bytes.
    framer: Callable[..., Any]
    #: A frame's bytes to its value.
    decode: Callable[..., Any]
    #: A connection's sans-IO state machine that judges each frame (accepted / violation with a reason).
    judge: Callable[..., Any]
    #: The driver's per-connection handler: frames, records and the summary.
    tracker: Callable[..., Any]
    #: Its own record fields, (name, type, meaning) each, beside ``records.COMMON_FIELDS``;
    #: ``schema.fields()`` joins them (a name two plug-ins declare needs one type in both).
    record_fields: tuple[tuple[str, str, str], ...]
    #: Its frame and message type names, for ``dissect --type``.
    type_names: tuple[str, ...]
    #: ``print_summary(console, summary)``: one connection's ``dissect --summary``.
    print_summary: Callable[[Any, dict], None]
    #: ``describe(record)``: the fields column of ``dissect``'s table.
    describe: Callable[[dict], str]
    #: Its spark-replay reports: table name -> builder over its own rows of ``frames``.
    spark_reports: Callable[[], Mapping[str, Callable[[Any], Any]]]
    #: Printed titles of its reports, by table name (the order they print in).
    report_titles: Mapping[str, str]
    #: Optional: makes one collector per connection for ``report`` (``feed(record)``, ``finish()`` ->
    #: ``report.signals.Signals``): its time series, checkpoint markers and latency distributions.
    report_signals: Callable[[], Any] | None = None
    #: Optional: fields about the whole connection, as ``record_fields``, but joined among
    #: ``records.CONNECTION_FIELDS`` (columns after the endpoints, before the frame fields).
    connection_fields: tuple[tuple[str, str, str], ...] = ()
    #: Optional: ``part_key(records.ConnectionKey) -> tuple`` of str and int. A capture split
    #: across tasks keeps connections with one part key in one task, so a plug-in whose
    #: dissection of one connection reads another's state gives them one key (default: each
    #: connection its own).
    part_key: Callable[[Any], tuple] = own_connection
    #: Optional: ``conformance_suites()`` -> its ``conformance.runner.Suite``s, for ``conformance``
    #: (a function, so the suites are imported only when asked for).
    conformance_suites: Callable[[], tuple[Any, ...]] | None = None
    #: Optional: ``proxy_faults()`` -> its fault kit for ``proxy`` (``proxy.faultkit``): the module
    #: with ``adapter()`` and ``NAMED_FAULTS`` (imported when asked for).
    proxy_faults: Callable[[], Any] | None = None
    #: Optional: the structs its ``array<struct:K>`` fields hold, K -> ((key, scalar type), ...).
    structs: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    #: Optional: its spark-replay reports keep plain names (``messages``, not ``wallaroo_messages``):
    #: Wallaroo's, which were the first and whose names users' jobs already use.
    plain_table_names: bool = False
    #: Optional: spark-replay prints its reports even when no capture holds its connections
    #: (Wallaroo's, printed so since they were the only ones).
    reports_always_printed: bool = False
    #: Optional: its field that says what a connection is for (Wallaroo's ``use``: source or
    #: sink), the ``use`` column of spark-replay's ``connections``.
    use_field: str | None = None
    #: Optional: ``replay_adapter()`` -> its module for ``replay`` and ``diff`` (``replay.adapter``
    #: says what it holds): how a recorded frame follows a live peer, which fields may differ.
    replay_adapter: Callable[[], Any] | None = None
    #: Optional: ``fuzz_hooks()`` -> its module for ``fuzz`` (``fuzz.hooks`` says what it holds):
    #: its frames' fields, what its peers owe, how they refuse.
    fuzz_hooks: Callable[[], Any] | None = None
    #: Optional: integer fields shown in hex (as Wireshark's BASE_HEX), name -> digits, so the
    #: table, ``-T fields`` and the summary write one value one way: ``0x`` and zero-padded.
    hex_fields: Mapping[str, int] = field(default_factory=dict)


@cache
def plugins() -> tuple[ProtocolPlugin, ...]:
    """Every registered plug-in, in detection order (imported on first use).

    Raises ``records.FieldClash`` if their record fields do not join (e.g. one name, two types).
    """
    found = tuple(importlib.import_module(name).PLUGIN for name in _PLUGIN_MODULES)
    join_fields(found)
    return found


def names() -> tuple[str, ...]:
    return tuple(p.name for p in plugins())


def get_plugin(name: str) -> ProtocolPlugin:
    """The plug-in called ``name``; KeyError names the known ones."""
    for plugin in plugins():
        if plugin.name == name:
            return plugin
    raise KeyError(f"unknown protocol {name!r} (known: {', '.join(names())})")


@cache
def hex_fields() -> dict[str, int]:
    """Every plug-in's hex fields (``ProtocolPlugin.hex_fields``), joined."""
    return {name: digits for plugin in plugins() for name, digits in plugin.hex_fields.items()}


def as_hex(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


def table_name(protocol: str, table: str) -> str:
    """A protocol's report as a table: ``<protocol>_<table>``, or ``table`` when its plug-in keeps
    plain names (``ProtocolPlugin.plain_table_names``)."""
    return table if get_plugin(protocol).plain_table_names else f"{protocol}_{table}"


__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "ProtocolPlugin",
    "as_hex",
    "get_plugin",
    "hex_fields",
    "names",
    "own_connection",
    "plugins",
    "table_name",
]
