"""Couchbase DCP's conformance suite: a producer, played against by a consumer."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite

from . import producer_suite

SUITES = (
    Suite(
        "producer",
        "dcp",
        "Play a DCP consumer against a producer (a Couchbase data node's KV port) at HOST:PORT.",
        "address",
        producer_suite.CASES,
        producer_suite.open_producer_target,
        producer_suite.OPTIONS,
    ),
)
