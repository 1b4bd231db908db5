"""spark-replay --report draws what report draws: ladders built on Spark equal the local ones."""

from __future__ import annotations

import json
import re

import pytest
from report_captures import CAPTURES
from support import run_cli

pytestmark = pytest.mark.slow

SAMPLES = [str(CAPTURES / n) for n in ("sink-2pc.pcap", "restart-reconnect.pcap", "source-session.pcap")]


def ladders(page: str) -> dict[str, dict]:
    found = re.finditer(r'<script type="application/json" id="frames-([^"]+)">(.*?)</script>', page, re.S)
    return {m.group(1): json.loads(m.group(2)) for m in found}


@pytest.mark.timeout(600)
def test_spark_replay_report_equals_the_local_report(tmp_path) -> None:
    local, on_spark = tmp_path / "local.html", tmp_path / "spark.html"
    assert run_cli("report", *SAMPLES, "-o", str(local)).returncode == 0
    result = run_cli(
        "spark-replay",
        *SAMPLES,
        "--master",
        "local[1]",
        "--rows",
        "1",
        "--report",
        str(on_spark),
        timeout=580,
    )
    assert result.returncode == 0, result.stderr
    mine, theirs = local.read_text(), on_spark.read_text()
    assert ladders(theirs) == ladders(mine)
    assert sorted(ladders(theirs)) == ["c1-1", "c2-1", "c2-2", "c3-1"]
    assert [len(v["head"]) for v in ladders(theirs).values()] == [18, 11, 9, 18]
    assert "aggregated on Spark" in theirs
    # The same latency table: PHASE1 to REPLY and REPLY to PHASE2, two rounds each.
    table = re.compile(r"<td>2PC [^<]+</td><td class=\"num\">2</td>")
    assert len(table.findall(theirs)) == len(table.findall(mine)) == 2
