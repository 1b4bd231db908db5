"""Message sources for mock-source: files, stdin, generated data, stream ids, rate limiting."""

from __future__ import annotations

import hashlib
import io
import struct
import time
from pathlib import Path

import pytest

from wallaroo_proto.protocols.wallaroo.frames import Message
from wallaroo_proto.protocols.wallaroo.inputs import (
    InputError,
    RateLimiter,
    build_inputs,
    file_input,
    generated_inputs,
    stdin_input,
    stream_id_for,
)

MAX = 4 * 1024 * 1024


def drain(reader, limit: int = 1000, wait: float = 5.0) -> list[Message]:
    """Everything a reader yields until its end (polling, as the event loop does)."""
    out: list[Message] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        batch = reader.read(limit)
        if batch is None:
            return out
        out.extend(batch)
        if not batch:
            time.sleep(0.005)
    raise AssertionError("reader never ended")


def test_stream_id_is_a_stable_64_bit_hash_of_the_name():
    # blake2b, 8-byte digest, big endian: the same on every host and run.
    assert stream_id_for("stream-0") == 6318646386196972352
    assert stream_id_for("stream-0") == int.from_bytes(
        hashlib.blake2b(b"stream-0", digest_size=8).digest(), "big"
    )
    assert stream_id_for(b"stream-0") == stream_id_for("stream-0")
    assert stream_id_for("stream-1") != stream_id_for("stream-0")
    assert 0 <= stream_id_for("x" * 1000) < 2**64


def test_lines_file_one_message_per_line(tmp_path: Path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"alpha\nbeta\r\n\nlast")
    spec = file_input(str(path), key="k-{n}", max_frame_size=MAX)
    assert spec.name == str(path) and spec.stream_id == stream_id_for(str(path)) and spec.rewindable
    messages = drain(spec.open(0))
    assert [m.payload for m in messages] == [b"alpha", b"beta", b"", b"last"]
    assert [m.message_id for m in messages] == [1, 2, 3, 4]
    assert [m.key for m in messages] == [b"k-1", b"k-2", b"k-3", b"k-4"]
    assert {m.stream_id for m in messages} == {spec.stream_id}
    # open(start) reads the ids from start on: a resume above a point of reference P opens at P + 1.
    assert [m.payload for m in drain(spec.open(3))] == [b"", b"last"]


def test_length_prefixed_records(tmp_path: Path):
    path = tmp_path / "in.bin"
    path.write_bytes(b"\x00\x00\x00\x03abc" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x02\n\x00")
    spec = file_input(str(path), framing="length-prefixed", name="bin", stream_id=9, max_frame_size=MAX)
    messages = drain(spec.open(0))
    assert [(m.stream_id, m.message_id, m.payload, m.key) for m in messages] == [
        (9, 1, b"abc", b""),
        (9, 2, b"", b""),
        (9, 3, b"\n\x00", b""),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00\x00\x01a\x00\x00", "record #2 at byte offset 5: truncated length prefix (2 of 4 bytes)"),
        (
            b"\x00\x00\x00\x01a\x00\x00\x00\x05ab",
            "record #2 at byte offset 5: 5 bytes announced, only 2 left",
        ),
        (struct.pack(">I", 5000), "record #1 at byte offset 0 is 5000 bytes"),
    ],
)
def test_bad_length_prefixed_records_say_where(tmp_path: Path, data: bytes, message: str):
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    reader = file_input(str(path), framing="length-prefixed", max_frame_size=1024).open(0)
    with pytest.raises(InputError) as err:
        drain(reader)
    assert message in str(err.value) and str(path) in str(err.value)


def test_line_longer_than_a_frame_is_refused(tmp_path: Path):
    path = tmp_path / "long.txt"
    path.write_bytes(b"short\n" + b"x" * 2000 + b"\n")
    reader = file_input(str(path), max_frame_size=1024).open(0)
    with pytest.raises(InputError, match="message #2 is 2000 bytes"):
        drain(reader)


def test_missing_file_fails_before_connecting(tmp_path: Path):
    with pytest.raises(InputError, match="cannot read input file"):
        file_input(str(tmp_path / "nope.txt"), max_frame_size=MAX)


def test_generated_data_is_deterministic_and_resumable():
    specs = generated_inputs(streams=2, count=5, payload_size=12, key="{stream}/{n}")
    assert [s.name for s in specs] == ["stream-0", "stream-1"]
    assert [s.stream_id for s in specs] == [stream_id_for("stream-0"), stream_id_for("stream-1")]
    assert specs[0].total == 5
    reader = specs[1].open(0)
    first = reader.read(2)
    assert [(m.message_id, m.key, m.payload) for m in first] == [
        (1, b"stream-1/1", b"stream-1:1:."),
        (2, b"stream-1/2", b"stream-1:2:."),
    ]
    assert [m.message_id for m in reader.read(100)] == [3, 4, 5]
    assert reader.read(100) is None
    assert [m.message_id for m in drain(specs[0].open(4))] == [4, 5]
    assert drain(specs[0].open(6)) == []
    # A payload smaller than its label is cut, never longer than asked.
    assert drain(generated_inputs(streams=1, count=1, payload_size=3)[0].open(0))[0].payload == b"str"


