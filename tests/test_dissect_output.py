"""dissect's output for scripts: one line a frame on a pipe, -T fields/json, -t, -w (end to end)."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from support import COMMAND, TABLE, run_cli

from wallaroo_proto.capture.views import PacketExport

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SINK = str(CAPTURES / "sink-2pc.pcap")
SINK_NS = str(CAPTURES / "sink-2pc-ns.pcapng")
SOURCE = str(CAPTURES / "source-session.pcap")
LOST = str(CAPTURES / "lost-segment.pcap")
DCP = str(CAPTURES / "dcp-rollback.pcap")
ALL = sorted(str(p) for p in CAPTURES.glob("*.pcap*"))


def records(*args: str) -> list[dict]:
    proc = run_cli("dissect", "--format", "jsonl", *args)
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def dissect(*args: str, code: int = 0, **kw) -> str:
    proc = run_cli("dissect", *args, **kw)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


# --- one line a frame ----------------------------------------------------------------


def test_piped_text_is_one_line_a_frame_that_greps_whole():
    out = dissect(SINK)
    # The 2PC transaction sink-out:c_id=1 and =2 each appear in a PHASE1, a REPLY and a PHASE2
    # (counted from the records, another view of the same frames).
    expected = sum(1 for r in records(SINK) if "sink-out:c_id" in (r.get("txn_id") or ""))
    assert expected == 6
    assert sum(1 for line in out.splitlines() if "txn=sink-out:c_id" in line) == expected
    assert len(out.splitlines()) == len(records(SINK))
    assert "12\t04:40:00.009999\t#1\tW→C\tPHASE1\ttxn=sink-out:c_id=1 where=1:0-28\t" in out.splitlines()
    assert "8\t04:40:00.006000\t#1\tW→C\tMESSAGE\tstream=sink-out (1) id=0 t=0\tline 0." in out.splitlines()


def test_piped_text_keeps_long_type_names_and_puts_notes_on_the_frame_line():
    assert any(line.split("\t")[4] == "DCP_STREAM_REQ_RESPONSE" for line in dissect(DCP).splitlines())
    [line] = [line for line in dissect(LOST).splitlines() if "\tpayload 07\t" in line]
    columns = line.split("\t")
    assert columns[4:7] == ["MESSAGE", "stream=lossy (1) id=7 t=7 key=k", "payload 07"]
    assert columns[7].startswith("note: 120 bytes missing at stream offset 187")
    assert columns[8] == "note: resynced at stream offset 319, 12 bytes skipped"


def test_a_terminal_still_gets_the_table():
    out = dissect(SINK, "-c", "1", env={**os.environ, **TABLE})
    assert out.splitlines()[0].split() == ["pkt", "time", "conn", "dir", "type", "fields", "payload"]


# --- -T fields, json ------------------------------------------------------------------


def test_fields_with_header_and_separator():
    out = dissect(
        SOURCE, "-T", "fields", "-e", "packet", "-e", "type", "-e", "stream_id", "-e", "stream_name"
    )
    assert out.splitlines()[:6] == [
        "4\tHELLO\t\t",
        "5\tOK\t\t",
        "6\tNOTIFY\t11\torders",
        "6\tNOTIFY\t12\tpayments",
        "7\tNOTIFY_ACK\t11\t",
        "7\tNOTIFY_ACK\t12\t",
    ]
    out = dissect(
        SOURCE, "-T", "fields", "-e", "type", "-e", "stream_id", "-E", "header=y", "-E", "separator=,"
    )
    assert out.splitlines()[:3] == ["type,stream_id", "HELLO,", "OK,"]


def test_fields_quote_lists_and_booleans():
    out = dissect(SINK, "--type", "phase1", "--type", "reply", "-T", "fields", "-e", "where", "-e", "commit")
    # where: stream_id:start_por:end_por of each entry; commit as in JSON.
    assert out.splitlines() == ["1:0:28\t", "\ttrue", "1:28:52\t", "\tfalse"]
    out = dissect(SINK, "--type", "reply", "-T", "fields", "-e", "type", "-e", "commit", "-E", "quote=d")
    assert out.splitlines() == ['"MESSAGE"\t"true"', '"MESSAGE"\t"false"']


@pytest.mark.parametrize("path", ALL)
def test_fields_agree_with_the_records(path: str):
    """Unfiltered, -T fields takes values from the plug-ins' blocks: they must be the records' own."""
    names = ["packet", "type", "stream_id", "message_id", "payload_len", "ts"]
    proc = run_cli("dissect", path, "-T", "fields", *[a for n in names for a in ("-e", n)])
    want = [
        "\t".join("" if r.get(n) is None else repr(r[n]) if n == "ts" else str(r[n]) for n in names)
        for r in records(path)
    ]
    assert proc.stdout.splitlines() == want


def test_field_mistakes_are_usage_errors():
    proc = run_cli("dissect", SINK, "-T", "fields", "-e", "typ")
    assert proc.returncode == 2 and "-e typ: no such field; did you mean type" in proc.stderr
    proc = run_cli("dissect", SINK, "-e", "type")
    assert proc.returncode == 2 and "-e needs -T fields" in proc.stderr
    proc = run_cli("dissect", SINK, "-T", "fields")
    assert proc.returncode == 2 and "at least one -e" in proc.stderr


def test_json_is_one_array_of_the_records():
    proc = run_cli("dissect", SINK, SOURCE, "-T", "json")
    assert json.loads(proc.stdout) == records(SINK, SOURCE)
    proc = run_cli("dissect", SINK, "-T", "json", "--type", "phase2")
    assert [r["packet"] for r in json.loads(proc.stdout)] == [14, 19]  # after each REPLY (13, 18)
    proc = run_cli("dissect", SINK, "-T", "json", "--type", "restart")
    assert proc.stdout == "[]\n"
    assert records(SINK) == [
        json.loads(line) for line in run_cli("dissect", SINK, "--format", "jsonl").stdout.splitlines()
    ]


# --- -t -----------------------------------------------------------------------------------


def times(*args: str, **kw) -> list[str]:
    return dissect(SINK, "-T", "fields", "-e", "time", *args, **kw).splitlines()


def test_time_formats():
    # sink-2pc.pcap: HELLO, NOTIFY, LIST_UNCOMMITTED in packet 4 at 1763700000.002 s
    # (2025-11-21 04:40:00.002 UTC), OK in packet 5 at .003.
    assert times("-c", "4") == ["04:40:00.002000"] * 3 + ["04:40:00.003000"]  # default: UTC time of day
    assert times("-c", "4", "-t", "u") == times("-c", "4")
    assert times("-c", "1", "-t", "ud") == ["2025-11-21 04:40:00.002000"]
    assert times("-c", "1", "-t", "e") == ["1763700000.002000"]
    assert times("-c", "4", "-t", "r") == ["0.000000"] * 3 + ["0.001000"]
    kolkata = {**os.environ, "TZ": "Asia/Kolkata"}  # UTC+05:30, no daylight saving
    assert times("-c", "1", "-t", "a", env=kolkata) == ["10:10:00.002000"]
    assert times("-c", "1", "-t", "ad", env=kolkata) == ["2025-11-21 10:10:00.002000"]


def test_relative_and_delta_times_count_frames_shown():
    # The data MESSAGEs of stream 1: packets 8-11 at .006, .006999, .007999, .008999 s.
    rows = dissect(
        SINK, "--stream", "1", "--type", "message", "-T", "fields", "-e", "packet", "-e", "time", "-t", "d"
    )
    assert rows.splitlines()[:4] == ["8\t0.000000", "9\t0.000999", "10\t0.001000", "11\t0.001000"]
    # r counts from the capture's first frame (packet 4, .002 s), shown or not.
    rows = dissect(SINK, "--stream", "1", "--type", "message", "-c", "1", "-t", "r")
    assert rows.split("\t")[:2] == ["8", "0.004000"]


# --- -w -----------------------------------------------------------------------------------


def tshark_packets(path: Path) -> list[str]:
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    proc = subprocess.run(
        ["tshark", "-r", str(path), "-T", "fields", "-e", "frame.time_epoch", "-e", "tcp.len"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_write_keeps_the_packets_of_the_frames_shown(tmp_path):
    out = tmp_path / "2pc.pcap"
    assert dissect(SINK, "--type", "phase1", "--type", "reply", "-w", str(out)) == ""
    # PHASE1 of txn 1 (packet 12, 77 bytes), its REPLY (13, 50), then txn 2's (17, 18).
    assert tshark_packets(out) == [
        "1763700000.009999000\t77",
        "1763700000.010999000\t50",
        "1763700000.014999000\t77",
        "1763700000.015999000\t50",
    ]


def test_write_from_a_pipe_keeps_nanoseconds(tmp_path):
    out = tmp_path / "first.pcap"
    with open(SINK_NS, "rb") as pipe_source:
        proc = subprocess.Popen(
            ["cat"], stdin=pipe_source, stdout=subprocess.PIPE
        )  # a real pipe: dissect cannot seek or re-read it
        done = run_cli("dissect", "-", "-c", "3", "-w", str(out), stdin=proc.stdout)
        proc.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    # The first three frames (HELLO, NOTIFY, LIST_UNCOMMITTED) share packet 1 of the ns capture:
    # one packet, 106 bytes of payload.
    [packet] = tshark_packets(out)
    assert packet.split("\t")[1] == "106"
    first = records(SINK_NS)[0]
    assert packet.split("\t")[0] == f"{first['ts_ns'] // 10**9}.{first['ts_ns'] % 10**9:09d}"


def test_write_with_summary_is_a_usage_error(tmp_path):
    proc = run_cli("dissect", SINK, "--summary", "-w", str(tmp_path / "x.pcap"))
    assert proc.returncode == 2 and "-w" in proc.stderr


# --- stream names -------------------------------------------------------------------------


def test_stream_names_beside_ids_and_as_stream_filter():
    # source-session.pcap: NOTIFY names stream 11 "orders" and 12 "payments" (packet 6).
    lines = dissect(SOURCE).splitlines()
    assert (
        "14\t04:40:00.018999\t#1\tC→W\tMESSAGE\tstream=payments (12) id=101 t=1763700000017998592\t"
        in "\n".join(lines)
    )
    assert any("\tNOTIFY_ACK\tsuccess=True stream_id=orders (11) " in line for line in lines)
    by_name = dissect(SOURCE, "--stream", "payments", "-T", "fields", "-e", "packet", "-e", "type")
    assert by_name.splitlines() == [
        "6\tNOTIFY",
        "7\tNOTIFY_ACK",
        "14\tMESSAGE",
        "15\tMESSAGE",
        "17\tEOS_MESSAGE",
    ]
    assert dissect(SOURCE, "--stream", "12", "-T", "fields", "-e", "packet", "-e", "type") == by_name
    # A hashed 20-digit id gets its name too.
    out = dissect(
        str(CAPTURES / "mock-source-tcpdump.pcap"), "--stream", "stream-0", "--type", "message", "-c", "1"
    )
    assert "\tstream=stream-0 (6318646386196972352) id=" in out


def test_packet_export_holds_only_what_later_records_may_need():
    target = io.BytesIO()
    export = PacketExport(target, max_bytes=1000)
    export.new_capture()
    export.begin(1, False)
    for number in range(1, 101):  # 100 packets of 100 bytes; records lag behind the reading
        export.packet(number, number * 1000, bytes([number]) * 100)
        if number % 10 == 0:
            export.record(number - 5, kept=number == 50)  # packet 45's frame is the one kept
        assert export._bytes <= 1000
    export.record(100, kept=True)
    export.record(100, kept=True)  # a second frame of the same packet: the packet goes once
    data = target.getvalue()
    # 24-byte header, then two records of 16 + 100 bytes: packets 45 and 100 (their first byte).
    assert len(data) == 24 + 2 * 116 and data[24 + 16] == 45 and data[24 + 116 + 16] == 100
    assert struct.unpack_from("<II", data, 24) == (0, 45)  # 45,000 ns: 45 us


# --- -w's mistakes and a reader that leaves ------------------------------------------------


def test_write_to_a_path_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("dissect", SINK, "-w", str(tmp_path / "no-such-folder" / "out.pcap"))
    assert proc.returncode == 2
    assert "cannot use -w" in proc.stderr and "its folder does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        (["-w", "-", "-T", "json"], "-w writes packets instead of showing frames: not with -T json"),
        (["-w", "-", "--stats", "conv"], "--stats with -w -: the tables would go into the pcap on stdout"),
    ],
)
def test_write_with_what_would_mix_into_the_pcap_is_a_usage_error(args: list[str], said: str) -> None:
    proc = run_cli("dissect", DCP, *args)
    assert proc.returncode == 2
    assert said in proc.stderr and proc.stdout == ""


def test_a_stream_name_of_other_digits_is_a_name() -> None:
    proc = run_cli("dissect", SINK, "--stream", "²")  # str.isdigit() is True, int() refuses it
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert "no frame matched --stream ²" in proc.stderr


@pytest.mark.e2e
def test_write_to_stdout_ends_when_its_reader_leaves_though_the_input_stays_open() -> None:
    data = Path(SINK).read_bytes()
    head, rest = data[:24], data[24:]
    proc = subprocess.Popen(
        [*COMMAND, "dissect", "-", "-w", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write(head + rest)
        proc.stdin.flush()
        assert len(proc.stdout.read(24)) == 24  # the pcap header: it is writing
        proc.stdout.close()  # as `| head -c 24`
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:  # the capture again, as a live source keeps sending (stdin stays open)
                proc.stdin.write(rest)
                proc.stdin.flush()
            except BrokenPipeError:
                break
            time.sleep(0.05)
        assert proc.wait(timeout=60) == 0
        assert b"Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
