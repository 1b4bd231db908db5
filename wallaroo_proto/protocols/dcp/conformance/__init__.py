"""Couchbase DCP's conformance suites: a producer (played by a consumer) and a consumer (by a producer)."""

from __future__ import annotations

from wallaroo_proto.conformance.runner import Suite

from . import consumer_suite, producer_suite

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
    Suite(
        "consumer",
        "dcp",
        "Play a DCP producer for a consumer: -- COMMAND ({host} {port} {state} filled in).",
        "command",
        consumer_suite.CASES,
        consumer_suite.open_consumer,
    ),
)
