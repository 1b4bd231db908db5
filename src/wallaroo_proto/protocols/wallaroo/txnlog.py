"""The sink's durable transaction log: one append-only file per worker instance.

Each record is ``u32 length | u32 crc32(payload) | payload``, written with one
``os.write`` and fsynced before the caller acts on it (replies, truncates).
Record kinds (first payload byte):

* ``H``: header, once, naming the instance (so ``--check`` can report it);
* ``V``: a phase-1 vote: vote byte, start, end, crc32 of the data bytes
  [start, end) and the txn id; written only after the data was fsynced;
* ``D``: a phase-2 decision applied: commit byte and the txn id;
* ``B``: base, written by compaction: the committed offset and the crc32 of
  the output's bytes [0, committed);
* ``R``: a decision remembered by compaction (commit byte, txn id), so a
  repeated PHASE2 is still recognised.

Replaying the records gives the committed offset and the transactions voted
commit but not yet decided. A crash can tear only the last record (appends are
sequential), so a short or bad-checksum record at the end is dropped; a bad
record followed by good ones is corruption, reported and never guessed around.

The log grows by a vote and a decision per round, so once it passes
``compact_at`` bytes it is rewritten as the state it replays to (H, B, R...,
undecided V...): written to ``<log>.tmp``, fsynced, renamed over the log, and
the directory fsynced before the next append. A crash before the rename leaves
the old log whole (the temp file is deleted on open); after it, the new one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes

from ...durable import fsync_dir
from .frames import Text, show_text

_HEAD = struct.Struct(">II")  # payload length, crc32(payload)
_VOTE = struct.Struct(">cBQQI")  # 'V', vote, start, end, data crc
_DECISION = struct.Struct(">cB")  # 'D' or 'R', commit
_BASE = struct.Struct(">cQI")  # 'B', committed offset, crc32 of [0, committed)
_U16 = struct.Struct(">H")
#: A record larger than this is a corrupt length field, not a record.
MAX_RECORD = 70_000
LOG_SUFFIX = ".txnlog"
OUT_SUFFIX = ".out"
#: How many decided txn ids are remembered, to answer a repeated PHASE2 idempotently.
RECENT_DECIDED = 256
#: A log this large is compacted (a round adds about 80 bytes).
COMPACT_AT = 1 << 20
TEMP_SUFFIX = ".tmp"
#: The steps of a compaction, in order, as told to ``TxnLog.on_compact_step`` (crash tests).
COMPACT_STEPS = (
    "before_temp_write",
    "after_temp_write",
    "after_temp_fsync",
    "after_rename",
    "after_dir_fsync",
)


class TxnLogError(Exception):
    """The log cannot be used: corrupt in the middle, or the disk refused a write."""


def txn_bytes(txn_id: Text) -> bytes:
    return txn_id.encode("utf-8") if isinstance(txn_id, str) else bytes(txn_id)


def instance_paths(out_dir: str | os.PathLike, instance_name: Text) -> tuple[Path, Path]:
    """(log path, output path) of an instance: its name percent-encoded into one safe file name."""
    stem = quote(txn_bytes(instance_name), safe="-_")  # '.' escaped too: no '..' or hidden files
    stem = stem.replace(".", "%2E") or "%00empty"
    base = Path(out_dir)
    return base / f"{stem}{LOG_SUFFIX}", base / f"{stem}{OUT_SUFFIX}"


def instance_from_stem(stem: str) -> str:
    raw = b"" if stem == "%00empty" else unquote_to_bytes(stem)
    return show_text(raw.decode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class Vote:
    txn_id: bytes
    commit: bool
    start: int
    end: int
    crc: int


@dataclass(frozen=True, slots=True)
class Decision:
    txn_id: bytes
    commit: bool


@dataclass(frozen=True, slots=True)
class Header:
    instance_name: bytes


@dataclass(frozen=True, slots=True)
class Base:
    committed: int
    crc: int


@dataclass(frozen=True, slots=True)
class Remembered:
    txn_id: bytes
    commit: bool


Record = Vote | Decision | Header | Base | Remembered


def crc32_concat(crc1: int, crc2: int, len2: int) -> int:
    """crc32(A + B) from crc32(A), crc32(B) and len(B), without the bytes.

    zlib's crc32_combine method: appending n zero bytes is a linear map on the CRC
    register, so crc1 goes through the maps for the powers of two that sum to len(B)
    (at most 64 of them, each 32 rows), and the result XORs with crc2. A commit costs
    microseconds whatever its size.
    """
    operators = _zero_byte_operators()
    power = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(operators[power], crc1)
        len2 >>= 1
        power += 1
    return crc1 ^ crc2


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, column) for column in matrix]


@functools.cache
def _zero_byte_operators() -> list[list[int]]:
    """The maps that append 2**k zero bytes, k = 0..63 (built once, on first use)."""
    one_zero_bit = [0xEDB88320] + [1 << n for n in range(31)]
    operator = _gf2_square(_gf2_square(_gf2_square(one_zero_bit)))
    operators = [operator]
    for _ in range(63):
        operator = _gf2_square(operator)
        operators.append(operator)
    return operators


def encode_record(record: Record) -> bytes:
    """The record's bytes in the log, header and checksum included."""
    if isinstance(record, Vote):
        payload = _VOTE.pack(b"V", int(record.commit), record.start, record.end, record.crc)
        payload += _U16.pack(len(record.txn_id)) + record.txn_id
    elif isinstance(record, Decision | Remembered):
        kind = b"D" if isinstance(record, Decision) else b"R"
        payload = _DECISION.pack(kind, int(record.commit)) + _U16.pack(len(record.txn_id)) + record.txn_id
    elif isinstance(record, Base):
        payload = _BASE.pack(b"B", record.committed, record.crc)
    else:
        payload = b"H" + _U16.pack(len(record.instance_name)) + record.instance_name
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _short(payload: bytes, pos: int) -> bytes:
    (n,) = _U16.unpack_from(payload, pos)
    value = payload[pos + 2 : pos + 2 + n]
    if len(value) != n or pos + 2 + n != len(payload):
        raise ValueError("bad string length")
    return value


