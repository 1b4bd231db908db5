"""Messages name what exists: an option a message names is an option of the command that says it."""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatch
from pathlib import Path

import click
from wallaroo_proto_cli.main import SUBCOMMANDS, cli

import wallaroo_proto

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(wallaroo_proto.__file__).parent
CLI = ROOT / "cli"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
EVERY = frozenset(SUBCOMMANDS)
#: Whose messages a library file's are: the top-level commands that run it (the first pattern that matches).
OWNERS = {
    "protocols/*/conformance/*": {"conformance"},
    "protocols/*/proxy_faults.py": {"proxy"},
    "protocols/*/wireshark.py": {"wireshark-dissector"},
    "conformance/*": {"conformance"},
    "protocols/kinesis/*": {"kinesis"},
    "protocols/dcp/*": {"dcp"},
    "protocols/ambrosia/*": {"ambrosia"},
    "protocols/tremor/*": {"tremor"},
    "protocols/wallaroo/*": {"mock-worker", "mock-source", "mock-sink"},
    "proxy/*": {"proxy"},
    "report/*": {"report"},
    "spark/*": {"spark-replay"},
    "capture/*": {"dissect", "report", "spark-replay"},
}


def _visible(command: click.Command, ctx: click.Context) -> set[str]:
    shown = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    found = {flag for p in shown for flag in p.opts + p.secondary_opts}
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            found |= _visible(sub, click.Context(sub, info_name=name, parent=ctx))
    return found


def _options_of(names: frozenset[str] | set[str]) -> set[str]:
    root = click.Context(cli, info_name="wallaroo-proto")
    found = {"--help", "--version"}
    for name in names:
        command = cli.get_command(root, name)
        found |= _visible(command, click.Context(command, info_name=name, parent=root))
    return found


def _owners(path: Path) -> set[str] | frozenset[str]:
    if path.is_relative_to(CLI):
        module = path.stem.removesuffix("_stats")
        return {name for name, (mod, _) in SUBCOMMANDS.items() if mod == module} or EVERY
    relative = path.relative_to(SRC).as_posix()
    return next((owners for pattern, owners in OWNERS.items() if fnmatch(relative, pattern)), EVERY)


def _messages(path: Path):
    """Every string constant that is not a docstring or an option's own name (a declaration)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and ast.get_docstring(node) is not None
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and not OPTION.fullmatch(node.value.strip())
        ):
            yield node.lineno, node.value


def misnamed_options(paths) -> list[str]:
    """Options named in messages that the commands running that code do not show."""
    known: dict[frozenset, set[str]] = {}
    found = []
    for path in paths:
        owners = frozenset(_owners(path))
        options = known.setdefault(owners, _options_of(owners))
        for line, text in _messages(path):
            # what follows " -- " in a command line is another program's
            for option in OPTION.findall(text.split(" -- ")[0]):
                if option not in options:
                    found.append(f"{path.name}:{line}: {option} in {text[:80]!r}")
    return found


def test_messages_name_options_their_commands_have():
    paths = sorted([*SRC.rglob("*.py"), *CLI.glob("*.py")])
    assert misnamed_options(paths) == []


def _text(node: ast.AST) -> str:
    """A message's literal text, with ``{}`` where an f-string fills a value in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ""


#: The shipped Wallaroo worker's own ERROR text, which the mock worker sends as it is.
SHIPPED_WORDING = {"Unknown protocol version: {}"}


def unknowns_without_the_known(paths) -> list[str]:
    """Errors raised or returned that say "unknown X" and not what is known."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise):
                value = node.exc
            elif isinstance(node, ast.Return):
                value = node.value
            else:
                continue
            if value is None:
                continue
            inner = {id(c) for j in ast.walk(value) if isinstance(j, ast.JoinedStr) for c in j.values}
            texts = [_text(part) for part in ast.walk(value) if id(part) not in inner]
            texts = [text for text in texts if text and text not in SHIPPED_WORDING]
            said = re.search(r"known[:;]|expected one of|choose from|supported:", " ".join(texts))
            found += [
                f"{path.name}:{node.lineno}: {text[:80]!r}"
                for text in texts
                if re.search(r"(^|: )unknown [a-z]", text, re.I) and not said
            ]
    return found


def test_every_unknown_x_lists_what_is_known():
    # the proxy's fault rules are another change's (src/wallaroo_proto/proxy/faults*.py)
    paths = [
        p
        for p in [*SRC.rglob("*.py"), *CLI.glob("*.py")]
        if not fnmatch(p.name, "faults*.py") or "proxy" not in p.parts
    ]
    assert unknowns_without_the_known(sorted(paths)) == []
