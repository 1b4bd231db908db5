"""The tree stays ruff-clean: lint and format are part of the test run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check():
    result = _ruff("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