def decode_record(payload: bytes) -> Record:
    kind = payload[:1]
    if kind == b"V":
        _, vote, start, end, crc = _VOTE.unpack_from(payload, 0)
        return Vote(_short(payload, _VOTE.size), bool(vote), start, end, crc)
    if kind in (b"D", b"R"):
        _, commit = _DECISION.unpack_from(payload, 0)
        return (Decision if kind == b"D" else Remembered)(_short(payload, _DECISION.size), bool(commit))
    if kind == b"B":
        if len(payload) != _BASE.size:
            raise ValueError("bad base record length")
        _, committed, crc = _BASE.unpack(payload)
        return Base(committed, crc)
    if kind == b"H":
        return Header(_short(payload, 1))
    raise ValueError(f"unknown record kind {kind!r} (known: B, D, H, R, V)")


@dataclass(slots=True)
class LogScan:
    """What a log says: the records' effect, and where the good part ends."""

    instance_name: bytes | None = None
    committed: int = 0
    #: crc32 of the output's bytes [0, committed).
    committed_crc: int = 0
    #: txn id -> its commit vote, for txns voted commit and not yet decided (at most one in practice).
    undecided: dict[bytes, Vote] = field(default_factory=dict)
    #: Recently decided txn ids -> commit flag (bounded).
    decided: dict[bytes, bool] = field(default_factory=dict)
    _decided_order: deque = field(default_factory=deque)
    records: int = 0
    good_length: int = 0
    #: Bytes of a torn or bad last record that recovery drops.
    torn_bytes: int = 0
    torn_reason: str = ""
    #: Committed ranges (start, end, crc) in order; filled only when asked (for --check).
    committed_ranges: list[tuple[int, int, int]] | None = None
    #: Inconsistencies between records (a decision that does not follow from the votes).
    problems: list[str] = field(default_factory=list)

    @property
    def undecided_end(self) -> int:
        """Where durable data ends: the committed offset or the end of a voted txn."""
        return max([self.committed, *(v.end for v in self.undecided.values())])

    def remember(self, txn_id: bytes, commit: bool) -> None:
        if txn_id not in self.decided:
            self._decided_order.append(txn_id)
        self.decided[txn_id] = commit
        while len(self._decided_order) > RECENT_DECIDED:
            self.decided.pop(self._decided_order.popleft(), None)

    def state_records(self) -> list[Record]:
        """The fewest records that replay to this state (after the header): a compacted log."""
        decided = [Remembered(txn, self.decided[txn]) for txn in self._decided_order]
        return [Base(self.committed, self.committed_crc), *decided, *self.undecided.values()]

    def apply(self, record: Record, at: int) -> None:
        """Replay one record onto the state."""
        self.records += 1
        if isinstance(record, Header):
            self.instance_name = record.instance_name
        elif isinstance(record, Base):
            self.committed, self.committed_crc = record.committed, record.crc
            if self.committed_ranges is not None:
                self.committed_ranges[:] = [(0, record.committed, record.crc)] if record.committed else []
        elif isinstance(record, Remembered):
            self.remember(record.txn_id, record.commit)
        elif isinstance(record, Vote):
            if record.commit:
                if record.start != self.committed or record.end < record.start:
                    self.problems.append(
                        f"record at log offset {at}: vote for txn {show_text(record.txn_id)!r} covers "
                        f"[{record.start}, {record.end}) but the committed offset was {self.committed}"
                    )
                self.undecided[record.txn_id] = record
            else:
                self.undecided.pop(record.txn_id, None)
                self.remember(record.txn_id, False)
        else:
            vote = self.undecided.pop(record.txn_id, None)
            if record.commit:
                if vote is None:
                    self.problems.append(
                        f"record at log offset {at}: commit of txn {show_text(record.txn_id)!r}, "
                        "which has no commit vote before it"
                    )
                else:
                    self.committed = vote.end
                    self.committed_crc = crc32_concat(self.committed_crc, vote.crc, vote.end - vote.start)
                    if self.committed_ranges is not None:
                        self.committed_ranges.append((vote.start, vote.end, vote.crc))
            self.remember(record.txn_id, record.commit)


