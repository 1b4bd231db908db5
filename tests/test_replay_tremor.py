"""Tremor's replay adapter (sans-IO): the upgrade key and accept, fresh masks, aliases the peer names.

Golden bytes are RFC 6455's own examples (the opening handshake of 1.3, the frames of 5.7) and
the frames of the sample captures, which our mock peers and wsproto wrote, never this adapter.
"""

from __future__ import annotations

from pathlib import Path

from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.protocols.tremor.wsframes import decode_frame, read_request, read_response
from wallaroo_proto.replay import adapter
from wallaroo_proto.replay.recording import Frame, find, frames

CAPTURES = Path(__file__).resolve().parent.parent / "captures"

#: RFC 6455 1.3's request and answer (its key, and the accept token it gives for it).
RFC_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
RFC_ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
REQUEST = (
    b"GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: " + RFC_KEY.encode() + b"\r\n"
    b"Origin: http://example.com\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
RESPONSE = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: " + RFC_ACCEPT.encode() + b"\r\n\r\n"
)
#: Another client's key (16 bytes of 0x01) and its token, worked out with hashlib:
#: base64(SHA-1("AQEBAQEBAQEBAQEBAQEBAQ==" + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")).
OTHER_KEY = "AQEBAQEBAQEBAQEBAQEBAQ=="
OTHER_ACCEPT = "5tWd1XMQfqfRMZqGrwjPEgEvyeE="
MASKED_HELLO = bytes.fromhex("818537fa213d7f9f4d5158")  # RFC 6455 5.7
HELLO = bytes.fromhex("810548656c6c6f")


def tremor(side: str):
    """The adapter the engine makes for Tremor (through the plug-in, as ``replay`` finds it)."""
    return adapter.make("tremor", side)


def frame(record: dict, raw: bytes, index: int = 0) -> Frame:
    return Frame(index, {"conn_index": 1, **record}, raw)


def ws(raw: bytes, type_: str = "TEXT", **record) -> Frame:
    f = decode_frame(raw)
    return frame({"type": type_, "ws_opcode": f.opcode, "ws_fin": f.fin, **record}, raw)


def test_the_plugin_gives_this_adapter_and_its_noise():
    module = get_plugin("tremor").replay_adapter()
    assert module.__name__ == "wallaroo_proto.protocols.tremor.replay"
    assert adapter.module("tremor") is module
    assert "length" in adapter.noise("tremor")
    assert "message_json" not in adapter.noise("tremor") and "alias" not in adapter.noise("tremor")


# --------------------------------------------------------------------------- the upgrade


def test_played_client_sends_the_recorded_request_with_a_fresh_key():
    a = tremor("client")
    out = a.outgoing(frame({"type": "UPGRADE_REQUEST"}, REQUEST))
    hs = read_request(out)
    assert hs.problems == [] and hs.target == "/chat"
    assert hs.key != RFC_KEY and a.key == hs.key
    assert out.replace(hs.key.encode(), RFC_KEY.encode()) == REQUEST  # nothing else changed
    again = tremor("client").outgoing(frame({"type": "UPGRADE_REQUEST"}, REQUEST))
    assert read_request(again).key != hs.key  # one key a connection


def test_the_live_accept_is_judged_against_the_fresh_key():
    """The adapter's key is the one the live run's judge checks the answer against."""
    a = tremor("client")
    ours = read_request(a.outgoing(frame({"type": "UPGRADE_REQUEST"}, REQUEST)))
    assert read_response(RESPONSE, read_request(REQUEST)).problems == []
    stale = read_response(RESPONSE, ours).problems
    assert stale and "Sec-WebSocket-Accept" in stale[0]


