"""The sink's transaction log and fault files: record bytes, recovery, torn and corrupt records."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto.protocols.wallaroo.faults import FaultFileError, load_faults, parse_faults
from wallaroo_proto.protocols.wallaroo.sink import InstanceStore
from wallaroo_proto.protocols.wallaroo.txnlog import (
    COMPACT_STEPS,
    Decision,
    TxnLog,
    TxnLogError,
    Vote,
    check_directory,
    crc32_concat,
    encode_record,
    instance_paths,
    scan_log,
)


def _record(payload: bytes) -> bytes:
    """u32 length | u32 crc32 | payload, written out by hand."""
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def _vote(txn: bytes, commit: int, start: int, end: int, crc: int) -> bytes:
    return _record(
        b"V" + bytes([commit]) + struct.pack(">QQI", start, end, crc) + struct.pack(">H", len(txn)) + txn
    )


def _decision(txn: bytes, commit: int) -> bytes:
    return _record(b"D" + bytes([commit]) + struct.pack(">H", len(txn)) + txn)


def _header(name: bytes) -> bytes:
    return _record(b"H" + struct.pack(">H", len(name)) + name)


def _base(committed: int, crc: int) -> bytes:
    return _record(b"B" + struct.pack(">QI", committed, crc))


def _remembered(txn: bytes, commit: int) -> bytes:
    return _record(b"R" + bytes([commit]) + struct.pack(">H", len(txn)) + txn)


def test_record_bytes_match_the_documented_layout():
    assert encode_record(Vote(b"t1", True, 0, 12, 0xDEADBEEF)) == _vote(b"t1", 1, 0, 12, 0xDEADBEEF)
    assert encode_record(Decision(b"t1", False)) == _decision(b"t1", 0)
    # a literal, so a change of layout is caught even if both helpers above drifted together
    assert _decision(b"t", 1) == bytes.fromhex("00000005") + zlib.crc32(b"D\x01\x00\x01t").to_bytes(
        4, "big"
    ) + (b"D\x01\x00\x01t")


def _write_log(tmp_path, *records: bytes):
    log, out = instance_paths(tmp_path, "w1")
    log.write_bytes(b"".join(records))
    return log, out


def test_replay_gives_committed_offset_and_undecided_votes(tmp_path):
    data = b"aaaabbbbcc"
    log, out = _write_log(
        tmp_path,
        _header(b"w1"),
        _vote(b"t1", 1, 0, 4, zlib.crc32(b"aaaa")),
        _decision(b"t1", 1),
        _vote(b"t2", 0, 4, 8, 0),  # voted abort
        _decision(b"t2", 0),
        _vote(b"t3", 1, 4, 8, zlib.crc32(b"bbbb")),  # voted commit, undecided
    )
    out.write_bytes(data)
    scan = scan_log(log)
    assert scan.instance_name == b"w1"
    assert scan.committed == 4
    assert list(scan.undecided) == [b"t3"]
    assert scan.undecided_end == 8
    assert scan.decided == {b"t1": True, b"t2": False}
    assert scan.torn_bytes == 0 and scan.problems == []
    [result] = check_directory(tmp_path)
    assert result.ok, result.problems
    assert (result.committed, result.output_length, result.uncommitted_tail) == (4, 10, 2)
    assert result.undecided == [("t3", 4, 8)]


@pytest.mark.parametrize("cut", [1, 3, 7, 8, 12, 20])
def test_torn_last_record_is_ignored_and_cut_off_on_open(tmp_path, cut):
    good = _header(b"w1") + _vote(b"t1", 1, 0, 4, zlib.crc32(b"aaaa")) + _decision(b"t1", 1)
    last = _vote(b"t2", 1, 4, 8, zlib.crc32(b"bbbb"))
    assert cut < len(last)
    log, out = _write_log(tmp_path, good, last[:cut])
    out.write_bytes(b"aaaabbbb")
    scan = scan_log(log)
    assert scan.committed == 4 and not scan.undecided
    assert scan.torn_bytes == cut and scan.good_length == len(good)
    [result] = check_directory(tmp_path)
    assert result.ok and result.torn_bytes == cut and result.uncommitted_tail == 4
    opened = TxnLog(log, "w1")  # recovery drops the torn bytes for good
    opened.append(Decision(b"t9", False))
    opened.close()
    assert log.read_bytes() == good + _decision(b"t9", 0)


def test_corrupt_last_record_is_ignored(tmp_path):
    last = bytearray(_decision(b"t1", 1))
    last[-1] ^= 0xFF  # payload changed, crc no longer matches
    log, _ = _write_log(tmp_path, _header(b"w1"), _vote(b"t1", 1, 0, 4, 0), bytes(last))
    scan = scan_log(log)
    assert scan.committed == 0 and list(scan.undecided) == [b"t1"]
    assert scan.torn_reason == "checksum mismatch"


def test_corrupt_record_in_the_middle_is_an_error_not_a_guess(tmp_path):
    middle = bytearray(_vote(b"t1", 1, 0, 4, 0))
    middle[10] ^= 0x01
    log, out = _write_log(tmp_path, _header(b"w1"), bytes(middle), _decision(b"t1", 1))
    out.write_bytes(b"aaaa")
    with pytest.raises(TxnLogError, match="corrupt record at log offset 13"):
        scan_log(log)
    [result] = check_directory(tmp_path)
    assert not result.ok and "corrupt record" in result.problems[0]


def test_check_finds_missing_and_changed_committed_bytes(tmp_path):
    log, out = _write_log(
        tmp_path, _header(b"w1"), _vote(b"t1", 1, 0, 4, zlib.crc32(b"aaaa")), _decision(b"t1", 1)
    )
    out.write_bytes(b"aa")
    [result] = check_directory(tmp_path)
    assert not result.ok and "promises 4" in result.problems[0]
    out.write_bytes(b"aXaa")
    [result] = check_directory(tmp_path)
    assert not result.ok and "do not match the checksum" in result.problems[0]
    out.write_bytes(b"aaaa")
    assert check_directory(tmp_path)[0].ok


def test_instance_names_become_safe_file_names(tmp_path):
    for name in ("../etc/passwd", "..", "", "a/b", "ünï"):
        log, out = instance_paths(tmp_path, name)
        assert log.parent == tmp_path and out.parent == tmp_path
        assert "/" not in log.name and not log.name.startswith(".")
    assert instance_paths(tmp_path, "a")[0] != instance_paths(tmp_path, "A")[0]


# --- fault files ---------------------------------------------------------------------------


def test_fault_file_toml_and_json_give_the_same_rules(tmp_path):
    toml = tmp_path / "f.toml"
    toml.write_text(
        '[[abort_vote]]\ntxn_id = "c_id=3$"\n[[abort_vote]]\npayload = "poison"\nstream = 1\n'
        '[[close]]\nat = "after_phase1_reply"\ncount = 1\n'
        '[[exit]]\nat = "before_phase2_apply"\ntxn_id = "x"\ncode = 9\n'
        '[[delay]]\nreply = "phase1"\nms = 5\n'
    )
    spec = {
        "abort_vote": [{"txn_id": "c_id=3$"}, {"payload": "poison", "stream": 1}],
        "close": [{"at": "after_phase1_reply", "count": 1}],
        "exit": [{"at": "before_phase2_apply", "txn_id": "x", "code": 9}],
        "delay": [{"reply": "phase1", "ms": 5}],
    }
    jsonf = tmp_path / "f.json"
    jsonf.write_text(json.dumps(spec))
    for faults in (load_faults(toml), load_faults(jsonf)):
        assert faults.abort_vote_for_txn("s:c_id=3") and not faults.abort_vote_for_txn("s:c_id=33")
        assert faults.payload_abort(1, b"a poison b") and not faults.payload_abort(0, b"poison")
        assert faults.should_close("after_phase1_reply", "t") and not faults.should_close(
            "after_phase1_reply", "t"
        )
        assert (
            faults.exit_code("before_phase2_apply", "x") == 9
            and faults.exit_code("before_phase2_apply", "y") is None
        )
        assert faults.delay_ms("phase1") == 5


def test_fault_rule_skip_and_count():
    faults = parse_faults({"abort_vote": [{"txn_id": "t", "skip": 2, "count": 1}]})
    assert [bool(faults.abort_vote_for_txn("t")) for _ in range(5)] == [False, False, True, False, False]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"abort": []}, "unknown key 'abort'"),
        ({"close": [{"at": "sometime"}]}, "close[0].at: must be one of"),
        ({"exit": [{"at": "after_data_write", "cod": 1}]}, "exit[0].cod: unknown key"),
        ({"exit": [{"at": "after_data_write", "code": "9"}]}, "exit[0].code: must be int, not str"),
        ({"abort_vote": [{"txn_id": "("}]}, "abort_vote[0].txn_id: bad regular expression"),
        ({"abort_vote": [{"stream": 1}]}, "give exactly one of txn_id or payload"),
        ({"abort_vote": [{"payload": "x", "stream": 2}]}, "abort_vote[0].stream"),
        ({"delay": [{"reply": "phase1"}]}, "delay[0].ms: missing"),
        ({"delay": [{"reply": "phase1", "ms": -1}]}, "delay[0].ms: must not be negative"),
        ([1], "top level"),
    ],
)
def test_bad_fault_files_name_the_bad_key(spec, message):
    with pytest.raises(FaultFileError) as err:
        parse_faults(spec, "f.toml")
    assert message in str(err.value)


def test_fault_file_is_data_never_code(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("[[abort_vote]]\ntxn_id = \"__import__('os').system('touch pwned')\"\n")
    faults = load_faults(path)  # the string is only ever a regex
    assert not faults.abort_vote_for_txn("t1")
    assert not (tmp_path / "pwned").exists()
    path.write_text("not = [toml")
    with pytest.raises(FaultFileError, match="not valid TOML"):
        load_faults(path)


_APPEND_UNDER_LIMIT = """
import resource, sys
from wallaroo_proto.protocols.wallaroo.txnlog import TxnLog, TxnLogError, Vote
log = TxnLog(sys.argv[1], "w1")
limit = log.size + 10  # the next record is longer than 10 bytes: a partial write, then EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    log.append(Vote(b"t2", True, 4, 8, 0))
except TxnLogError as err:
    print("refused:", err)