def iter_log_records(data: bytes, scan: LogScan) -> Iterator[tuple[int, Record]]:
    """Good records of a log image; sets ``scan.good_length``/``torn_*``; raises on mid-log corruption."""
    pos = 0
    n = len(data)
    while pos < n:
        bad = _bad_record(data, pos)
        if bad is None:
            (length, _) = _HEAD.unpack_from(data, pos)
            payload = data[pos + 8 : pos + 8 + length]
            yield pos, decode_record(payload)
            pos += 8 + length
            scan.good_length = pos
            continue
        # A bad record: torn tail if nothing valid follows it, else corruption.
        if _valid_record_after(data, pos):
            raise TxnLogError(f"corrupt record at log offset {pos} with valid records after it: {bad}")
        scan.torn_bytes = n - pos
        scan.torn_reason = bad
        return


def _bad_record(data: bytes, pos: int) -> str | None:
    n = len(data)
    if n - pos < 8:
        return f"{n - pos} bytes of a record header (needs 8)"
    length, crc = _HEAD.unpack_from(data, pos)
    if length == 0 or length > MAX_RECORD:
        return f"impossible record length {length}"
    if pos + 8 + length > n:
        return f"record of {length} bytes cut short at {n - pos - 8}"
    payload = data[pos + 8 : pos + 8 + length]
    if zlib.crc32(payload) != crc:
        return "checksum mismatch"
    try:
        decode_record(payload)
    except (ValueError, struct.error) as err:
        return f"undecodable record: {err}"
    return None


def _valid_record_after(data: bytes, pos: int) -> bool:
    """Is there a whole valid record starting anywhere after ``pos``? (bounded scan)"""
    limit = min(len(data), pos + 8 + MAX_RECORD + 1)
    return any(len(data) - start >= 9 and _bad_record(data, start) is None for start in range(pos + 1, limit))


def scan_log(path: str | os.PathLike, *, keep_ranges: bool = False) -> LogScan:
    """Replay a log file without changing it."""
    scan = LogScan(committed_ranges=[] if keep_ranges else None)
    data = Path(path).read_bytes()
    for at, record in iter_log_records(data, scan):
        scan.apply(record, at)
    return scan


