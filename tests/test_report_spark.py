"""spark-replay --report draws what report draws: ladders built on Spark equal the local ones."""

from __future__ import annotations

import json
import re

import pytest
from support import run_cli

pytestmark = pytest.mark.e2e


def ladders(page: str) -> dict[str, dict]:
    found = re.finditer(r'<script type="application/json" id="frames-([^"]+)">(.*?)</script>', page, re.S)
    return {m.group(1): json.loads(m.group(2)) for m in found}


def test_spark_replay_report_equals_the_local_report(replayed_everything, tmp_path) -> None:
    """The shared run's report (every protocol's captures) against ``report`` over the same captures."""
    replay = replayed_everything.ok()
    local = tmp_path / "local.html"
    drawn = run_cli("report", *map(str, replay.paths.values()), "-o", str(local), timeout=300)
    # report's documented exit for a capture cut short (a problem found); it draws what came before
    assert drawn.returncode == 1 and f"{replay.paths['damaged']}: packet 20" in drawn.stderr, drawn.stderr
    mine, theirs = local.read_text(), replay.report.read_text()
    assert ladders(theirs) == ladders(mine)
    # The first three captures: sink-2pc (c1), restart-reconnect (c2) and source-session (c3).
    first = {k: v for k, v in ladders(theirs).items() if k in ("c1-1", "c2-1", "c2-2", "c3-1")}
    assert [len(first[k]["head"]) for k in ("c1-1", "c2-1", "c2-2", "c3-1")] == [18, 11, 9, 18]
    assert "aggregated on Spark" in theirs
    # The same latency tables, every protocol's distributions with their counts.
    assert latencies(theirs) == latencies(mine)
    # (Latencies come from the first 20 connections; the captures after them give summary rows only.)
    assert {name for _, name, _ in latencies(mine)} == {
        "2PC PHASE1 to REPLY",
        "2PC REPLY to PHASE2",
        "NOOP to response",
        "STREAM_REQ to response",
        "request to status",
    }


def latencies(page: str) -> list[tuple[str, str, int]]:
    """(protocol, distribution, count) rows of the page's Latencies section."""
    section = page.split("<h2>Latencies</h2>", 1)[1].split("<h2>", 1)[0]
    rows = []
    for part in section.split("<h3>")[1:]:
        protocol = part.split("</h3>", 1)[0]
        for name, count in re.findall(r'<tr><td>([^<]+)</td><td class="num">(\d+)</td>', part):
            rows.append((protocol, name, int(count)))
    return rows
