"""Mutants: a seed conversation with edits, and the steps the replay engine plays for them.

An edit names frames by their place in the seed, so a mutant is small (a seed and a few
edits), can be mutated further, shrunk edit by edit, and said in words. Field edits change
the bytes the replay adapter made (the frame still follows the live peer, then is changed),
so a mutant reaches the states the seed reached.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from wallaroo_proto.replay.recording import Frame

from .hooks import Field, Hooks

#: Each mutation kind and how often it is chosen: field values and frames out of state most,
#: bytes at the framing layer a minority.
WEIGHTS = {
    "value": 34,
    "insert": 20,
    "drop": 10,
    "duplicate": 10,
    "swap": 8,
    "cut": 5,
    "half-close": 4,
    "reset": 3,
    "bytes": 6,
}


@dataclass(frozen=True, slots=True)
class Edit:
    """One change to the seed: ``kind`` at seed frame ``at`` (see ``WEIGHTS``)."""

    kind: str
    at: int
    #: value: the field's name; insert: the inserted frame's type.
    name: str = ""
    #: value: the new value; cut: bytes kept; bytes: the offset changed.
    value: int = 0
    #: bytes: the byte written; insert: the template's bytes.
    data: bytes = b""
    #: What was changed, for a person (and the reproducer's comment).
    text: str = ""


@dataclass(frozen=True, slots=True)
class Mutant:
    """A seed (its index) and the edits made to it, in order."""

    seed: int
    edits: tuple[Edit, ...] = ()
    #: Units of the seed left out (shrinking): a frame of ours and the peer's frames after it.
    removed: frozenset[int] = frozenset()

    @property
    def label(self) -> str:
        return "; ".join(edit.text for edit in self.edits) or "the seed as recorded"

    @property
    def kinds(self) -> str:
        return "+".join(edit.kind for edit in self.edits) or "none"


def own_positions(frames: list[Frame], side: str) -> list[int]:
    return [i for i, frame in enumerate(frames) if frame.sender == side]


def _field_edit(frame: Frame, at: int, hooks: Hooks, rng: random.Random, last: dict[str, int]) -> Edit | None:
    choices: list[Field] = hooks.fields(frame.record, frame.raw)
    if not choices:
        return None
    chosen = rng.choice(choices)
    value = rng.choice(boundaries(chosen, last.get(chosen.name)))
    return Edit(
        "value",
        at,
        name=chosen.name,
        value=value,
        text=f"{frame.type} #{at} {chosen.name} = {value} (was {chosen.value})",
    )


def boundaries(field: Field, last: int | None) -> list[int]:
    """The values worth trying for ``field``: its type's edges and, by kind, off by one in a
    length or count, around the last id sent, credits beyond the grant."""
    top = (1 << field.bits) - 1
    value = field.value
    out = {0, top, (top >> 1) + 1, value + 1, max(0, value - 1)}
    if field.kind in ("length", "count"):
        out |= {value + 2, value * 2 + 1}
    elif field.kind == "id" and last is not None:
        out |= {max(0, last - 1), last, last + 1}
    elif field.kind == "credit":
        out |= {value * 2 + 1, value + 1_000}
    elif field.kind == "enum":
        out |= {value + 16, 0x7F, 0xFF}
    out.discard(value)
    return sorted(v & top for v in out if v >= 0) or [0]


def mutate(
    mutant: Mutant,
    frames: list[Frame],
    side: str,
    hooks: Hooks,
    rng: random.Random,
    templates: dict[str, bytes],
) -> Mutant:
    """``mutant`` with one more edit, chosen by ``WEIGHTS`` among those the seed allows."""
    ours = own_positions(frames, side)
    if not ours:
        return mutant
    kinds = list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    for _ in range(20):
        kind = rng.choices(kinds, weights)[0]
        at = rng.choice(ours)
        frame = frames[at]
        edit: Edit | None = None
        if kind == "value":
            last = _last_values(frames, ours, at, hooks)
            edit = _field_edit(frame, at, hooks, rng, last)
        elif kind == "insert" and templates:
            name = _template(frames, side, templates, rng)
            edit = Edit(
                "insert",
                at,
                name=name,
                data=templates[name],
                text=f"{name} inserted before {frame.type} #{at}",
            )
        elif kind in ("drop", "duplicate", "half-close", "reset"):
            verb = {
                "drop": "dropped",
                "duplicate": "sent twice",
                "half-close": "then half-closed",
                "reset": "then reset",
            }
            edit = Edit(kind, at, text=f"{frame.type} #{at} {verb[kind]}")
        elif kind == "swap":
            later = [i for i in ours if i > at]
            if later:
                edit = Edit(
                    "swap",
                    at,
                    value=later[0],
                    text=f"{frame.type} #{at} sent after {frames[later[0]].type} #{later[0]}",
                )
        elif kind == "cut" and len(frame.raw) > 1:
            keep = rng.randrange(1, len(frame.raw))
            edit = Edit(
                "cut",
                at,
                value=keep,
                text=f"{frame.type} #{at} cut after {keep} of {len(frame.raw)} bytes, then half-closed",
            )
        elif kind == "bytes" and frame.raw:
            offset = rng.randrange(min(len(frame.raw), 8))  # the framing layer: length and type
            byte = rng.choice((0x00, 0xFF, 0x7F, 0x80, frame.raw[offset] ^ 0x01))
            edit = Edit(
                "bytes",
                at,
                value=offset,
                data=bytes([byte]),
                text=f"{frame.type} #{at} byte {offset} = 0x{byte:02x}",
            )
        if edit is not None:
            return replace(mutant, edits=(*mutant.edits, edit))
    return mutant


def sweep(seed: int, frames: list[Frame], side: str, templates: dict[str, bytes]) -> list[Mutant]:
    """The deterministic stage, before random mutation: each frame type inserted once in each
    state the seed reaches (a state: the peer's last frame type and the frame of ours due), so a
    frame out of state is tried everywhere it can be, whatever the random choices."""
    out = []
    seen: set[tuple[str, str]] = set()
    last_peer = "start"
    for at, frame in enumerate(frames):
        if frame.sender != side:
            last_peer = frame.type or last_peer
            continue
        if (last_peer, frame.type) in seen:
            continue
        seen.add((last_peer, frame.type))
        for name in sorted(templates):
            text = f"{name} inserted before {frame.type} #{at}"
            out.append(Mutant(seed, (Edit("insert", at, name=name, data=templates[name], text=text),)))
    return out


def _template(frames: list[Frame], side: str, templates: dict[str, bytes], rng: random.Random) -> str:
    """A frame type to insert: mostly one the seed never has the played side send (out of any
    state it reached), else any."""
    sent = {frame.type for frame in frames if frame.sender == side}
    unseen = sorted(name for name in templates if name not in sent)
    return rng.choice(unseen if unseen and rng.random() < 0.7 else sorted(templates))


def _last_values(frames: list[Frame], ours: list[int], at: int, hooks: Hooks) -> dict[str, int]:
    """Each field's value in the last frame of ours before ``at`` that has it (ids: the last sent)."""
    last: dict[str, int] = {}
    for i in ours:
        if i >= at:
            break
        for f in hooks.fields(frames[i].record, frames[i].raw):
            last[f.name] = f.value
    return last


def units(frames: list[Frame], side: str) -> list[list[int]]:
    """The seed cut into units: each frame of ours with the peer's frames recorded after it (its
    answers), and what came before the first as a unit of its own."""
    out: list[list[int]] = [[]]
    for i, frame in enumerate(frames):
        if frame.sender == side:
            out.append([i])
        else:
            out[-1].append(i)
    return [unit for unit in out if unit]


def steps(mutant: Mutant, frames: list[Frame], side: str, hooks: Hooks) -> list[Frame]:
    """The frames to play for ``mutant``: the seed's, less the removed units, with its edits."""
    gone: set[int] = set()
    for unit_index, unit in enumerate(units(frames, side)):
        if unit_index in mutant.removed:
            gone.update(unit)
    by_at: dict[int, list[Edit]] = {}
    for edit in mutant.edits:
        by_at.setdefault(edit.at, []).append(edit)
    swapped = {e.value: e.at for e in mutant.edits if e.kind == "swap"}
    out: list[Frame] = []
    held: dict[int, Frame] = {}  # a swapped frame, sent after its partner
    carried: list[str] = []  # notes of frames dropped or moved, for the next frame of ours
    for i, frame in enumerate(frames):
        if i in gone:
            continue
        edits = by_at.get(i, [])
        for e in edits:  # an inserted frame goes before its frame, even one dropped
            if e.kind == "insert":
                out.append(
                    replace(
                        frame,
                        record={k: frame.record.get(k) for k in _WHERE} | {"type": e.name},
                        raw=hooks.fit(e.data, frame),
                        as_is=True,
                        note=f"fuzz: {e.text}",
                    )
                )
        if any(e.kind == "drop" for e in edits):
            carried += [e.text for e in edits if e.kind == "drop"]
            continue
        changed = _changed(frame, edits, hooks)
        carried += [e.text for e in edits if e.kind == "swap"]
        if carried and frame.sender == side:  # a dropped or moved frame is noted on the next of ours
            note = "; ".join(carried + ([changed.note.removeprefix("fuzz: ")] if changed.note else []))
            changed = replace(changed, note=f"fuzz: {note}")
            carried = []
        if any(e.kind == "swap" for e in edits):
            held[i] = changed
            continue
        out.append(changed)
        if i in swapped and swapped[i] in held:
            out.append(held.pop(swapped[i]))
        if changed.then:
            break
    out.extend(held.values())
    return out


#: What an inserted frame keeps of the recorded one it goes before: who sends it, where.
_WHERE = ("sender", "conn_index", "direction", "packet", "ts")


def _changed(frame: Frame, edits: list[Edit], hooks: Hooks) -> Frame:
    edits = [e for e in edits if e.kind not in ("insert", "drop", "swap")]
    if not edits:
        return frame
    record = frame.record
    then = None

    def edit(data: bytes) -> bytes:
        for e in edits:
            if e.kind == "value":
                field = next((f for f in hooks.fields(record, data) if f.name == e.name), None)
                if field is not None:
                    data = hooks.with_value(record, data, field, e.value)
            elif e.kind == "duplicate":
                data = data + data
            elif e.kind == "cut":
                data = data[: e.value]
            elif e.kind == "bytes" and e.value < len(data):
                data = data[: e.value] + e.data + data[e.value + 1 :]
        return data

    for e in edits:
        if e.kind in ("cut", "half-close"):
            then = "half-close"
        elif e.kind == "reset":
            then = "reset"
    return replace(frame, edit=edit, then=then, note="fuzz: " + "; ".join(e.text for e in edits))
