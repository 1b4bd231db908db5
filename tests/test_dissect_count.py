"""dissect -c N stops after N frames over all captures; a filter matching nothing says so."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from support import TABLE, run_cli

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
#: 13 frames, then 18.
LOST, SOURCE = str(CAPTURES / "lost-segment.pcap"), str(CAPTURES / "source-session.pcap")
WIDE = {**os.environ, **TABLE}


def jsonl(*args: str) -> list[dict]:
    proc = run_cli("dissect", "--format", "jsonl", *args)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_count_stops_after_n_frames_over_all_captures():
    everything = jsonl(LOST, SOURCE)
    assert len(everything) == 31
    assert jsonl("-c", "5", LOST, SOURCE) == everything[:5]
    assert jsonl("--count", "20", LOST, SOURCE) == everything[:20]  # 13 of one, 7 of the other
    assert jsonl("-c", "1000", LOST, SOURCE) == everything


def test_count_applies_to_the_frames_a_filter_passes():
    messages = [r for r in jsonl(LOST, SOURCE) if r["type"] == "MESSAGE"]
    assert jsonl("-c", "10", "--type", "message", LOST, SOURCE) == messages[:10]


def test_count_in_the_table():
    proc = run_cli("dissect", "-c", "3", LOST, SOURCE, env=WIDE)
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"^\s+(\d+)\s+\d\d:\d\d:\d\d\.\d{6}\s+#1\s", proc.stdout, re.M)
    assert rows == ["4", "5", "6"]
    assert "source-session" not in proc.stdout  # the second capture is never started


def test_count_with_summary_summarises_the_first_frames_read():
    proc = run_cli("dissect", "--summary", "--format", "jsonl", "-c", "3", LOST, SOURCE)
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    summary = json.loads(line)["summary"]
    assert summary["frames"] == 3 and summary["frames_by_type"] == {"HELLO": 1, "OK": 1, "NOTIFY": 1}


def test_a_filter_matching_nothing_says_so():
    proc = run_cli("dissect", "--type", "error", "--stream", "7", LOST, SOURCE)
    assert proc.returncode == 0
    assert proc.stderr.splitlines() == [
        "wallaroo-proto dissect: no frame matched --stream 7 --type error (31 frame(s) read)"
    ]
    proc = run_cli("dissect", "--format", "jsonl", "--connection", "9", LOST)
    assert proc.returncode == 0 and proc.stdout == ""
    assert "no frame matched --connection 9 (13 frame(s) read)" in proc.stderr
    assert run_cli("dissect", "-q", "--type", "error", LOST).stderr == ""
    found = run_cli("dissect", "--format", "jsonl", "--type", "ack", LOST)
    assert found.stdout and "no frame matched" not in found.stderr


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_a_summary_of_a_connection_that_is_not_there_says_so(fmt):
    proc = run_cli(
        "dissect", "--summary", "--format", fmt, "--connection", "9", "--connection", "nowhere", LOST, SOURCE
    )
    assert proc.returncode == 0 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "wallaroo-proto dissect: no connection matched --connection 9 --connection nowhere "
        "(2 connection(s) read)"
    ]
    assert run_cli("dissect", "-q", "--summary", "--connection", "9", LOST).stderr == ""
    found = run_cli("dissect", "--summary", "--format", "jsonl", "--connection", "1", LOST)
    assert found.stdout and found.stderr == ""
