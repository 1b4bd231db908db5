"""The plug-in is the one way a protocol is found: what its package brings, its plug-in offers."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from wallaroo_proto import conformance
from wallaroo_proto.protocols import names, plugins
from wallaroo_proto.proxy import faults

PROTOCOLS = Path(importlib.import_module("wallaroo_proto.protocols").__file__).parent


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
