"""The Kinesis MultiLangDaemon's conformance suites: a record processor, and a daemon."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite, SuiteOption

from . import daemon_suite, processor_suite

SUITES = (
    Suite(
        "processor",
        "kinesis",
        "Play the Kinesis MultiLangDaemon for a record processor: -- COMMAND (on its stdin and stdout).",
        "command",
        processor_suite.CASES,
        processor_suite.open_processor,
        (SuiteOption("window-ms", "How long a processor may take to exit once its input ends.", 500),),
        examples=(
            "wallaroo-proto conformance processor -- python my_processor.py",
            "wallaroo-proto conformance processor --junit p.xml -- wallaroo-proto kinesis mock-processor",
            "wallaroo-proto conformance processor --list",
        ),
    ),
    Suite(
        "daemon",
        "kinesis",
        "Play Kinesis record processors against a daemon listening at HOST:PORT (one connection a shard).",
        "address",
        daemon_suite.CASES,
        daemon_suite.open_daemon,
        examples=(
            "wallaroo-proto conformance daemon 127.0.0.1:7111",
            "wallaroo-proto conformance daemon 127.0.0.1:7111 --case checkpoint --format json",
        ),
    ),
)
