"""Two recordings of one conversation compared offline, with replay's engine: ``diff``.

Each capture's conversation is picked as replay picks it; the frames of each side of the
first are matched with the same side's frames of the second (by type and the protocol's
``match_key``) and compared field by field, passing over the protocol's noise and
``--ignore``. Both captures are read as streams, side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest

from . import adapter as adapters
from .compare import BAD, Matcher, Outcome, Result
from .recording import Conversation, frames


class DiffError(ValueError):
    """The two conversations cannot be compared (two protocols)."""


@dataclass
class DiffReport:
    protocol: str
    first: str
    second: str
    counts: dict[str, int]
    outcomes: list[Outcome]
    #: Frames of each capture's conversation.
    frames: tuple[int, int] = (0, 0)
    other_packet: str = "second packet"
    sides: dict[str, dict[str, int]] = field(default_factory=dict)
    #: What a person should know besides (a capture cut short).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.counts.get(r.value, 0) for r in BAD)

    def title(self) -> str:
        return f"diff of {self.protocol} conversations {self.first} and {self.second}"

    def as_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "first": self.first,
            "second": self.second,
            "ok": self.ok,
            "counts": self.counts,
            "sides": self.sides,
            "frames": list(self.frames),
            "notes": self.notes,
            "outcomes": [o.as_dict() for o in self.outcomes],
        }


def diff(
    first: Conversation,
    second: Conversation,
    ignore: frozenset[str] = frozenset(),
    sides: tuple[str, ...] | None = None,
) -> DiffReport:
    """``first``'s frames matched against ``second``'s, each side apart (``sides``: only these).

    Each capture is read once: its frames go to their side's matcher as they come, the two
    captures side by side, so two long runs that agree take little memory."""
    if first.protocol != second.protocol:
        raise DiffError(f"{first.capture} holds {first.protocol}, {second.capture} holds {second.protocol}")
    noise = adapters.noise(first.protocol, ignore)
    key = adapters.key_of(first.protocol)
    wanted = sides or first.sides
    matchers = {side: Matcher(noise, key, keep=1000) for side in wanted}
    cuts = [units_reader(first.protocol, wanted), units_reader(second.protocol, wanted)]
    totals = [0, 0]
    index = 0
    for one, two in zip_longest(frames(first), frames(second)):
        for which, frame in ((0, one), (1, two)):
            if frame is None or frame.sender not in matchers:
                totals[which] += frame is not None
                continue
            totals[which] += 1
            matcher = matchers[frame.sender]
            for unit in cuts[which](frame):
                if which == 0:
                    matcher.expect(index, unit)
                else:
                    matcher.seen(unit)
        index += 1
    counts = dict.fromkeys((r.value for r in Result), 0)
    outcomes: list[Outcome] = []
    per_side: dict[str, dict[str, int]] = {}
    for side, matcher in matchers.items():
        matcher.give_up_all("not in the second recording")
        per_side[side] = {r.value: n for r, n in matcher.counts.items()}
        for result, n in matcher.counts.items():
            counts[result.value] += n
        outcomes += matcher.kept
    outcomes.sort(key=lambda o: (o.recorded or o.live or {}).get("packet") or 0)
    notes = [c.cut for c in (first, second) if c.cut]
    return DiffReport(
        first.protocol,
        first.capture,
        second.capture,
        counts,
        outcomes,
        tuple(totals),
        sides=per_side,
        notes=notes,
    )


def units_reader(protocol: str, sides: tuple[str, ...]):
    """A frame's units, as replay compares them: the adapter's ``units(record, raw)`` where only
    the bytes tell them (an AMBROSIA RPCBatch), else the module's ``units(record)``."""
    by_bytes = {side: getattr(adapters.make(protocol, side), "units", None) for side in sides}
    by_record = adapters.units_of(protocol)

    def cut(frame) -> list[dict]:
        units = by_bytes.get(frame.sender)
        return units(frame.record, frame.raw) if units is not None else by_record(frame.record)

    return cut
