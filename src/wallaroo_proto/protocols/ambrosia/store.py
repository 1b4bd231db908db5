"""The mock IC's durable log and checkpoints: files with fsync, or memory without ``--log-dir``.

As the IC keeps them: a checkpoint, and the log records written after it in a
log file of their own (``log-<first seq>.bin``), started when the checkpoint
is asked for. A record is on disk (fsync) before it goes to the LB. On disk a
record's size field is ``-(size)-1``, as the IC marks xxHash64 check bytes,
and each record is followed by the IC's watermarks: how many of its input
RPCs and of the LB's outgoing RPCs the log holds up to it. ``checkpoint.bin``
(replaced atomically) holds the IC's own state as one JSON line, then the
self calls it holds, then the LB's checkpoint bytes. Loading verifies every
record's check bytes and cuts a torn or damaged tail, as a crash mid-write leaves.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from wallaroo_proto.durable import fsync_dir, write_atomic

from .codec import HEADER_SIZE, Incomplete, check_bytes, read_header, read_zz

_WATERMARK = struct.Struct("<qq")
_SIZE = struct.Struct("<i")


@dataclass
class IcCheckpoint:
    """The IC's state at a checkpoint and the LB's bytes."""

    committer: int
    seq: int  # the first record after it
    generated: int  # input RPCs logged before it
    outputs: int  # LB outgoing RPCs received before it
    pending: list[bytes]  # LB self calls received, not yet logged
    blob: bytes

    def encode(self) -> bytes:
        """One JSON line, then the pending calls back to back (each message carries its size; the
        line says how many bytes they take), then the LB's bytes. Thousands of calls can wait at a
        checkpoint, and the LB waits for this write: raw bytes, no hex or JSON string for them."""
        held = b"".join(self.pending)
        meta = {
            "committer": self.committer,
            "seq": self.seq,
            "generated": self.generated,
            "outputs": self.outputs,
            "pending_bytes": len(held),
        }
        return json.dumps(meta).encode() + b"\n" + held + self.blob

    @classmethod
    def decode(cls, data: bytes) -> IcCheckpoint:
        line, _, rest = data.partition(b"\n")
        meta = json.loads(line)
        if "pending_bytes" in meta:
            size = meta["pending_bytes"]
            pending, blob = _split_messages(rest[:size]), rest[size:]
        else:  # the older form: a hex string for each call
            pending, blob = [bytes.fromhex(p) for p in meta["pending"]], rest
        return cls(meta["committer"], meta["seq"], meta["generated"], meta["outputs"], pending, blob)


class StoreError(ValueError):
    """A ``--log-dir`` whose files this tool did not write (a checkpoint that does not decode)."""


def _split_messages(data: bytes) -> list[bytes]:
    """Encoded messages back to back, each one's bytes apart (its ZigZag size says where it ends)."""
    out = []
    pos = 0
    while pos < len(data):
        try:
            size, after = read_zz(data, pos, len(data))
        except Incomplete:
            size, after = -1, pos
        if size < 0 or after + size > len(data):
            raise ValueError(f"pending calls: no whole message at byte {pos}")
        out.append(data[pos : after + size])
        pos = after + size
    return out


@dataclass
class LoggedRecord:
    wire: bytes  # as sent to the LB
    seq: int
    generated: int
    outputs: int


@dataclass
class Loaded:
    checkpoint: IcCheckpoint | None
    records: list[LoggedRecord] = field(default_factory=list)
    #: What loading cut off (a torn tail), for the log.
    cut: str | None = None


