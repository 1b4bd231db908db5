"""The mock worker's stream registry: claims across connections, replays, checkpoints, state files."""

from __future__ import annotations

import json
import os

import pytest

from wallaroo_proto.protocols.wallaroo.registry import (
    STATE_FORMAT,
    STATE_VERSION,
    Registry,
    StateError,
    write_atomic,
)

A, B = "conn-a", "conn-b"


def test_new_stream_starts_at_the_connectors_point_of_reference() -> None:
    reg = Registry()
    claim = reg.notify(7, "alpha", A, 40)
    assert (claim.success, claim.point_of_ref) == (True, 40)
    # As in the shipped worker, a new stream's first message may have any id...
    assert not reg.is_replay(7, 3)
    reg.delivered(7, 41)
    # ...and after it, an id not above the last one seen is a replay.
    assert reg.is_replay(7, 41)
    assert reg.is_replay(7, 40)
    assert not reg.is_replay(7, 42)


def test_held_stream_is_refused_to_any_connection_until_released() -> None:
    reg = Registry()
    assert reg.notify(1, "s", A).success
    refused = reg.notify(1, "s", B)
    assert (refused.success, refused.holder) == (False, A)
    assert not reg.notify(1, "s", A).success  # held means held, by anyone
    assert not reg.release(1, B)  # only the holder releases
    assert reg.release(1, A)
    assert reg.notify(1, "s", B).success
    assert reg.streams[1].refused == 2


def test_release_all_frees_only_that_owners_streams() -> None:
    reg = Registry()
    reg.notify(1, "a", A)
    reg.notify(2, "b", A)
    reg.notify(3, "c", B)
    assert sorted(reg.release_all(A)) == [1, 2]
    assert reg.held_by(B) == [3]
    assert reg.held_by(A) == []


def test_replays_are_judged_across_connections() -> None:
    reg = Registry()
    reg.notify(5, "s", A)
    for mid in (0, 1, 2):
        assert not reg.is_replay(5, mid)
        reg.delivered(5, mid)
    reg.release_all(A)
    reg.notify(5, "s", B)  # another connection takes over: ids up to 2 are still seen
    assert reg.is_replay(5, 2)
    assert reg.is_replay(5, 0)
    assert not reg.is_replay(5, 3)


def test_checkpoint_reports_the_last_delivered_id_for_advanced_streams_only() -> None:
    reg = Registry()
    reg.notify(1, "a", A)
    reg.notify(2, "b", A)
    reg.delivered(1, 10)
    reg.delivered(1, 11)
    snap = reg.advanced()
    assert snap == {1: 11}
    # Before commit, a NOTIFY still gets the old (durable) point of reference.
    reg.release_all(A)
    assert reg.notify(1, "a", B).point_of_ref == 0
    reg.commit(snap)
    assert reg.streams[1].point_of_ref == 11
    assert reg.advanced() == {}  # nothing new since
    reg.delivered(2, 1)
    assert reg.advanced() == {2: 1}


def test_resume_point_differs_from_the_connectors_for_a_known_stream() -> None:
    reg = Registry()
    reg.notify(9, "s", A)
    reg.delivered(9, 4)
    reg.commit(reg.advanced())
    reg.release(9, A)
    assert reg.notify(9, "s", B, 1000).point_of_ref == 4


def test_state_round_trip(tmp_path) -> None:
    path = tmp_path / "state.json"
    reg = Registry.open(path)
    reg.notify(3, "three", A)
    reg.notify(2**64 - 2, "big", A)
    reg.delivered(3, 99)
    reg.delivered(2**64 - 2, 2**64 - 3)
    snap = reg.advanced()
    write_atomic(path, reg.state_bytes(snap))
    doc = json.loads(path.read_text())
    assert doc["format"] == STATE_FORMAT
    assert doc["streams"] == [
        {"stream_id": 3, "name": "three", "point_of_ref": 99},
        {"stream_id": 2**64 - 2, "name": "big", "point_of_ref": 2**64 - 3},
    ]
    again = Registry.open(path)
    assert again.streams[3].point_of_ref == 99
    assert again.streams[3].owner is None
    assert again.is_replay(3, 99) and not again.is_replay(3, 100)
    assert again.notify(3, "three", B, 0).point_of_ref == 99
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left behind


def test_save_replaces_atomically(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    write_atomic(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "something else"}', "not a mock-worker state file"),
        (json.dumps({"format": STATE_FORMAT, "version": 99, "streams": []}), "version 99"),
        # Version 1 stored the last id + 1: read as today's rule it would skip a message.
        (json.dumps({"format": STATE_FORMAT, "version": 1, "streams": []}), "version 1"),
        (
            json.dumps({"format": STATE_FORMAT, "version": STATE_VERSION, "streams": [{"stream_id": 1}]}),
            r"streams\[0\] lacks .name.",
        ),
        (
            json.dumps(
                {
                    "format": STATE_FORMAT,
                    "version": STATE_VERSION,
                    "streams": [{"stream_id": -1, "name": "x", "point_of_ref": 0}],
                }
            ),
            "bad stream_id",
        ),
    ],
)
def test_bad_state_files_are_named_and_explained(tmp_path, content, message) -> None:
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(StateError, match=message) as info:
        Registry.open(path)
    assert str(path) in str(info.value)


def test_missing_state_file_starts_empty(tmp_path) -> None:
    reg = Registry.open(tmp_path / "absent.json")
    assert reg.streams == {}
    assert reg.path == tmp_path / "absent.json"


def test_dirty_set_is_cleared_in_place() -> None:
    # The worker's hot loop keeps a reference to ``dirty`` across awaits; a checkpoint in between
    # must not leave it adding to a set nobody reads.
    reg = Registry()
    reg.notify(1, "a", A)
    held = reg.dirty
    reg.delivered(1, 1)
    assert reg.advanced() == {1: 1}
    held.add(1)
    reg.delivered(1, 2)
    assert reg.advanced() == {1: 2}


def test_sink_position_is_kept_in_the_same_atomic_state_file(tmp_path) -> None:
    path = tmp_path / "state.json"
    registry = Registry.open(path)
    position = {"offset": 320, "txn": "out:c_id=4", "next_cid": 5}
    write_atomic(path, registry.state_bytes({}, sink=position))
    assert Registry.open(path).sink == position


def test_a_bad_sink_position_is_a_state_error(tmp_path) -> None:
    path = tmp_path / "state.json"
    registry = Registry.open(path)
    write_atomic(path, registry.state_bytes({}, sink={"offset": "x", "txn": None, "next_cid": 1}))
    with pytest.raises(StateError, match="'sink' must hold offset, txn and next_cid"):
        Registry.open(path)
