"""The generated Lua plugin in real tshark finds the same frames as `dissect`.

CI installs tshark, so a missing tshark fails these tests rather than skipping them.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from support import run_cli

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.protocols.wallaroo.wireshark import generate, tshark_command

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAME = [
    "source-session.pcap",
    "sink-2pc.pcap",
    "restart-reconnect.pcap",
    "sink-2pc-ns.pcapng",
    "mock-source-tcpdump.pcap",
]
FIELDS = ("frame.number", "wallaroo.type", "wallaroo.message_id", "wallaroo.twopc")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> str:
    assert shutil.which("tshark"), "tshark is not installed (CI installs it: apt-get install -y tshark)"
    path = tmp_path_factory.mktemp("lua") / "wallaroo.lua"
    proc = run_cli("wireshark-dissector", "-o", str(path))
    assert proc.returncode == 0, proc.stderr
    assert path.read_text() == generate()
    return str(path)


def tshark_frames(plugin: str, capture: Path) -> dict[int, tuple[list, list, list]]:
    proc = subprocess.run(
        tshark_command(plugin, str(capture), *FIELDS), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Lua: Error" not in proc.stderr, proc.stderr
    out = {}
    for line in proc.stdout.splitlines():
        number, types, ids, tags = (line.split("\t") + ["", "", ""])[:4]
        out[int(number)] = tuple(v.split(",") if v else [] for v in (types, ids, tags))
    return out


def dissect_frames(capture: Path) -> dict[int, tuple[list, list, list]]:
    records, _ = dissect(capture)
    out: dict[int, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    for r in records:
        types, ids, tags = out[r["packet"]]
        types.append(r["type"])
        if r.get("message_id") is not None:
            ids.append(str(r["message_id"]))
        if "twopc" in r:
            tags.append(r["twopc"])
    return dict(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", SAME)
def test_tshark_finds_the_same_frames(plugin, name):
    theirs = tshark_frames(plugin, CAPTURES / name)
    ours = dissect_frames(CAPTURES / name)
    assert theirs, "tshark decoded nothing"
    assert theirs == ours


@pytest.mark.timeout(120)
def test_lost_segment_tshark_stops_where_dissect_resyncs(plugin):
    # Wireshark's PDU reassembly cannot find the next frame after a hole; dissect resyncs.
    theirs = tshark_frames(plugin, CAPTURES / "lost-segment.pcap")
    ours = dissect_frames(CAPTURES / "lost-segment.pcap")
    for number, frames in theirs.items():
        assert ours[number] == frames
    extra = sorted(set(ours) - set(theirs))
    assert extra == [9, 10, 11]
    records, _ = dissect(CAPTURES / "lost-segment.pcap")
    assert any("resynced" in " ".join(r.get("notes", [])) for r in records if r["packet"] == extra[0])


@pytest.mark.timeout(120)
def test_tshark_shows_fields_and_heuristic_on_another_port(plugin, tmp_path):
    proc = subprocess.run(
        [*tshark_command(plugin, str(CAPTURES / "sink-2pc.pcap")), "-V"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Transaction id: sink-out:c_id=2" in proc.stdout
    assert "Commit: abort (0)" in proc.stdout
    assert "Version: v0.0.1" in proc.stdout
    # Registered only on port 9 here: the HELLO heuristic must still claim the connection.
    lua = tmp_path / "other.lua"
    lua.write_text(generate(ports=[9]))
    theirs = tshark_frames(str(lua), CAPTURES / "source-session.pcap")
    assert theirs == dissect_frames(CAPTURES / "source-session.pcap")


def test_an_output_path_through_a_file_is_one_line_and_quiet_writes_no_line(tmp_path):
    (tmp_path / "five.txt").write_text("a file\n")
    bad = run_cli("wireshark-dissector", "-o", str(tmp_path / "five.txt" / "w.lua"))
    assert bad.returncode == 2
    assert bad.stderr == (
        f"wallaroo-proto wireshark-dissector: cannot use --output {tmp_path / 'five.txt' / 'w.lua'}: "
        "a part of that path is a file where a folder is needed\n"
    )
    quiet = run_cli("wireshark-dissector", "-o", str(tmp_path / "w.lua"), "-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and (tmp_path / "w.lua").read_text().strip()


# The frame types of the protocol spec, written out by hand (not read from the codec).
SPEC_TYPES = {
    "0": "HELLO",
    "1": "OK",
    "2": "ERROR",
    "3": "NOTIFY",
    "4": "NOTIFY_ACK",
    "5": "MESSAGE",
    "6": "ACK",
    "7": "RESTART",
    "8": "EOS_MESSAGE",
    "9": "WORKERS_LEFT",
}


@pytest.mark.timeout(120)
def test_type_fields_print_names_and_codes_and_filter_by_name(plugin):
    capture = str(CAPTURES / "sink-2pc.pcap")
    cmd = tshark_command(plugin, capture, "wallaroo.type", "wallaroo.type_code", "wallaroo.twopc")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pairs = []
    twopc = []
    for line in proc.stdout.splitlines():
        names, codes, tags = (line.split("\t") + ["", ""])[:3]
        pairs += zip(codes.split(","), names.split(","), strict=True)
        twopc += [t for t in tags.split(",") if t]
    assert pairs and all(SPEC_TYPES[code] == name for code, name in pairs)
    assert {"PHASE1", "REPLY", "PHASE2"} <= set(twopc)
    # A name works in a display filter, as tshark users write them.
    cmd = tshark_command(plugin, capture)
    assert cmd[-2:] == ["-Y", "wallaroo"]
    cmd[-1] = 'wallaroo.type == "NOTIFY"'
    only = subprocess.run(
        [*cmd, "-T", "fields", "-e", "frame.number"], capture_output=True, text=True, timeout=60
    )
    assert only.returncode == 0, only.stderr
    ours = {n for n, (types, _, _) in dissect_frames(CAPTURES / "sink-2pc.pcap").items() if "NOTIFY" in types}
    assert ours and {int(n) for n in only.stdout.split()} == ours
