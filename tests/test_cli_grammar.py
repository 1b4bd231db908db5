"""Every command holds to docs/cli.md: the same words for the same things, help worth reading."""

from __future__ import annotations

import click
import pytest
from support import run_cli
from wallaroo_proto_cli.main import cli
from wallaroo_proto_cli.options import Address

#: Commands that serve (``--listen HOST:PORT``) and commands that reach a peer (``--connect HOST:PORT``).
SERVERS = {"mock-worker", "mock-sink", "tremor mock-node", "ambrosia mock-ic", "dcp mock-producer"}
CLIENTS = {"mock-source", "tremor mock-client", "ambrosia mock-lb", "dcp mock-consumer"}
FORMATS = {"text", "json", "jsonl"}
#: Spellings docs/cli.md replaced: still accepted hidden, never shown.
OLD_OUTPUT_WORDS = {"--out", "--out-dir", "--jsonl"}


def _walk(group: click.Group, ctx: click.Context, prefix: str = ""):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        path = f"{prefix}{name}"
        sub = click.Context(command, info_name=name, parent=ctx)
        yield path, command, sub
        if isinstance(command, click.Group):
            yield from _walk(command, sub, f"{path} ")


ROOT = click.Context(cli, info_name="wallaroo-proto")
COMMANDS = {path: (command, ctx) for path, command, ctx in _walk(cli, ROOT)}


def _visible(command: click.Command) -> dict[str, click.Option]:
    return {
        flag: p
        for p in command.params
        if isinstance(p, click.Option) and not p.hidden
        for flag in p.opts + p.secondary_opts
    }


def problems(path: str, command: click.Command, ctx: click.Context) -> list[str]:
    """Where ``command`` departs from docs/cli.md, one line each."""
    found: list[str] = []
    shown = _visible(command)
    options = {id(p): p for p in shown.values()}.values()
    found += [f"{p.opts[-1]} has no help" for p in options if not (p.help or "").strip()]
    if path in SERVERS:
        if "--listen" not in shown:
            found.append("a server without --listen")
        found += [f"a server shows {flag}" for flag in ("--host", "--port") if flag in shown]
    if path in CLIENTS and "--connect" not in shown:
        found.append("a client without --connect")
    for flag in ("--listen", "--connect"):
        if flag in shown and not isinstance(shown[flag].type, Address):
            found.append(f"{flag} is not HOST:PORT")
    if "--format" in shown:
        choices = set(getattr(shown["--format"].type, "choices", ()))
        if path == "dissect":
            choices.discard("fields")  # tshark's -T fields: the one command that writes chosen fields
        if not choices or not choices <= FORMATS:
            found.append(f"--format offers {sorted(choices)}, not within text|json|jsonl")
    found += [f"shows {flag} (write with -o/--output)" for flag in OLD_OUTPUT_WORDS & set(shown)]
    if "--output" in shown and "-o" not in shown:
        found.append("--output without -o")
    if "--version" in shown:
        found.append("shows --version (the tool's own; a protocol's is --protocol-version)")
    if not isinstance(command, click.Group):
        for short, long in (("-q", "--quiet"), ("-v", "--verbose")):
            if short not in shown or long not in shown or shown[short] is not shown[long]:
                found.append(f"no {short}/{long}")
    last = command.get_help(ctx).rstrip().split("\n\n")[-1].lstrip()
    if not last.startswith("Examples:") or "wallaroo-proto " not in last:
        found.append("the help does not end with an Examples: block")
    return found


def test_the_walk_sees_every_command():
    assert {"mock-worker", "dissect", "spark-replay", "conformance worker", "kinesis mock-daemon"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_command_holds_to_the_grammar(path: str):
    command, ctx = COMMANDS[path]
    assert problems(path, command, ctx) == []


def test_the_checks_catch_a_departure():
    @click.command(name="mock-worker")
    @click.option("--host")
    @click.option("--port", type=int, help="Port.")
    @click.option("--out", help="Out.")
    @click.option("--format", type=click.Choice(["rich", "jsonl"]), help="Format.")
    @click.option("--version", help="Protocol version.")
    def bad(**_: object) -> None:
        """No examples."""

    found = problems("mock-worker", bad, click.Context(bad, info_name="mock-worker", parent=ROOT))
    assert set(found) == {
        "--host has no help",
        "a server without --listen",
        "a server shows --host",
        "a server shows --port",
        "--format offers ['jsonl', 'rich'], not within text|json|jsonl",
        "shows --out (write with -o/--output)",
        "shows --version (the tool's own; a protocol's is --protocol-version)",
        "no -q/--quiet",
        "no -v/--verbose",
        "the help does not end with an Examples: block",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mock-worker", "--listen", "nowhere"], "Invalid value for '--listen': 'nowhere' is not HOST:PORT"),
        (["dissect", "x.pcap", "--no-such-option"], "No such option '--no-such-option'"),
        (["mock-source", "-q", "-v"], "--quiet and --verbose exclude each other"),
    ],
)
def test_a_mistake_in_the_command_line_is_one_line(args: list[str], message: str):
    result = run_cli(*args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"wallaroo-proto {args[0]}: {message}"), line