class TxnLog:
    """An open log: replayed on open (dropping a torn tail), then appended to durably and
    compacted once it passes ``compact_at`` bytes."""

    def __init__(
        self,
        path: str | os.PathLike,
        instance_name: Text,
        *,
        compact_at: int = COMPACT_AT,
        on_compact_step: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.temp_path = self.path.with_name(self.path.name + TEMP_SUFFIX)
        self.compact_at = compact_at
        self.on_compact_step = on_compact_step or (lambda step: None)
        #: Why the last compaction failed before its rename (the old log stands), or "".
        self.compaction_error = ""
        self._broken = ""
        with contextlib.suppress(FileNotFoundError):  # a compaction that died before its rename
            os.unlink(self.temp_path)
        exists = self.path.exists()
        self.scan = scan_log(self.path) if exists else LogScan()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if self.scan.torn_bytes:
                os.ftruncate(self.fd, self.scan.good_length)
                os.fsync(self.fd)
            self.size = self.scan.good_length
            self._compact_next = compact_at
            if not exists or self.scan.records == 0:
                self.append(Header(txn_bytes(instance_name)))
                if not exists:
                    fsync_dir(self.path.parent)
        except BaseException:
            os.close(self.fd)
            raise

    def append(self, record: Record) -> None:
        """Write and fsync one record; on failure cut the partial record off again and raise."""
        if self._broken:
            raise TxnLogError(self._broken)
        data = encode_record(record)
        try:
            _write_all(self.fd, data)
            os.fsync(self.fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            raise TxnLogError(f"transaction log {self.path}: write failed: {err}") from err
        self.scan.apply(record, self.size)
        self.size += len(data)
        if self.size >= self._compact_next:
            self.compact()

    def compact(self) -> None:
        """Rewrite the log as the state it replays to: temp file, fsync, rename, fsync the directory.

        A failure before the rename leaves the old log in use (``compaction_error``; tried again
        once the log has doubled); after it, the log is unusable until reopened (TxnLogError).
        """
        name = self.scan.instance_name if self.scan.instance_name is not None else b""
        image = b"".join(encode_record(r) for r in (Header(name), *self.scan.state_records()))
        step = self.on_compact_step
        step("before_temp_write")
        try:
            fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, image)
                step("after_temp_write")
                os.fsync(fd)
                step("after_temp_fsync")
            finally:
                os.close(fd)
            os.replace(self.temp_path, self.path)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(self.temp_path)
            self.compaction_error = f"compacting {self.path} failed, the log stays as it is: {err}"
            self._compact_next = 2 * self.size
            return
        step("after_rename")
        try:  # appends go to the new file, and only once its name is durable
            fsync_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as err:
            self._broken = f"transaction log {self.path}: compacted, but then {err}; reopen it"
            raise TxnLogError(self._broken) from err
        step("after_dir_fsync")
        os.close(self.fd)
        self.fd = fd
        self.size = self.scan.good_length = len(image)
        self.compaction_error = ""
        self._compact_next = max(self.compact_at, 2 * self.size)

    def close(self) -> None:
        os.close(self.fd)


def _write_all(fd: int, data: bytes) -> None:
    done = 0
    while done < len(data):  # a short write is retried, so a full disk shows its errno
        written = os.write(fd, memoryview(data)[done:])
        if written <= 0:
            raise OSError(f"no progress writing after {done} of {len(data)} bytes")
        done += written


@dataclass(slots=True)
class InstanceCheck:
    instance: str
    log: str
    output: str
    committed: int = 0
    output_length: int = 0
    undecided: list[tuple[str, int, int]] = field(default_factory=list)
    torn_bytes: int = 0
    uncommitted_tail: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_directory(out_dir: str | os.PathLike) -> list[InstanceCheck]:
    """Verify every instance in an output directory against its log (read only)."""
    base = Path(out_dir)
    if not base.is_dir():
        raise FileNotFoundError(f"{base} is not a directory")
    results = []
    logs = sorted(base.glob(f"*{LOG_SUFFIX}"))
    for log in logs:
        stem = log.name[: -len(LOG_SUFFIX)]
        out = base / f"{stem}{OUT_SUFFIX}"
        result = InstanceCheck(instance_from_stem(stem), str(log), str(out))
        results.append(result)
        try:
            scan = scan_log(log, keep_ranges=True)
        except TxnLogError as err:
            result.problems.append(str(err))
            continue
        if scan.instance_name is not None:
            result.instance = show_text(scan.instance_name.decode("utf-8", "replace"))
        result.committed = scan.committed
        result.torn_bytes = scan.torn_bytes
        result.undecided = [
            (show_text(v.txn_id.decode("utf-8", "replace")), v.start, v.end) for v in scan.undecided.values()
        ]
        result.problems.extend(scan.problems)
        if not out.exists():
            if scan.undecided_end:
                result.problems.append(
                    f"output file {out.name} is missing; the log commits {scan.committed} bytes"
                )
            continue
        result.output_length = out.stat().st_size
        durable = scan.undecided_end
        if result.output_length < durable:
            result.problems.append(
                f"output {out.name} has {result.output_length} bytes but the log promises {durable} "
                f"(committed {scan.committed})"
            )
        result.uncommitted_tail = max(0, result.output_length - durable)
        ranges = list(scan.committed_ranges or [])
        ranges += [(v.start, v.end, v.crc) for v in scan.undecided.values()]
        _check_ranges(out, ranges, result)
    for out in sorted(base.glob(f"*{OUT_SUFFIX}")):
        if not out.with_name(out.name[: -len(OUT_SUFFIX)] + LOG_SUFFIX).exists() and out.stat().st_size:
            stem = out.name[: -len(OUT_SUFFIX)]
            result = InstanceCheck(instance_from_stem(stem), "", str(out), output_length=out.stat().st_size)
            result.problems.append(
                f"output {out.name} has {result.output_length} bytes but no transaction log"
            )
            results.append(result)
    return results


def _check_ranges(out: Path, ranges: list[tuple[int, int, int]], result: InstanceCheck) -> None:
    """Recompute each committed range's crc32 from the output file, streaming."""
    with open(out, "rb") as f:
        for start, end, crc in ranges:
            f.seek(start)
            remaining = end - start
            actual = 0
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                actual = zlib.crc32(chunk, actual)
                remaining -= len(chunk)
            if remaining > 0:
                return  # already reported as a short file
            if actual != crc:
                result.problems.append(
                    f"bytes [{start}, {end}) of {out.name} do not match the checksum logged at their vote"
                )
