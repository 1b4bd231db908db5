"""What the commands share: the grammar of docs/cli.md (addresses, output, verbosity) and the exits."""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from wallaroo_proto.input_spec import read_input

#: The host an address without one means: everything here runs on loopback by default.
DEFAULT_HOST = "127.0.0.1"

#: Exit code after SIGINT or SIGTERM (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def input_option(help: str, dest: str = "input_path", **kw: Any) -> Callable:
    """``--input FILE|-``: what a peer sends instead of what it would generate (``-`` is stdin)."""
    return click.option("--input", dest, metavar="FILE|-", help=help, **kw)


def input_lines(*paths: str) -> list[bytes]:
    """Every line of the ``--input`` files in turn; one that cannot be read is a usage error."""
    lines: list[bytes] = []
    for path in paths:
        try:
            lines.extend(read_input(path).splitlines())
        except OSError as err:
            raise usage_error(f"cannot read --input {path}: {os_reason(err)}") from err
    return lines


def state_option(help: str) -> Callable:
    """``--state FILE``, passed as ``state_path``: what a peer keeps durably, so that a restart resumes."""
    return click.option("--state", "state_path", type=click.Path(dir_okay=False), default=None, help=help)


#: ``--format text|json`` for a peer's summary, passed to the command as ``fmt``.
summary_format = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)


def command_path(ctx: click.Context | None) -> str:
    """``wallaroo-proto COMMAND ...`` however the tool was started (``python -m`` included)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["wallaroo-proto", *reversed(names)])


class CommandError(click.ClickException):
    """One line on stderr, ``wallaroo-proto COMMAND: message``, and the exit code."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.command_path = command_path(click.get_current_context(silent=True))

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.command_path}: {self.format_message()}", err=file is None, file=file)


class CommandUsageError(click.UsageError):
    """A mistake in the command line, in the one error style: ``wallaroo-proto COMMAND: message``."""

    def show(self, file: Any = None) -> None:
        click.echo(f"{command_path(self.ctx)}: {self.format_message()}", err=file is None, file=file)


def usage_error(message: str) -> click.ClickException:
    """Unusable input (a file, a port, an option): exit 2 with the message, no traceback."""
    return CommandError(message, 2)


