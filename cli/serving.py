"""What the mock peers share: the stop signals, the one ready line and the JSON summary.

A script waits for the ready line on stdout (``listening on HOST:PORT``) before it connects;
it is flushed at once, and the signal handlers are in place before it is written. At the end
``--format json`` gives the summary as one line; people get each command's own tables.
"""

from __future__ import annotations

import json
import sys

import click

from wallaroo_proto.runtime import on_stop_signals

__all__ = ["json_summary", "on_stop_signals", "ready"]


def ready(line: str) -> None:
    """Print the ready line and flush it: stdout may be a pipe a script is reading."""
    click.echo(line)
    sys.stdout.flush()


def json_summary(summary: object, fmt: str, err: bool = False) -> bool:
    """``--format json``: the summary as one JSON line for scripts (True), else nothing (False)
    and the caller renders it for people."""
    if fmt != "json":
        return False
    click.echo(json.dumps(summary), err=err)
    return True
