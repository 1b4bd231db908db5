"""The mocks' data (sans-IO): snapshots of a history, a consumer's rollback, the promise in-process."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp.core import needs_rollback
from wallaroo_proto.protocols.dcp.store import (
    DELETION,
    EXPIRATION,
    MUTATION,
    Bucket,
    ConsumerVBucket,
    StateError,
    VBucket,
    items_of,
)

OPCODES = {MUTATION: codec.MUTATION, DELETION: codec.DELETION, EXPIRATION: codec.EXPIRATION}


def _vb(*ops: tuple[str, str]) -> VBucket:
    vb = VBucket(0, [(7, 0)])
    for key, op in ops:
        vb.add(key, op, f"{key}@{vb.high_seqno + 1}")
    return vb


def test_disk_snapshot_is_one_deduplicated_backfill_and_memory_snapshots_are_cut():
    vb = _vb(("a", MUTATION), ("b", MUTATION), ("a", MUTATION), ("c", MUTATION))
    vb.persisted = 3
    vb.add("a", DELETION)
    vb.add("d", MUTATION)
    vb.add("d", MUTATION)
    snaps = list(vb.snapshots(0, codec.FOREVER, 2))
    assert [(s.start, s.end, s.flags) for s in snaps] == [(0, 3, 6), (4, 5, 5), (6, 7, 5)]
    assert [[(v.seqno, v.key) for v in s.versions] for s in snaps] == [
        [(2, "b"), (3, "a")],
        [(4, "c"), (5, "a")],
        [(7, "d")],
    ]
    # from the middle, and up to an end seqno: the first marker starts at the requested start
    assert [(s.start, s.end) for s in vb.snapshots(4, 6, 2)] == [(4, 6)]


def test_failover_loses_the_newest_versions_and_starts_a_new_uuid():
    vb = _vb(("a", MUTATION), ("a", MUTATION), ("b", MUTATION))
    vb.fail_over(0x99, 2)
    assert vb.high_seqno == 1 and vb.failover == [(0x99, 1), (7, 0)] and vb.state() == {"a": "a@1"}
    assert vb.add("a", MUTATION).rev == 2


def test_consumer_rolls_back_to_its_last_complete_snapshot():
    c = ConsumerVBucket(0, [(7, 0)])
    c.marker(0, 2)
    c.apply(1, b"a", codec.MUTATION, b"1")
    assert c.apply(2, b"b", codec.MUTATION, b"2")
    c.marker(3, 5)
    c.apply(3, b"a", codec.MUTATION, b"3")
    assert c.rollback(4) == 2
    assert (c.seqno, c.snap_start, c.snap_end, c.state()) == (2, 2, 2, {"a": "1", "b": "2"})
    assert c.rollback(1) == 0 and c.state() == {} and c.failover == [(7, 0)]


def test_an_item_whose_seqno_does_not_rise_is_left_out_of_the_copy():
    c = ConsumerVBucket(0, [(7, 0)])
    c.marker(0, 5)
    c.apply(2, b"a", codec.MUTATION, b"1")
    c.apply(3, b"b", codec.MUTATION, b"2")
    assert not c.apply(3, b"c", codec.MUTATION, b"again") and not c.apply(1, b"d", codec.MUTATION, b"old")
    assert c.state() == {"a": "1", "b": "2"}
    again = ConsumerVBucket.from_json(0, c.to_json())  # the state file still loads
    assert again.state() == c.state() and again.seqno == 3


def test_a_consumer_state_of_the_earlier_form_still_loads():
    """Earlier releases kept each key's versions; the copy is now one log in seqno order."""
    earlier = {
        "failover": [[7, 0]],
        "seqno": 3,
        "snap_start": 3,
        "snap_end": 3,
        "versions": {"a": [[1, "mutation", "1"], [3, "mutation", "3"]], "b": [[2, "deletion", ""]]},
        "consistent": [2, 3],
        "items": 3,
        "rollbacks": 0,
    }
    c = ConsumerVBucket.from_json(0, earlier)
    assert c.state() == {"a": "3"} and (c.seqno, c.consistent) == (3, [2, 3])
    assert c.to_json()["log"] == [
        [1, "mutation", "a", "1"],
        [2, "deletion", "b", ""],
        [3, "mutation", "a", "3"],
    ]
    assert c.rollback(2) == 2 and c.state() == {"a": "1"}


