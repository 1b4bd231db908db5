"""The mock daemon's lease table: each shard's checkpoint, kept durably in one JSON file.

The real KCL keeps checkpoints in a DynamoDB lease table; a restarted worker
initializes each shard from its checkpoint and delivers the records after it.
``LeaseTable.save`` writes a temporary file in the same directory, fsyncs it,
renames it over the target and fsyncs the directory, so a daemon killed at any
moment leaves the old table or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ...durable import write_atomic

FORMAT = "wallaroo-proto kinesis lease table"
VERSION = 1


class StateError(ValueError):
    """A lease table that cannot be used: says which file and what is wrong."""


class LeaseTable:
    """shard id -> (sequence number or sentinel, subsequence number)."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.leases: dict[str, tuple[str, int]] = {}
        self.saves = 0
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike | None) -> LeaseTable:
        """Load ``path`` when it exists (an empty table otherwise, or for None)."""
        table = cls(path)
        if path is None or not os.path.exists(path):
            return table
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as err:
            raise StateError(f"cannot read --state {path}: {err.strerror or err}") from err
        except ValueError as err:
            raise StateError(f"--state {path} is not JSON: {err}") from err
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise StateError(f'--state {path} is not a {FORMAT} (no "format": "{FORMAT}")')
        if data.get("version") != VERSION:
            raise StateError(f"--state {path}: version {data.get('version')!r}, this build reads {VERSION}")
        leases = data.get("leases")
        if not isinstance(leases, dict):
            raise StateError(f'--state {path}: "leases" must be an object')
        for shard, lease in leases.items():
            seq = lease.get("checkpoint") if isinstance(lease, dict) else None
            sub = lease.get("subSequenceNumber", 0) if isinstance(lease, dict) else None
            if not isinstance(seq, str) or not isinstance(sub, int):
                raise StateError(
                    f'--state {path}: lease {shard!r} needs "checkpoint" (string) '
                    'and "subSequenceNumber" (integer)'
                )
            table.leases[shard] = (seq, sub)
        return table

    def get(self, shard_id: str) -> tuple[str, int] | None:
        return self.leases.get(shard_id)

    def set(self, shard_id: str, sequence_number: str, sub_sequence_number: int | None) -> None:
        """Record a checkpoint and write the table through (when it has a file)."""
        self.leases[shard_id] = (sequence_number, sub_sequence_number or 0)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:  # shards checkpoint from threads of their own
            body = {
                "format": FORMAT,
                "version": VERSION,
                "leases": {
                    shard: {"checkpoint": seq, "subSequenceNumber": sub}
                    for shard, (seq, sub) in sorted(self.leases.items())
                },
            }
            write_atomic(self.path, (json.dumps(body, indent=1) + "\n").encode("utf-8"))
            self.saves += 1
