"""The data behind the DCP mocks (sans-IO): a producer's vbucket histories and a consumer's copy.

Producer side: a ``VBucket`` keeps every version of every item in seqno
order (seqnos 1..high, no gaps) and its failover table. A stream from a
start seqno is cut into snapshots: what was already on "disk" when the
producer started (everything loaded from ``--state``) goes as one
deduplicated disk snapshot, as a backfill does; newer versions go as memory
snapshots of at most ``snapshot_size`` versions, deduplicated inside each.
Each snapshot's end is the seqno of its last version, so every snapshot end is
a point where the consumer's copy equals the producer's state at that seqno.
A failover loses the newest versions (the promoted replica never got them)
and starts a new failover entry with a fresh uuid at the new high seqno.

Consumer side: a ``ConsumerVBucket`` keeps every item received (undecoded, in
seqno order) and the ends of the snapshots it completed, so a ROLLBACK to seqno r truncates it to
the last completed snapshot end at or before r, the newest point it holds a
consistent copy of. Both sides serialize to plain JSON values for ``--state``.
"""

from __future__ import annotations

import bisect
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

from . import codec
from .core import StreamRun, add_failover_entry

MUTATION, DELETION, EXPIRATION = "mutation", "deletion", "expiration"
OPS = (MUTATION, DELETION, EXPIRATION)
_OPCODES = {MUTATION: codec.MUTATION, DELETION: codec.DELETION, EXPIRATION: codec.EXPIRATION}
#: What a version is sent as by default: an expiration is a DELETION unless the consumer opened with
#: IncludeDeleteTimes and asked for ``enable_expiry_opcode`` (the producer encodes that form itself).
_SENT_AS = {MUTATION: codec.MUTATION, DELETION: codec.DELETION, EXPIRATION: codec.DELETION}
#: Where a packet's CAS is.
CAS_AT = 16
#: Where a packet's opaque starts.
OPAQUE_AT = 12


def _no_clock() -> int:
    return 0


class StateError(ValueError):
    """A state or input file that cannot be read as this program wrote it."""


@dataclass(slots=True)
class Version:
    """One version of an item, kept with its stream packet already encoded.

    The packet (``codec.items``) with the opaque left out is ``head`` + opaque +
    ``tail``: a stream sends it with its own opaque and nothing encoded per item.
    """

    seqno: int
    key: str
    op: str
    value: str
    rev: int
    cas: int = 0
    head: bytes = b""
    tail: bytes = b""


@dataclass(slots=True)
class Snapshot:
    start: int
    end: int
    flags: int
    versions: list[Version]


def new_uuid(rng: random.Random) -> int:
    """A vbucket uuid: random 64 bits, never 0."""
    while True:
        uuid = rng.getrandbits(64)
        if uuid:
            return uuid


