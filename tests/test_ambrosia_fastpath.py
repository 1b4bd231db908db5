"""The one-pass paths (a record's plain and batched RPCs, a batch of self calls) agree with the
general path.

Random records, valid and not, go through two mock LBs, one forced onto the
general path: verdicts, counters, the immortal's state and the self calls
it sends must be the same. The IC's one-pass reading of self-call batches is
held against decoding each RPC and encoding it again.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wallaroo_proto.protocols.ambrosia.codec import (
    ASYNC,
    COUNT_REPLAYABLE_RPC_BATCH,
    FORK,
    IMPULSE,
    INITIAL_MESSAGE,
    PING,
    RPC,
    RPC_BATCH,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    Header,
    Message,
    RecordFrame,
    batch_messages,
    check_bytes,
    control_record,
    decode_rpc,
    encode_batch,
    encode_incoming_rpc,
    encode_message,
    encode_outgoing_rpc,
    read_header,
    read_message,
    record_messages,
    scan_batched_rpcs,
    scan_rpcs,
    scan_self_calls,
    zz32,
)
from wallaroo_proto.protocols.ambrosia.core import IC, LB, Phase, Session
from wallaroo_proto.protocols.ambrosia.immortal import ADD, BONUS, Counter, RpcSource, bonus_call
from wallaroo_proto.protocols.ambrosia.lb import LbConfig, MockLB

C = 7
_args = st.one_of(
    st.integers(-50, 10_000).map(lambda n: b"%d" % n),
    st.binary(max_size=70),
    st.sampled_from([b"", b" 15 ", b"1_0", b"+5", b"-0", b"\xff"]),
    st.integers(-50, 10**20).map(lambda n: b'{"value":%d}' % n),  # mock-ic's form, and too long
    st.sampled_from(  # near it: each read by the JSON parser, or by its length
        [b'{"value":007}', b'{"value": 5}', b'{"value":1_0}', b'{"value":5', b'{"value":"5"}']
        + [b'{"value":5.0}', b'{"value":1e3}', b'{"value":5}\n{"value":6}', b'{"value":0}', b"{}"]
    ),
)
_method = st.one_of(st.sampled_from([ADD, BONUS]), st.integers(0, 63), st.integers(-3, 200))
#: One message of a record body: mostly plain RPCs, sometimes anything else a body can hold.
_plain_rpc = st.builds(
    encode_incoming_rpc, _method, st.sampled_from([ASYNC, FORK, IMPULSE]), _args, st.integers(0, 255)
)


@st.composite
def _batch(draw) -> bytes:
    """An RPCBatch or CountReplayableRPCBatch of RPCs (mostly plain ones), its counts mostly right:
    one- and two-byte sizes, Impulses anywhere, now and then a count, a size or an RPC that is off."""
    rpcs = draw(st.lists(_plain_rpc if draw(st.integers(0, 9)) else _message_in_batch, max_size=9))
    count = len(rpcs) + draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1, -1]))
    if draw(st.booleans()):
        data = zz32(count) + b"".join(rpcs)
        kind = RPC_BATCH
    else:
        replayable = sum(1 for r in rpcs if len(r) > 4 and r[1] == RPC and r[4] != IMPULSE)
        replayable += draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1]))
        data = zz32(count) + zz32(replayable) + b"".join(rpcs)
        kind = COUNT_REPLAYABLE_RPC_BATCH
    message = encode_message(kind, data)
    if draw(st.integers(0, 9)) == 0:  # a size one off: the batch overruns or leaves bytes behind
        size = 2 * (len(data) + 1) + draw(st.sampled_from([2, -2]))
        message = (bytes((size,)) if size < 0x80 else bytes((size & 0x7F | 0x80, size >> 7))) + message[
            1 if len(data) + 1 < 64 else 2 :
        ]
    return message


#: What the batched scan takes: short RPCs, and good batches of them.
_short_rpc = st.builds(
    encode_incoming_rpc,
    st.integers(0, 63),
    st.sampled_from([ASYNC, FORK, IMPULSE]),
    st.one_of(_args, st.binary(max_size=59)).filter(lambda a: len(a) < 60),
    st.integers(0, 255),
)
_good_batch = st.lists(_short_rpc, min_size=1, max_size=12).flatmap(
    lambda rpcs: st.sampled_from(
        [encode_batch(rpcs), encode_batch(rpcs, replayable=sum(r[4] != IMPULSE for r in rpcs))]
    )
)


@st.composite
def _miscounted_batch(draw) -> bytes:
    """A batch of short RPCs whose count or replayable count is off, all else right."""
    rpcs = draw(st.lists(_short_rpc, min_size=1, max_size=12))
    replayable = sum(r[4] != IMPULSE for r in rpcs)
    if draw(st.booleans()):
        return encode_batch(rpcs, replayable=replayable + draw(st.sampled_from([-1, 1])))
    count = len(rpcs) + draw(st.sampled_from([-1, 1]))
    return encode_message(RPC_BATCH, zz32(count) + b"".join(rpcs))


@st.composite
def _lying_batch(draw) -> bytes:
    """A batch head whose count and size claim the RPCs that follow it as its own, with the head
    of another batch among them (not counted in its size): the general path finds that batch
    inside this one."""
    inner = draw(st.lists(_short_rpc, min_size=1, max_size=4))
    after = draw(st.lists(_short_rpc, max_size=3))
    nested = encode_batch(inner)
    rpcs = [*draw(st.lists(_short_rpc, max_size=3)), nested, *after]
    count = len(rpcs) - 1 + len(inner)
    size = 2 + sum(map(len, rpcs)) - (len(nested) - sum(map(len, inner)))  # the nested head left out
    return zz32(size) + bytes((RPC_BATCH,)) + zz32(count) + b"".join(rpcs)


_message_in_batch = st.one_of(
    st.builds(encode_incoming_rpc, _method, st.integers(3, 255), _args),
    st.builds(encode_message, st.sampled_from([INITIAL_MESSAGE, PING, 99]), st.binary(max_size=8)),
    st.builds(lambda a: encode_batch([encode_incoming_rpc(ADD, FORK, a)]), _args),
)
_message = st.one_of(
    _plain_rpc,
    _batch(),
    st.builds(encode_incoming_rpc, _method, st.integers(3, 255), _args),  # an unknown RPC type
    st.builds(lambda a: encode_batch([encode_incoming_rpc(ADD, FORK, a)]), _args),
    st.builds(
        encode_message, st.sampled_from([INITIAL_MESSAGE, PING, TAKE_CHECKPOINT, 99]), st.binary(max_size=8)
    ),
    st.builds(lambda a: zz32(len(a) + 9) + bytes((RPC,)) + a, st.binary(max_size=6)),  # a size that overruns
    st.binary(min_size=1, max_size=6),
)


@st.composite
def _records(draw) -> list[tuple[int, int, bytes, bool]]:
    """(committer, sequence id, body, right check bytes) for a run of normal records."""
    out = []
    seq = 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from([_plain_rpc, _message, st.one_of(_short_rpc, _good_batch)]))
        body = b"".join(draw(st.lists(kind, max_size=12)))
        seq += draw(st.sampled_from([1, 1, 1, 1, 2, 0, -5]))
        committer = draw(st.sampled_from([C, C, C, C + 1]))
        out.append((committer, seq, body, draw(st.sampled_from([True, True, True, False]))))
    return out


def _shared(verdict) -> tuple:
    """A verdict's fields but its messages (the fast path gives its RPCs as lists instead)."""
    return (verdict.kind, verdict.side, verdict.rule, verdict.reason, verdict.violations, verdict.note)


