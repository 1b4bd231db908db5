"""AMBROSIA's conformance suites: a language binding (played by the IC), an IC (played by bindings)."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite, SuiteOption

from . import ic_suite, lb_suite

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
    Suite(
        "ic",
        "ambrosia",
        "Play AMBROSIA language bindings against an Immortal Coordinator at HOST:RECEIVE_PORT:SEND_PORT.",
        "address",
        ic_suite.CASES,
        ic_suite.open_ic_target,
        (SuiteOption("window-ms", "How long the IC is watched for a record it must hold back.", 500),),
    ),
)