class VBucket:
    """One vbucket's full history and failover table (newest entry first)."""

    def __init__(self, vb: int, failover: list[tuple[int, int]], log: list[Version] | None = None) -> None:
        self.vb = vb
        self.failover = failover
        self.log: list[Version] = log or []
        self.revs: dict[str, int] = {}
        self.max_cas = 0
        for v in self.log:
            self.revs[v.key] = v.rev
            if v.cas <= self.max_cas:  # a state written before CAS was kept: a logical clock
                v.cas = self.max_cas + 1
            self.max_cas = v.cas
            self._encode(v)
        #: Versions up to this seqno count as on disk: a stream from before it starts with a backfill.
        self.persisted = self.high_seqno

    @property
    def high_seqno(self) -> int:
        return len(self.log)

    @property
    def uuid(self) -> int:
        return self.failover[0][0]

    def add(self, key: str, op: str, value: str = "", now_ns: int = 0) -> Version:
        """A new version; its CAS comes from the vbucket's hybrid logical clock at ``now_ns``.

        As the server's HLC: the physical time in nanoseconds with the low 16 bits
        cleared for a logical counter, and never less than the last CAS plus one.
        """
        rev = self.revs.get(key, 0) + 1
        self.revs[key] = rev
        self.max_cas = max(now_ns & ~0xFFFF, self.max_cas + 1)
        version = Version(len(self.log) + 1, key, op, value if op == MUTATION else "", rev, self.max_cas)
        self._encode(version)
        self.log.append(version)
        return version

    def _encode(self, v: Version) -> None:
        """Keep the version's stream packet, opaque left out (as a store keeps items in their binary form)."""
        entry = (_SENT_AS[v.op], v.seqno, v.rev, v.key.encode(), v.value.encode())
        wire = codec.items(self.vb, 0, [entry])[0]
        v.head, v.tail = wire[:OPAQUE_AT], v.cas.to_bytes(8, "big") + wire[CAS_AT + 8 :]

    def fail_over(self, uuid: int, lose: int) -> None:
        """A replica that missed the newest ``lose`` versions takes over with ``uuid``."""
        del self.log[max(0, len(self.log) - lose) :]
        self.revs = {}
        for v in self.log:
            self.revs[v.key] = v.rev
        self.max_cas = max((v.cas for v in self.log), default=self.max_cas)  # the clock never goes back
        self.persisted = min(self.persisted, self.high_seqno)
        self.failover = add_failover_entry(self.failover, uuid, self.high_seqno)

    def snapshots(self, start: int, end: int, snapshot_size: int) -> Iterator[Snapshot]:
        """The stream's snapshots after ``start`` up to ``end`` (or the high seqno)."""
        last = min(end, self.high_seqno)
        first_marker = True
        pos = start
        if pos < self.persisted and pos < last:
            stop = min(self.persisted, last)
            yield Snapshot(pos, stop, codec.SNAP_DISK | codec.SNAP_CHECKPOINT, _dedup(self.log[pos:stop]))
            pos, first_marker = stop, False
        while pos < last:
            stop = min(pos + snapshot_size, last)
            marker_start = start if first_marker else pos + 1
            yield Snapshot(
                marker_start, stop, codec.SNAP_MEMORY | codec.SNAP_CHECKPOINT, _dedup(self.log[pos:stop])
            )
            pos, first_marker = stop, False

    def state(self) -> dict[str, int | str | None]:
        """The live items: key -> value (deleted and expired keys absent)."""
        live: dict[str, Any] = {}
        for v in self.log:
            if v.op == MUTATION:
                live[v.key] = v.value
            else:
                live.pop(v.key, None)
        return live

    def to_json(self) -> dict:
        return {
            "failover": [[u, s] for u, s in self.failover],
            "log": [[v.key, v.op, v.value, v.rev, v.cas] for v in self.log],
        }

    @classmethod
    def from_json(cls, vb: int, obj: Any) -> VBucket:
        try:
            failover = [(int(u), int(s)) for u, s in obj["failover"]]
            log = [
                Version(n, str(k), str(op), str(val), int(rev), int(cas[0]) if cas else 0)
                for n, (k, op, val, rev, *cas) in enumerate(obj["log"], 1)
            ]
        except (KeyError, TypeError, ValueError) as err:
            raise StateError(f"vbucket {vb}: {err}") from None
        if not failover or any(op not in OPS for op in (v.op for v in log)):
            raise StateError(f"vbucket {vb}: no failover log or an unknown op (known: {', '.join(OPS)})")
        return cls(vb, failover, log)


def _dedup(versions: list[Version]) -> list[Version]:
    """The last version of each key, in seqno order (what a snapshot carries)."""
    latest = dict(zip(map(_KEY, versions), versions, strict=True))  # a key's last version wins
    if len(latest) == len(versions):
        return versions
    return sorted(latest.values(), key=_VERSION_SEQNO)


_KEY = attrgetter("key")
_VERSION_SEQNO = attrgetter("seqno")


