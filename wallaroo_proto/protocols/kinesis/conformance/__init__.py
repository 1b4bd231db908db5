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
    ),
    Suite(
        "daemon",
        "kinesis",
        "Play Kinesis record processors against a daemon listening at HOST:PORT (one connection a shard).",
        "address",
        daemon_suite.CASES,
        daemon_suite.open_daemon,
    ),
)