"""


def test_a_log_append_the_disk_refuses_leaves_no_partial_record(tmp_path):
    import subprocess
    import sys

    log, _ = _write_log(tmp_path, _header(b"w1"), _vote(b"t1", 1, 0, 4, 0), _decision(b"t1", 1))
    before = log.read_bytes()
    result = subprocess.run(
        [sys.executable, "-c", _APPEND_UNDER_LIMIT, str(log)], capture_output=True, text=True, timeout=30
    )
    assert "refused:" in result.stdout and "File too large" in result.stdout, result.stderr
    assert log.read_bytes() == before  # the partial record was cut off again
    scan = scan_log(log)
    assert scan.committed == 4 and scan.torn_bytes == 0


# --- compaction ------------------------------------------------------------------------------

DATA = b"aaaabbbbbbcc"  # t1 commits [0, 4), t2 votes abort, t3 commits [4, 10), t4 voted [10, 12)
OLD_LOG = b"".join(
    [
        _header(b"w1"),
        _vote(b"t1", 1, 0, 4, zlib.crc32(b"aaaa")),
        _decision(b"t1", 1),
        _vote(b"t2", 0, 4, 10, 0),
        _decision(b"t2", 0),
        _vote(b"t3", 1, 4, 10, zlib.crc32(b"bbbbbb")),
        _decision(b"t3", 1),
        _vote(b"t4", 1, 10, 12, zlib.crc32(b"cc")),  # undecided
    ]
)
COMPACTED = b"".join(
    [
        _header(b"w1"),
        _base(10, zlib.crc32(b"aaaabbbbbb")),
        _remembered(b"t1", 1),
        _remembered(b"t2", 0),
        _remembered(b"t3", 1),
        _vote(b"t4", 1, 10, 12, zlib.crc32(b"cc")),
    ]
)

_COMPACT_AND_DIE = """
import os, signal, sys
from wallaroo_proto.protocols.wallaroo.txnlog import TxnLog