class Bucket:
    """A producer's vbuckets, made new, loaded from ``--state``, faulted and saved."""

    def __init__(self, vbuckets: list[VBucket]) -> None:
        self.vbuckets = {v.vb: v for v in vbuckets}
        #: Nanoseconds since the epoch for new versions' CAS (the caller gives a clock; 0: logical only).
        self.clock: Callable[[], int] = _no_clock

    @classmethod
    def new(cls, count: int, rng: random.Random) -> Bucket:
        return cls([VBucket(vb, [(new_uuid(rng), 0)]) for vb in range(count)])

    @classmethod
    def open(cls, path: str | None, count: int, rng: random.Random) -> Bucket:
        """The bucket the ``--state`` file keeps, when there is one (a restart keeps its history),
        else ``count`` new vbuckets; a file that cannot be read or used is a StateError naming it."""
        if not path or not os.path.exists(path):
            return cls.new(count, rng)
        try:
            with open(path, "rb") as f:
                return cls.from_json(f.read())
        except OSError as err:
            raise StateError(f"cannot read --state {path}: {err.strerror or err}") from err
        except StateError as err:
            raise StateError(f"--state {path}: {err}") from err

    @classmethod
    def from_json(cls, raw: bytes) -> Bucket:
        try:
            obj = json.loads(raw)
            vbs = obj["vbuckets"]
            return cls([VBucket.from_json(int(vb), v) for vb, v in vbs.items()])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise StateError(f"not a mock-producer state file: {err}") from None

    def to_json(self) -> bytes:
        return json.dumps({"vbuckets": {str(vb): v.to_json() for vb, v in self.vbuckets.items()}}).encode()

    def fail_over(self, rng: random.Random, lose: int) -> None:
        """Every vbucket fails over: its newest ``lose`` versions are gone and a new uuid begins."""
        for vb in self.vbuckets.values():
            vb.fail_over(new_uuid(rng), lose)

    def generate(self, count: int, rng: random.Random, keys: int, value_size: int) -> None:
        """``count`` new versions per vbucket over ``keys`` keys: mutations, deletions, expirations."""
        for vb in self.vbuckets.values():
            for _ in range(count):
                key = f"key-{vb.vb}-{rng.randrange(keys)}"
                roll = rng.random()
                op = MUTATION if roll < 0.85 else DELETION if roll < 0.95 else EXPIRATION
                value = ""
                if op == MUTATION:
                    n = vb.high_seqno + 1
                    body = json.dumps({"key": key, "n": n})
                    value = body + " " * max(0, value_size - len(body))
                vb.add(key, op, value, self.clock())

    def load(self, items: Iterable[dict]) -> int:
        """Items from JSONL (key, value, vbucket, op); returns how many."""
        n = 0
        for item in items:
            vb = self.vbuckets.get(int(item.get("vbucket", 0)))
            if vb is None:
                raise StateError(f"item {n + 1}: no vbucket {item.get('vbucket')}")
            op = item.get("op", MUTATION)
            if op not in OPS or "key" not in item:
                raise StateError(f"item {n + 1}: needs a key and an op of {', '.join(OPS)}")
            value = item.get("value", "")
            vb.add(str(item["key"]), op, value if isinstance(value, str) else json.dumps(value), self.clock())
            n += 1
        return n


def items_of(lines: Iterable[bytes | str]) -> list[dict]:
    """``--input``'s items, a JSON object a line (blank lines skipped); a StateError names the line."""
    items = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as err:
            raise StateError(f"line {n}: not JSON ({err})") from None
        if not isinstance(item, dict):
            raise StateError(f"line {n}: not a JSON object")
        items.append(item)
    return items


# ------------------------------------------------------------------------------------------ consumer


