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
        examples=(
            "wallaroo-proto conformance producer 127.0.0.1:11210",
            "wallaroo-proto conformance producer 10.0.0.7:11210 --case refuse --junit producer.xml",
        ),
    ),
    Suite(
        "consumer",
        "dcp",
        "Play a DCP producer for a consumer: -- COMMAND ({host} {port} {state} filled in).",
        "command",
        consumer_suite.CASES,
        consumer_suite.open_consumer,
        examples=(
            "wallaroo-proto conformance consumer -- ./my-consumer '{host}:{port}' --state {state}",
            "wallaroo-proto conformance consumer --list",
        ),
    ),
)