def step(name):
    if name == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)

TxnLog(sys.argv[1], "w1", on_compact_step=step).compact()
print("compacted")
"""


def test_crc32_concat_matches_the_crc_of_the_joined_bytes():
    a, b = os.urandom(1000), os.urandom((1 << 20) + 777)
    assert crc32_concat(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_concat(0, zlib.crc32(b), len(b)) == zlib.crc32(b)
    assert crc32_concat(zlib.crc32(a), 0, 0) == zlib.crc32(a)


@given(st.binary(max_size=600), st.binary(max_size=3000))
def test_crc32_concat_property(a: bytes, b: bytes):
    assert crc32_concat(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("kill_at", [*COMPACT_STEPS, None])
def test_kill_9_at_each_step_of_a_compaction_loses_nothing(tmp_path, kill_at):
    log, out = _write_log(tmp_path, OLD_LOG)
    out.write_bytes(DATA + b"unvoted")
    result = subprocess.run(
        [sys.executable, "-c", _COMPACT_AND_DIE, str(log), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if kill_at is None:
        assert result.returncode == 0 and "compacted" in result.stdout, result.stderr
    else:
        assert result.returncode == -9, result.stderr
    renamed = kill_at is None or COMPACT_STEPS.index(kill_at) >= COMPACT_STEPS.index("after_rename")
    assert log.read_bytes() == (COMPACTED if renamed else OLD_LOG)  # one whole log or the other
    [before] = check_directory(tmp_path)  # read only, a stray temp file is no instance
    assert before.ok and before.committed == 10 and before.undecided == [("t4", 10, 12)], before.problems

    store = InstanceStore(tmp_path, "w1")  # recovery
    try:
        assert (store.committed, store.scan.committed_crc) == (10, zlib.crc32(DATA[:10]))
        assert list(store.scan.undecided) == [b"t4"] and store.end == 12
        assert store.scan.decided == {b"t1": True, b"t2": False, b"t3": True}
        assert store.phase2(b"t3", True) == "already committed"
        assert store.phase2(b"t4", True) == "committed [10, 12)"
    finally:
        store.close()
    assert not log.with_name(log.name + ".tmp").exists()
    assert out.read_bytes() == DATA  # no committed byte lost, the unvoted tail dropped
    [after] = check_directory(tmp_path)
    assert after.ok and after.committed == 12 and after.undecided == [], after.problems


def test_a_compaction_that_fails_before_its_rename_leaves_the_old_log(tmp_path):
    log, out = _write_log(tmp_path, OLD_LOG)
    out.write_bytes(DATA)

    def failing_fsync(step: str) -> None:
        if step == "after_temp_write":
            raise OSError(5, "Input/output error")

    opened = TxnLog(log, "w1", on_compact_step=failing_fsync)
    opened.compact()
    assert "Input/output error" in opened.compaction_error
    assert log.read_bytes() == OLD_LOG and not log.with_name(log.name + ".tmp").exists()
    opened.append(Decision(b"t4", True))  # the log carries on
    opened.close()
    assert log.read_bytes() == OLD_LOG + _decision(b"t4", 1)
    assert scan_log(log).committed == 12


def test_the_log_stays_bounded_over_many_rounds(tmp_path):
    compact_at = 16 * 1024
    store = InstanceStore(tmp_path, "w1", compact_at=compact_at)
    log_path, out_path = instance_paths(tmp_path, "w1")
    sizes, offset = [], 0
    try:
        for n in range(700):  # about 56 KB of votes and decisions
            payload = b"%05d\n" % n
            store.data(offset, payload)
            txn = f"w1:c_id={n}"
            assert store.vote(txn, ((1, offset, offset + 6),), 1) == (True, "")
            store.phase2(txn, n % 7 != 3)  # some decided abort: the data is sent again
            if n % 7 == 3:
                store.data(offset, payload)
                assert store.vote(txn + "b", ((1, offset, offset + 6),), 1) == (True, "")
                store.phase2(txn + "b", True)
            offset += 6
            sizes.append(log_path.stat().st_size)
    finally:
        store.close()
    compacted = len(_header(b"w1")) + len(_base(0, 0)) + 256 * len(_remembered(b"w1:c_id=000b", 1))
    assert max(sizes) < max(compact_at, 2 * compacted) + 100  # one record past the threshold at most
    assert min(sizes[300:]) < max(sizes[300:]) // 2  # compacted again and again
    expected = b"".join(b"%05d\n" % n for n in range(700))
    assert out_path.read_bytes() == expected
    scan = scan_log(log_path)
    assert (scan.committed, scan.committed_crc, scan.undecided) == (len(expected), zlib.crc32(expected), {})
    [result] = check_directory(tmp_path)
    assert result.ok and result.committed == len(expected), result.problems
