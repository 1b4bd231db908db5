"""What a protocol brings to ``fuzz``: its frames' fields, what its peers owe, how they refuse.

A plug-in's ``fuzz_hooks()`` gives a module with (each optional; the defaults here):

* ``fields(record, raw) -> list[Field]``: the fields of a frame of the played side worth
  changing, with where they lie in its bytes (``raw``: the whole frame as sent, its length
  prefix included). The kinds tell the fuzzer which values are the boundaries (``KINDS``).
* ``with_value(record, raw, field, value) -> bytes``: the frame with ``field`` set to
  ``value`` (default: the integer written at ``field.offset``; a text protocol rewrites
  its line or message).
* ``templates(side) -> dict[str, bytes]``: one well-formed frame of each type ``side`` may
  ever send, written by the codec: what the fuzzer inserts where the core expects
  something else (a RESTART in the middle of a stream).
* ``owed(record) -> Owed | None``: what the peer owes for a legal frame of the played side
  (a NOTIFY is owed a NOTIFY_ACK; a RESTART a new connection): a peer that gives none of
  it within ``--answer-timeout`` stopped answering.
* ``refusal(record) -> bool``: is this frame of the peer its error reply (an ERROR, a
  response with an error status)?
* ``closed(record) -> bool``: did this frame (the peer's, or a legal one of ours) end the
  session, so that what we send after it is owed no reply (default: ``refusal``; Tremor's
  close, close-ack and Close too, which refuse no illegal frame sent before them)?
* ``tolerated(record) -> bool``: is this illegal frame of the played side one the protocol
  lets the peer pass over (a data node logs a DCP BUFFER_ACK of too many bytes and goes on)?
  Going on after it is then no ``accepted`` finding.
* ``REPLY_BEFORE_CLOSE``: the sides that must answer an illegal frame with an error reply
  before they close (a Wallaroo worker sends ERROR); any other side refuses by closing.
* ``REFUSE_BY_EXIT``: the sides whose process exits when a peer breaks a rule, by design (an
  AMBROSIA IC): their exit after an illegal frame is their refusal, not a crash.
* ``fit(template, frame) -> bytes``: a template made to fit the recorded frame it is inserted
  before (its ids, its committer), so it is out of state and nothing else.
* ``signature(kind) -> str``: what a peer's frame of type ``kind`` counts as when the first
  plays of a seed are compared (default: itself); runs of one name count once. A peer that
  splits or joins frames as its reads fall (AMBROSIA's RPC batches, a hint) is steady all the same.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from wallaroo_proto.protocols import get_plugin

#: Field kinds: ``uint`` (any integer), ``length`` and ``count`` (off by one and past the end
#: matter), ``id`` (below, equal to and above the last one sent matter), ``credit`` (beyond
#: the grant matters), ``enum`` (values outside the known set matter).
KINDS = ("uint", "length", "count", "id", "credit", "enum")


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a frame: its name, kind, value and width; ``offset`` into the frame's bytes."""

    name: str
    kind: str
    value: int
    bits: int
    offset: int | None = None
    byteorder: str = "big"


@dataclass(frozen=True, slots=True)
class Owed:
    """What the peer owes: a frame of one of ``types``, or (``reconnect``) a new connection."""

    types: frozenset[str] = frozenset()
    reconnect: bool = False


def integer_at(raw: bytes, offset: int, bits: int, byteorder: str = "big") -> int | None:
    """The unsigned integer of ``bits`` at ``offset``, or None past the frame's end."""
    size = bits // 8
    if offset + size > len(raw):
        return None
    return int.from_bytes(raw[offset : offset + size], byteorder)  # type: ignore[arg-type]


def laid_out(raw: bytes, layout: list[tuple[str, str, int, int]]) -> list[Field]:
    """Fields of a binary frame from its layout, (name, kind, offset, bits) each (big-endian):
    those that lie past the frame's end (a short frame) are left out."""
    out = []
    for name, kind, offset, bits in layout:
        value = integer_at(raw, offset, bits)
        if value is not None:
            out.append(Field(name, kind, value, bits, offset))
    return out


def fields(record: dict, raw: bytes) -> list[Field]:
    """Default: nothing known of the frame's layout (only sequence and byte mutations apply)."""
    return []


def with_value(record: dict, raw: bytes, field: Field, value: int) -> bytes:
    """Default: the integer written over the field's bytes, wrapped to its width."""
    if field.offset is None:
        return raw
    size = field.bits // 8
    data = (value % (1 << field.bits)).to_bytes(size, field.byteorder)  # type: ignore[arg-type]
    return raw[: field.offset] + data + raw[field.offset + size :]


def templates(side: str) -> dict[str, bytes]:
    return {}


def owed(record: dict) -> Owed | None:
    return None


def refusal(record: dict) -> bool:
    return False


def tolerated(record: dict) -> bool:
    return False


REPLY_BEFORE_CLOSE: frozenset[str] = frozenset()
REFUSE_BY_EXIT: frozenset[str] = frozenset()


def fit(template: bytes, frame: Any) -> bytes:
    return template


def signature(kind: str) -> str:
    return kind


def module(protocol: str) -> ModuleType:
    """The protocol's fuzz hooks (its plug-in's ``fuzz_hooks``), else the defaults here."""
    factory = getattr(get_plugin(protocol), "fuzz_hooks", None)
    return factory() if factory is not None else importlib.import_module(__name__)


class Hooks:
    """One protocol's hooks, each the plug-in's or the default."""

    def __init__(self, protocol: str) -> None:
        mod = module(protocol)
        here = importlib.import_module(__name__)
        for name in (
            "fields",
            "with_value",
            "templates",
            "owed",
            "refusal",
            "tolerated",
            "REPLY_BEFORE_CLOSE",
            "REFUSE_BY_EXIT",
            "fit",
            "signature",
        ):
            setattr(self, name, getattr(mod, name, getattr(here, name)))
        self.closed = getattr(mod, "closed", self.refusal)
