"""AMBROSIA's conformance suites: a language binding (played by the IC), an IC (played by bindings)."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite, SuiteOption

from . import ic_suite, lb_suite

SUITES = (
    Suite(
        "lb",
        "ambrosia",
        "Play the AMBROSIA Immortal Coordinator for a language binding: -- COMMAND ({host}, "
        "{receive_port}, {send_host} and {send_port} filled in), or --listen and --send-listen for one "
        "started by hand.",
        "command",
        lb_suite.CASES,
        lb_suite.open_ic,
        lb_suite.OPTIONS,
        can_listen=True,
        examples=(
            "wallaroo-proto conformance lb -- wallaroo-proto ambrosia mock-lb "
            "--connect {host}:{receive_port} --send-connect {send_host}:{send_port}",
            "wallaroo-proto conformance lb -- node my-lb.js --ic-ports {receive_port},{send_port}",
            "wallaroo-proto conformance lb --listen 127.0.0.1:2000 --send-listen 127.0.0.1:2001",
        ),
    ),
    Suite(
        "ic",
        "ambrosia",
        "Play AMBROSIA language bindings against an Immortal Coordinator: HOST:PORT is its receive port, "
        "--send-connect HOST:PORT its send port.",
        "address",
        ic_suite.CASES,
        ic_suite.open_ic_target,
        (
            SuiteOption(
                "send-connect",
                "The IC's send port, HOST:PORT, where an LB reads records (mock-ic's ready line names it).",
            ),
            SuiteOption("window-ms", "How long the IC is watched for a record it must hold back.", 500),
        ),
        examples=(
            "wallaroo-proto conformance ic 127.0.0.1:2000 --send-connect 127.0.0.1:2001",
            "wallaroo-proto conformance ic 127.0.0.1:41234 --send-connect 127.0.0.1:41235 --junit ic.xml",
        ),
    ),
)