class MemoryStore:
    """The same store, in memory: survives an LB's restart, not the IC's."""

    def __init__(self) -> None:
        self._checkpoint: IcCheckpoint | None = None
        self._records: list[LoggedRecord] = []

    def load(self) -> Loaded:
        return Loaded(self._checkpoint, list(self._records))

    def append(self, record: LoggedRecord) -> None:
        self._records.append(record)

    def append_many(self, records: list[LoggedRecord]) -> None:
        self._records += records

    def save_checkpoint(self, checkpoint: IcCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._records = [r for r in self._records if r.seq >= checkpoint.seq]

    def close(self) -> None:
        pass


class DirStore:
    """``--log-dir``: checkpoint.bin and log-<seq>.bin files, each write fsync'd unless ``fsync`` is off."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True) -> None:
        self.path = Path(path)
        if self.path.is_file():  # a file given for the folder: said in words, not as mkdir's errno
            raise StoreError(
                f"--log-dir {path} is a file; give a folder (mock-ic keeps its log and checkpoints in it)"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._log = None
        self._log_seq: int | None = None

    def _log_path(self, seq: int) -> Path:
        return self.path / f"log-{seq}.bin"

    def load(self) -> Loaded:
        """The checkpoint and the verified records after it; a damaged tail is cut off the file."""
        self.close()
        ckpt_path = self.path / "checkpoint.bin"
        if not ckpt_path.exists():
            return Loaded(None)
        try:
            checkpoint = IcCheckpoint.decode(ckpt_path.read_bytes())
        except (ValueError, KeyError, TypeError) as err:  # json's errors are ValueErrors
            raise StoreError(f"{ckpt_path}: not a checkpoint mock-ic wrote ({err})") from None
        log_path = self._log_path(checkpoint.seq)
        records: list[LoggedRecord] = []
        cut = None
        if log_path.exists():
            data = log_path.read_bytes()
            pos = 0
            while pos < len(data):
                record, reason = _read_logged(data, pos)
                if record is None:
                    cut = f"{log_path.name}: {reason} at byte {pos}; {len(data) - pos} bytes cut"
                    with open(log_path, "r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                    break
                records.append(record)
                pos += len(record.wire) + _WATERMARK.size
        self._log_seq = checkpoint.seq
        return Loaded(checkpoint, records, cut)

    def append(self, record: LoggedRecord) -> None:
        self.append_many([record])

    def append_many(self, records: list[LoggedRecord]) -> None:
        """Records in order, in one write (and one fsync): a group commit. All of them are on disk
        (or, without fsync, with the OS) when it returns."""
        if not records:
            return
        if self._log is None:
            seq = self._log_seq if self._log_seq is not None else records[0].seq
            self._log = open(self._log_path(seq), "ab")  # noqa: SIM115 - closed by close()
            self._log_seq = seq
            if self.fsync:
                fsync_dir(self.path)
        out = []
        for record in records:
            wire = record.wire
            out += (
                wire[:4],
                _SIZE.pack(-_SIZE.unpack_from(wire, 4)[0] - 1),
                wire[8:],
                _WATERMARK.pack(record.generated, record.outputs),
            )
        self._log.write(b"".join(out))
        self._log.flush()
        if self.fsync:
            os.fsync(self._log.fileno())

    def save_checkpoint(self, checkpoint: IcCheckpoint) -> None:
        """The checkpoint, atomically; records from its ``seq`` on go to a new log file, older files go."""
        path = self.path / "checkpoint.bin"
        if self.fsync:
            write_atomic(path, checkpoint.encode())
        else:  # still atomic (a rename), safe from kill -9, not from a power cut
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(checkpoint.encode())
            os.replace(tmp, path)
        self.close()
        self._log_seq = checkpoint.seq
        for old in self.path.glob("log-*.bin"):
            try:
                if int(old.stem[4:]) < checkpoint.seq:
                    old.unlink()
            except ValueError:
                continue

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _read_logged(data: bytes, pos: int) -> tuple[LoggedRecord | None, str]:
    if len(data) - pos < HEADER_SIZE:
        return None, "a torn record header"
    header = read_header(data, pos)
    size = -header.size - 1
    if size < HEADER_SIZE:
        return None, f"size field {header.size} (not an xxHash64 record)"
    end = pos + size
    if end + _WATERMARK.size > len(data):
        return None, "a torn record"
    body = data[pos + HEADER_SIZE : end]
    if check_bytes(body, header.seq) != header.check:
        return None, f"record {header.seq}: wrong check bytes"
    wire = data[pos : pos + 4] + _SIZE.pack(size) + data[pos + 8 : end]
    generated, outputs = _WATERMARK.unpack_from(data, end)
    return LoggedRecord(wire, header.seq, generated, outputs), ""
