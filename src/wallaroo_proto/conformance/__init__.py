"""Conformance suites: point the toolkit at an implementation, get the spec's rules it keeps and breaks.

The shared part lives here: the case runner (``runner``) and the reports
(``report``: JSON and JUnit XML; the CLI draws the table). Each protocol brings
its suites from its own package, and its plug-in offers them
(``ProtocolPlugin.conformance_suites``). No suite module imports another protocol.
"""

from __future__ import annotations

from functools import cache

from wallaroo_proto.protocols import plugins

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


@cache
def suites() -> tuple[Suite, ...]:
    """Every plug-in's suites, in registry order (imported on first use); names are unique across
    protocols."""
    return tuple(
        suite for plugin in plugins() if plugin.conformance_suites for suite in plugin.conformance_suites()
    )


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