def problem(message: str) -> click.ClickException:
    """The work found a problem (a peer's error, a failed check): exit 1 with the message."""
    return CommandError(message, 1)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class _OneLineUsage(click.Command):
    """A mistake in the command line is one line in the grammar's error style."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:  # fmt: skip
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group given nothing shows its help, as it is
        except click.UsageError as err:
            raise CommandUsageError(err.format_message(), err.ctx) from None


class Command(_OneLineUsage):
    """A command of the grammar: Ctrl-C is one line and exit 130 (not click's ``Aborted!`` and 1),
    and options may be shown under headed sections (``sections={"Heading": ["dest", ...]}``).
    """

    def __init__(self, *args: Any, sections: dict[str, list[str]] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sections = sections or {}

    def invoke(self, ctx: click.Context) -> Any:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops a command as Ctrl-C does
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise CommandError("interrupted", EXIT_INTERRUPTED) from None
        except click.UsageError as err:
            if isinstance(err, CommandUsageError):
                raise
            raise CommandUsageError(err.format_message(), err.ctx or ctx) from None
        finally:
            if previous is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an in-process caller gets its own back

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str | None, list[tuple[str, str]]] = {}
        where = {dest: heading for heading, dests in self.sections.items() for dest in dests}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                records.setdefault(where.get(param.name or ""), []).append(record)
        for heading in [*self.sections, None]:
            if records.get(heading):
                with formatter.section(heading or "Options"):
                    formatter.write_dl(records[heading])


class AliasChoice(click.Choice):
    """A choice that also takes older words, hidden from the help: ``aliases={"rich": "text"}``."""

    def __init__(self, choices: list[str], aliases: dict[str, str]) -> None:
        super().__init__(choices)
        self.aliases = aliases

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value in self.aliases:
            return self.aliases[value]
        return super().convert(value, param, ctx)


def hidden_alias(old: str, dest: str, value: Any = None, **kw: Any) -> Callable:
    """An older spelling ``old`` of the option whose value is ``dest``, still taken, hidden.

    Give the old option's type (or ``is_flag``) in ``kw``; when given, its value (or ``value``) is
    ``dest``'s.
    """
    alias = "old_" + old.lstrip("-").replace("-", "_")

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, **values: Any) -> Any:
            old_value = values.pop(alias)
            if old_value is not None and old_value is not False:
                values[dest] = old_value if value is None else value
            return f(*args, **values)

        return click.option(old, alias, default=None, hidden=True, **kw)(command)

    return decorate


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
        if ":" in host and not (host.startswith("[") and host.endswith("]")):
            self.fail(f"{text!r}: write an IPv6 address in brackets, [ADDRESS]:PORT", param, ctx)
        lowest = 0 if self.free_port else 1
        if not port.isdigit() or not lowest <= int(port) <= 65535:
            self.fail(f"{text!r} is not HOST:PORT (a port {lowest}-65535)", param, ctx)
        return host.strip("[]") or DEFAULT_HOST, int(port)


LISTEN_ADDRESS = Address(free_port=True)
CONNECT_ADDRESS = Address(free_port=False)


def os_reason(err: OSError) -> str:
    """The system's words for an OSError (asyncio's own messages repeat the address in Python's)."""
    if err.errno and err.errno > 0:
        return os.strerror(err.errno)
    return err.strerror or str(err)  # a resolver's error (socket.gaierror) has a negative errno


def open_failure(err: OSError, what: str = "", path: str | None = None) -> str:
    """Why a path could not be opened or made, in words: which part is a file, which is missing.

    ``path`` names it when the failing file is not the one given (an atomic write's temporary).
    """
    path = path if path is not None else err.filename or ""
    named = f"{what} {path}".strip()
    if err.errno in (errno.EEXIST, errno.ENOTDIR):
        return f"cannot use {named}: a part of that path is a file where a folder is needed"
    if err.errno == errno.EISDIR:
        return f"cannot use {named}: it is a folder, a file is needed"
    if err.errno == errno.ENOENT:
        return f"cannot use {named}: its folder does not exist"
    return f"cannot use {named}: {err.strerror or err}"


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


def output_option(help: str, **kw: Any) -> Callable:
    """``-o/--output PATH``: what the command writes besides what it prints."""
    return click.option("-o", "--output", "output", help=help, **kw)


def verbosity(
    quiet: str = "No live view or progress: errors and the summary.",
    verbose: str = "A line per event worth seeing.",
) -> Callable:
    """``-q/--quiet`` and ``-v/--verbose`` with what they mean for this command, passed as
    ``verbosity``: -1, 0 or 1."""

    def decorate(f: Callable) -> Callable:
        @functools.wraps(f)
        def command(*args: Any, quiet: bool, verbose: bool, **kw: Any) -> Any:
            if quiet and verbose:
                raise click.UsageError("--quiet and --verbose exclude each other")
            return f(*args, verbosity=-1 if quiet else 1 if verbose else 0, **kw)

        command = click.option("-v", "--verbose", is_flag=True, help=verbose)(command)
        return click.option("-q", "--quiet", is_flag=True, help=quiet)(command)

    return decorate


#: ``-q/--quiet`` and ``-v/--verbose`` with their usual meaning.
verbosity_options = verbosity()


def command_log(command: str, shown: bool = True) -> Callable[[str], None]:
    """A peer's log callback: each line on stderr as ``wallaroo-proto COMMAND: line`` (none when not
    ``shown``, for -q)."""

    def log(line: str) -> None:
        if shown:
            click.echo(f"wallaroo-proto {command}: {line}", err=True)

    return log


def stderr_or_nothing(text: str) -> None:
    """Write ``text`` on stderr if anyone still reads it.

    A child's stderr may be closed, or its reader gone (the KCL MultiLangDaemon's JVM exits
    before its processors end): a diagnostic that cannot be shown must not turn a clean run into
    a failure, so the first failed write sends the rest of stderr, Python's last flush too, to
    /dev/null.
    """
    stream = sys.stderr
    if stream is None:  # started with descriptor 2 closed
        return
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        _stderr_to_devnull()


def _stderr_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)  # the old stream's buffered bytes then go nowhere when it is dropped
    finally:
        os.close(devnull)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 record``, ``2 records``, ``3 recoveries`` (``many`` where an s will not do)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def examples(*lines: str) -> str:
    """An ``Examples:`` block for the end of a command's help, shown as written."""
    return "\n\n\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def write_timeout_option(who: str) -> Callable:
    """``--write-timeout S`` of a server (the shared write watch): the same word, default and rule."""
    return click.option(
        "--write-timeout",
        type=click.FloatRange(0),
        default=30.0,
        show_default=True,
        help=f"Reset {who} that reads nothing of ours for this many seconds (0: never).",
    )


