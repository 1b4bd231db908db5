"""Frames compared field by field, and two runs of a conversation matched frame by frame.

Shared by ``replay`` (the recording against the live peer) and ``diff`` (two recordings).
Frames are matched by type and by their protocol's ``match_key`` (first come, first
matched), not by position: a peer may interleave independent streams in another order
without that being a difference. A frame with no counterpart is *missing* (recorded, never
seen) or *extra* (seen, never recorded).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
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


@dataclass(slots=True)
class _Waiting:
    index: int
    record: dict
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
    #: A frame seen before its recorded counterpart was expected waits for it, up to this many
    #: frames (a live peer answers as soon as it can, often before the replay has reached the
    #: answer's place in the recording); 0: extra at once (``diff`` reads ahead instead).
    hold: int = 0
    _by_key: dict[tuple, deque[_Waiting]] = field(default_factory=dict)
    _early: dict[tuple, deque[_Waiting]] = field(default_factory=dict)
    _held: deque[_Waiting] = field(default_factory=deque)
    _order: deque[_Waiting] = field(default_factory=deque)
    counts: dict[Result, int] = field(default_factory=lambda: dict.fromkeys(Result, 0))

    def expect(self, index: int, record: dict) -> None:
        """The recording says its side sent ``record`` (its ``index``-th frame)."""
        key = (record.get("type"), *self.key(record))
        early = self._early.get(key)
        while early:
            seen = early.popleft()
            if not seen.done:
                seen.done = True
                self._judged(record, seen.record, None)
                return
        waiting = _Waiting(index, record)
        self._order.append(waiting)
        self._by_key.setdefault(key, deque()).append(waiting)

    def seen(self, record: dict, verdict_rule: str | None = None) -> Outcome | None:
        """That side really sent ``record``: matched, divergent, a violation or extra (None: held
        for its recorded counterpart, see ``hold``)."""
        key = (record.get("type"), *self.key(record))
        queue = self._by_key.get(key)
        waiting = None
        while queue:
            candidate = queue.popleft()
            if not candidate.done:
                waiting = candidate
                break
        if waiting is None and self.hold:
            held = _Waiting(-1, record)
            self._early.setdefault(key, deque()).append(held)
            self._held.append(held)
            while self._held and (self._held[0].done or len(self._held) > self.hold):
                old = self._held.popleft()
                if not old.done:
                    old.done = True
                    self._judged(None, old.record, None)
            return None
        if waiting is not None:
            waiting.done = True
        return self._judged(waiting.record if waiting else None, record, verdict_rule)

    def holding(self) -> int:
        """How many frames are held for their recorded counterparts (at most ``hold``)."""
        held = self._held
        while held and held[0].done:
            held.popleft()
        return len(held)

    def first_held(self) -> int | None:
        """The live packet of the first frame still held (its outcome, and comment, to come)."""
        return next((w.record.get("packet") for w in self._held if not w.done), None)

    def _judged(self, recorded: dict | None, record: dict, verdict_rule: str | None) -> Outcome:
        if recorded is None:
            outcome = Outcome(
                Result.EXTRA, record.get("type") or "", None, record, reason="not in the recording"
            )
        else:
            diffs = differences(recorded, record, self.ignore)
            result = Result.DIVERGENT if diffs else Result.MATCHED
            outcome = Outcome(result, record.get("type") or "", recorded, record, diffs)
        if record.get("verdict") == "violation":
            outcome.result = Result.VIOLATION
            outcome.rule = verdict_rule or record.get("rule")
            outcome.reason = "; ".join(record.get("violations") or ()) or None
        self._decided(outcome)
        return outcome

    def outstanding_before(self, index: int) -> _Waiting | None:
        """The first expected frame recorded before frame ``index`` that has not come."""
        order = self._order
        while order and order[0].done:
            order.popleft()
        return order[0] if order and order[0].index < index else None

    def pending(self) -> int:
        self.outstanding_before(1 << 62)
        return sum(1 for w in self._order if not w.done)

    def give_up(self, waiting: _Waiting, reason: str) -> Outcome:
        """An expected frame that will not be waited for any longer: missing."""
        waiting.done = True
        outcome = Outcome(
            Result.MISSING, waiting.record.get("type") or "", waiting.record, None, reason=reason
        )
        self._decided(outcome)
        return outcome

    def give_up_all(self, reason: str) -> None:
        """Every frame still held is extra, every one still expected missing (for ``reason``)."""
        for held in self._held:
            if not held.done:
                held.done = True
                self._judged(None, held.record, None)
        self._held.clear()
        self._early.clear()
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


#: How far ``compare_runs`` reads the first run ahead of the second: the memory it keeps.
LOOKAHEAD = 4096


def compare_runs(
    expected: Iterable[dict],
    actual: Iterable[dict],
    ignore: frozenset[str],
    key: Callable[[dict], tuple],
    matcher: Matcher | None = None,
) -> Matcher:
    """Two recordings of one side of a conversation, matched (``diff``). The first is read at
    most ``LOOKAHEAD`` frames ahead of the second, so two long runs that agree take little
    memory; a frame further out of place than that counts as missing and extra."""
    matcher = matcher or Matcher(ignore, key)
    ahead = iter(expected)
    index = 0
    for record in actual:
        for first in ahead:
            matcher.expect(index, first)
            index += 1
            if index > matcher_seen(matcher) + LOOKAHEAD:
                break
        matcher.seen(record)
    for first in ahead:
        matcher.expect(index, first)
        index += 1
    matcher.give_up_all("not in the second recording")
    return matcher


def matcher_seen(matcher: Matcher) -> int:
    """How many frames of the second run the matcher was told of."""
    counts = matcher.counts
    return counts[Result.MATCHED] + counts[Result.DIVERGENT] + counts[Result.VIOLATION] + counts[Result.EXTRA]
