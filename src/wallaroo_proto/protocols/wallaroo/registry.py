"""The mock worker's stream registry: who holds each stream and where it may resume.

The shipped worker keeps a global registry of stream ids across all connector
connections (spec, "Streaming"): a stream held open by one connection cannot be
NOTIFYed by another, and a reopened stream resumes from the last checkpointed
point of reference. This module is that registry, without any I/O but its
optional durable state file.

Point-of-reference rule, the shipped worker's: ``point_of_ref`` is the id of the
last message a checkpoint holds, so every message with an id at or below it is
durable, and a connector resumes by sending the ids above it (a re-sent id at or
below it is dropped as a replay). 0 means nothing is acknowledged yet.

Durability: ``state_bytes`` renders the registry as JSON and ``write_atomic``
writes it to a temporary file in the same directory, fsyncs it, renames it over
the target and fsyncs the directory, so a crash leaves either the old or the new
state, never a torn one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ...durable import write_atomic
from .frames import Text, show_text

STATE_FORMAT = "wallaroo-proto mock-worker state"
#: 2: points of reference are the last id held (version 1 stored the last id + 1).
STATE_VERSION = 2
_U64_MAX = (1 << 64) - 1


class StateError(ValueError):
    """A state file that cannot be used: says which file and what is wrong."""


@dataclass(slots=True)
class StreamEntry:
    stream_id: int
    name: Text = ""
    #: Checkpointed point of reference: every message id at or below it is durable.
    point_of_ref: int = 0
    #: Last delivered message id (across all connections); -1 when none.
    #: A message whose id is not above it is a replay and is dropped.
    last_seen: int = -1
    #: The connection that holds the stream (NOTIFY accepted, no EOS yet), or None.
    owner: Hashable | None = None
    delivered: int = 0
    replays: int = 0
    notifies: int = 0
    refused: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to a NOTIFY: success, and the point of reference for NOTIFY_ACK."""

    success: bool
    point_of_ref: int
    #: Who holds the stream when the claim was refused.
    holder: Hashable | None = None