class Group(_OneLineUsage, click.Group):
    """A command group of the grammar: a mistyped subcommand or a bad option is one line,
    ``wallaroo-proto GROUP: message`` (with click's nearest names), exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            if isinstance(err, (CommandUsageError, click.exceptions.NoArgsIsHelpError)):
                raise  # already in the style, or a subgroup given nothing: its help as it is
            raise CommandUsageError(err.format_message(), err.ctx or ctx) from None

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple:
        """As click's, with the nearest names for a mistyped subcommand also where the group makes
        its subcommands as asked (click looks only at the ones registered)."""
        names = self.list_commands(ctx)
        if args[0] not in names and not args[0].startswith("-") and not ctx.resilient_parsing:
            raise click.exceptions.NoSuchCommand(args[0], possibilities=names, ctx=ctx)
        return super().resolve_command(ctx, args)


def quiet_broken_pipe(f: Callable) -> Callable:
    """A command whose reader went away (``| head``) stops quietly with 0, as ``cat`` would:
    no traceback, and nothing more written to the closed pipe at exit."""

    @functools.wraps(f)
    def command(*args: Any, **kw: Any) -> Any:
        try:
            return f(*args, **kw)
        except BrokenPipeError:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())  # Python's own last flush goes nowhere
            except (OSError, ValueError, AttributeError):  # stdout without a descriptor: in-process
                pass
            raise SystemExit(0) from None

    return command


def record_option(help: str) -> Callable:
    """``--record FILE``: every connection written to a pcap; ``-`` is stdout, a stream that
    ``dissect -`` shows live, and the command's own text (ready line, summary) goes to stderr."""

    def stdout_free(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value == "-":
            sys.stdout = sys.stderr
        return value

    return click.option(
        "--record",
        type=click.Path(dir_okay=False, writable=True, allow_dash=True),
        default=None,
        callback=stdout_free,
        help=help + ' ("-": stdout, for `| wallaroo-proto dissect -`; the ready line goes to stderr).',
    )


def protocol_version_option(default: str, help: str, dest: str = "version") -> Callable:
    """``--protocol-version V`` of a Wallaroo peer, passed as ``dest``; ``--version``, the older
    word, still works, hidden from the help."""

    def decorate(f: Callable) -> Callable:
        f = hidden_alias("--version", dest)(f)
        return click.option("--protocol-version", dest, default=default, show_default=True, help=help)(f)

    return decorate


def live_option(what: str = "") -> Callable:
    """``--live/--no-live`` of a server's live view on stderr (``None`` when not given: see
    ``shows_live``)."""
    return click.option(
        "--live/--no-live",
        default=None,
        help=f"Live view on stderr{what}  [default: when stderr is a terminal]",
    )


def shows_live(live: bool | None, verbosity: int) -> bool:
    """``--live`` as given, else the live view shows when stderr is a terminal and -q is not given."""
    return live if live is not None else sys.stderr.isatty() and verbosity >= 0