def test_played_server_holds_its_101_for_the_live_key_then_answers_it():
    a = tremor("server")
    recorded = frame({"type": "UPGRADE_RESPONSE"}, RESPONSE)
    held = a.outgoing(recorded)
    assert isinstance(held, adapter.Hold) and "Sec-WebSocket-Key" in held.reason
    live = REQUEST.replace(RFC_KEY.encode(), OTHER_KEY.encode())
    a.incoming({"type": "UPGRADE_REQUEST", "sender": "client"}, live)
    out = a.outgoing(recorded)
    assert out == RESPONSE.replace(RFC_ACCEPT.encode(), OTHER_ACCEPT.encode())
    assert read_response(out, read_request(live)).problems == []
    # a refusal carries no accept: it goes as recorded, with no key to wait for
    refusal = frame({"type": "UPGRADE_RESPONSE"}, b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
    assert tremor("server").outgoing(refusal) == refusal.raw


# --------------------------------------------------------------------------- masks


def test_a_client_frame_goes_with_a_fresh_mask():
    out = tremor("client").outgoing(ws(MASKED_HELLO))
    f = decode_frame(out)
    assert out[:2] == MASKED_HELLO[:2] and len(out) == len(MASKED_HELLO)
    assert f.payload == b"Hello" and f.mask_key != bytes.fromhex("37fa213d")


def test_fragments_and_a_ping_between_them_keep_their_opcodes():
    """RFC 6455 5.7's fragmented "Hello", a ping between the fragments, then a close with a code."""
    a = tremor("server")
    recorded = [
        bytes.fromhex("01 03 48656c"),
        bytes.fromhex("89 05 48656c6c6f"),
        bytes.fromhex("80 02 6c6f"),
        bytes.fromhex("88 02 03e8"),
    ]
    assert [a.outgoing(ws(raw)) for raw in recorded] == recorded  # a server's: the codec makes the same
    assert tremor("server").outgoing(ws(bytes.fromhex("8800"), "CLOSE")) == bytes.fromhex("8800")
    c = tremor("client")
    for raw in recorded:
        masked = bytes([raw[0], raw[1] | 0x80]) + b"\x00\x00\x00\x00" + raw[2:]  # key 0: unmasked payload
        out = c.outgoing(ws(masked))
        f, want = decode_frame(out), decode_frame(raw)
        assert (f.opcode, f.fin, f.payload, f.masked) == (want.opcode, want.fin, want.payload, True)
        assert f.mask_key != b"\x00\x00\x00\x00"


def test_a_frame_the_codec_cannot_make_keeps_its_header_with_a_fresh_mask():
    """RSV1 set with nothing negotiated, a 16-bit length for 5 bytes: the recording's violations
    are replayed, not mended."""
    a = tremor("client")
    rsv = bytes.fromhex("c18537fa213d7f9f4d5158")
    long_form = bytes.fromhex("81fe000537fa213d7f9f4d5158")
    for raw in (rsv, long_form):
        out = a.outgoing(ws(raw))
        f, want = decode_frame(out), decode_frame(raw)
        assert out[: len(raw) - 9] == raw[: len(raw) - 9] and len(out) == len(raw)
        assert (f.rsv, f.length_bits, f.payload) == (want.rsv, want.length_bits, b"Hello")
        assert f.mask_key != want.mask_key
    # and the codec is not thrown by them: the next frame is made by it again
    assert decode_frame(a.outgoing(ws(MASKED_HELLO))).payload == b"Hello"


def test_every_client_frame_of_the_sample_captures_comes_back_the_same_but_its_mask():
    """The frames our mock client sent (the framing sample: 16- and 64-bit lengths, a ping between
    fragments, a binary frame): re-encoded, each says what it said with another key."""
    for capture in ("tremor-framing.pcap", "tremor-session.pcap"):
        for conn in (1, 2):
            a = tremor("client")
            for f in frames(find(CAPTURES / capture, connections=(str(conn),))):
                if f.sender != "client" or f.record.get("ws_opcode") is None:
                    continue
                out = a.outgoing(f)
                got, want = decode_frame(out), decode_frame(f.raw)
                assert (got.opcode, got.fin, got.rsv, got.length_bits, got.payload) == (
                    want.opcode,
                    want.fin,
                    want.rsv,
                    want.length_bits,
                    want.payload,
                ), (capture, f.packet)
                assert got.masked and got.mask_key != want.mask_key and len(out) == len(f.raw)


# --------------------------------------------------------------------------- aliases


def _text(alias_json: str, type_: str, alias: str, sender: str, masked: bool) -> Frame:
    payload = alias_json.encode()
    head = bytes([0x81, len(payload) | (0x80 if masked else 0)]) + (b"\0\0\0\0" if masked else b"")
    record = {
        "type": type_,
        "sender": sender,
        "ws_opcode": 1,
        "ws_fin": True,
        "ws_payload_len": len(payload),
        "message_json": alias_json,
        "alias": alias,
    }
    return frame(record, head + payload)


def test_played_client_follows_the_alias_the_live_node_acknowledged():
    a = tremor("client")
    ack = '{"tremor":{"connect-ack":{"protocol":"echo","alias":"echo"}}}'
    assert a.expected(_text(ack, "connect-ack", "echo", "server", False))["alias"] == "echo"
    a.incoming({"type": "connect-ack", "alias": "echo-1"}, b"")
    sent = decode_frame(a.outgoing(_text('{"echo":"beep"}', "echo", "echo", "client", True)))
    assert sent.payload == b'{"echo-1":"beep"}'
    bye = decode_frame(
        a.outgoing(_text('{"tremor":{"disconnect":"echo"}}', "disconnect", "echo", "client", True))
    )
    assert bye.payload == b'{"tremor":{"disconnect":"echo-1"}}'
    want = a.expected(_text('{"echo":"beep"}', "echo", "echo", "server", False))
    assert (want["alias"], want["message_json"], want["ws_payload_len"]) == (
        "echo-1",
        '{"echo-1":"beep"}',
        17,
    )
    other = a.expected(_text('{"ps":"list"}', "pubsub:list", "ps", "server", False))
    assert other["alias"] == "ps"  # an alias the live node did not rename stays
    cut = '{"echo":"' + "x" * 4087 + "..."
    long = frame({"type": "echo", "alias": "echo", "ws_opcode": 1, "ws_fin": True, "message_json": cut}, b"")
    long.record["ws_payload_len"] = 4111
    want = a.expected(long)  # a record holds a long message's start only: its alias follows, no more
    assert (want["alias"], want["message_json"], want["ws_payload_len"]) == (
        "echo-1",
        long.record["message_json"],
        4111,
    )


def test_played_server_answers_on_the_alias_the_live_client_chose():
    a = tremor("server")
    connect = '{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}'
    a.expected(_text(connect, "connect", "e", "client", True))
    a.incoming({"type": "connect", "alias": "mine"}, b"")
    ack = a.outgoing(
        _text(
            '{"tremor":{"connect-ack":{"protocol":"echo","alias":"e"}}}', "connect-ack", "e", "server", False
        )
    )
    assert ack == b"\x81\x3d" + b'{"tremor":{"connect-ack":{"protocol":"echo","alias":"mine"}}}'
    assert a.outgoing(_text('{"e":"beep"}', "echo", "e", "server", False)) == b'\x81\x0f{"mine":"beep"}'


def test_same_aliases_change_nothing():
    a = tremor("client")
    ack = _text(
        '{"tremor":{"connect-ack":{"protocol":"echo","alias":"e"}}}', "connect-ack", "e", "server", False
    )
    a.expected(ack)
    a.incoming({"type": "connect-ack", "alias": "e"}, b"")
    beep = _text('{"e":"beep"}', "echo", "e", "server", False)
    assert a.aliases == {} and a.expected(beep) is beep.record


def test_stream_frames_match_on_their_alias_control_frames_in_order():
    key = adapter.key_of("tremor")
    assert key({"type": "echo", "alias": "e"}) == ("e",)
    assert key({"type": "pubsub:data", "alias": "ps"}) == ("ps",)
    assert key({"type": "CLOSE"}) == (None,)
    assert key({"type": "connect-ack", "alias": "e"}) == key({"type": "disconnect-ack", "alias": "x"}) == ()


#: A server's Close with no code (the prototype's ``Message::Close(None)``) and a client's
#: recorded Close (mask 37fa213d, no payload): RFC 6455 5.5.1's frames, by hand.
BARE_CLOSE = bytes.fromhex("8800")
CLIENT_CLOSE = bytes.fromhex("888037fa213d")


def test_a_live_close_the_recording_has_not_is_answered_and_waited_on_no_more():
    """The node closed early (its error close): our Close answers it at once (the node waits for
    it before it hangs up), nothing more of it is waited for, and our recorded Close is not sent
    again when its turn comes."""
    client = tremor("client")
    assert client.owed() is None and client.waits(ws(HELLO))
    live = {"type": "CLOSE", "ws_opcode": 8, "conn_index": 1, "sender": "server"}
    client.incoming(live, BARE_CLOSE)
    record, data = client.owed()
    answer = decode_frame(data)
    assert record is live and (answer.opcode, answer.masked, answer.payload) == (8, True, b"")
    assert client.owed() is None and not client.waits(ws(HELLO))
    assert client.outgoing(ws(CLIENT_CLOSE, "CLOSE", ws_opcode=8, ws_masked=True)) == adapter.SKIP


def test_a_close_the_recording_answers_itself_is_left_to_it():
    client = tremor("client")
    client.expected(ws(BARE_CLOSE, "CLOSE", ws_opcode=8, sender="server"))
    client.incoming({"type": "CLOSE", "ws_opcode": 8, "conn_index": 1}, BARE_CLOSE)
    assert client.owed() is None
    sent = decode_frame(client.outgoing(ws(CLIENT_CLOSE, "CLOSE", ws_opcode=8, ws_masked=True)))
    assert (sent.opcode, sent.masked) == (8, True)
