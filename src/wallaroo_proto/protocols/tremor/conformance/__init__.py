"""The Tremor network protocol's conformance suite: a node, played against by clients."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite

from . import node_suite

SUITES = (
    Suite(
        "node",
        "tremor",
        "Play Tremor network-protocol clients (WebSocket) against a node listening at HOST:PORT.",
        "address",
        node_suite.CASES,
        node_suite.open_node,
        examples=(
            "wallaroo-proto conformance node 127.0.0.1:9899",
            "wallaroo-proto conformance node 127.0.0.1:9899 --case echo --junit node.xml",
        ),
    ),
)
