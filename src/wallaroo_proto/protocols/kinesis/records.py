"""Records for the mock daemon: generated, or lines of files and stdin, shaped as Kinesis shapes them.

Shard ids are ``shardId-000000000000``; sequence numbers are 56-digit
decimal strings that grow within a shard; a partition key picks its shard by
the MD5 of the key over the 128-bit hash key range, split evenly between the
shards, as a stream with evenly split shards does. A shard's records can be
listed from any checkpoint on, so a restarted or respawned shard resumes
after its checkpoint.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
from collections.abc import Iterable, Sequence

from .codec import CURRENT, RECORD_JSON, LazyRecords, ProcessRecords, Record, encode, records_line

_BASE = 49_590_338 * 10**48  # 56 digits
_SHARD_STRIDE = 10**36
_STEP = 1_000_003  # records' numbers are not contiguous in Kinesis either
_DIGITS = 9  # a generated record's number in its data: 9 digits, three whole base64 groups


def shard_id(index: int) -> str:
    return f"shardId-{index:012d}"


def sequence_number(shard_index: int, n: int) -> str:
    """The ``n``-th (0-based) record's sequence number in shard ``shard_index``."""
    return str(_BASE + shard_index * _SHARD_STRIDE + (n + 1) * _STEP)


class GeneratedRecords(LazyRecords):
    """Generated records ``first`` to ``last`` of a shard, each made when looked at.

    The daemon itself only looks at the last one of a batch (and the batch's
    line is built straight from the numbers), so a batch costs no objects per record.
    """

    __slots__ = ("shard", "first", "last")

    def __init__(self, shard: ShardRecords, first: int, last: int) -> None:
        self.shard, self.first, self.last = shard, first, last

    def __len__(self) -> int:
        return self.last - self.first

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self.shard.record(n) for n in range(self.first, self.last)[i]]
        return self.shard.record(range(self.first, self.last)[i])


def shard_for_key(partition_key: str, shards: int) -> int:
    """The shard whose hash key range holds MD5(partition key)."""
    hashed = int.from_bytes(hashlib.md5(partition_key.encode("utf-8")).digest(), "big")
    return hashed * shards >> 128