@dataclass(slots=True)
class Registry:
    """Streams across all connections of one worker."""

    path: Path | None = None
    streams: dict[int, StreamEntry] = field(default_factory=dict)
    checkpoints: int = 0
    #: Streams delivered to since the last snapshot (checked at the next checkpoint).
    dirty: set[int] = field(default_factory=set)
    #: The sink forwarder's durable position, when the worker drives a sink.
    sink: dict | None = None
    #: The ``--out`` file's checkpointed length: {"path": absolute path, "bytes": n}.
    out: dict | None = None

    # --- notify / end of stream -------------------------------------------------

    def notify(self, stream_id: int, name: Text, owner: Hashable, connector_por: int = 0) -> Claim:
        """Claim a stream for ``owner``; refused while any connection holds it.

        A stream never seen before starts at the connector's own point of
        reference and, as in the shipped worker, takes any id as its first
        message; a known one resumes from its checkpointed point of reference,
        whatever the connector sent.
        """
        entry = self.streams.get(stream_id)
        if entry is None:
            por = min(max(connector_por, 0), _U64_MAX)
            entry = self.streams[stream_id] = StreamEntry(stream_id, name, por)
        entry.notifies += 1
        if entry.owner is not None:
            entry.refused += 1
            return Claim(False, entry.point_of_ref, entry.owner)
        entry.owner = owner
        entry.name = name
        return Claim(True, entry.point_of_ref)

    def release(self, stream_id: int, owner: Hashable) -> bool:
        """The owner ended the stream (EOS_MESSAGE) or went away; True if it held it."""
        entry = self.streams.get(stream_id)
        if entry is None or entry.owner != owner:
            return False
        entry.owner = None
        return True

    def release_all(self, owner: Hashable) -> list[int]:
        """Release every stream ``owner`` holds (its connection closed); returns their ids."""
        released = [e.stream_id for e in self.streams.values() if e.owner == owner]
        for stream_id in released:
            self.streams[stream_id].owner = None
        return released

    def held_by(self, owner: Hashable) -> list[int]:
        return [e.stream_id for e in self.streams.values() if e.owner == owner]

    # --- messages -----------------------------------------------------------------

    def is_replay(self, stream_id: int, message_id: int) -> bool:
        """True if the id is not above the last one delivered on this stream (any connection)."""
        return message_id <= self.streams[stream_id].last_seen

    def delivered(self, stream_id: int, message_id: int) -> None:
        """Record a delivered message: it becomes the stream's last seen id."""
        entry = self.streams[stream_id]
        entry.last_seen = message_id
        entry.delivered += 1
        self.dirty.add(stream_id)

    # --- checkpoints ----------------------------------------------------------------

    def advanced(self) -> dict[int, int]:
        """Streams whose deliveries passed their checkpoint: {stream_id: new point_of_ref}.

        Clears the dirty set; deliveries after this call count towards the next checkpoint.
        """
        snapshot = {}
        streams = self.streams
        for stream_id in self.dirty:
            entry = streams[stream_id]
            if entry.last_seen > entry.point_of_ref:
                snapshot[stream_id] = entry.last_seen
        self.dirty.clear()  # in place: the worker's hot loop holds a reference to this set
        return snapshot

    def commit(self, snapshot: dict[int, int]) -> None:
        """Make ``snapshot`` the checkpointed points of reference (after it is durable)."""
        for stream_id, por in snapshot.items():
            entry = self.streams[stream_id]
            if por > entry.point_of_ref:
                entry.point_of_ref = por
        self.checkpoints += 1

    # --- durable state ----------------------------------------------------------------

    def state_bytes(
        self, pending: dict[int, int] | None = None, sink: dict | None = None, out: dict | None = None
    ) -> bytes:
        """The registry as its state file, with ``pending`` points of reference applied.

        ``sink`` is the sink forwarder's position (offset, txn, next checkpoint id) and
        ``out`` the ``--out`` file's length at the checkpoint, written in the same atomic
        file so all move together.
        """
        pending = pending or {}
        sink = sink if sink is not None else self.sink
        out = out if out is not None else self.out
        streams = [
            {
                "stream_id": e.stream_id,
                "name": show_text(e.name),
                "point_of_ref": max(e.point_of_ref, pending.get(e.stream_id, 0)),
            }
            for e in sorted(self.streams.values(), key=lambda e: e.stream_id)
        ]
        doc = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "checkpoints": self.checkpoints + (1 if pending else 0),
            "streams": streams,
        }
        if sink is not None:
            doc["sink"] = sink
        if out is not None:
            doc["out"] = out
        return (json.dumps(doc, indent=1) + "\n").encode()

    def save(self) -> None:
        """Write the state file now (blocking); a no-op without a path."""
        if self.path is not None:
            write_atomic(self.path, self.state_bytes())

    def resume_out(self, out: str | None) -> int | None:
        """Where ``--out`` continues after a restart: the checkpointed length when the state
        knows this file, so lines past the last checkpoint (delivered again) are not doubled.

        A state from a run that wrote no ``--out`` (or another file) cannot say; the file
        is then appended to. No state at all starts a regular file afresh; a pipe just
        takes what comes. This run's own checkpoints record its own file (or none, without
        ``out``: the state's mark of an earlier run's file is stale) from now on.
        """
        known = self.out
        self.out = None
        if not out:
            return None
        path = Path(out)
        if not path.is_file():
            return None
        if known is not None and known["path"] == str(path.resolve()):
            return known["bytes"]
        return path.stat().st_size if self.streams else None

    @classmethod
    def open(cls, path: str | os.PathLike | None) -> Registry:
        """A registry backed by ``path``, loaded from it when the file exists."""
        if path is None:
            return cls()
        path = Path(path)
        registry = cls(path)
        if path.exists():
            entries, registry.sink, registry.out = _parse_state(path)
            registry.load_entries(entries)
        return registry

    def load_entries(self, entries: Iterable[tuple[int, str, int]]) -> None:
        for stream_id, name, por in entries:
            # Ids at or below a checkpointed point are replays; 0 is "nothing acknowledged".
            self.streams[stream_id] = StreamEntry(stream_id, name, por, por if por > 0 else -1)


def _parse_state(path: Path) -> tuple[list[tuple[int, str, int]], dict | None, dict | None]:
    try:
        doc = json.loads(path.read_bytes())
    except OSError as err:
        raise StateError(f"cannot read state file {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise StateError(f"state file {path} is not valid JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise StateError(f"state file {path} is not a mock-worker state file (no format {STATE_FORMAT!r})")
    if doc.get("version") == 1:
        raise StateError(
            f"state file {path} has version 1, whose points of reference are the last id + 1; "
            "this worker keeps the last id held (version 2): start from a new state file"
        )
    if doc.get("version") != STATE_VERSION:
        raise StateError(f"state file {path} has version {doc.get('version')!r}; expected {STATE_VERSION}")
    entries = []
    streams = doc.get("streams")
    if not isinstance(streams, list):
        raise StateError(f"state file {path}: 'streams' must be a list")
    for i, item in enumerate(streams):
        try:
            stream_id, name, por = item["stream_id"], item["name"], item["point_of_ref"]
        except (TypeError, KeyError) as err:
            raise StateError(f"state file {path}: streams[{i}] lacks {err}") from err
        ok_int = all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U64_MAX for v in (stream_id, por)
        )
        if not ok_int or not isinstance(name, str):
            raise StateError(f"state file {path}: streams[{i}] has a bad stream_id, name or point_of_ref")
        entries.append((stream_id, name, por))
    sink = doc.get("sink")
    if sink is not None and not (
        isinstance(sink, dict)
        and all(isinstance(sink.get(k), int) for k in ("offset", "next_cid"))
        and isinstance(sink.get("txn"), (str, type(None)))
    ):
        raise StateError(f"state file {path}: 'sink' must hold offset, txn and next_cid")
    out = doc.get("out")
    if out is not None and not (
        isinstance(out, dict) and isinstance(out.get("path"), str) and isinstance(out.get("bytes"), int)
    ):
        raise StateError(f"state file {path}: 'out' must hold path and bytes")
    return entries, sink, out
