"""What every serving command shares: the stop signals and the one ready line.

A script waits for the ready line on stdout (``listening on HOST:PORT``) before it connects;
it is flushed at once, and the signal handlers are in place before it is written.
"""

from __future__ import annotations

import sys

import click

from wallaroo_proto.runtime import on_stop_signals

__all__ = ["on_stop_signals", "ready"]


def ready(line: str) -> None:
    """Print the ready line and flush it: stdout may be a pipe a script is reading."""
    click.echo(line)
    sys.stdout.flush()
