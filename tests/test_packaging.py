"""What ``pip install`` builds holds every module and data file, and every command runs from it.

The rest of the suite runs the installed package too (conftest.py), so a module left out of the
wheel fails there as well; these tests say which file is missing, and run each command's
``--help`` in a fresh environment that holds nothing but the wheel and its dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Where each shipped tree lands in the wheel.
TREES = {ROOT / "src" / "wallaroo_proto": "wallaroo_proto", ROOT / "cli": "wallaroo_proto_cli"}


def _shipped_files() -> set[str]:
    """Every file of the package trees, as the wheel should name it."""
    names = set()
    for tree, package in TREES.items():
        for path in tree.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                names.add(f"{package}/{path.relative_to(tree).as_posix()}")
    return names


def _tracked_copy(into: Path) -> Path:
    """The checkout's tracked files, so the build neither writes into it nor sees stray files."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from a git checkout's tracked files; this is not one")
    source = _tracked_copy(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("wallaroo_proto-*.whl")
    return found


def test_the_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if ".dist-info/" not in name}
    assert "wallaroo_proto/proxy/relay.py" in _shipped_files()  # the tree walk sees what it must
    assert sorted(_shipped_files() - packed) == []
    assert sorted(packed - _shipped_files()) == []


def _commands() -> list[list[str]]:
    """Every command and subcommand path, walked from the installed click tree."""
    import click
    from wallaroo_proto_cli.main import cli

    paths: list[list[str]] = []

    def walk(group: click.Group, ctx: click.Context, prefix: list[str]) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            paths.append([*prefix, name])
            if isinstance(command, click.Group):
                walk(command, click.Context(command, info_name=name, parent=ctx), [*prefix, name])

    walk(cli, click.Context(cli, info_name="wallaroo-proto"), [])
    return paths


def test_every_command_helps_from_a_fresh_environment_outside_the_checkout(wheel: Path, tmp_path) -> None:
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
        env=environ,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    script = env_dir / "bin" / "wallaroo-proto"
    failures = []
    for path in [[], *_commands()]:
        done = subprocess.run(
            [str(script), *path, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            env=environ,
            cwd=tmp_path,
        )
        if done.returncode != 0 or "Usage:" not in done.stdout or "not built" in done.stdout + done.stderr:
            failures.append(
                f"wallaroo-proto {' '.join(path)} --help: exit {done.returncode}: {done.stderr[-300:]}"
            )
    assert failures == []


def _system_packages(tmp_path: Path, uid: int) -> subprocess.CompletedProcess:
    """tests/system-packages on a PATH that holds none of the tools and no apt-get, as ``uid``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "id").chmod(0o755)
    return subprocess.run(
        ["/bin/bash", str(ROOT / "tests" / "system-packages")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir)},
    )


@pytest.mark.parametrize("uid", [1000, 0], ids=["a user", "root without apt-get"])
def test_what_the_tests_need_from_the_system_is_one_line_where_it_cannot_be_installed(tmp_path, uid) -> None:
    done = _system_packages(tmp_path, uid)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        "tests: install tshark tcpdump openjdk-17-jdk-headless chromium nodejs npm first"
        " (Debian: sudo apt-get install tshark tcpdump openjdk-17-jdk-headless chromium nodejs npm)\n"
    )
