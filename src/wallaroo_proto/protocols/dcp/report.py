"""DCP's signals for ``report``: the flow-control buffer's free bytes, full-buffer spells,
rollbacks and stream ends, and the NOOP and STREAM_REQ round trips.

DCP's flow control is the consumer's ``connection_buffer_size``: the producer
may send stream messages while fewer bytes than the buffer are unacknowledged,
and BUFFER_ACKNOWLEDGEMENT gives bytes back. The dissector's core keeps the
unacknowledged count on each stream message and acknowledgement (``outstanding``),
so the level is read, not recomputed. It is drawn as the bytes still free, like
a source's credits, so a series thinned to its lows keeps every full buffer; a
spell with the buffer full lasts until the acknowledgement that frees some.
"""

from __future__ import annotations

from collections import OrderedDict

from wallaroo_proto.report.signals import Distribution, Marker, Series, Signals, Span

#: Requests awaiting their response: a bound for a peer that never answers.
MAX_PENDING = 10_000
#: Statuses of a stream request's response that are not a refusal.
_NOT_REFUSALS = {"SUCCESS", "ROLLBACK"}


class DcpSignals:
    """One DCP connection's collector (``ProtocolPlugin.report_signals``)."""

    def __init__(self) -> None:
        self.buffer_size = 0
        self.free = Series("buffer bytes free", "bytes")
        self.unknown_buffer = False
        self.out = Signals(span_label="buffer full")
        self.full_since: float | None = None
        self.last_ts: float | None = None
        self.noop = Distribution("NOOP to response")
        self.stream_req = Distribution("STREAM_REQ to response")
        self.pending: dict[str, OrderedDict[int, float]] = {
            "DCP_NOOP": OrderedDict(),
            "DCP_STREAM_REQ": OrderedDict(),
        }
        self.left_out = 0

    def feed(self, r: dict) -> None:
        ts = float(r.get("ts") or 0.0)
        self.last_ts = ts
        kind = r.get("type")
        if kind == "DCP_CONTROL" and r.get("control_key") == "connection_buffer_size":
            try:
                self.buffer_size = int(r.get("control_value") or 0)
            except ValueError:
                self.buffer_size = 0
        if r.get("outstanding") is not None:
            if self.buffer_size:
                free = self.buffer_size - int(r["outstanding"])
                self.free.add(ts, free)
                self._full(ts, free <= 0)
            else:  # the capture began after the consumer set the buffer
                self.unknown_buffer = True
        self._round_trip(r, ts, kind)
        self._markers(r, ts, kind)

    def _full(self, ts: float, full: bool) -> None:
        if full and self.full_since is None:
            self.full_since = ts
        elif not full and self.full_since is not None:
            self._close_spell(ts)

    def _close_spell(self, ts: float) -> None:
        if not self.out.add_span(Span(self.full_since, ts, "buffer full")):
            self.left_out += 1
        self.full_since = None

    def _round_trip(self, r: dict, ts: float, kind: str | None) -> None:
        opaque = r.get("opaque")
        if opaque is None or kind is None:
            return
        if kind in self.pending:
            pending = self.pending[kind]
            pending[int(opaque)] = ts
            if len(pending) > MAX_PENDING:
                pending.popitem(last=False)
        elif kind.endswith("_RESPONSE") and kind[: -len("_RESPONSE")] in self.pending:
            start = self.pending[kind[: -len("_RESPONSE")]].pop(int(opaque), None)
            if start is not None:
                (self.noop if kind == "DCP_NOOP_RESPONSE" else self.stream_req).add(ts - start)

    def _markers(self, r: dict, ts: float, kind: str | None) -> None:
        index = r.get("frame_index")
        status = r.get("status")
        marker = None
        if kind == "DCP_STREAM_REQ_RESPONSE" and r.get("rollback_seqno") is not None:
            label = f"vb {r.get('vbucket', '?')} rollback to {r['rollback_seqno']}"
            marker = Marker(ts, "rollback", label, index)
        elif kind == "DCP_STREAM_REQ_RESPONSE" and status not in _NOT_REFUSALS:
            marker = Marker(ts, "error", f"stream request {status}", index)
        elif kind == "DCP_STREAM_END":
            label = f"vb {r.get('vbucket', '?')} end {r.get('end_reason') or ''}".strip()
            marker = Marker(ts, "end", label, index)
        if marker is not None and not self.out.add_marker(marker):
            self.left_out += 1

    def finish(self) -> Signals:
        out = self.out
        if self.full_since is not None and self.last_ts is not None:
            self._close_spell(self.last_ts)
        if self.free.points:
            self.free.name = f"buffer bytes free (of {self.buffer_size})"
            out.series.append(self.free)
            if self.free.thinned:
                out.notes.append(
                    f"buffer bytes free: {self.free.thinned} changes merged; a point is its interval's lowest"
                )
        if self.unknown_buffer:
            out.notes.append("flow control on, but the capture does not show the buffer's size: not drawn")
        out.distributions.extend(d for d in (self.noop, self.stream_req) if d.count)
        if self.left_out:
            out.notes.append(
                f"{self.left_out} markers and full-buffer spells past the first {len(out.markers)} left out"
            )
        return out
