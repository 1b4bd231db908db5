"""AMBROSIA's conformance suite: a language binding, played against by the Immortal Coordinator."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite

from . import lb_suite

SUITES = (
    Suite(
        "lb",
        "ambrosia",
        "Play the AMBROSIA Immortal Coordinator for a language binding: -- COMMAND "
        "({receive_port} and {send_port} filled in).",
        "command",
        lb_suite.CASES,
        lb_suite.open_ic,
        lb_suite.OPTIONS,
    ),
)