def _sync(vb: VBucket, c: ConsumerVBucket, budget: int | None, size: int) -> str:
    """One stream request and what follows, cut after ``budget`` items (a dropped connection)."""
    req = c.stream_request(max(vb.high_seqno, c.seqno))
    back = needs_rollback(
        req.start, req.vbucket_uuid, req.snap_start, req.snap_end, vb.failover, vb.high_seqno
    )
    if back is not None:
        assert back <= req.start
        c.rollback(back)
        return "rollback"
    assert req.start <= vb.high_seqno
    c.failover = list(vb.failover)
    for snap in vb.snapshots(req.start, req.end, size):
        c.marker(snap.start, snap.end)
        for v in snap.versions:
            if budget is not None:
                if budget == 0:
                    return "cut"
                budget -= 1
            c.apply(v.seqno, v.key.encode(), OPCODES[v.op], v.value.encode())
    return "done"


steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30)),
        st.tuples(st.just("failover"), st.integers(0, 25)),
        st.tuples(st.just("sync"), st.one_of(st.none(), st.integers(0, 20))),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 8), st.randoms(use_true_random=False))
def test_the_promise_in_process(plan, size, rnd):
    """New items, failovers that lose items, cut streams in any mix: a last full sync makes the copy equal."""
    bucket = Bucket.new(1, random.Random(1))
    vb = bucket.vbuckets[0]
    c = ConsumerVBucket(0)
    uuid = 100
    for step, arg in plan:
        if step == "add":
            bucket.generate(arg, rnd, 6, 0)
        elif step == "failover":
            uuid += 1
            vb.fail_over(uuid, arg)
        else:
            _sync(vb, c, arg, size)
    for _ in range(4):
        if _sync(vb, c, None, size) == "done":
            break
    assert c.state() == vb.state()
    assert c.seqno == vb.high_seqno


def test_a_bucket_opens_from_its_state_file_when_there_is_one_else_new(tmp_path):
    path = tmp_path / "p.json"
    fresh = Bucket.open(str(path), 4, random.Random(1))
    assert sorted(fresh.vbuckets) == [0, 1, 2, 3] and not path.exists()
    fresh.generate(3, random.Random(2), 5, 10)
    path.write_bytes(fresh.to_json())
    again = Bucket.open(str(path), 64, random.Random(3))  # the file keeps its own vbuckets
    assert again.to_json() == fresh.to_json()
    assert sorted(Bucket.open(None, 2, random.Random(1)).vbuckets) == [0, 1]


def test_a_state_file_that_cannot_be_used_is_refused_naming_it(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(StateError, match=rf"^--state {bad}: not a mock-producer state file: "):
        Bucket.open(str(bad), 4, random.Random(1))
    bad.unlink()
    bad.mkdir()
    with pytest.raises(StateError, match=rf"^cannot read --state {bad}: Is a directory$"):
        Bucket.open(str(bad), 4, random.Random(1))


def test_a_bucket_fails_over_every_vbucket_at_once():
    bucket = Bucket.new(3, random.Random(1))
    bucket.generate(4, random.Random(2), 2, 0)
    before = {vb.vb: (vb.uuid, vb.high_seqno) for vb in bucket.vbuckets.values()}
    bucket.fail_over(random.Random(3), 1)
    for vb in bucket.vbuckets.values():
        assert vb.uuid != before[vb.vb][0] and vb.high_seqno == before[vb.vb][1] - 1


def test_input_items_are_a_json_object_a_line_and_a_bad_line_is_named():
    assert items_of([b'{"key": "a"}\n', b"  \n", b'{"key": "b", "op": "deletion"}\n']) == [
        {"key": "a"},
        {"key": "b", "op": "deletion"},
    ]
    with pytest.raises(StateError, match=r"^line 2: not JSON \(Expecting value"):
        items_of([b"\n", b"nope\n"])
    with pytest.raises(StateError, match=r"^line 1: not a JSON object$"):
        items_of([b"[1, 2]\n"])
