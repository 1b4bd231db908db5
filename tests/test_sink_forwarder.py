"""The sink forwarder's place among the worker's consumers."""

from __future__ import annotations

from wallaroo_proto.protocols.wallaroo.sink_forwarder import SinkForwarder
from wallaroo_proto.protocols.wallaroo.worker import JsonLinesOut, MockWorker, WorkerConfig


def test_the_forwarder_stays_the_last_consumer(tmp_path) -> None:
    # The checkpoint snapshot counts a delivery once every consumer took it; the sink
    # must be the last to take it, or it could commit what the snapshot does not cover.
    worker = MockWorker(WorkerConfig(port=0))
    forwarder = SinkForwarder("127.0.0.1", 9)
    worker.set_sink(forwarder)
    out = JsonLinesOut(tmp_path / "out.jsonl")
    worker.add_consumer(out)
    assert worker.consumers == [out, forwarder]
    assert worker.consumer_calls == [out.deliver, forwarder.deliver]
    worker.io.shutdown()
