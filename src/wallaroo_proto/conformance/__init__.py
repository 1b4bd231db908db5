"""Conformance suites: point the toolkit at an implementation, get the spec's rules it keeps and breaks.

The shared part lives here: the case runner (``runner``) and the reports
(``report``: JSON and JUnit XML; the CLI draws the table). Each protocol brings
its suites from its own package, as a module with ``SUITES``; its module name
goes in ``_SUITE_MODULES``. No suite module imports another protocol.
"""

from __future__ import annotations

import importlib
from functools import cache

from .runner import (
    Case,
    CaseFailed,
    CaseSkipped,
    Result,
    Suite,
    SuiteOption,
    SuiteUnavailable,
    run_suite,
    select,
)

_SUITE_MODULES = (
    "wallaroo_proto.protocols.wallaroo.conformance",
    "wallaroo_proto.protocols.kinesis.conformance",
    "wallaroo_proto.protocols.dcp.conformance",
    "wallaroo_proto.protocols.ambrosia.conformance",
    "wallaroo_proto.protocols.tremor.conformance",
)


@cache
def suites() -> tuple[Suite, ...]:
    """Every registered suite (imported on first use); names are unique across protocols."""
    found: list[Suite] = []
    for name in _SUITE_MODULES:
        found.extend(importlib.import_module(name).SUITES)
    return tuple(found)


def get_suite(name: str) -> Suite:
    for suite in suites():
        if suite.name == name:
            return suite
    raise KeyError(f"unknown conformance suite {name!r} (known: {', '.join(s.name for s in suites())})")


__all__ = [
    "Case",
    "CaseFailed",
    "CaseSkipped",
    "Result",
    "Suite",
    "SuiteOption",
    "SuiteUnavailable",
    "get_suite",
    "run_suite",
    "select",
    "suites",
]
