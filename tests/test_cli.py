"""The command group itself: help, version, and honest placeholders."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import run_cli
from wallaroo_proto_cli.main import SUBCOMMANDS

from wallaroo_proto import __version__


def test_help_lists_every_subcommand_with_one_line_help():
    result = run_cli("--help")
    assert result.returncode == 0
    for name in ("mock-worker", "mock-source", "mock-sink", "dissect", "spark-replay"):
        assert name in result.stdout
    for name, (_module, help_text) in SUBCOMMANDS.items():
        line = next(line for line in result.stdout.splitlines() if line.split()[:1] == [name])
        assert help_text.split()[0] in line


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"wallaroo-proto, version {__version__}"


def test_unknown_subcommand_is_a_usage_error():
    result = run_cli("no-such-thing")
    assert result.returncode == 2
    assert "No such command" in result.stderr


@pytest.mark.parametrize(
    ("typed", "nearest"),
    [(("disect",), "dissect"), (("conformance", "lbx"), "lb"), (("kinesis", "mock-deamon"), "mock-daemon")],
)
def test_a_mistyped_command_is_one_line_with_the_nearest_name(typed, nearest):
    result = run_cli(*typed)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"wallaroo-proto{' ' + typed[0] if len(typed) > 1 else ''}: No such command")
    assert f"'{nearest}'" in line


@pytest.mark.parametrize("group", [(), ("dcp",), ("conformance",)])
def test_a_group_given_nothing_shows_its_help(group):
    result = run_cli(*group)
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]  # (the program is named as the test starts it: python -m ...)
    usage = " ".join(("", *group, "[OPTIONS] COMMAND [ARGS]..."))
    assert first.startswith("Usage: ") and first.endswith(usage), first
    assert "Commands:" in result.stderr and ": Usage:" not in result.stderr


def test_help_imports_no_subcommand():
    """``wallaroo-proto --help`` stays fast: the one-line helps come without importing a subcommand
    (scapy, pyspark); the shared option parts are click and the standard library only."""
    code = (
        "import sys; from wallaroo_proto_cli.main import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass\n"
        "shared = ('wallaroo_proto_cli.main', 'wallaroo_proto_cli.options')\n"
        "mine = [m for m in sys.modules if m.startswith('wallaroo_proto_cli.') and m not in shared]\n"
        "print(sorted(mine + [m for m in ('scapy', 'pyspark', 'rich.table') if m in sys.modules]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
