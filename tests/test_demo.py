"""The main job, without its Spark step (spark-replay has its own tests; CI runs the full demo)."""

from __future__ import annotations

import os

import pytest
from support import run_cli

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_demo_passes_and_leaves_its_recordings(tmp_path) -> None:
    wide = {**os.environ, "COLUMNS": "300"}
    result = run_cli(
        "demo", "--no-spark", "--workdir", str(tmp_path), "--count", "200", timeout=280, env=wide
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "demo passed" in result.stdout
    assert "the sink committed all 600 messages once each, every stream in order" in result.stdout
    assert "1 RESTART(s)" in result.stdout or "RESTART(s) sent" in result.stdout
    assert sorted(p.name for p in (tmp_path / "captures").iterdir()) == ["sink-side.pcap", "source-side.pcap"]
    report = tmp_path / "report.html"
    assert f"report: {report}" in result.stdout.replace("\n", "")
    page = report.read_text()
    assert page.count('class="ladder-box"') >= 3 and "2PC PHASE1 to REPLY" in page
