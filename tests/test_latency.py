"""The latency histogram: quantiles within its 2% buckets, weights, constant memory."""

from __future__ import annotations

from wallaroo_proto.latency import LatencyHistogram


def test_quantiles_fall_within_two_percent_of_the_true_value():
    hist = LatencyHistogram()
    for ms in range(1, 1001):
        hist.add(ms / 1000)
    assert hist.count == 1000
    assert 0.500 <= hist.quantile(0.5) <= 0.500 * 1.02
    assert 0.990 <= hist.quantile(0.99) <= 1.0
    assert hist.summary() == {
        "count": 1000,
        "p50_ms": round(hist.quantile(0.5) * 1000, 3),
        "p99_ms": 1000.0,
        "max_ms": 1000.0,
    }


def test_a_weighted_sample_counts_as_that_many_and_memory_stays_bounded():
    hist = LatencyHistogram()
    hist.add(0.001, 99)  # a batch of 99 messages delivered in 1 ms
    hist.add(0.5, 1)
    hist.add(3.0, 0)  # nothing delivered: no sample
    assert hist.count == 100
    assert hist.quantile(0.99) <= 0.001 * 1.02
    assert hist.quantile(1.0) == 0.5
    for i in range(100_000):
        hist.add(0.001 + i * 1e-6)
    assert len(hist._buckets) < 300  # 1 ms to 0.1 s in 2% steps: about 233 buckets, whatever the count


def test_empty():
    assert LatencyHistogram().summary() == {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
