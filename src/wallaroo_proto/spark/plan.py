"""Which captures a spark-replay reads, and how its tasks share them out (no pyspark here).

The driver lists the capture files and plans tasks; each task is a
``(path, name, part, nparts)`` tuple that an executor reads through the data source
(``datasource``). A capture larger than its share of the cluster is split into
``nparts`` tasks that each read the file but reassemble only the connections whose
``flow_hash`` falls in their part (``PartFilter``).
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wallaroo_proto import records
from wallaroo_proto.spark import remote

DEFAULT_PATHS = ("captures",)
CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap")
#: Never split a capture into parts smaller than this: each part re-reads the whole file.
MIN_SPLIT_BYTES = 64 * 1024 * 1024
PROBLEM_COLUMN = "_problem"
#: Marks a --fail-fast failure inside a Spark error so the driver can name the capture.
FAIL_FAST_MARK = "wallaroo-capture-failed:"


@dataclass(frozen=True)
class CaptureFile:
    path: str  # absolute, or a URL: what executors open
    name: str  # as the user gave it: what reports show
    size: int


@dataclass(frozen=True)
class Problem:
    capture: str
    error: str


class CaptureFailed(Exception):
    """--fail-fast: a capture could not be read; the job stops."""


def _is_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def list_captures(paths: Sequence[str] = DEFAULT_PATHS) -> tuple[list[CaptureFile], list[Problem]]:
    """Expand files, directories (recursively: *.pcap, *.pcapng, *.cap) and globs, on the driver.

    A URL (``s3://bucket/prefix/``, any fsspec URL) is listed alike: an object, a prefix, a glob.
    Paths that name nothing come back as problems, by name; files are not opened here.
    """
    found: dict[str, CaptureFile] = {}
    problems: list[Problem] = []

    def add(name: str) -> None:
        path = os.path.abspath(name)
        if path not in found:
            try:
                size = os.path.getsize(path)
            except OSError as err:
                problems.append(Problem(name, f"cannot read: {err.strerror}"))
                return
            found[path] = CaptureFile(path, name, size)

    for given in paths:
        if remote.is_url(given):
            urls, why = remote.list_url(given, CAPTURE_SUFFIXES)
            if why:
                problems.append(Problem(given, why))
            for url, size in urls:
                found.setdefault(url, CaptureFile(url, url, size))
        elif os.path.isdir(given):
            names = sorted(
                str(p)
                for p in Path(given).rglob("*")
                if p.is_file() and p.name.lower().endswith(CAPTURE_SUFFIXES)
            )
            if not names:
                problems.append(Problem(given, "directory holds no .pcap, .pcapng or .cap files"))
            for name in names:
                add(name)
        elif os.path.exists(given):
            add(given)
        elif _is_glob(given):
            names = sorted(n for n in glob.glob(given, recursive=True) if os.path.isfile(n))
            if not names:
                problems.append(Problem(given, "no file matches this pattern"))
            for name in names:
                add(name)
        else:
            problems.append(Problem(given, "no such file or directory"))
    return list(found.values()), problems


def plan_tasks(
    captures: Sequence[CaptureFile], parallelism: int, split_bytes: int | None = None
) -> list[tuple[str, str, int, int]]:
    """One ``(path, name, part, nparts)`` task per capture part, largest captures first.

    A capture is split when it is clearly larger than its fair share of the
    cluster (total bytes / parallelism, at least ``MIN_SPLIT_BYTES``): into
    ``round(size / share)`` parts, at most ``parallelism``.
    """
    parallelism = max(1, parallelism)
    total = sum(c.size for c in captures)
    if split_bytes is None:
        split_bytes = max(MIN_SPLIT_BYTES, math.ceil(total / parallelism))
    tasks = []
    for capture in sorted(captures, key=lambda c: (-c.size, c.name)):
        nparts = max(1, min(parallelism, round(capture.size / max(1, split_bytes))))
        tasks.extend((capture.path, capture.name, part, nparts) for part in range(nparts))
    return tasks


class PartFilter:
    """Picklable connection filter: this part's share of a capture's connections, by part key."""

    __slots__ = ("part", "nparts")

    def __init__(self, part: int, nparts: int) -> None:
        self.part = part
        self.nparts = nparts

    def __call__(self, key: tuple) -> bool:
        return records.flow_hash(key) % self.nparts == self.part
