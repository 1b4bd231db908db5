"""Kinesis MLD's report signals: lag behind the shard's newest, checkpoints, request-to-status latency."""

from __future__ import annotations

from wallaroo_proto.report.signals import Distribution, Marker, Series, Signals


class KinesisSignals:
    """One shard conversation's collector (``ProtocolPlugin.report_signals``).

    The MLD's flow control is one request at a time: the daemon holds back the
    next batch until the processor's status line. So its signals are the lag
    the daemon reports with each batch (``millisBehindLatest``), the latency
    from each request to its status, and the checkpoints (a failed one marked
    as an error).
    """

    def __init__(self) -> None:
        self.behind = Series("ms behind latest", "ms", step=True)
        self.batch = Series("records per batch", "records", step=False)
        self.latency = Distribution("request to status")
        self.out = Signals()
        self.left_out = 0

    def feed(self, r: dict) -> None:
        ts = float(r.get("ts") or 0.0)
        kind = r.get("type")
        index = r.get("frame_index")
        if kind == "processRecords":
            if r.get("millis_behind_latest") is not None:
                self.behind.add(ts, float(r["millis_behind_latest"]))
            if r.get("record_count") is not None:
                self.batch.add(ts, float(r["record_count"]))
        elif kind == "status" and r.get("latency") is not None:
            self.latency.add(float(r["latency"]))
        marker = None
        if kind == "checkpoint" and r.get("sender") == "processor":
            marker = Marker(ts, "checkpoint", f"checkpoint {r.get('sequence_number') or ''}".strip(), index)
        elif kind == "checkpoint" and r.get("checkpoint_error"):
            marker = Marker(ts, "error", f"checkpoint failed: {r['checkpoint_error']}", index)
        elif kind in ("shutdown", "shardEnded", "leaseLost", "shutdownRequested"):
            marker = Marker(ts, "end", f"{kind} {r.get('reason') or ''}".strip(), index)
        if marker is not None and not self.out.add_marker(marker):
            self.left_out += 1

    def finish(self) -> Signals:
        out = self.out
        out.series = [s for s in (self.behind, self.batch) if s.points]
        if self.latency.count:
            out.distributions.append(self.latency)
        if self.left_out:
            out.notes.append(f"{self.left_out} markers past the first {len(out.markers)} left out")
        return out
