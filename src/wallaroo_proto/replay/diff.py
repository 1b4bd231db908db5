"""Two recordings of one conversation compared offline, with replay's engine: ``diff``.

Each capture's conversation is picked as replay picks it; the frames of each side of the
first are matched with the same side's frames of the second (by type and the protocol's
``match_key``) and compared field by field, passing over the protocol's noise and
``--ignore``. Both captures are read as streams, side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import adapter as adapters
from .compare import BAD, Matcher, Outcome, Result, compare_runs
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
            "outcomes": [o.as_dict() for o in self.outcomes],
        }


def diff(first: Conversation, second: Conversation, ignore: frozenset[str] = frozenset()) -> DiffReport:
    """``first``'s frames matched against ``second``'s, each side apart."""
    if first.protocol != second.protocol:
        raise DiffError(f"{first.capture} holds {first.protocol}, {second.capture} holds {second.protocol}")
    noise = adapters.noise(first.protocol, ignore)
    key = adapters.key_of(first.protocol)
    units = adapters.units_of(first.protocol)
    counts = dict.fromkeys((r.value for r in Result), 0)
    outcomes: list[Outcome] = []
    sides: dict[str, dict[str, int]] = {}
    totals = [0, 0]
    for side in first.sides:
        matcher = Matcher(noise, key, keep=1000)

        def of_side(conversation: Conversation, which: int, side: str = side):
            for frame in frames(conversation):
                totals[which] += 1
                if frame.sender == side:
                    yield from units(frame.record)

        compare_runs(of_side(first, 0), of_side(second, 1), noise, key, matcher)
        sides[side] = {r.value: n for r, n in matcher.counts.items()}
        for result, n in matcher.counts.items():
            counts[result.value] += n
        outcomes += matcher.kept
    outcomes.sort(key=lambda o: (o.recorded or o.live or {}).get("packet") or 0)
    return DiffReport(
        first.protocol, first.capture, second.capture, counts, outcomes, tuple(totals), sides=sides
    )
