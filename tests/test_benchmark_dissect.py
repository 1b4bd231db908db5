"""benchmarks/dissect.py runs each case end to end at tiny sizes (the figures are its job, not these)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "dissect.py"
NO_TSHARK = "tshark is not installed: this case measures against it"


def _bench(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", *args], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _records(output: str, row: str) -> int:
    """The records column of a table row."""
    match = re.search(rf"^{re.escape(row)}\s+([\d,]+) ", output, re.MULTILINE)
    assert match, f"no row {row!r} in:\n{output}"
    return int(match.group(1).replace(",", ""))


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("tshark"), reason=NO_TSHARK)
def test_dcp_case_measures_tshark_and_dissect_on_the_same_packets():
    out = _bench("--case", "dcp", "--dcp-vbuckets", "2", "--dcp-items", "50")
    counts = re.search(r"tshark decodes ([\d,]+) opcodes, dissect writes ([\d,]+) records \(the same\)", out)
    assert counts, out
    assert counts[1] == counts[2]
    records = int(counts[2])
    assert records > 100  # the 100 items, their snapshot markers and the handshake
    assert _records(out, "tshark -T fields (2 fields)") == records
    assert _records(out, "dissect --format jsonl") == records
    assert _records(out, "dissect --summary") == records
    assert _records(out, "dissect -T fields (2 fields)") == records
    assert _records(out, "dissect --format jsonl, 4x") > 4 * 100
    assert re.search(r"dissect --format jsonl vs tshark: +[\d.]+x per CPU second.*target >= 1x", out)
    assert re.search(r"dissect --summary vs tshark: +[\d.]+x per CPU second.*target >= 2x", out)
    assert "load average" in out


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("tshark"), reason=NO_TSHARK)
def test_dcp_case_can_leave_out_the_large_capture():
    out = _bench("--case", "dcp", "--dcp-vbuckets", "1", "--dcp-items", "10", "--dcp-skip-large")
    assert "dissect --summary vs tshark" in out
    assert ", 4x" not in out


@pytest.mark.e2e
def test_samples_case_times_every_protocol_workload():
    out = _bench("--case", "samples", "--samples-scale", "0.005")
    for protocol in ("wallaroo", "kinesis", "dcp", "ambrosia", "tremor"):
        made = re.search(rf"^{protocol}: [\d.]+ MB, ([\d,]+) records", out, re.MULTILINE)
        assert made, out
        records = int(made[1].replace(",", ""))
        assert records > 0
        assert _records(out, f"{protocol} jsonl") == records
        assert _records(out, f"{protocol} --summary") == records
    assert re.search(r"^start-up \(in every row above\): [\d.]+ CPU s", out, re.MULTILINE), out


@pytest.mark.e2e
@pytest.mark.skipif(not shutil.which("tshark"), reason=NO_TSHARK)
def test_wallaroo_case_still_compares_with_tshark_and_scapy():
    out = _bench("--case", "wallaroo", "--packets", "400", "--large", "800", "--scapy-packets", "50")
    assert re.search(r"^frames: \d+ ", out, re.MULTILINE), out
    for line in ("dissect vs tshark -T json:", "dissect vs scapy:", "peak RSS: ", "load average"):
        assert line in out


@pytest.mark.e2e
def test_filter_case_times_y_against_the_older_options_and_no_filter():
    out = _bench("--case", "filter", "--samples-scale", "0.01")
    frames = int(re.search(r"^wallaroo: [\d.]+ MB, ([\d,]+) frames", out, re.MULTILINE)[1].replace(",", ""))
    half = re.search(r"^\[1\] -Y .* keeps ([\d,]+) frames \((\d+)%\)", out, re.MULTILINE)
    assert half and 40 <= int(half[2]) <= 60, out
    assert re.search(r"^\[2\] -Y 'type == RESTART' keeps 0 frames", out, re.MULTILINE), out
    for row in ("no filter", "[1] -Y", "[1] the older options", "[2] -Y", "[2] the older options"):
        assert _records(out, row) == frames
    for i in (1, 2):
        line = rf"^\[{i}\] the compiled filter alone \d+ ns a record; -Y [+-][\d.]+ µs a frame against"
        assert re.search(line, out, re.MULTILINE), out
