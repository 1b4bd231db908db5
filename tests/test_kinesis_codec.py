"""Kinesis MLD lines: golden bytes hand-written from the protocol notes; the line splitter's properties."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.kinesis.codec import (
    CURRENT,
    V1,
    V2,
    Checkpoint,
    Fatal,
    Initialize,
    LeaseLost,
    LineSplitter,
    ProcessRecords,
    Record,
    ShardEnded,
    Shutdown,
    ShutdownRequested,
    Skipped,
    Status,
    decode_from_daemon,
    decode_from_processor,
    encode,
    encode_kclpy,
    message_dict,
    split_lines,
)

# ----------------------------------------------------------------------------- golden: the MLD's bytes

MLD_LINES = [
    (
        Initialize("shardId-000000000001", "TRIM_HORIZON", 0),
        b'{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON",'
        b'"subSequenceNumber":0}\n',
    ),
    (
        ProcessRecords([Record("a2l0dGVu", "some cats", "4959", 1700000000123, 0)], 0),
        b'{"action":"processRecords","records":[{"data":"a2l0dGVu","partitionKey":"some cats",'
        b'"sequenceNumber":"4959","approximateArrivalTimestamp":1700000000123,"subSequenceNumber":0,'
        b'"action":"record"}],"millisBehindLatest":0}\n',
    ),
    (LeaseLost(), b'{"action":"leaseLost"}\n'),
    (ShardEnded(), b'{"action":"shardEnded"}\n'),
    (ShutdownRequested(), b'{"action":"shutdownRequested"}\n'),
]


@pytest.mark.parametrize(("msg", "wire"), MLD_LINES)
def test_mld_requests_encode_to_the_mld_bytes_and_back(msg, wire):
    assert encode(msg) == wire
    assert decode_from_daemon(wire) == msg


def test_checkpoint_replies_carry_error_and_nulls():
    ok = Checkpoint("4955", 0, None)
    assert (
        encode(ok, reply=True)
        == b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":0,"error":null}\n'
    )
    refused = Checkpoint(None, None, "InvalidStateException")
    assert (
        encode(refused, reply=True)
        == b'{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,'
        b'"error":"InvalidStateException"}\n'
    )
    assert (
        decode_from_daemon(
            b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":0,"error":null}'
        )
        == ok
    )


def test_non_ascii_is_written_unescaped_as_utf8():
    wire = encode(Initialize("shardId-é", "TRIM_HORIZON", 0))
    assert b'"shardId":"shardId-\xc3\xa9"' in wire


def test_kclpy_lines_are_wrapped_in_blank_lines():
    assert encode_kclpy(Status("initialize")) == b'\n{"action": "status", "responseFor": "initialize"}\n'
    assert (
        encode_kclpy(Checkpoint("4955", 0))
        == b'\n{"action": "checkpoint", "sequenceNumber": "4955", "subSequenceNumber": 0}\n'
    )
    assert (
        encode_kclpy(Checkpoint(None, None))
        == b'\n{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}\n'
    )


def test_old_forms():
    assert encode(Initialize("shardId-1"), V1) == b'{"action":"initialize","shardId":"shardId-1"}\n'
    assert (
        encode(ProcessRecords([Record("eA==", "k", "12")]), V1) == b'{"action":"processRecords","records":'
        b'[{"data":"eA==","partitionKey":"k","sequenceNumber":"12"}]}\n'
    )
    assert encode(Shutdown("TERMINATE"), V2) == b'{"action":"shutdown","reason":"TERMINATE"}\n'
    assert (
        encode(Checkpoint("123", None, None), V1, reply=True)
        == b'{"action":"checkpoint","checkpoint":"123","error":null}\n'
    )
    assert encode_kclpy(Checkpoint("123"), V1) == b'\n{"action": "checkpoint", "checkpoint": "123"}\n'
    assert decode_from_daemon(b'{"action":"initialize","shardId":"shardId-1"}') == Initialize("shardId-1")
    assert decode_from_daemon(b'{"action":"shutdown","reason":"ZOMBIE"}') == Shutdown("ZOMBIE")
    assert decode_from_daemon(b'{"action":"checkpoint","checkpoint":"123","error":null}', V1) == Checkpoint(
        "123"
    )


# ------------------------------------------------------------ the processor's lines, as the MLD reads them


def test_processor_lines_the_mld_accepts():
    assert decode_from_processor(b'{"action": "status", "responseFor": "initialize"}') == (
        Status("initialize"),
        None,
    )
    assert decode_from_processor(b'  {"responseFor":"shardEnded","action":"status"}  ')[0] == Status(
        "shardEnded"
    )
    msg, note = decode_from_processor(b'{"action":"status","responseFor":"leaseLost"} junk')
    assert msg == Status("leaseLost") and "after the JSON object" in note
    # checkpoint alone means "at the latest"; a number and a digit string are coerced; error is accepted
    assert decode_from_processor(b'{"action":"checkpoint"}')[0] == Checkpoint(None, None)
    assert decode_from_processor(b'{"action":"checkpoint","sequenceNumber":4955,"subSequenceNumber":"3"}')[
        0
    ] == (Checkpoint("4955", 3))
    assert decode_from_processor(b'{"action":"checkpoint","sequenceNumber":"1","error":"x"}')[
        0
    ] == Checkpoint("1", None, "x")
    assert decode_from_processor(b"") is None


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"   ", "whitespace"),
        (b"hello from print()", "not JSON"),
        (b'{"action":"Status","responseFor":"initialize"}', "unknown action"),
        (b'{"responseFor":"initialize"}', "no 'action'"),
        (b'{"action":"record","data":""}', "unknown action"),
        (b'[{"action":"status"}]', "array"),
        (b'{"action":"status","responseFor":"x","extra":1}', "unknown field 'extra'"),
        (b'{"action":"checkpoint","checkpoint":"123"}', "V1 checkpoint form"),
        (b"null", "null"),
    ],
)
def test_processor_lines_the_mld_skips(line, why):
    with pytest.raises(Skipped, match=why):
        decode_from_processor(line)


def test_v1_checkpoint_form_is_read_in_the_v1_dialect():
    assert decode_from_processor(b'{"action":"checkpoint","checkpoint":"123"}', V1)[0] == Checkpoint("123")


# ------------------------------------------------------------ the daemon's lines, as kclpy reads them


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"", "blank line"),
        (b"not json", "not JSON"),
        (b'{"action":"initialize","shardId":"s"} x', "not JSON"),
        (b'{"shardId":"s"}', "no 'action'"),
        (b'{"action":"bogus"}', "unknown action"),
        (b'{"action":"initialize","shardId":"s","sequenceNumber":"1"}', "subSequenceNumber"),
        (b'{"action":"processRecords","records":[],"subSequenceNumber":0}', "millisBehindLatest"),
        (
            b'{"action":"processRecords","millisBehindLatest":0,"records":[{"data":"","partitionKey":"k",'
            b'"sequenceNumber":"1","approximateArrivalTimestamp":1,"subSequenceNumber":0}]}',
            "action",
        ),
        (
            b'{"action":"processRecords","millisBehindLatest":0,"records":[{"data":"","partitionKey":"k",'
            b'"sequenceNumber":"1","approximateArrivalTimestamp":null,"subSequenceNumber":0,"action":"record"}]}',
            "null",
        ),
        (b'{"action":"checkpoint","sequenceNumber":"1","error":null}', "subSequenceNumber"),
    ],
)
def test_daemon_lines_kclpy_cannot_survive(line, why):
    with pytest.raises(Fatal, match=why):
        decode_from_daemon(line, CURRENT)


def test_daemon_lines_may_carry_extra_keys():
    line = b'{"action":"initialize","shardId":"s","sequenceNumber":null,"subSequenceNumber":null,"x":1}'
    assert decode_from_daemon(line) == Initialize("s")


# ----------------------------------------------------------------------------- line splitting


def test_line_ends_as_readline_sees_them():
    lines = split_lines(b'a\nb\r\nc\rd\n\n{"x":1}')
    assert [(ln.number, ln.offset, ln.data) for ln in lines] == [
        (1, 0, b"a"),
        (2, 2, b"b"),
        (3, 5, b"c"),
        (4, 7, b"d"),
        (5, 9, b""),
        (6, 10, b'{"x":1}'),
    ]


def test_a_cr_at_a_chunk_end_waits_for_its_lf():
    splitter = LineSplitter()
    assert [ln.data for ln in splitter.feed(b"one\r")] == [b"one"]
    assert [ln.data for ln in splitter.feed(b"\ntwo\r")] == [b"two"]
    assert [ln.data for ln in splitter.feed(b"three\n")] == [b"three"]


def test_a_gap_drops_the_broken_line_and_resyncs_at_the_next_end():
    splitter = LineSplitter()
    assert [ln.data for ln in splitter.feed(b'{"a":1}\n{"b":')] == [b'{"a":1}']
    splitter.gap(10)
    lines = splitter.feed(b'tail of a line"}\n{"c":3}\n')
    assert [ln.data for ln in lines] == [b'{"c":3}']
    assert lines[0].offset == 13 + 10 + 17
    assert "10 bytes missing at offset 13" in lines[0].note and "resynced" in lines[0].note


def test_an_endless_line_is_bounded():
    splitter = LineSplitter(max_line=4)
    assert splitter.feed(b"abcdefgh") == []
    assert splitter.pending() == 4
    (cut, nxt) = splitter.feed(b"ij\nok\n")
    assert (cut.data, nxt.data, nxt.offset) == (b"abcd", b"ok", 11)
    assert "6 bytes dropped" in cut.note


def _reference(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    for match in re.finditer(rb"\r\n|\r|\n", data):
        out.append((pos, data[pos : match.start()]))
        pos = match.end()
    if pos < len(data):
        out.append((pos, data[pos:]))
    return out


_stream = st.lists(
    st.sampled_from([b"a", b"{}", b"\n", b"\r", b"\r\n", b" ", b'"x"', b"\xc3\xa9"]), max_size=60
).map(b"".join)


@settings(deadline=None)  # a loaded machine is no failure
@given(_stream, st.lists(st.integers(1, 7), max_size=30))
def test_any_chunking_gives_readlines_lines(data, cuts):
    splitter = LineSplitter()
    lines, pos = [], 0
    for size in cuts:
        lines += splitter.feed(data[pos : pos + size])
        pos += size
    lines += splitter.feed(data[pos:]) + splitter.end()
    assert [(ln.offset, ln.data) for ln in lines] == _reference(data)
    assert [ln.number for ln in lines] == list(range(1, len(lines) + 1))
    assert all(data[ln.offset : ln.offset + len(ln.data)] == ln.data for ln in lines)


@settings(deadline=None)  # a loaded machine is no failure
@given(_stream, st.integers(1, 50), _stream)
def test_after_a_gap_only_whole_lines_come_back_at_their_offsets(before, missing, after):
    splitter = LineSplitter()
    splitter.feed(before)
    splitter.gap(missing)
    lines = splitter.feed(after) + splitter.end()
    base = len(before) + missing
    first_end = re.search(rb"\r\n|\r|\n", after)
    expected = []
    if first_end is not None:
        expected = [(base + first_end.end() + off, d) for off, d in _reference(after[first_end.end() :])]
    assert [(ln.offset, ln.data) for ln in lines] == expected


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_seq = st.integers(0, 10**56).map(str)
_records = st.builds(Record, _text, _text, _seq, st.integers(0, 2**50), st.integers(0, 2**31))
_requests = st.one_of(
    st.builds(Initialize, _text, st.one_of(st.none(), _seq), st.one_of(st.none(), st.integers(0, 9))),
    st.builds(ProcessRecords, st.lists(_records, max_size=4), st.one_of(st.none(), st.integers(0, 10**9))),
    st.just(LeaseLost()),
    st.just(ShardEnded()),
    st.just(ShutdownRequested()),
)


@settings(deadline=None)  # a loaded machine is no failure
@given(_requests)
def test_every_request_the_daemon_encodes_reads_back(msg):
    wire = encode(msg)
    assert wire.endswith(b"\n") and wire.count(b"\n") == 1  # one line: newlines inside strings are escaped
    assert decode_from_daemon(wire[:-1]) == msg


@settings(deadline=None)  # a loaded machine is no failure
@given(
    st.one_of(
        st.builds(Status, _text), st.builds(Checkpoint, st.one_of(st.none(), _seq), st.none(), st.none())
    )
)
def test_every_processor_message_reads_back_through_its_lines(msg):
    lines = [ln for ln in split_lines(encode_kclpy(msg)) if ln.data]
    assert len(lines) == 1
    assert decode_from_processor(lines[0].data)[0] == msg


@settings(deadline=None)  # a loaded machine is no failure
@given(st.integers(0, 50), st.integers(0, 10**6), st.integers(1, 40), st.integers(0, 2**41))
def test_a_generated_batch_line_is_what_the_plain_json_encoder_writes(index, first, count, t0):
    from wallaroo_proto.protocols.kinesis.records import ShardRecords

    shard = ShardRecords(index, generated=first + count)
    shard.stamp(t0 + first + count)
    msg, line = shard.request(first, first + count)
    plain = json.dumps(
        message_dict(ProcessRecords(list(msg.records), msg.millis_behind_latest)), separators=(",", ":")
    )
    assert line == (plain + "\n").encode()
    assert decode_from_daemon(line) == msg


# ------------------------------------------------------------ any line: a message or the codec's error

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = ("shardId", "sequenceNumber", "subSequenceNumber", "records", "millisBehindLatest", "responseFor")
_shaped = st.builds(
    lambda action, fields: {"action": action, **fields},
    st.sampled_from(["initialize", "processRecords", "status", "checkpoint", "shutdown", "record", "x"]),
    st.dictionaries(st.sampled_from(_FIELDS), _json_values, max_size=4),
).map(lambda obj: json.dumps(obj).encode())
#: Python's reader has limits of its own: nesting past its recursion limit, over 4,300 digits.
_deep = st.builds(
    lambda n, opener, head: head + opener * n,
    st.integers(900, 100_000),
    st.sampled_from([b"[", b'{"a":', b'{"action":"processRecords","records":[']),
    st.sampled_from([b"", b'{"action":"status","responseFor":']),
)
_huge = st.builds(
    lambda digits, template: template.replace(b"N", b"1" * digits),
    st.integers(4_000, 6_000),
    st.sampled_from(
        [
            b'{"action":"checkpoint","sequenceNumber":N,"subSequenceNumber":0}',
            b'{"action":"checkpoint","sequenceNumber":"N","subSequenceNumber":"N"}',
            b'{"action":"initialize","shardId":"s","sequenceNumber":"N","subSequenceNumber":N}',
            b'{"action":"processRecords","records":[],"millisBehindLatest":N}',
        ]
    ),
)
_any_line = st.one_of(st.binary(max_size=64), _shaped, _deep, _huge)


@settings(deadline=None, max_examples=300)  # a loaded machine is no failure
@given(_any_line)
def test_any_line_is_a_message_or_the_codecs_error_with_a_reason(line):
    for dialect in (CURRENT, V1):
        try:
            decoded = decode_from_processor(line, dialect)
        except Skipped as err:
            assert str(err)
        else:
            assert decoded is None or isinstance(decoded[0], tuple)
        try:
            decode_from_daemon(line, dialect)
        except Fatal as err:
            assert str(err)


@settings(deadline=None, max_examples=200)  # a loaded machine is no failure
@given(st.lists(st.tuples(st.booleans(), _any_line), max_size=6))
def test_a_conversation_judges_any_lines_with_a_verdict(lines):
    from wallaroo_proto.protocols.kinesis.core import DAEMON, PROCESSOR, Conversation

    conv = Conversation()
    head = [(True, MLD_LINES[0][1][:-1]), (True, MLD_LINES[1][1][:-1])]
    for from_daemon, line in head + lines:
        verdict = conv.feed(DAEMON if from_daemon else PROCESSOR, line)
        assert verdict.kind is not None


def test_lines_pythons_reader_cannot_take_are_the_codecs_error():
    deep = b"[" * 100_000
    with pytest.raises(Fatal, match="nested too deeply"):
        decode_from_daemon(deep)
    with pytest.raises(Skipped, match="nested too deeply"):
        decode_from_processor(deep)
    long_number = b'{"action":"checkpoint","sequenceNumber":' + b"1" * 5000 + b',"subSequenceNumber":0}'
    with pytest.raises(Skipped, match="a number too long"):
        decode_from_processor(long_number)
    with pytest.raises(Fatal, match="a number too long"):
        decode_from_daemon(long_number)
    as_text = b'{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":"' + b"1" * 5000 + b'"}'
    with pytest.raises(Skipped, match="a Java long"):
        decode_from_processor(as_text)
