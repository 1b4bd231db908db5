"""Frames compared field by field, and two runs of a conversation matched frame by frame.

Shared by ``replay`` (the recording against the live peer) and ``diff`` (two recordings).
Frames are matched by type and by their protocol's ``match_key`` (first come, first
matched), not by position: a peer may interleave independent streams in another order
without that being a difference. A frame with no counterpart is *missing* (recorded, never
seen) or *extra* (seen, never recorded).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Result(StrEnum):
    """What became of one frame of the compared side."""

    MATCHED = "matched"
    DIVERGENT = "divergent"
    VIOLATION = "violation"
    MISSING = "missing"
    EXTRA = "extra"


#: The results that make a run differ (exit 1).
BAD = frozenset({Result.DIVERGENT, Result.VIOLATION, Result.MISSING, Result.EXTRA})


@dataclass(slots=True)
class Outcome:
    """One frame's result: which frames (recorded, live) and, when they differ, how."""

    result: Result
    type: str
    #: The recorded frame's record (None: extra).
    recorded: dict | None = None
    #: The live (or second recording's) frame's record (None: missing).
    live: dict | None = None
    #: (field, recorded value, live value) for each field that differs.
    fields: tuple[tuple[str, Any, Any], ...] = ()
    #: A violation's rule, or why a frame is missing or a run stopped.
    rule: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"result": self.result.value, "type": self.type}
        for name, record in (("recorded", self.recorded), ("live", self.live)):
            if record is not None:
                out[f"{name}_packet"] = record.get("packet")
                out[f"{name}_frame"] = record.get("frame_index")
        if self.fields:
            out["fields"] = [{"field": f, "recorded": a, "live": b} for f, a, b in self.fields]
        if self.rule:
            out["rule"] = self.rule
        if self.reason:
            out["reason"] = self.reason
        return out

    def text(self) -> str:
        """One line for a person (and a pcapng comment)."""
        where = []
        if self.recorded is not None:
            where.append(f"recorded packet {self.recorded.get('packet')}")
        if self.live is not None:
            where.append(f"live packet {self.live.get('packet')}")
        head = f"{self.result.value} {self.type}" + (f" ({', '.join(where)})" if where else "")
        if self.fields:
            shown = "; ".join(f"{f}: {_short(a)} recorded, {_short(b)} live" for f, a, b in self.fields[:6])
            more = f"; {len(self.fields) - 6} more" if len(self.fields) > 6 else ""
            return f"{head}: {shown}{more}"
        if self.rule or self.reason:
            return f"{head}: " + " ".join(
                x for x in (f"[{self.rule}]" if self.rule else "", self.reason or "") if x
            )
        return head


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def differences(recorded: dict, live: dict, ignore: frozenset[str]) -> tuple[tuple[str, Any, Any], ...]:
    """The fields whose values differ, in the recorded record's order, then the live one's new ones."""
    out = []
    for name, value in recorded.items():
        if name in ignore:
            continue
        other = live.get(name)
        if other != value:
            out.append((name, value, other))
    for name, value in live.items():
        if name not in ignore and name not in recorded and value is not None:
            out.append((name, None, value))
    return tuple(out)


@dataclass(slots=True, eq=False)
class _Waiting:
    index: int
    record: dict
    key: tuple = ()
    done: bool = False