class ShardRecords:
    """One shard's records in sequence order, listable after a checkpoint."""

    def __init__(
        self, index: int, records: list[Record] | None = None, *, generated: int = 0, aggregate: int = 1
    ) -> None:
        self.index = index
        self.shard_id = shard_id(index)
        self._records = records
        self._generated = generated
        #: Generated user records per KPL aggregate: they share its sequence number and arrival
        #: time, with subsequence numbers 0..aggregate-1, as the KCL delivers them deaggregated.
        self.aggregate = aggregate
        self._t0 = 0
        #: Shards this one was split or merged from: it starts once each ended (at SHARD_END).
        self.parents: tuple[str, ...] = ()
        #: A closed shard (a parent of a reshard): its records end with shardEnded.
        self.closed = False

    def __len__(self) -> int:
        return self._generated if self._records is None else len(self._records)

    def stamp(self, now_ms: int) -> None:
        """Arrival times for generated records: one per millisecond, the last at ``now_ms``."""
        self._t0 = now_ms - self._generated

    def start_after(self, checkpoint: tuple[str, int] | None) -> int:
        """Index of the first record after ``checkpoint`` (0 for none or a sentinel)."""
        if checkpoint is None or not checkpoint[0].isdigit():
            return len(self) if checkpoint is not None and checkpoint[0] == "SHARD_END" else 0
        key, sub = int(checkpoint[0]), checkpoint[1] or 0
        if self._records is None:
            k = self.aggregate
            offset = key - _BASE - self.index * _SHARD_STRIDE
            n = offset // _STEP  # aggregates 0..n-1 are at or below it
            at = n * k if offset % _STEP else (n - 1) * k + min(sub, k - 1) + 1  # inside aggregate n-1
            return min(max(at, 0), len(self))
        keys = [(int(r.sequence_number), r.sub_sequence_number or 0) for r in self._records]
        return bisect.bisect_right(keys, (key, sub))

    def slice(self, first: int, last: int) -> Sequence[Record]:
        if self._records is not None:
            return self._records[first:last]
        return GeneratedRecords(self, first, last)

    def record(self, n: int) -> Record:
        """Generated record ``n``: data ``<shard id> event <n, 9 digits>``, key ``pk-<n>``."""
        data = base64.b64encode(f"{self.shard_id} event {n:0{_DIGITS}d}".encode()).decode("ascii")
        k = self.aggregate
        return Record(data, f"pk-{n}", sequence_number(self.index, n // k), self._t0 + n - n % k, n % k)

    def request(self, first: int, last: int, dialect: str = CURRENT) -> tuple[ProcessRecords, bytes]:
        """The processRecords message for records ``first`` to ``last`` and its line."""
        records = self.slice(first, last)
        millis = None if dialect == "v1" else self.millis_behind(last - 1)
        msg = ProcessRecords(records, millis)
        if self._records is not None or dialect != CURRENT or last + 1 >= 10**_DIGITS or self.aggregate > 1:
            return msg, encode(msg, dialect)
        return msg, records_line(self._records_json(first, last), millis)

    def _records_json(self, first: int, last: int) -> str:
        """The JSON of generated records in C-level passes over number ranges: the daemon's per-record cost.

        The data's prefix ``<shard id> event `` is 27 bytes and every number 9
        digits, both whole base64 groups, so the base64 of all the numbers at once
        splits into each record's piece. Every value is base64, digits or
        ``pk-<n>``: nothing for JSON to escape.
        """
        prefix = base64.b64encode(f"{self.shard_id} event ".encode()).decode("ascii")
        head = str((_BASE + self.index * _SHARD_STRIDE) // _SHARD_STRIDE)  # then 36 digits of (n + 1) * STEP
        template = RECORD_JSON % (f'"{prefix}%s"', '"pk-%d"', f'"{head}%036d"', "%d", "0")
        numbers = range(first, last)
        count = len(numbers)
        digits = (b"%09d" * count) % tuple(numbers)
        encoded = binascii.b2a_base64(digits, newline=False).decode("ascii")
        width = _DIGITS // 3 * 4
        pieces = map(
            encoded.__getitem__,
            map(slice, range(0, count * width, width), range(width, (count + 1) * width, width)),
        )
        steps = range((first + 1) * _STEP, (last + 1) * _STEP, _STEP)
        stamps = range(self._t0 + first, self._t0 + last)
        return ",".join(map(template.__mod__, zip(pieces, numbers, steps, stamps, strict=True)))

    def millis_behind(self, last_index: int) -> int:
        """How far behind the shard's newest record the record at ``last_index`` is."""
        total = len(self)
        if not total:
            return 0
        if self._records is None:
            return total - 1 - last_index
        newest = self._records[-1].approximate_arrival_timestamp or 0
        return max(newest - (self._records[last_index].approximate_arrival_timestamp or 0), 0)


def generated(shards: int, per_shard: int, aggregate: int = 1) -> list[ShardRecords]:
    return [ShardRecords(i, generated=per_shard, aggregate=aggregate) for i in range(shards)]


RESHARDS = ("split", "merge")


def reshard(parents: list[ShardRecords], how: str, per_shard: int, aggregate: int = 1) -> list[ShardRecords]:
    """The parents closed, and their children (``per_shard`` generated records each) after them.

    ``split``: each parent gets two children; ``merge``: each pair of parents one
    child (an odd last parent stays open). Children are numbered after the parents,
    as Kinesis numbers new shards.
    """
    groups = [(p,) for p in parents for _ in (0, 1)] if how == "split" else []
    if how == "merge":
        groups = [tuple(parents[i : i + 2]) for i in range(0, len(parents) - 1, 2)]
    children = []
    for offset, group in enumerate(groups):
        child = ShardRecords(len(parents) + offset, generated=per_shard, aggregate=aggregate)
        child.parents = tuple(p.shard_id for p in group)
        for p in group:
            p.closed = True
        children.append(child)
    return parents + children


def check_key_template(template: str) -> None:
    """Refuse a partition-key template before any line is read: it may name {n} and {line} only,
    and one that fails on the first line would fail on every one."""
    try:
        template.format(n=0, line="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"{template!r}: use {{n}} and {{line}} only ({err})") from None


def from_lines(
    lines: Iterable[bytes], shards: int, *, key_template: str = "{n}", now_ms: int = 0, aggregate: int = 1
) -> list[ShardRecords]:
    """One record per input line (its bytes are the data), routed by partition key.

    The lines arrived one millisecond apart, the last at ``now_ms``: each record
    has its own arrival time, and a batch's ``millisBehindLatest`` falls as the
    processor catches up, as Kinesis reports them. With ``aggregate`` k, each
    shard's records come in KPL aggregates of k: one sequence number, one arrival
    time, subsequence numbers 0..k-1.
    """
    per: list[list[Record]] = [[] for _ in range(shards)]
    lines = list(lines)
    first_ms = now_ms - len(lines) + 1
    for n, raw in enumerate(lines):
        key = key_template.format(n=n, line=raw.decode("utf-8", errors="replace"))
        index = shard_for_key(key, shards)
        bucket = per[index]
        m = len(bucket)
        head = bucket[m - m % aggregate] if m % aggregate else None  # the aggregate this one joins
        bucket.append(
            Record(
                base64.b64encode(raw).decode("ascii"),
                key,
                sequence_number(index, m // aggregate),
                head.approximate_arrival_timestamp if head else first_ms + n,
                m % aggregate,
            )
        )
    return [ShardRecords(i, records) for i, records in enumerate(per)]
