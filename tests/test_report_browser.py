"""The report in a real browser: headless Chromium (Debian's package) renders it without script
errors, each ladder holds one arrow per frame of a small capture, paging walks a long connection,
a violation's link finds its red arrow; screenshots are kept as test artifacts (the path is printed)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from report_captures import CAPTURES, SAMPLE_FRAMES, long_session, unnotified_message
from support import run_cli

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Flags that keep a headless Chromium quiet and local (no network of its own, no GPU, no sandbox as root).
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Kinesis: two shards recorded below, each: initialize, 3 processRecords, shardEnded, each answered by
#: a status, and 5 checkpoints (at 10, 20, 30 records, one throttled and retried, SHARD_END) answered.
KINESIS_FRAMES = [20, 20]
LONG_MESSAGES = 100  # 4 frames before, an ACK each 10 MESSAGEs: 114 frames
#: The violations of the last capture: MESSAGEs 40 and 90 (report_captures.long_session).
BAD_FRAMES = (4 + 39 + 39 // 10, 4 + 89 + 89 // 10)
#: Boxes (x, y, width, height) of each chart's legends and plot areas (matplotlib's SVG ids).
BOXES_JS = """svgs => svgs.map(svg => {
  const box = (g) => { const r = g.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  return {
    width: svg.getBoundingClientRect().width,
    legends: [...svg.querySelectorAll('g[id^="legend_"]')].map(box),
    plots: [...svg.querySelectorAll('g[id^="axes_"] > g[id^="patch_"]:first-child')].map(box),
  };
})"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    root = os.environ.get("WALLAROO_PROTO_ARTIFACTS")
    path = Path(root) / "report-browser" if root else tmp_path_factory.mktemp("report-browser")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _kinesis_capture(path: Path) -> Path:
    processor = ["--", sys.executable, "-m", "wallaroo_proto_cli"]
    result = run_cli(
        "kinesis", "mock-daemon", "--shards", "2", "--records", "30", "--batch-size", "10", "--shard-end",
        "--checkpoint-error", "ThrottlingException@1", "--record", str(path),
        *processor, "kinesis", "mock-processor", "--checkpoint-every", "10",
    )  # fmt: skip
    assert result.returncode == 0 and path.exists(), result.stderr
    return path


@pytest.mark.timeout(240)
def test_the_report_in_headless_chromium(tmp_path, artifacts, capsys) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    captures = [
        CAPTURES / "source-session.pcap",
        CAPTURES / "restart-reconnect.pcap",
        unnotified_message(tmp_path / "bad.pcap"),
        _kinesis_capture(tmp_path / "mld.pcap"),
        long_session(tmp_path / "long.pcap", LONG_MESSAGES),
        CAPTURES / "dcp-rollback.pcap",  # a buffer chart with its markers' legend
        long_session(tmp_path / "long-bad.pcap", LONG_MESSAGES, unnotified=(40, 90)),
    ]
    expected = {
        "c1-1": SAMPLE_FRAMES["source-session.pcap"][0],
        "c2-1": SAMPLE_FRAMES["restart-reconnect.pcap"][0],
        "c2-2": SAMPLE_FRAMES["restart-reconnect.pcap"][1],
        "c3-1": 3,
        "c4-1": KINESIS_FRAMES[0],
        "c4-2": KINESIS_FRAMES[1],
    }
    report = tmp_path / "report.html"
    result = run_cli("report", *map(str, captures), "-o", str(report))
    assert result.returncode == 0, result.stderr

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000})
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            page.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
            page.on("request", lambda req: req.url.startswith("file:") or errors.append(f"fetched {req.url}"))
            page.goto(report.as_uri())
            page.wait_for_function("document.body.dataset.ladders === '9'", timeout=60_000)
            page.screenshot(path=artifacts / "report-top.png")

            # The first screen shows the findings table, its rows linked to their frames.
            first_row = page.locator("#findings + p + table tbody tr").first
            assert first_row.bounding_box()["y"] + first_row.bounding_box()["height"] < 1000
            assert page.evaluate("window.scrollY") == 0
            # The last ladder opens at its first violation, deep in what the first and last 20 hid.
            bad_ladder = page.locator("#c7-1 svg.ladder")
            assert bad_ladder.locator("#f-c7-1-0").count() == 0
            arrow, box = page.locator(f"#f-c7-1-{BAD_FRAMES[0]}"), page.locator("#c7-1 .ladder-box")
            assert "bad" in arrow.get_attribute("class")
            inner, outer = arrow.bounding_box(), box.bounding_box()
            assert outer["y"] <= inner["y"] and inner["y"] + inner["height"] <= outer["y"] + outer["height"]
            # Its second violation's row in the findings table opens the ladder there.
            page.locator(f'#findings + p + table a[data-goto="c7-1:{BAD_FRAMES[1]}"]').click()
            assert "flash" in page.locator(f"#f-c7-1-{BAD_FRAMES[1]}").get_attribute("class")
            page.locator("#c7-1").screenshot(path=artifacts / "ladder-at-finding.png")

            # Each chart is as wide as the page's text, and no legend covers a plot.
            text_width = page.locator("h1").bounding_box()["width"]
            charts = page.locator(".chart svg").evaluate_all(BOXES_JS)
            assert len(charts) >= 8 and any(chart["legends"] for chart in charts)
            for chart in charts:
                assert chart["width"] >= 0.98 * text_width
                for legend in chart["legends"]:
                    assert not any(_overlap(legend, plot) for plot in chart["plots"]), chart
            page.locator("#c6-1 .chart").screenshot(path=artifacts / "charts-dcp.png")

            for cid, frames in expected.items():
                arrows = page.locator(f"#{cid} svg.ladder g.arrow")
                assert arrows.count() == frames, cid
                ids = arrows.evaluate_all("gs => gs.map(g => g.id)")
                assert ids == [f"f-{cid}-{i}" for i in range(frames)], cid
            assert page.locator("#c3-1 svg.ladder g.arrow.bad").count() == 1
            # An address naming a frame opens its ladder at it.
            page.goto(f"{report.as_uri()}#f-c5-1-60")
            page.wait_for_function("document.body.dataset.ladders === '9'", timeout=60_000)
            assert page.locator("#c5-1 #f-c5-1-60").count() == 1
            page.locator("#c5-1 button[data-act=ends]").click()
            page.locator("#c2-1").screenshot(path=artifacts / "ladder-restart.png")

            # The long connection opens on its first and last 20 frames; its pages hold all 114.
            long_ladder = page.locator("#c5-1 svg.ladder")
            total = 4 + LONG_MESSAGES + LONG_MESSAGES // 10
            assert long_ladder.locator("g.arrow").count() == 40
            assert long_ladder.locator("g.elision").count() == 1
            seen: list[str] = []
            for _ in range(3):
                page.locator("#c5-1 button[data-act=next]").click()
                seen += long_ladder.locator("g.arrow").evaluate_all("gs => gs.map(g => g.id)")
            assert seen == [f"f-c5-1-{i}" for i in range(total)]
            height = float(long_ladder.get_attribute("height"))
            page.locator("#c5-1 button[data-act=in]").click()
            assert float(long_ladder.get_attribute("height")) > height

            # A violation's row links to its red arrow.
            page.locator('#c3-1 a[data-goto="c3-1:2"]').click()
            assert "flash" in page.locator("#f-c3-1-2").get_attribute("class")
            page.locator("#c3-1").screenshot(path=artifacts / "ladder-violation.png")
        finally:
            browser.close()
    assert errors == []
    with capsys.disabled():
        print(f"\nreport screenshots in {artifacts}")
    assert (artifacts / "ladder-restart.png").stat().st_size > 10_000
