"""What the commands share: the grammar of docs/cli.md (addresses, output, verbosity) and the exits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

#: The host an address without one means: everything here runs on loopback by default.
DEFAULT_HOST = "127.0.0.1"

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


class Address(click.ParamType):
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (``[v6]:PORT`` too), as a ``(host, port)`` pair."""

    name = "HOST:PORT"

    def __init__(self, *, free_port: bool) -> None:
        #: Whether port 0 (a free port, for a server) is allowed.
        self.free_port = free_port

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = "", text
        lowest = 0 if self.free_port else 1
        if not port.isdigit() or not lowest <= int(port) <= 65535:
            self.fail(f"{text!r} is not HOST:PORT (a port {lowest}-65535)", param, ctx)
        return host.strip("[]") or DEFAULT_HOST, int(port)


LISTEN_ADDRESS = Address(free_port=True)
CONNECT_ADDRESS = Address(free_port=False)


def format_address(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_option(default_port: int, what: str = "Address to listen on") -> Callable:
    """``--listen HOST:PORT`` for a server, passed as ``listen=(host, port)``.

    ``--host`` and ``--port``, the older words, still work, hidden from the help.
    """

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(
            *args: Any, listen: tuple[str, int] | None, host: str | None, port: int | None, **kw: Any
        ):
            listen_host, listen_port = listen or (DEFAULT_HOST, default_port)
            address = (host if host is not None else listen_host, port if port is not None else listen_port)
            return f(*args, listen=address, **kw)

        command = click.option("--port", type=click.IntRange(0, 65535), default=None, hidden=True)(command)
        command = click.option("--host", default=None, hidden=True)(command)
        return click.option(
            "--listen",
            type=LISTEN_ADDRESS,
            default=None,
            help=f"{what} [default: {DEFAULT_HOST}:{default_port}]; port 0 binds a free one (the ready line "
            "names it).",
        )(command)

    return decorate


def verbosity_options(f: Callable) -> Callable:
    """``-q/--quiet`` and ``-v/--verbose``, passed as ``verbosity``: -1, 0 or 1."""

    @functools.wraps(f)
    def command(*args: Any, quiet: bool, verbose: bool, **kw: Any) -> Any:
        if quiet and verbose:
            raise click.UsageError("--quiet and --verbose exclude each other")
        return f(*args, verbosity=-1 if quiet else 1 if verbose else 0, **kw)

    command = click.option("-v", "--verbose", is_flag=True, help="A line per event worth seeing.")(command)
    return click.option(
        "-q", "--quiet", is_flag=True, help="No live view or progress: errors and the summary."
    )(command)


def examples(*lines: str) -> str:
    """An ``Examples:`` block for the end of a command's help, shown as written."""
    return "\n\n\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
