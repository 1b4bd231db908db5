"""What the commands share: the usage-error exit, the interrupted exit, the summary --format option."""

from __future__ import annotations

import click

#: Exit code after SIGINT or SIGTERM (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: ``--format text|json`` for a peer's summary, passed to the command as ``fmt``.
summary_format = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)


def usage_error(message: str) -> click.ClickException:
    """Unusable input (a file, a port, an option): exit 2 with the message, no traceback."""
    err = click.ClickException(message)
    err.exit_code = 2
    return err