@dataclass
class Matcher:
    """Recorded frames expected from one side, matched against the frames that side really sent."""

    ignore: frozenset[str]
    key: Callable[[dict], tuple]
    #: At most this many outcomes other than matched are kept (``kept``); all are counted.
    keep: int = 100_000
    #: The outcomes kept, in the order they were decided.
    kept: list[Outcome] = field(default_factory=list)
    #: Called with each outcome as it is decided (a live view, a recording's comments).
    on_outcome: Callable[[Outcome], None] | None = None
    _by_key: dict[tuple, deque[_Waiting]] = field(default_factory=dict)
    _order: deque[_Waiting] = field(default_factory=deque)
    #: Frames seen before anything like them was expected (a peer faster than the recording's
    #: walk): matched when expected; at most ``early_limit``, beyond which a frame is extra at once.
    _early: dict[tuple, deque[dict]] = field(default_factory=dict)
    _early_count: int = 0
    early_limit: int = 100_000
    counts: dict[Result, int] = field(default_factory=lambda: dict.fromkeys(Result, 0))

    def expect(self, index: int, record: dict) -> Outcome | None:
        """The recording says its side sent ``record`` (its ``index``-th frame); the outcome when a
        frame that came early matches it at once."""
        key = (record.get("type"), *self.key(record))
        early = self._early.get(key)
        if early:
            live = early.popleft()
            self._early_count -= 1
            if not early:
                del self._early[key]
            return self._compared(record, live)
        waiting = _Waiting(index, record, key)
        self._order.append(waiting)
        self._by_key.setdefault(key, deque()).append(waiting)
        return None

    def seen(self, record: dict) -> Outcome | None:
        """That side really sent ``record``: matched, divergent or a violation; or, with nothing
        expected like it yet, held as early (a violation too: its recorded frame may still be
        expected), extra or a violation if nothing like it is expected by the end."""
        key = (record.get("type"), *self.key(record))
        queue = self._by_key.get(key)
        while queue:
            candidate = queue.popleft()
            if not queue:
                del self._by_key[key]
            if not candidate.done:
                candidate.done = True
                return self._compared(candidate.record, record)
        if self._early_count >= self.early_limit:
            return self._extra(record)
        self._early.setdefault(key, deque()).append(record)
        self._early_count += 1
        return None

    def _compared(self, recorded: dict | None, live: dict) -> Outcome:
        kind = live.get("type") or ""
        if recorded is None:
            outcome = Outcome(Result.EXTRA, kind, None, live, reason="not in the recording")
        else:
            diffs = differences(recorded, live, self.ignore)
            outcome = Outcome(Result.DIVERGENT if diffs else Result.MATCHED, kind, recorded, live, diffs)
        if live.get("verdict") == "violation":
            outcome.result = Result.VIOLATION
            outcome.rule = live.get("rule")
            outcome.reason = "; ".join(live.get("violations") or ()) or None
        self._decided(outcome)
        return outcome

    def _extra(self, live: dict) -> Outcome:
        outcome = Outcome(Result.EXTRA, live.get("type") or "", None, live, reason="not in the recording")
        self._decided(outcome)
        return outcome

    def settle_violations(self) -> None:
        """Decide the early frames that broke a rule: the peer is no longer waited for, so their
        recorded frames will not be walked to in time (they come before what is then missing)."""
        for key, queue in list(self._early.items()):
            bad = [record for record in queue if record.get("verdict") == "violation"]
            if not bad:
                continue
            kept = deque(record for record in queue if record.get("verdict") != "violation")
            if kept:
                self._early[key] = kept
            else:
                del self._early[key]
            self._early_count -= len(bad)
            for record in bad:
                self._compared(None, record)

    def oldest_early_packet(self) -> int | None:
        """The packet of the oldest frame still waiting for its counterpart (its comment may come)."""
        packets = [queue[0].get("packet") or 0 for queue in self._early.values() if queue]
        return min(packets) if packets else None

    def outstanding_before(self, index: int) -> _Waiting | None:
        """The first expected frame recorded before frame ``index`` that has not come."""
        order = self._order
        while order and order[0].done:
            order.popleft()
        return order[0] if order and order[0].index < index else None

    def give_up(self, waiting: _Waiting, reason: str) -> Outcome:
        """An expected frame that will not be waited for any longer: missing."""
        waiting.done = True
        queue = self._by_key.get(waiting.key)
        if queue is not None:  # forgotten, so a key never seen again holds nothing
            queue.remove(waiting)
            if not queue:
                del self._by_key[waiting.key]
        outcome = Outcome(
            Result.MISSING, waiting.record.get("type") or "", waiting.record, None, reason=reason
        )
        self._decided(outcome)
        return outcome

    def give_up_all(self, reason: str) -> None:
        """The end: what was expected and never came is missing, what came and was never
        expected is extra."""
        early = [record for queue in self._early.values() for record in queue]
        self._early.clear()
        self._early_count = 0
        for record in sorted(early, key=lambda r: r.get("packet") or 0):  # what came, first
            self._compared(None, record)  # extra, or a violation
        self._by_key.clear()  # every waiting frame is decided here: none needs finding again
        for waiting in list(self._order):
            if not waiting.done:
                self.give_up(waiting, reason)
        self._order.clear()

    def _decided(self, outcome: Outcome) -> None:
        self.counts[outcome.result] += 1
        if outcome.result is not Result.MATCHED and len(self.kept) < self.keep:
            self.kept.append(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
