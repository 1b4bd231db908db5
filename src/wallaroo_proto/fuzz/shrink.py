"""Shrinking a finding: the shortest conversation that still gives it (delta debugging).

First each edit alone is left out (a mutant that stacked edits may need one), then the seed's
units (a frame of ours and the peer's answers to it) are left out by ddmin, then an inserted
frame is moved as early as it still gives the finding, and a changed value brought as close
to the recorded one as it still does. Every try is one execution against the live peer, so it
stops at ``seconds``, keeping the smallest found so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from wallaroo_proto.replay.recording import Frame

from .mutate import Edit, Mutant, own_positions, units


def shrink(
    mutant: Mutant, frames: list[Frame], side: str, gives: Callable[[Mutant], bool], seconds: float
) -> Mutant:
    deadline = time.monotonic() + seconds
    best = mutant

    def better(candidate: Mutant) -> bool:
        nonlocal best
        if time.monotonic() > deadline:
            return False
        if gives(candidate):
            best = candidate
            return True
        return False

    # each edit alone, while there are several
    i = 0
    while len(best.edits) > 1 and i < len(best.edits):
        if not better(replace(best, edits=best.edits[:i] + best.edits[i + 1 :])):
            i += 1
    # an inserted frame, as early as it still gives the finding
    for n, edit in enumerate(best.edits):
        if edit.kind != "insert":
            continue
        for at in own_positions(frames, side):
            if at >= edit.at:
                break
            moved = replace(
                edit, at=at, text=edit.text.rsplit(" before ", 1)[0] + f" before {frames[at].type} #{at}"
            )
            if better(replace(best, edits=(*best.edits[:n], moved, *best.edits[n + 1 :]))):
                break
    # the frame an inserted one went before, left out (what follows the insert may not be needed)
    for edit in list(best.edits):
        if edit.kind == "insert" and not any(e.kind == "drop" and e.at == edit.at for e in best.edits):
            gone = Edit("drop", edit.at, text=f"{frames[edit.at].type} #{edit.at} dropped")
            better(replace(best, edits=(*best.edits, gone)))
    # the seed's units, by ddmin: those holding an edit's frame stay
    held = {e.at for e in best.edits} | {e.value for e in best.edits if e.kind == "swap"}
    removable = [n for n, unit in enumerate(units(frames, side)) if n > 0 and not held & set(unit)]
    # a unit after the last edit is never needed to reach it, but may be to see the reaction
    chunk = max(1, len(removable) // 2)
    while removable and chunk >= 1 and time.monotonic() < deadline:
        progressed = False
        for start in range(0, len(removable), chunk):
            part = removable[start : start + chunk]
            candidate = replace(best, removed=best.removed | frozenset(part))
            if better(candidate):
                removable = [n for n in removable if n not in part]
                progressed = True
                break
        if not progressed:
            if chunk == 1:
                break
            chunk = max(1, chunk // 2)
    return best
