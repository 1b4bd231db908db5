"""Wallaroo's signals for ``report``: credits held, zero-credit spells, checkpoints, RESTARTs, 2PC latencies.

Credits follow the dissector's flow-control rules (``protocols.wallaroo.spark.flow_control``):
the worker's OK and ACKs grant credits; every frame the connector sends after
the OK, HELLO aside, spends one, unless the core rejected it; the level never
goes below zero. Only a source's credits are drawn: on a sink the worker
ignores the sink's credits and relies on TCP backpressure (protocol notes), so
its level would fall to zero and mean nothing.
"""

from __future__ import annotations

from collections import OrderedDict

from wallaroo_proto.report.signals import Distribution, Marker, Series, Signals, Span

#: Transactions awaiting their REPLY or PHASE2: a bound for a sink that never answers.
MAX_PENDING = 10_000


class WallarooSignals:
    """One connection's collector (``ProtocolPlugin.report_signals``)."""

    def __init__(self) -> None:
        self.ok_seen = False
        self.level = 0
        self.use: str | None = None
        self.credits = Series("credits held by the connector", "credits")
        self.out = Signals(span_label="zero credits")
        self.zero_since: float | None = None
        self.last_ts: float | None = None
        self.phase1_to_reply = Distribution("2PC PHASE1 to REPLY")
        self.reply_to_phase2 = Distribution("2PC REPLY to PHASE2")
        self.phase1: OrderedDict[str, float] = OrderedDict()
        self.replied: OrderedDict[str, float] = OrderedDict()
        self.left_out = 0

    def feed(self, r: dict) -> None:
        ts = float(r.get("ts") or 0.0)
        self.last_ts = ts
        kind = r.get("type")
        if self.use is None and r.get("use"):
            self.use = r["use"]
        granted = 0
        if kind == "OK" and r.get("initial_credits") is not None:
            granted = int(r["initial_credits"])
        elif kind == "ACK" and r.get("credits") is not None:
            granted = int(r["credits"])
        spent = (
            self.ok_seen
            and r.get("sender") == "connector"
            and kind != "HELLO"
            and r.get("verdict") != "violation"
        )
        if kind == "OK" and r.get("verdict") == "accepted":
            self.ok_seen = True
        if self.ok_seen and self.use == "source":
            self.level = max(self.level + granted - int(spent), 0)
            self.credits.add(ts, self.level)
            self._zero(ts)
        self._markers(r, ts, kind)
        if r.get("twopc"):
            self._twopc(r, ts)

    def _zero(self, ts: float) -> None:
        if self.level == 0 and self.zero_since is None:
            self.zero_since = ts
        elif self.level > 0 and self.zero_since is not None:
            self._close_spell(ts)

    def _close_spell(self, ts: float) -> None:
        if not self.out.add_span(Span(self.zero_since, ts, "zero credits")):
            self.left_out += 1
        self.zero_since = None

    def _markers(self, r: dict, ts: float, kind: str | None) -> None:
        index = r.get("frame_index")
        marker = None
        if kind == "ACK" and r.get("acks"):
            pairs = " ".join(f"{a['stream_id']}@{a['point_of_ref']}" for a in r["acks"])
            marker = Marker(ts, "checkpoint", f"ACK {pairs}", index)
        elif kind == "RESTART":
            marker = Marker(ts, "restart", "RESTART", index)
        elif kind == "ERROR":
            marker = Marker(ts, "error", f"ERROR {r.get('reason') or ''}".strip(), index)
        elif r.get("twopc") == "PHASE2":
            decision = "commit" if r.get("commit") else "abort"
            marker = Marker(
                ts, "checkpoint" if r.get("commit") else "abort", f"{decision} {r.get('txn_id')}", index
            )
        if marker is not None and not self.out.add_marker(marker):
            self.left_out += 1

    def _twopc(self, r: dict, ts: float) -> None:
        txn = r.get("txn_id")
        if txn is None:
            return
        step = r["twopc"]
        if step == "PHASE1":
            _remember(self.phase1, txn, ts)
        elif step == "REPLY":
            start = self.phase1.pop(txn, None)
            if start is not None:
                self.phase1_to_reply.add(ts - start)
            _remember(self.replied, txn, ts)
        elif step == "PHASE2":
            start = self.replied.pop(txn, None)
            if start is not None:
                self.reply_to_phase2.add(ts - start)

    def finish(self) -> Signals:
        out = self.out
        if self.zero_since is not None and self.last_ts is not None:
            self._close_spell(self.last_ts)
        if self.credits.points:
            out.series.append(self.credits)
            if self.credits.thinned:
                out.notes.append(
                    f"credits: {self.credits.thinned} changes merged; a point is its interval's lowest"
                )
        for dist in (self.phase1_to_reply, self.reply_to_phase2):
            if dist.count:
                out.distributions.append(dist)
        if self.left_out:
            out.notes.append(
                f"{self.left_out} markers and zero-credit spells past the first {len(out.markers)} left out"
            )
        return out


def _remember(pending: OrderedDict[str, float], txn: str, ts: float) -> None:
    pending[txn] = ts
    if len(pending) > MAX_PENDING:
        pending.popitem(last=False)