@dataclass(slots=True)
class ConsumerVBucket:
    """A consumer's copy of one vbucket and what it asks the producer for when it resumes.

    The copy is a log of the items received, in seqno order, as they came off the
    wire: (opcode, seqno, key, value) with key and value undecoded, so a run of items
    is added with one ``extend``. Text is made only for output and the state file.
    """

    vb: int
    failover: list[tuple[int, int]] = field(default_factory=list)
    seqno: int = 0
    snap_start: int = 0
    snap_end: int = 0
    #: Every item received, oldest first: (opcode, seqno, key, value); a value only for a mutation.
    log: list[tuple[int, int, bytes, bytes]] = field(default_factory=list)
    #: Ends of the snapshots completed, ascending: the points a rollback can go back to.
    consistent: list[int] = field(default_factory=list)
    items: int = 0
    rollbacks: int = 0
    done: bool = False

    def stream_request(self, end: int = codec.FOREVER) -> codec.StreamReq:
        uuid = self.failover[0][0] if self.failover else 0
        if self.seqno < self.snap_start:  # a marker came but none of its items: resume from the last point
            return codec.StreamReq(0, self.seqno, end, uuid, self.seqno, self.seqno)
        return codec.StreamReq(0, self.seqno, end, uuid, self.snap_start, self.snap_end)

    def marker(self, start: int, end: int) -> None:
        self.snap_start, self.snap_end = start, end

    def apply(self, seqno: int, key: bytes, opcode: int, value: bytes = b"") -> bool:
        """One item (a codec MUTATION, DELETION or EXPIRATION); True when it completes the snapshot.

        An item whose seqno does not rise (a producer's violation, which the core reports) is left
        out: the copy stays a log in seqno order, which rollbacks and the state file rely on.
        """
        if self.log and seqno <= self.log[-1][1]:
            return False
        self.log.append((opcode, seqno, key, value if opcode == codec.MUTATION else b""))
        self.seqno = seqno
        self.items += 1
        return self.complete(seqno)

    def apply_run(self, run: StreamRun) -> tuple[int, bool, int]:
        """One stream's markers and items as ``Connection.feed_run`` judged them.

        Returns (items applied, whether a snapshot completed, markers that ask for an
        acknowledgement). The same changes as ``marker`` and ``apply`` one by one: the
        core already found which items completed their snapshot.
        """
        items = run.items
        self.log.extend(items)
        self.items += len(items)
        if items:
            self.seqno = items[-1][1]
        acks = 0
        for _, start, end, flags in run.markers:
            self.snap_start, self.snap_end = start, end
            if flags & codec.SNAP_ACK:
                acks += 1
        completed = run.completed
        if completed:
            self.consistent += completed
            if completed[-1] == self.snap_end:  # the last snapshot is whole (a marker comes after any other)
                self.snap_start = self.snap_end
        return len(items), bool(completed), acks

    def complete(self, seqno: int) -> bool:
        if seqno == self.snap_end:
            self.consistent.append(seqno)
            self.snap_start = seqno  # the whole snapshot is here: resume as from its end
            return True
        return False

    def rollback(self, to: int) -> int:
        """Truncate to the newest consistent point at or before ``to``; returns that point."""
        kept = bisect.bisect_right(self.consistent, to)
        point = self.consistent[kept - 1] if kept else 0
        del self.consistent[kept:]
        del self.log[bisect.bisect_right(self.log, point, key=_SEQNO) :]
        self.seqno = self.snap_start = self.snap_end = point
        self.failover = [(u, s) for u, s in self.failover if s <= point]
        self.rollbacks += 1
        return point

    def state(self) -> dict[str, str]:
        """The live items as text: key -> value (deleted and expired keys absent)."""
        latest = {key: (opcode, value) for opcode, _, key, value in self.log}
        return {
            key.decode("utf-8", "replace"): value.decode("utf-8", "replace")
            for key, (opcode, value) in latest.items()
            if opcode == codec.MUTATION
        }

    def to_json(self) -> dict:
        return {
            "failover": [[u, s] for u, s in self.failover],
            "seqno": self.seqno,
            "snap_start": self.snap_start,
            "snap_end": self.snap_end,
            "log": [
                [seqno, _OP_NAMES[opcode], key.decode("utf-8", "replace"), value.decode("utf-8", "replace")]
                for opcode, seqno, key, value in self.log
            ],
            "consistent": self.consistent,
            "items": self.items,
            "rollbacks": self.rollbacks,
        }

    @classmethod
    def from_json(cls, vb: int, obj: Any) -> ConsumerVBucket:
        try:
            rows = obj["log"] if "log" in obj else _log_of_versions(obj["versions"])
            log = [
                (_OPCODES[op], int(seqno), str(key).encode(), str(value).encode())
                for seqno, op, key, value in rows
            ]
            if any(log[i][1] >= log[i + 1][1] for i in range(len(log) - 1)):
                raise ValueError("log seqnos not rising")
            return cls(
                vb,
                [(int(u), int(s)) for u, s in obj["failover"]],
                int(obj["seqno"]),
                int(obj["snap_start"]),
                int(obj["snap_end"]),
                log,
                [int(c) for c in obj["consistent"]],
                int(obj.get("items", 0)),
                int(obj.get("rollbacks", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise StateError(f"vbucket {vb}: {err}") from None


def _log_of_versions(versions: dict) -> list:
    """A state file of earlier releases kept each key's versions, ``{key: [[seqno, op, value]]}``."""
    return sorted(([seqno, op, key, value] for key, held in versions.items() for seqno, op, value in held))


_SEQNO = itemgetter(1)
_OP_NAMES = {opcode: name for name, opcode in _OPCODES.items()}
