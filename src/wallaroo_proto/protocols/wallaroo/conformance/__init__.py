"""The Wallaroo connector protocol's conformance suites: worker, sink and connector.

Each plays the other side against an implementation under test, driving the
same codec and protocol core as the mock peers.
"""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite

from . import connector_suite, sink_suite, worker_suite

SUITES = (
    Suite(
        "worker",
        "wallaroo",
        "Play connectors against a Wallaroo worker at HOST:PORT.",
        "address",
        worker_suite.CASES,
        worker_suite.open_worker,
        worker_suite.OPTIONS,
        examples=(
            "wallaroo-proto conformance worker 127.0.0.1:7100",
            "wallaroo-proto conformance worker 10.0.0.5:7100 --cookie s3cret --junit worker.xml",
            "wallaroo-proto conformance worker 127.0.0.1:7100 --case handshake --format json",
        ),
    ),
    Suite(
        "sink",
        "wallaroo",
        "Play a Wallaroo worker against a connector sink at HOST:PORT (2PC).",
        "address",
        sink_suite.CASES,
        sink_suite.open_sink,
        sink_suite.OPTIONS,
        examples=(
            "wallaroo-proto conformance sink 127.0.0.1:7200",
            "wallaroo-proto conformance sink 127.0.0.1:7200 --restart-cmd './restart-sink.sh' --list",
        ),
    ),
    Suite(
        "connector",
        "wallaroo",
        "Play a Wallaroo worker for a connector source: -- COMMAND (with {host} {port}), or --listen.",
        "command",
        connector_suite.CASES,
        connector_suite.open_connector,
        connector_suite.OPTIONS,
        can_listen=True,
        examples=(
            "wallaroo-proto conformance connector -- python my_connector.py --worker {host}:{port}",
            "wallaroo-proto conformance connector --listen 127.0.0.1:7100 --window-ms 1000",
        ),
    ),
)