def _judged(session: Session) -> dict:
    """A session's state, without the fast path's hint of which scanner to try first."""
    return {k: v for k, v in vars(session).items() if k != "_batches_seen"}


class _Wire:
    """Stands in for the LB's writer: what it would send."""

    def __init__(self) -> None:
        self.sent = bytearray()

    def write(self, data: bytes) -> None:
        self.sent += data


def _lb(general: bool) -> MockLB:
    lb = MockLB(LbConfig())
    lb.writer = _Wire()
    if general:
        session = lb.session
        session.from_ic_rpcs = lambda header, body: (session.feed(IC, (header, body)), None)
    return lb


def _frame(committer: int, seq: int, body: bytes, good_check: bool) -> RecordFrame:
    check = check_bytes(body, seq) ^ (0 if good_check else 1)
    return RecordFrame(0, Header(committer, 24 + len(body), check, seq), body)


@settings(max_examples=300, deadline=None)
@given(_records(), st.booleans())
def test_lb_fast_and_general_paths_agree(records, opened) -> None:
    fast, general = _lb(False), _lb(True)
    frames = []
    if opened:  # a first start, answered: normal records come next
        start = control_record(C, TAKE_BECOMING_PRIMARY_CHECKPOINT)
        frames.append(RecordFrame(0, read_header(start), start[24:]))
    frames += [_frame(*record) for record in records]
    for frame in frames:
        fast._record(frame)
        general._record(frame)
    for lb in (fast, general):
        lb._flush_self_calls()
    assert fast.stats == general.stats
    assert fast.counter.state() == general.counter.state()
    assert bytes(fast.writer.sent) == bytes(general.writer.sent)
    del general.session.from_ic_rpcs
    assert _judged(fast.session) == _judged(general.session)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_method, st.sampled_from([ASYNC, FORK, IMPULSE]), _args), max_size=30), _records())
