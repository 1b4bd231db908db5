"""The mock consumer on whatever a producer answers: a summary or a named problem, never a traceback.

A scripted link stands in for the socket: it answers each request the consumer
writes the way a producer would (HELLO, DCP_OPEN, controls, the high seqnos, one
stream of two items ended ok), except for the one answer a case replaces with
arbitrary bytes. Whatever those bytes are, ``run`` gives a summary; when they
are no valid answer the summary says the run failed.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.judge import Kind
from wallaroo_proto.protocols.dcp import codec
from wallaroo_proto.protocols.dcp import consumer as consumer_module
from wallaroo_proto.protocols.dcp.consumer import ConsumerConfig, MockConsumer
from wallaroo_proto.protocols.dcp.core import CONSUMER, PRODUCER, Connection

UUID = 0xABCD


def good_answer(p: codec.Packet) -> bytes:
    """What a well-behaved producer with one vbucket of two items says to request ``p``."""
    if p.opcode == codec.GET_ALL_VB_SEQNOS:
        return codec.response(p.opcode, opaque=p.opaque, value=codec.vb_seqnos_value([(0, 2)]))
    if p.opcode == codec.STREAM_REQ:
        return b"".join(
            (
                codec.response(p.opcode, opaque=p.opaque, value=codec.failover_log_value([(UUID, 0)])),
                codec.snapshot_marker(0, p.opaque, 1, 2, codec.SNAP_MEMORY),
                codec.mutation(0, p.opaque, 1, 1, b"a", b"1"),
                codec.mutation(0, p.opaque, 2, 1, b"b", b"2"),
                codec.stream_end(0, p.opaque, codec.END_OK),
            )
        )
    if p.is_request and p.opcode in (codec.HELLO, codec.OPEN, codec.CONTROL):
        return codec.response(p.opcode, opaque=p.opaque)
    return b""  # noop replies, buffer acks


class ScriptedLink:
    """A ``Link`` whose peer answers every request at once; the end of the stream once it has no more."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.inbox = bytearray()
        self.transport = self

    def write(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            p = codec.decode_packet(data, pos)
            self.inbox += self.answer(p)
            pos += p.size

    async def read(self, timeout: float | None = None) -> bytes:
        data, self.inbox = bytes(self.inbox), bytearray()
        return data

    async def drain(self, timeout: float | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass


def run_against(answer, monkeypatch, **config) -> dict:
    async def open_link(cls, host: str, port: int) -> ScriptedLink:
        return ScriptedLink(answer)

    monkeypatch.setattr(consumer_module.Link, "open", classmethod(open_link))
    consumer = MockConsumer(ConsumerConfig(noop_interval=1.0, user=None, **config), lambda line: None)
    return asyncio.run(consumer.run())


def test_the_scripted_producer_gives_a_clean_run(monkeypatch):
    summary = run_against(good_answer, monkeypatch)
    assert summary["ok"], summary
    assert summary["items_received"] == 2 and summary["stream_ends"] == {"ok": 1}


@pytest.mark.parametrize(
    "opcode, status, value, reason",
    [
        # a 5-byte high-seqno list: half an entry of a vbucket id (u16) and a seqno (u64)
        (codec.GET_ALL_VB_SEQNOS, codec.SUCCESS, b"\x00\x00\x00\x00\x05", "5 bytes is no multiple of 10"),
        # a 3-byte failover log: entries are 16 bytes, a vbucket uuid and a seqno
        (codec.STREAM_REQ, codec.SUCCESS, b"abc", "failover log of 3 bytes is no multiple of 16"),
        # a ROLLBACK without its 8-byte seqno
        (codec.STREAM_REQ, codec.ROLLBACK, b"\x00\x01", "must be the 8-byte seqno"),
    ],
)
@pytest.mark.parametrize("keep_going", [False, True])
def test_a_short_answer_is_a_violation_and_the_run_fails(
    monkeypatch, opcode, status, value, reason, keep_going
):
    def answer(p: codec.Packet) -> bytes:
        if p.opcode == opcode:
            return codec.response(opcode, status, opaque=p.opaque, value=value)
        return good_answer(p)

    summary = run_against(answer, monkeypatch, keep_going=keep_going)
    assert not summary["ok"]
    assert summary["violations"] >= 1 and reason in summary["violation_list"][0]
    assert summary["failures"]


REPLIED = [codec.HELLO, codec.OPEN, codec.CONTROL, codec.GET_ALL_VB_SEQNOS, codec.STREAM_REQ]


@settings(max_examples=300, deadline=None)
@given(
    opcode=st.sampled_from(REPLIED),
    status=st.one_of(
        st.sampled_from([codec.SUCCESS, codec.ROLLBACK, codec.NOT_MY_VBUCKET, codec.EINVAL]),
        st.integers(0, 0xFFFF),
    ),
    extras=st.binary(max_size=20),
    key=st.binary(max_size=8),
    value=st.one_of(st.binary(max_size=40), st.binary(min_size=16, max_size=16)),
    keep_going=st.booleans(),
)
def test_any_answer_gives_a_summary(opcode, status, extras, key, value, keep_going):
    """Arbitrary bodies for each answer the consumer reads: a value it uses or a named problem."""

    wire = codec.response(opcode, status, extras=extras, key=key, value=value)
    try:
        codec.parse_response(codec.decode_packet(wire), 0, opcode)
        malformed = False
    except codec.ProtocolError:
        malformed = True

    def answer(p: codec.Packet) -> bytes:
        if p.opcode == opcode:
            return codec.response(opcode, status, opaque=p.opaque, extras=extras, key=key, value=value)
        return good_answer(p)

    with pytest.MonkeyPatch.context() as monkeypatch:
        summary = run_against(answer, monkeypatch, keep_going=keep_going, stream_retries=2)
    if malformed:
        assert not summary["ok"] and summary["violations"] >= 1, summary


@settings(max_examples=500, deadline=None)
@given(
    opcode=st.sampled_from(REPLIED),
    status=st.integers(0, 0xFFFF),
    extras=st.binary(max_size=20),
    key=st.binary(max_size=8),
    value=st.binary(max_size=60),
)
def test_the_core_reads_any_answer_to_a_value_or_a_named_problem(opcode, status, extras, key, value):
    """Each answer the consumer reads, parsed by the request it answers: a Response or a ProtocolError."""
    wire = codec.response(opcode, status, opaque=7, extras=extras, key=key, value=value)
    try:
        msg = codec.parse_response(codec.decode_packet(wire), 0, opcode)
    except codec.ProtocolError as err:
        assert 0 <= err.offset <= len(wire)
    else:
        assert isinstance(msg, codec.Response) and msg.status == status
    conn = Connection()
    requests = {
        codec.HELLO: codec.request(codec.HELLO, opaque=7, key=b"c"),
        codec.OPEN: codec.open_request("c", codec.OPEN_PRODUCER, 7),
        codec.CONTROL: codec.control_request("enable_noop", "true", 7),
        codec.GET_ALL_VB_SEQNOS: codec.request(codec.GET_ALL_VB_SEQNOS, opaque=7),
        codec.STREAM_REQ: codec.stream_req_request(0, 7, codec.StreamReq(0, 0, 10, 0, 0, 0)),
    }
    conn.feed(CONSUMER, codec.decode_packet(codec.open_request("c", codec.OPEN_PRODUCER, 6)))
    conn.feed(CONSUMER, codec.decode_packet(requests[opcode]))
    verdict = conn.feed(PRODUCER, codec.decode_packet(wire))
    assert (verdict.kind is Kind.MALFORMED) is (verdict.message is None)
