"""The mock IC's store: checkpoints keep the self calls they hold, a burst of records is logged like
the same records one by one."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import run_cli

from wallaroo_proto.protocols.ambrosia.codec import FORK, encode_incoming_rpc, encode_record
from wallaroo_proto.protocols.ambrosia.store import DirStore, IcCheckpoint, LoggedRecord, StoreError

#: Self calls as the IC holds them: encoded incoming RPCs, short and long sizes.
_calls = st.lists(
    st.builds(encode_incoming_rpc, st.integers(0, 300), st.just(FORK), st.binary(max_size=200)), max_size=20
)


@given(_calls, st.binary(max_size=50))
def test_a_checkpoint_keeps_its_pending_calls(calls, blob) -> None:
    checkpoint = IcCheckpoint(7, 12, 300, 40, calls, blob)
    assert IcCheckpoint.decode(checkpoint.encode()) == checkpoint


def test_the_older_form_of_pending_calls_still_loads() -> None:
    calls = [encode_incoming_rpc(2, FORK, b"15"), encode_incoming_rpc(2, FORK, b"x" * 100)]
    meta = {"committer": 7, "seq": 3, "generated": 30, "outputs": 2, "pending": [c.hex() for c in calls]}
    data = json.dumps(meta).encode() + b"\n" + b"state"
    assert IcCheckpoint.decode(data) == IcCheckpoint(7, 3, 30, 2, calls, b"state")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8), st.integers(0, 8))
def test_a_burst_is_logged_as_its_records_one_after_another(tmp_path_factory, bodies, cut) -> None:
    records = [
        LoggedRecord(encode_record(5, seq, body), seq, 10 * seq, seq) for seq, body in enumerate(bodies)
    ]
    path = tmp_path_factory.mktemp("log")
    store = DirStore(path, fsync=False)
    store.append_many(records[:cut])
    store.append_many(records[cut:])
    store.close()
    # on disk: each record with its size field as -(size) - 1, then its two watermarks
    want = b"".join(
        r.wire[:4] + struct.pack("<i", -len(r.wire) - 1) + r.wire[8:] + struct.pack("<qq", r.generated, seq)
        for seq, r in enumerate(records)
    )
    assert (path / "log-0.bin").read_bytes() == want
    store.save_checkpoint(IcCheckpoint(5, 0, 0, 0, [], b""))  # a checkpoint before them: all replay
    assert DirStore(path).load().records == records


META = b'{"committer": 7, "seq": 0, "generated": 0, "outputs": 0, "pending_bytes": 3}\n'


@pytest.mark.parametrize(
    "content, reason",
    [
        (META + b"\x7f\x00\x00", "no whole message at byte 0"),  # ZigZag 0x7f is -64: a negative size
        (META + b"\x0a\x00\x00", "no whole message at byte 0"),  # size 5, only 2 bytes after it
        (META + b"\x80\x80\x80", "no whole message at byte 0"),  # a varint that never ends
        (b"not json\n", "not a checkpoint mock-ic wrote"),
        (b'{"seq": 1}\n', "not a checkpoint mock-ic wrote"),
    ],
)
def test_a_checkpoint_it_did_not_write_is_refused_with_its_path(tmp_path, content, reason) -> None:
    (tmp_path / "checkpoint.bin").write_bytes(content)
    with pytest.raises(StoreError, match=reason) as refused:
        DirStore(tmp_path).load()
    assert str(tmp_path / "checkpoint.bin") in str(refused.value)


def test_mock_ic_refuses_such_a_log_dir_at_start(tmp_path) -> None:
    (tmp_path / "checkpoint.bin").write_bytes(META + b"\x7f\x00\x00")
    args = ("--log-dir", str(tmp_path), "--receive-port", "0", "--send-port", "0")
    done = run_cli("ambrosia", "mock-ic", *args, timeout=120)
    assert done.returncode == 2 and "not a checkpoint mock-ic wrote" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_given_for_the_log_folder_is_refused_in_words_and_left_alone(tmp_path) -> None:
    five = tmp_path / "five.txt"
    five.write_text("5\n")
    with pytest.raises(StoreError) as refused:
        DirStore(str(five))
    assert str(refused.value) == (
        f"--log-dir {five} is a file; give a folder (mock-ic keeps its log and checkpoints in it)"
    )
    assert five.read_text() == "5\n"
