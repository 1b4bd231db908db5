"""The judge contract: the one shape every protocol's core keeps (sans-IO).

A judge is one connection's (or one conversation's) rules. Whoever drives it (a mock
peer, the dissector, the proxy's checker, a conformance suite, replay, fuzz) tells it,
in the order things happened:

* ``feed(side, frame)``: ``side`` sent ``frame`` (decoded, or the bytes a core decodes
  itself). The answer is a ``Verdict``.
* ``end(side, how, partial=0)``: ``side`` stopped sending: closed (``End.CLOSED``),
  reset or lost (``End.RESET``), or cut short with ``partial`` bytes of a frame it
  never finished (``End.CUT``). The answer is a ``Verdict`` when the end itself
  breaks a rule, else None.
* ``expects()``: what it waits for next, as an ``Expected``: the frame types each
  side may send now, and a line for a person. Replay and fuzzing ask it.

Each core names its sides in ``SIDES`` and its rules in ``RULES`` (name -> what the
rule says). Every violation names one of them (``Verdict.rule``): the catalogue is
the documentation and the vocabulary of findings. A core's ``Verdict`` is a subclass
of the one here, with the protocol's own fields after the shared ones.

This module imports nothing of the project: every core may import it, and it
imports no core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, Protocol


class Kind(StrEnum):
    """What a judge made of one frame; one set for every protocol."""

    #: Legal here.
    ACCEPTED = "accepted"
    #: Legal, and a repeat of what was had already: dropped (Wallaroo's replayed MESSAGE) or
    #: replayed on purpose (AMBROSIA's recovery).
    REPLAYED = "replayed"
    #: Legal, read and not acted on: sent before the other side's refusal reached the sender,
    #: or a message its reader decodes and passes over.
    IGNORED = "ignored"
    #: No frame of the protocol; the real peer passes over it (a Kinesis line that is no JSON).
    SKIPPED = "skipped"
    #: Bytes that do not decode as the frame they claim to be.
    MALFORMED = "malformed"
    #: A frame that breaks a rule (``Verdict.rule``).
    VIOLATION = "violation"


#: The kinds that are not ``ok``.
_BAD = frozenset({Kind.VIOLATION, Kind.MALFORMED})


class End(StrEnum):
    """How a side stopped sending."""

    CLOSED = "closed"  # a FIN: nothing more will come from it
    RESET = "reset"  # a RST, or the connection lost
    CUT = "cut"  # the stream ended inside a frame (``partial`` bytes of it)


@dataclass(slots=True)
class Verdict:
    """A judge's answer on one frame or end. Cores extend it with their own fields."""

    kind: Kind
    #: Who sent the frame: one of the core's ``SIDES``.
    side: str = ""
    #: The ``RULES`` name of the rule broken (a violation), else None.
    rule: str | None = None
    #: Why, for a person: what was wrong, or what the frame did.
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """Neither a violation nor malformed."""
        return self.kind not in _BAD


class Expected(NamedTuple):
    """What a judge waits for next."""

    #: Each side's frame types that are legal now (an empty set: that side may send nothing).
    legal: Mapping[str, frozenset[str]]
    #: The same for a person: "Checkpoint from the LB", "OK or ERROR from the worker", ...
    text: str


class Judge(Protocol):
    """The contract a protocol's core keeps (see the module's docstring)."""

    SIDES: ClassVar[tuple[str, str]]
    RULES: ClassVar[Mapping[str, str]]

    def feed(self, side: str, frame: Any) -> Verdict: ...

    def end(self, side: str, how: End = End.CLOSED, partial: int = 0) -> Verdict | None: ...

    def expects(self) -> Expected: ...


__all__ = ["End", "Expected", "Judge", "Kind", "Verdict"]