def test_session_fast_path_verdicts_and_rpcs(rpcs, records) -> None:
    """Plain RPC bodies take the fast path; every body gets the general path's verdict."""
    plain = b"".join(encode_incoming_rpc(m, t, a) for m, t, a in rpcs)
    one_byte = all(0 <= m < 64 and len(a) < 60 for m, _, a in rpcs)
    scanned = scan_rpcs(plain)
    assert (scanned is not None) == one_byte
    if scanned is not None:
        assert list(scanned[0]) == [m for m, _, _ in rpcs]
        assert scanned[1] == [a for _, _, a in rpcs]
    fast, general = Session(), Session()
    for committer, seq, body, good in [(C, 0, plain, True), *records]:
        frame = _frame(committer, seq, body, good)
        verdict, _ = fast.from_ic_rpcs(frame.header, body)
        want = general.feed(IC, (frame.header, body))
        assert _shared(verdict) == _shared(want)
    assert _judged(fast) == _judged(general)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.lists(st.one_of(_short_rpc, _good_batch), max_size=12),
        st.lists(st.one_of(_short_rpc, _good_batch, _miscounted_batch(), _lying_batch()), max_size=6),
        st.lists(st.one_of(_short_rpc, _good_batch, _good_batch, _batch(), _message), max_size=12),
    )
)
@example([encode_batch([encode_incoming_rpc(ADD, FORK, b"5")] * 2), encode_incoming_rpc(ADD, FORK, b"6")])
@example([encode_batch([encode_incoming_rpc(ADD, IMPULSE, b'{"value":%d}' % n) for n in range(7)], 0)])
def test_batched_scan_is_the_general_reading(messages) -> None:
    """A body the batched scan takes is one the general path finds nothing wrong in, with the same
    RPCs in order; a body of plain RPCs and well-formed batches of them is always taken."""
    body = b"".join(messages)
    scanned = scan_batched_rpcs(body)
    session = Session()
    session.phase = Phase.NORMAL  # past the start and its checkpoint: only the body is judged
    verdict = session.feed(IC, (Header(C, 24 + len(body), check_bytes(body, 0), 0), body))
    if scanned is None:
        if verdict.ok:
            flat = [m for m in _flatten(body) if m is not None]
            well_formed = all(_short(m) for m in flat) and _batches_of_short_rpcs(body)
            assert not well_formed, "a body of short RPCs and good batches of them fell to the general path"
        return
    assert verdict.ok, verdict.violations
    rpcs = _flatten(body)
    assert scanned == (bytes(decode_rpc(r, False).method_id for r in rpcs), [r[3:] for r in rpcs])
    if scan_rpcs(body) is not None:
        assert scan_rpcs(body) == scanned


def _flatten(body: bytes) -> list[bytes | None]:
    """Every RPC's data in a body, in order, batches opened (None for any other message)."""
    out: list[bytes | None] = []
    for message in record_messages(body):
        if message.type in (RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH):
            out += [m.data if m.type == RPC else None for m in batch_messages(message)[2]]
        else:
            out.append(message.data if message.type == RPC else None)
    return out


def _short(data: bytes) -> bool:
    """An RPC's data in the short form the scans take: one-byte size, method id 0 to 63, type 0 to 2."""
    return len(data) < 63 and len(data) >= 3 and data[1] < 0x80 and not data[1] & 1 and data[2] <= IMPULSE


def _batches_of_short_rpcs(body: bytes) -> bool:
    """Every message a short RPC, or a batch of them with at least one and one-byte counts,
    its size in one or two bytes (the forms the batched scan takes)."""
    pos = 0
    for message in record_messages(body):
        size_bytes = 1 if body[pos] < 0x80 else 2
        if message.type in (RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH):
            count, replayable, inner = batch_messages(message)
            if size_bytes == 2 and body[pos + 1] == 0 or not 0 < count < 64 or (replayable or 0) >= 64:
                return False
            if not all(m.type == RPC and _short(m.data) for m in inner):
                return False
        elif message.type != RPC or size_bytes != 1:
            return False
        pos += size_bytes + 1 + len(message.data)
    return True


def test_the_generated_mixed_bodies_take_the_batched_scan() -> None:
    for arg_form in ("raw", "json"):
        source = RpcSource(3000, arg_form=arg_form, batching="mixed")
        for first in range(0, 3000, 100):
            body = source.body(first, first + 100)
            assert scan_batched_rpcs(body) is not None
            assert scan_batched_rpcs(body)[1] == [source.args(i) for i in range(first, first + 100)]
            session = Session()
            session.phase = Phase.NORMAL
            session.last_seq = first - 1
            _, rpcs = session.from_ic_rpcs(Header(C, 24 + len(body), check_bytes(body, first), first), body)
            assert rpcs is not None  # the LB's one pass, not a message object an RPC


