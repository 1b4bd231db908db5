"""Tremor's fuzz hooks: where a frame's fields lie, a frame written again with one changed, what a
peer owes and how it refuses, and the oracle on a node that closed before our illegal frame.

Golden bytes are written by hand from RFC 6455 (5.2's layout, 5.7's examples) and RFC 0019's
messages, masked here by the XOR of 5.3, never by the code under test.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from wallaroo_proto.fuzz.hooks import Hooks
from wallaroo_proto.fuzz.oracle import judge
from wallaroo_proto.protocols.tremor import fuzz
from wallaroo_proto.protocols.tremor.core import Session
from wallaroo_proto.protocols.tremor.messages import parse
from wallaroo_proto.protocols.tremor.wsframes import FrameSplitter, MessageAssembler, decode_frame

KEY = bytes.fromhex("37fa213d")  # RFC 6455 5.7's masking key
MASKED_HELLO = bytes.fromhex("818537fa213d7f9f4d5158")  # RFC 6455 5.7


def xor(data: bytes, key: bytes = KEY) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(data))


def client_text(text: bytes) -> bytes:
    """A masked client text frame of under 126 bytes: FIN+TEXT, MASK|length, key, masked payload."""
    assert len(text) < 126
    return bytes([0x81, 0x80 | len(text)]) + KEY + xor(text)


CONNECT = b'{"tremor":{"connect":{"protocol":"echo","alias":"echo"}}}'
ECHO = b'{"echo":{"n":7,"r":[1,2]}}'


def by_name(record: dict, raw: bytes) -> dict:
    return {f.name: f for f in fuzz.fields(record, raw)}


def payload(raw: bytes) -> bytes:
    return decode_frame(raw).payload


def test_header_fields_of_rfc_masked_hello():
    f = by_name({"type": "TEXT"}, MASKED_HELLO)
    assert {n: (f[n].value, f[n].bits, f[n].kind) for n in ("opcode", "mask")} == {
        "opcode": (1, 4, "enum"),
        "mask": (1, 1, "enum"),
    }
    assert (f["payload_len"].value, f["payload_len"].bits, f["payload_len"].kind) == (5, 7, "length")
    assert "alias" not in f  # "Hello" is no message


def test_a_16_bit_length_lies_at_offset_2():
    raw = bytes.fromhex("817e00c8") + b"a" * 200
    f = by_name({"type": "TEXT"}, raw)["payload_len"]
    assert (f.value, f.bits, f.offset) == (200, 16, 2)


def test_a_connect_names_its_alias_op_protocol_and_stream():
    f = by_name({"type": "connect"}, client_text(CONNECT))
    names = fuzz.NAMES
    assert f["alias"].value == names.index("tremor") and f["op"].value == names.index("connect")
    assert f["protocol"].value == names.index("echo") and f["stream_alias"].value == names.index("echo")


def test_an_echo_names_its_integers_and_a_close_its_code():
    f = by_name({"type": "echo"}, client_text(ECHO))
    assert (f["int echo/n"].value, f["int echo/r/0"].value, f["int echo/r/1"].value) == (7, 1, 2)
    close = bytes([0x88, 0x82]) + KEY + xor(bytes.fromhex("03e8"))  # Close 1000, masked
    assert by_name({"type": "CLOSE"}, close)["close_code"].value == 1000


def test_with_value_writes_the_message_again_masked_with_the_frame_key():
    raw = client_text(CONNECT)
    field = by_name({"type": "connect"}, raw)["stream_alias"]
    out = fuzz.with_value({"type": "connect"}, raw, field, fuzz.NAMES.index("ps"))
    want = b'{"tremor":{"connect":{"protocol":"echo","alias":"ps"}}}'
    assert out == bytes([0x81, 0x80 | len(want)]) + KEY + xor(want)


def test_with_value_on_header_fields():
    f = by_name({"type": "TEXT"}, MASKED_HELLO)
    assert fuzz.with_value({}, MASKED_HELLO, f["payload_len"], 6)[:2] == bytes([0x81, 0x86])
    assert fuzz.with_value({}, MASKED_HELLO, f["opcode"], 2)[0] == 0x82
    assert fuzz.with_value({}, MASKED_HELLO, f["mask"], 0) == bytes.fromhex("810548656c6c6f")  # RFC 5.7


def test_with_value_on_the_upgrade():
    request = b"GET / HTTP/1.1\r\nHost: x\r\nSec-WebSocket-Version: 13\r\n\r\n"
    field = by_name({"type": "UPGRADE_REQUEST"}, request)["ws_version"]
    assert field.value == 13
    out = fuzz.with_value({"type": "UPGRADE_REQUEST"}, request, field, 8)
    assert out == request.replace(b"Version: 13", b"Version: 8")
    response = b"HTTP/1.1 101 Switching Protocols\r\n\r\n"
    field = by_name({"type": "UPGRADE_RESPONSE"}, response)["http_status"]
    out = fuzz.with_value({"type": "UPGRADE_RESPONSE"}, response, field, 400)
    assert out == b"HTTP/1.1 400 Switching Protocols\r\n\r\n"


@given(st.sampled_from([CONNECT, ECHO, b'{"tremor":"close"}', b'{"ps":{"subscribe":["/a/b"]}}']))
def test_each_field_round_trips(text):
    raw = client_text(text)
    record = {"type": "x"}
    for field in fuzz.fields(record, raw):
        if field.name in ("payload_len", "mask"):
            continue  # a length other than the payload's, or no key: the frame no longer parses alone
        value = (field.value + 1) % (1 << field.bits)
        out = fuzz.with_value(record, raw, field, value)
        assert by_name(record, out)[field.name].value == value, field.name


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([CONNECT, ECHO, b'{"tremor":{"disconnect":"echo"}}', b'{"ps":"list"}']),
    st.data(),
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.booleans(),
)
def test_any_value_of_any_field_gives_bytes_the_reader_splits_and_judges(text, data, value, masked):
    raw = client_text(text) if masked else bytes([0x81, len(text)]) + text
    field = data.draw(st.sampled_from(fuzz.fields({"type": "x"}, raw)))
    out = fuzz.with_value({"type": "x"}, raw, field, value)
    splitter = FrameSplitter(client=True)
    assembler = MessageAssembler(client=True)
    session = Session()
    for frame in splitter.feed(out + MASKED_HELLO):
        message, _ = assembler.frame(frame)
        if message is not None and message.text is not None:
            session.feed("client", message.text)


def test_templates_are_the_messages_they_are_named():
    for side in ("client", "server"):
        session = Session()
        if side == "server":  # a server's answers are judged against what was asked
            session.feed("client", '{"tremor":{"connect":{"protocol":"echo"}}}')
        for name, raw in fuzz.templates(side).items():
            frame = decode_frame(raw)
            assert frame.masked == (side == "client") and frame.wire_length == len(raw), name
            if name in ("PING", "CLOSE", "BINARY"):
                assert frame.opcode == {"PING": 9, "CLOSE": 8, "BINARY": 2}[name]
                continue
            message = parse(frame.payload.decode())
            kind = name.split()[0]
            if message.op != "stream":
                assert message.op == kind, name
            else:
                assert kind.split(":")[0] in ("echo", "pubsub") and message.alias in ("echo", "ps"), name


def test_owed_and_refusal():
    client, server = {"sender": "client"}, {"sender": "server"}
    assert fuzz.owed({**client, "type": "connect"}).types == {"connect-ack", "error-close"}
    assert fuzz.owed({**client, "type": "pubsub:subscribe"}).types == {"pubsub:subscribe-ack", "error-close"}
    assert fuzz.owed({**client, "type": "pubsub:send"}) is None
    assert fuzz.owed({**server, "type": "CLOSE"}).types == {"CLOSE"}
    assert fuzz.owed({**server, "type": "echo"}) is None
    assert fuzz.refusal({**server, "type": "error-close"})
    assert fuzz.refusal({**server, "type": "CLOSE", "ws_close_code": 1002})
    assert not fuzz.refusal({**server, "type": "CLOSE", "ws_close_code": None})
    assert fuzz.refusal({**server, "type": "CLOSE", "ws_close_code": 1000})  # the echo of ours
    assert fuzz.closed({**server, "type": "CLOSE"}) and fuzz.closed({**server, "type": "close-ack"})
    assert fuzz.refusal({**server, "type": "UPGRADE_RESPONSE", "http_status": 400})
    assert not fuzz.refusal({**server, "type": "UPGRADE_RESPONSE", "http_status": 101})
    assert not fuzz.refusal({**server, "type": "close-ack"}) and fuzz.refusal({**client, "type": "CLOSE"})
    assert {"server"} == fuzz.REPLY_BEFORE_CLOSE


def _ours(kind: str, bad: bool = False) -> tuple:
    return (
        "ours",
        {"type": kind, "sender": "client", "conn_index": 1, "verdict": "violation" if bad else "accepted"},
    )


def _peer(kind: str) -> tuple:
    return ("peer", {"type": kind, "sender": "server", "conn_index": 1, "verdict": "accepted"})


def test_an_illegal_frame_after_the_node_closed_is_owed_no_error_close():
    """The node's close-ack and Close ended the session; our message after it is illegal, and the
    node, having closed, owes it nothing."""
    hooks = Hooks("tremor")
    over = [_ours("close"), _peer("close-ack"), _peer("CLOSE"), _ours("echo", bad=True), ("end", 1, "closed")]
    assert judge(over, hooks, "server").findings == []
    open_ = [_ours("connect"), _peer("connect-ack"), _ours("echo", bad=True), ("end", 1, "closed")]
    assert [f.kind for f in judge(open_, hooks, "server").findings] == ["no-error-reply"]


def test_an_illegal_frame_after_our_own_close_is_owed_nothing():
    """We asked to close, then sent a message (illegal): the node ended the session with its
    close-ack and bare Close, as it must."""
    hooks = Hooks("tremor")
    events = [_ours("close"), _ours("connect", bad=True), _peer("close-ack"), _peer("CLOSE")]
    assert judge([*events, ("end", 1, "closed")], hooks, "server").findings == []


def test_a_reset_after_the_nodes_own_close_is_how_it_hung_up():
    """Our frame claimed more bytes than came (the judge never read it whole, so all we sent
    looks legal); the node failed the connection with 1007 and reset it: no finding. A reset
    with no refusal before it still is one."""
    hooks = Hooks("tremor")
    failed = ("peer", {**_peer("CLOSE")[1], "ws_close_code": 1007})
    refused = [_ours("connect"), failed, ("end", 1, "reset")]
    assert judge(refused, hooks, "server").findings == []
    bare = [_ours("connect"), _peer("connect-ack"), ("end", 1, "reset")]
    assert [f.kind for f in judge(bare, hooks, "server").findings] == ["reset"]


def test_a_node_that_acks_an_illegal_disconnect_and_ends_normally_gave_no_error_close():
    """Its close-ack and bare Close at the end of the session refuse nothing."""
    hooks = Hooks("tremor")
    events = [_ours("disconnect", bad=True), _peer("disconnect-ack"), _ours("close"), _peer("close-ack")]
    events += [_peer("CLOSE"), ("end", 1, "closed")]
    assert [f.kind for f in judge(events, hooks, "server").findings] == ["no-error-reply"]


def test_answers_lost_with_our_own_reset_are_not_owed():
    """The mutant reset the connection after an echo whose answer was in flight: not silence."""
    hooks = Hooks("tremor")
    events = [_ours("connect"), _peer("connect-ack"), _ours("echo")]
    assert [f.kind for f in judge(events, hooks, "server").findings] == ["silent"]
    assert judge([*events, ("we-end", 1, "reset")], hooks, "server").findings == []
    illegal = [_ours("connect"), _peer("connect-ack"), _ours("echo", bad=True)]  # then our reset
    assert [f.kind for f in judge(illegal, hooks, "server").findings] == ["accepted"]
    assert judge([*illegal, ("we-end", 1, "reset")], hooks, "server").findings == []


def test_the_plugin_gives_these_hooks():
    hooks = Hooks("tremor")
    assert hooks.fields is fuzz.fields and {"server"} == hooks.REPLY_BEFORE_CLOSE
    assert json.loads(payload(fuzz.templates("client")["close"])) == {"tremor": "close"}