def test_generated_payloads_across_a_change_of_width_and_a_percent_in_the_name():
    """Payloads are built one template per run of numbers of one width: 9 to 10, 99 to 100."""
    spec = generated_inputs(streams=1, count=101, payload_size=8, names=["%d"], ids=[1])[0]
    got = {m.message_id: m.payload for m in drain(spec.open(8))}
    assert (got[9], got[10], got[99], got[100], got[101]) == (
        b"%d:9:...",
        b"%d:10:..",
        b"%d:99:..",
        b"%d:100:.",
        b"%d:101:.",
    )
    cut = generated_inputs(streams=1, count=1000, payload_size=6, names=["ab"], ids=[1])[0]
    assert [m.payload for m in drain(cut.open(999))] == [b"ab:999", b"ab:100"]


def test_explicit_names_and_ids():
    specs = generated_inputs(streams=2, count=1, payload_size=1, names=["a", "b"], ids=[1, 2])
    assert [(s.name, s.stream_id) for s in specs] == [("a", 1), ("b", 2)]
    with pytest.raises(InputError, match="1 stream ids given for 2 streams"):
        generated_inputs(streams=2, count=1, payload_size=1, ids=[1])
    with pytest.raises(InputError, match="stream ids must be unique"):
        generated_inputs(streams=2, count=1, payload_size=1, ids=[3, 3])
    with pytest.raises(InputError, match="not a u64"):
        generated_inputs(streams=1, count=1, payload_size=1, ids=[2**64])


def test_stdin_is_read_by_a_thread_and_cannot_be_reread():
    spec = stdin_input(stream=io.BytesIO(b"one\ntwo\n"), max_frame_size=MAX)
    assert spec.name == "stdin" and spec.stream_id == stream_id_for("stdin") and not spec.rewindable
    reader = spec.open(0)
    assert [m.payload for m in drain(reader)] == [b"one", b"two"]
    with pytest.raises(InputError, match="stdin cannot be read a second time"):
        spec.open(0)


def test_stdin_resume_skips_what_the_worker_has():
    spec = stdin_input(
        stream=io.BytesIO(b"\x00\x00\x00\x01a\x00\x00\x00\x01b"),
        framing="length-prefixed",
        max_frame_size=MAX,
    )
    assert [(m.message_id, m.payload) for m in drain(spec.open(2))] == [(2, b"b")]


def test_stdin_bad_record_is_reported():
    spec = stdin_input(
        stream=io.BytesIO(b"\x00\x00\x00\x09ab"), framing="length-prefixed", max_frame_size=MAX
    )
    with pytest.raises(InputError, match="9 bytes announced, only 2 left"):
        drain(spec.open(0))


def test_build_inputs_checks_the_command_line(tmp_path: Path):
    path = tmp_path / "f.txt"
    path.write_text("x\n")
    with pytest.raises(InputError, match="not both"):
        build_inputs(
            files=[str(path)],
            framing="lines",
            streams=2,
            count=None,
            payload_size=1,
            key=None,
            names=None,
            ids=None,
            max_frame_size=MAX,
        )
    with pytest.raises(InputError, match="only once"):
        build_inputs(
            files=["-", "-"],
            framing="lines",
            streams=None,
            count=None,
            payload_size=1,
            key=None,
            names=None,
            ids=None,
            max_frame_size=MAX,
        )
    with pytest.raises(InputError, match="does not fit"):
        build_inputs(
            files=[],
            framing="lines",
            streams=None,
            count=None,
            payload_size=100,
            key=None,
            names=None,
            ids=None,
            max_frame_size=64,
        )
    specs = build_inputs(
        files=[str(path)],
        framing="lines",
        streams=None,
        count=None,
        payload_size=1,
        key=None,
        names=["named"],
        ids=None,
        max_frame_size=MAX,
    )
    assert specs[0].name == "named" and specs[0].stream_id == stream_id_for("named")
    default = build_inputs(
        files=[],
        framing="lines",
        streams=None,
        count=None,
        payload_size=8,
        key=None,
        names=None,
        ids=None,
        max_frame_size=MAX,
    )
    assert len(default) == 1 and default[0].total == 100


def test_rate_limiter_is_a_token_bucket():
    now = [100.0]
    limiter = RateLimiter(100, clock=lambda: now[0])
    assert limiter.allow(50) == 10  # a burst of a tenth of a second
    assert limiter.allow(50) == 0
    assert limiter.wait_time() == pytest.approx(0.01)
    now[0] += 0.05
    assert limiter.allow(50) == 5
    now[0] += 10
    assert limiter.allow(50) == 10  # the bucket does not grow past the burst
    assert RateLimiter(None).allow(123) == 123
    with pytest.raises(InputError):
        RateLimiter(0)