def test_generated_mixed_bodies_are_built_once_a_shape_and_the_same() -> None:
    """mock-ic's mixed bodies, built once for each place in the args' and the runs' periods, are the
    bodies built afresh, across those periods."""
    cached = RpcSource(50_000, batching="mixed")
    for first, last in ((0, 100), (21_000, 21_100), (990, 1013), (20_950, 21_077), (42_000, 42_001)):
        cached.body(first, last)  # fill the cache at the shape's first sight
        assert cached.body(first, last) == RpcSource(50_000, batching="mixed")._mixed(first, last)
    lines = RpcSource(lines=[b"%d" % n for n in range(300)], batching="mixed")
    assert lines.body(0, 300) == RpcSource(lines=[b"%d" % n for n in range(300)], batching="mixed")._mixed(
        0, 300
    )
    assert not lines._bodies  # bodies of given lines are never kept
    large = RpcSource(10**7, batching="mixed")  # shapes of 10,000 RPCs that do not come back soon
    for first in range(0, 600_000, 9_973):
        large.body(first, first + 10_000)
        assert large._kept <= 8 << 20 and large._kept == sum(map(len, large._bodies.values()))
    assert large.body(9_973, 19_973) == RpcSource(10**7, batching="mixed")._mixed(9_973, 19_973)


@settings(max_examples=300, deadline=None)
@given(st.lists(_method, max_size=40), st.lists(_args, max_size=40))
@example([ADD, ADD], [b"5", b"x" * 60])  # a self call too long for the one-byte size form
def test_apply_many_is_apply_in_order(methods, args) -> None:
    methods = [m % 64 for m in methods][: len(args)]
    args = args[: len(methods)]
    one, many = Counter(), Counter()
    calls = [call for m, a in zip(methods, args, strict=True) if (call := one.apply(m, a))]
    assert many.apply_many(bytes(methods), args) == calls
    assert many.state() == one.state()


_self_call = st.one_of(
    st.builds(encode_outgoing_rpc, st.just(""), _method, st.sampled_from([ASYNC, FORK, IMPULSE]), _args),
    st.builds(encode_outgoing_rpc, st.sampled_from(["other", ""]), _method, st.integers(0, 4), _args),
    st.builds(bonus_call, _args),
    st.binary(min_size=1, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_self_call, max_size=12), st.integers(-1, 2))
def test_self_call_batches_fast_and_general_agree(calls, count_off) -> None:
    data = zz32(len(calls) + count_off) + b"".join(calls)
    message = Message(RPC_BATCH, data)
    fast, general = Session(), Session()
    verdict, delivered = fast.from_lb_self_calls(message)
    want = general.feed(LB, message)
    assert verdict == want
    assert vars(fast) == vars(general)
    if delivered is not None:  # what the IC's general path makes of each inner RPC
        inner = [decode_rpc(m.data, outgoing=True) for m in batch_messages(message)[2]]
        assert not any(r.destination for r in inner)
        assert delivered == [encode_incoming_rpc(r.method_id, r.rpc_type, r.args, r.reserved) for r in inner]


def test_plain_self_call_batch_takes_the_fast_path() -> None:
    calls = [bonus_call(b"%d" % n) for n in range(5, 200, 5)]
    assert scan_self_calls(read_message(encode_batch(calls), 0, 1 << 20)[0].data) == [
        encode_incoming_rpc(BONUS, FORK, b"%d" % n) for n in range(5, 200, 5)
    ]


@given(_args)
def test_bonus_call_is_the_general_encoding(args) -> None:
    assert bonus_call(args) == encode_outgoing_rpc("", BONUS, FORK, args)


def test_generated_bodies_cross_the_period() -> None:
    source = RpcSource(5000)
    for first, last in ((0, 0), (0, 100), (990, 1010), (1, 3999), (2500, 5000)):
        assert source.body(first, last) == b"".join(source.encoded(first, last))


@pytest.mark.parametrize(
    "odd",
    [b'{"value":007}', b'{"value":0}', b'{"value":5}\n{"value":6}', b'{"value":12345678901234567890}', b"5"],
)
def test_json_arguments_read_alike_in_one_pass_and_one_by_one(odd) -> None:
    """``apply_many``'s reading of mock-ic's JSON form, beside ones near it, agrees with ``apply``."""
    args = [b'{"value":%d}' % n for n in (5, 12, 0, 999)] + [odd]
    methods = bytes([ADD]) * len(args)
    together, one_by_one = Counter(), Counter()
    calls = together.apply_many(methods, args)
    assert calls == [c for a in args if (c := one_by_one.apply(ADD, a))]
    assert together.state() == one_by_one.state()
