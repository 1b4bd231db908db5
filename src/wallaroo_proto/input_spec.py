"""The one grammar of ``--input`` (and of mock-source's input arguments).

``-`` is stdin, ``gen:N`` (or ``generate:N``) N generated lines where a command generates
them, anything else a file. Every command reads its input through here, so a file that is
missing fails when it is opened, before anything listens or connects.
"""

from __future__ import annotations

import sys
from typing import BinaryIO

STDIN = "-"
GENERATED = ("gen:", "generate:")


def generated_lines(spec: str) -> int | None:
    """N of ``gen:N``; None when ``spec`` names stdin or a file. A bad N is a ValueError."""
    if not spec.startswith(GENERATED):
        return None
    number = spec.split(":", 1)[1]
    if not number.isdigit():
        raise ValueError(f"--input {spec!r}: gen: takes a number of lines, e.g. gen:1000")
    return int(number)


def open_input(spec: str) -> BinaryIO:
    """stdin's bytes for ``-``, else the file, opened now (OSError when it cannot be)."""
    return sys.stdin.buffer if spec == STDIN else open(spec, "rb")  # noqa: SIM115 - the caller closes it


def read_input(spec: str) -> bytes:
    """All of an input's bytes (stdin is left open: another part of the command may read it)."""
    if spec == STDIN:
        return sys.stdin.buffer.read()
    with open(spec, "rb") as f:
        return f.read()
