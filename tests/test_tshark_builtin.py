"""The README's tshark lines for DCP and Tremor (tshark's own dissectors) find what `dissect` finds.

The lines are read from README.md and run as written, then on the other sample of the
protocol with its file and server port put in. CI installs tshark, so a missing tshark fails.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from wallaroo_proto.capture.dissector import dissect

ROOT = Path(__file__).resolve().parent.parent
#: The README line's sample, the other sample, and per tshark field the record key and how to read its text.
CASES = {
    "couchbase": (
        "dcp-stream.pcap",
        "dcp-rollback.pcap",
        {"couchbase.opcode": ("dcp_opcode", lambda v: int(v, 16)), "couchbase.key": ("dcp_key", str)},
    ),
    "http": ("tremor-session.pcap", "tremor-framing.pcap", {"websocket.opcode": ("ws_opcode", int)}),
}  # fmt: skip


def readme_line(decoder: str) -> str:
    lines = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("tshark -r captures/") and f",{decoder} " in line
    ]
    assert len(lines) == 1, f"README.md should show one tshark line decoding as {decoder}"
    return lines[0]


def server_port(capture: Path) -> int:
    records, _ = dissect(capture)
    ports = {r["responder_port"] for r in records}
    assert len(ports) == 1
    return ports.pop()


def run(argv: list[str]) -> dict[int, list[list[str]]]:
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        number, *values = line.split("\t")
        out[int(number)] = [v.split(",") if v else [] for v in values]
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("decoder", CASES)
@pytest.mark.parametrize("which", [0, 1])
def test_readme_tshark_line_finds_the_frames_dissect_finds(decoder, which):
    assert shutil.which("tshark"), "tshark is not installed (CI installs it: apt-get install -y tshark)"
    line = readme_line(decoder)
    written, other, fields = CASES[decoder]
    argv = shlex.split(line)
    assert argv[argv.index("-r") + 1] == f"captures/{written}"
    assert re.search(rf"tcp\.port=={server_port(ROOT / 'captures' / written)},", line)
    shown = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert shown == ["frame.number", *fields], "the line's fields are the ones checked"
    if which:
        port = server_port(ROOT / "captures" / other)
        argv = [re.sub(r"tcp\.port==\d+,", f"tcp.port=={port},", a) for a in argv]
        argv[argv.index("-r") + 1] = f"captures/{other}"
    capture = ROOT / argv[argv.index("-r") + 1]
    theirs = {
        n: [[read(v) for v in vs] for vs, (_, read) in zip(values, fields.values(), strict=True)]
        for n, values in run(argv).items()
    }
    records, _ = dissect(capture)
    ours: dict[int, list[list]] = defaultdict(lambda: [[] for _ in fields])
    for r in records:
        for values, (key, _) in zip(ours[r["packet"]], fields.values(), strict=True):
            if r.get(key) is not None:
                values.append(r[key])
    ours = {n: v for n, v in ours.items() if v[0]}
    assert len(ours) > 10
    assert theirs == ours
