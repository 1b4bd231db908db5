"""Tremor's signals for ``report``: streams connected, echo round trips, connects and closes.

A Tremor session multiplexes streams, each opened by ``connect`` and its
``connect-ack`` under an alias and closed by ``disconnect-ack``; the level of
streams connected is drawn over time. The echo protocol sends each message back
as it came, so a client's echo and the node's identical answer on the same alias
(first in, first out) make a round trip.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from wallaroo_proto.report.signals import Distribution, Marker, Series, Signals

#: Echoes awaiting their answer: a bound for a node that never answers.
MAX_PENDING = 10_000


class TremorSignals:
    """One Tremor session's collector (``ProtocolPlugin.report_signals``)."""

    def __init__(self) -> None:
        self.connected: set[str] = set()
        self.streams = Series("streams connected", "streams")
        self.echo = Distribution("echo round trip")
        self.pending: OrderedDict[tuple[str, int], deque[float]] = OrderedDict()
        self.waiting = 0
        self.out = Signals()
        self.left_out = 0

    def feed(self, r: dict) -> None:
        ts = float(r.get("ts") or 0.0)
        kind = r.get("type")
        alias = r.get("alias")
        accepted = r.get("verdict") == "accepted"
        if accepted and alias is not None and kind in ("connect-ack", "disconnect-ack"):
            (self.connected.add if kind == "connect-ack" else self.connected.discard)(alias)
            self.streams.add(ts, len(self.connected))
        elif kind in ("close-ack", "error-close") and self.connected:  # the session's streams end with it
            self.connected.clear()
            self.streams.add(ts, 0)
        if kind == "echo" and alias is not None:
            self._echo(ts, r.get("sender"), (alias, hash(r.get("message_json"))))
        self._markers(r, ts, kind, alias)

    def _echo(self, ts: float, sender: str | None, key: tuple[str, int]) -> None:
        if sender == "client":
            self.pending.setdefault(key, deque()).append(ts)
            self.waiting += 1
            while self.waiting > MAX_PENDING:  # forget the oldest
                _, oldest = next(iter(self.pending.items()))
                oldest.popleft()
                self.waiting -= 1
                if not oldest:
                    self.pending.popitem(last=False)
        elif sender == "server" and self.pending.get(key):
            self.echo.add(ts - self.pending[key].popleft())
            self.waiting -= 1
            if not self.pending[key]:
                del self.pending[key]

    def _markers(self, r: dict, ts: float, kind: str | None, alias: str | None) -> None:
        index = r.get("frame_index")
        marker = None
        if kind == "connect-ack":
            marker = Marker(ts, "connect", f"connected {alias} ({r.get('tremor_protocol') or '?'})", index)
        elif kind == "disconnect-ack":
            marker = Marker(ts, "end", f"disconnected {alias}", index)
        elif kind == "error-close":
            marker = Marker(ts, "error", f"closed with {r.get('status_code') or 'an error'}", index)
        elif kind == "close-ack":
            marker = Marker(ts, "end", "session closed", index)
        if marker is not None and not self.out.add_marker(marker):
            self.left_out += 1

    def finish(self) -> Signals:
        out = self.out
        if self.streams.points:
            out.series.append(self.streams)
        if self.echo.count:
            out.distributions.append(self.echo)
        if self.left_out:
            out.notes.append(f"{self.left_out} markers past the first {len(out.markers)} left out")
        return out
