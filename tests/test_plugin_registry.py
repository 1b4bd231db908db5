"""The plug-in is the one way a protocol is found: what its package brings, its plug-in offers."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from wallaroo_proto import conformance, protocols
from wallaroo_proto.capture import dissector
from wallaroo_proto.capture.dissector import Dissector, iter_records
from wallaroo_proto.protocols import names, plugins
from wallaroo_proto.proxy import faults

PROTOCOLS = Path(importlib.import_module("wallaroo_proto.protocols").__file__).parent
CAPTURES = Path(__file__).resolve().parent.parent / "captures"


@pytest.mark.parametrize("name", names())
def test_a_plugin_offers_its_suites_and_its_proxy_faults(name):
    """A suite or a fault kit in a protocol's package that its plug-in does not offer would be
    silently missing from ``conformance`` and ``proxy``."""
    plugin = next(p for p in plugins() if p.name == name)
    package = f"wallaroo_proto.protocols.{name}"
    if (PROTOCOLS / name / "conformance").is_dir():
        assert plugin.conformance_suites() == importlib.import_module(f"{package}.conformance").SUITES
    if (PROTOCOLS / name / "proxy_faults.py").is_file():
        assert plugin.proxy_faults() is importlib.import_module(f"{package}.proxy_faults")
        assert faults.named_faults(name) is plugin.proxy_faults().NAMED_FAULTS


def test_the_conformance_suites_come_in_registry_order():
    order = [suite.protocol for suite in conformance.suites()]
    assert sorted(set(order), key=order.index) == list(names())


def test_every_protocol_keeps_the_frame_limit_it_was_read_with():
    """Before plug-ins declared theirs, every protocol was read with 4 MiB; a limit the user gives
    still applies to every protocol."""
    assert {p.name: p.max_frame_size for p in plugins()} == dict.fromkeys(names(), 4 * 1024 * 1024)
    for name in names():
        assert Dissector("x").frame_limit(name) == 4 * 1024 * 1024
        assert Dissector("x", max_frame_size=16).frame_limit(name) == 16


def test_a_plugins_declared_limit_is_the_one_its_connections_are_read_with(monkeypatch):
    """With no limit given, the driver reads a connection with its plug-in's ``max_frame_size``."""
    capture = CAPTURES / "source-session.pcap"
    small = tuple(dataclasses.replace(p, max_frame_size=16) if p.name == "wallaroo" else p for p in plugins())
    given = [r for r in iter_records(capture, max_frame_size=16)]
    assert any(r["type"] == "INVALID" for r in given)  # 16 bytes is too few for this capture
    monkeypatch.setattr(protocols, "plugins", lambda: small)
    monkeypatch.setattr(dissector, "plugins", lambda: small)
    assert list(iter_records(capture)) == given
