"""AMBROSIA's signals for ``report``: RPCs per log record or batch, replay spells, checkpoints,
recoveries and upgrades.

The two sockets of one language binding are two connections in the report, each
with its own signals: the IC's socket shows the log records it delivers (how many
RPCs each carries, which are replays) and its checkpoint requests; the LB's
socket shows its RPC batches and the checkpoints it takes. A replay spell runs
from the first message the core judges in replay (after a checkpoint record, or
an upgrade test) to the first in normal running.
"""

from __future__ import annotations

from wallaroo_proto.report.signals import Marker, Series, Signals, Span

_REPLAY_PHASES = {"replay", "upgrade-test"}
_CHECKPOINT_ASKS = {"TakeCheckpoint", "TakeBecomingPrimaryCheckpoint", "UpgradeTakeCheckpoint"}


class AmbrosiaSignals:
    """One AMBROSIA socket's collector (``ProtocolPlugin.report_signals``)."""

    def __init__(self) -> None:
        self.per_record = Series("RPCs per log record", "RPCs", step=False)
        self.per_batch = Series("RPCs per batch from the LB", "RPCs", step=False)
        self.out = Signals(span_label="replay")
        self.replay_since: float | None = None
        self.replay_label = "replay"
        self.last_ts: float | None = None
        self.left_out = 0

    def feed(self, r: dict) -> None:
        ts = float(r.get("ts") or 0.0)
        self.last_ts = ts
        kind = r.get("type")
        phase = r.get("phase")
        if phase in _REPLAY_PHASES and self.replay_since is None:
            self.replay_since = ts
            self.replay_label = "upgrade test" if phase == "upgrade-test" else "replay"
        elif phase is not None and phase not in _REPLAY_PHASES and self.replay_since is not None:
            self._close_spell(ts)
        if kind == "Record" and r.get("rpc_count") is not None:
            self.per_record.add(ts, float(r["rpc_count"]))
        elif kind in ("RPCBatch", "CountReplayableRPCBatch") and r.get("sender") == "lb":
            self.per_batch.add(ts, float(r.get("rpc_count") or 0))
        self._markers(r, ts, kind)

    def _close_spell(self, ts: float) -> None:
        if not self.out.add_span(Span(self.replay_since, ts, self.replay_label)):
            self.left_out += 1
        self.replay_since = None

    def _markers(self, r: dict, ts: float, kind: str | None) -> None:
        index = r.get("frame_index")
        size = r.get("checkpoint_length")
        marker = None
        if kind in _CHECKPOINT_ASKS:
            marker = Marker(ts, "checkpoint", kind, index)
        elif kind == "Checkpoint" and r.get("sender") == "lb":
            marker = Marker(ts, "checkpoint", f"Checkpoint of {size} bytes", index)
        elif kind == "CheckpointRecord":
            marker = Marker(ts, "restart", f"recovery from a checkpoint of {size} bytes", index)
        elif kind == "UpgradeService":
            marker = Marker(ts, "restart", "UpgradeService", index)
        if marker is not None and not self.out.add_marker(marker):
            self.left_out += 1

    def finish(self) -> Signals:
        out = self.out
        if self.replay_since is not None and self.last_ts is not None:
            self._close_spell(self.last_ts)
        for series in (self.per_record, self.per_batch):
            if series.points:
                out.series.append(series)
                if series.thinned:
                    out.notes.append(f"{series.name}: {series.thinned} points merged, keeping the lower")
        if self.left_out:
            out.notes.append(
                f"{self.left_out} markers and replay spells past the first {len(out.markers)} left out"
            )
        return out
