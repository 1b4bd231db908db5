"""Tremor: the passive WebSocket reader on RFC 6455's own examples and wsproto's frames; the JSON messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol, Opcode

from wallaroo_proto.protocols.tremor import messages as m
from wallaroo_proto.protocols.tremor.wsframes import (
    BINARY,
    CLOSE,
    PING,
    TEXT,
    FrameSplitter,
    MessageAssembler,
    decode_frame,
    read_request,
    read_response,
)

# --------------------------------------------------------------------------- RFC 6455 5.7 examples


def test_rfc_unmasked_hello():
    f = decode_frame(bytes.fromhex("810548656c6c6f"))
    assert (f.fin, f.opcode, f.masked, f.payload, f.length_bits, f.wire_length) == (
        True,
        TEXT,
        False,
        b"Hello",
        7,
        7,
    )


def test_rfc_masked_hello():
    f = decode_frame(bytes.fromhex("818537fa213d7f9f4d5158"))
    assert f.masked and f.mask_key == bytes.fromhex("37fa213d")
    assert f.payload == b"Hello"


def test_rfc_fragmented_hello_with_a_ping_between():
    wire = bytes.fromhex("010348656c") + bytes.fromhex("890548656c6c6f") + bytes.fromhex("80026c6f")
    frames = FrameSplitter(client=False).feed(wire)
    assert [(f.opcode, f.fin, f.offset) for f in frames] == [(TEXT, False, 0), (PING, True, 5), (0, True, 12)]
    asm = MessageAssembler(client=False)
    out = [asm.frame(f) for f in frames]
    assert out[0] == (None, []) and out[1] == (None, [])
    message, problems = out[2]
    assert problems == [] and message.text == "Hello" and message.frames == 2


def test_rfc_16_and_64_bit_lengths():
    f = decode_frame(bytes.fromhex("827e0100") + bytes(256))
    assert (f.opcode, f.length_bits, len(f.payload)) == (BINARY, 16, 256)
    f = decode_frame(bytes.fromhex("827f0000000000010000") + bytes(65536))
    assert (f.length_bits, len(f.payload), f.problems) == (64, 65536, [])


def test_fact_sheet_frames():
    # 200-byte server text, 70 000-byte server binary, the prototype's Close(None).
    assert decode_frame(bytes.fromhex("817e00c8") + b"a" * 200).length_bits == 16
    assert len(decode_frame(bytes.fromhex("827f0000000000011170") + bytes(70000)).payload) == 70000
    close = decode_frame(bytes.fromhex("8800"))
    assert close.opcode == CLOSE and close.payload == b""


def test_non_minimal_length_and_unmasked_client_frame_are_violations():
    f = decode_frame(bytes.fromhex("817e0005") + b"Hello")
    assert f.problems == ["payload length 5 not in its minimal form (16-bit length used)"]
    _, problems = MessageAssembler(client=True).frame(decode_frame(bytes.fromhex("810548656c6c6f")))
    assert problems == ["client frame not masked (RFC 6455 5.1: the server must close, 1002)"]


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        ("c10548656c6c6f", "RSV bits 100 set with no extension negotiated"),
        ("830548656c6c6f", "reserved data opcode 0x3"),
        ("800548656c6c6f", "continuation frame with no fragmented message to continue"),
        ("0900", "control frame fragmented (FIN not set)"),
        ("880103", "close frame with a 1-byte payload (a status code takes 2)"),
        ("880203ed", "close code 1005 may not be sent (RFC 6455 7.4)"),
        ("8102c328", "text message not UTF-8 at byte 0 (RFC 6455 8.1: close 1007)"),
    ],
)
def test_framing_rules(wire, problem):
    asm = MessageAssembler(client=False)
    problems = []
    for f in FrameSplitter(client=False).feed(bytes.fromhex(wire)):
        problems += asm.frame(f)[1]
    assert problem in problems


def test_handshake_rfc_example_key_and_accept():
    req = read_request(
        b"GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert req.problems == [] and req.target == "/chat"
    ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    good = read_response(ok + b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n", req)
    assert good.status == 101 and good.problems == []
    bad = read_response(ok + b"Sec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n", req)
    assert bad.problems == [
        "Sec-WebSocket-Accept 'AAAAAAAAAAAAAAAAAAAAAAAAAAA=', "
        "expected 's3pPLMBiTxaQ9kYGzzhZRbK+xOo=' for the client's key"
    ]


def test_handshake_missing_version_and_short_key():
    req = read_request(
        b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: abc=\r\n\r\n"
    )
    assert any("Sec-WebSocket-Version" in p for p in req.problems)
    assert any("base64 of 16 bytes" in p for p in req.problems)


# --------------------------------------------------------------------------- against wsproto's serializer

_opcodes = st.sampled_from([Opcode.TEXT, Opcode.BINARY, Opcode.PING, Opcode.PONG])


@settings(max_examples=150, deadline=None)
@given(
    client=st.booleans(),
    items=st.lists(st.tuples(_opcodes, st.binary(max_size=300)), min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 97), max_size=30),
)
def test_frames_wsproto_writes_read_back_whatever_the_segmentation(client, items, cuts):
    """wsproto's FrameProtocol serialises (masking client frames); ours reads them in any chunking."""
    proto = FrameProtocol(client=client, extensions=[])
    wire = b""
    expected = []
    for opcode, payload in items:
        if opcode in (Opcode.PING, Opcode.PONG):
            payload = payload[:125]
            wire += proto._serialize_frame(opcode, payload)
        else:
            data = payload.decode("latin-1") if opcode is Opcode.TEXT else payload
            wire += proto.send_data(data, fin=True)
            payload = data.encode("utf-8") if opcode is Opcode.TEXT else payload
        expected.append((int(opcode), payload))
    splitter = FrameSplitter(client=client)
    frames = []
    pos = 0
    for cut in cuts:
        frames += splitter.feed(wire[pos : pos + cut])
        pos += cut
    frames += splitter.feed(wire[pos:])
    assert [(f.opcode, f.payload) for f in frames] == expected
    assert all(f.masked == client and not f.problems for f in frames)
    assert sum(f.wire_length for f in frames) == len(wire)


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=400), size=st.integers(1, 50))
def test_fragmented_text_reassembles(text, size):
    proto = FrameProtocol(client=True, extensions=[])
    data = text.encode()
    chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    wire = b""
    for i, chunk in enumerate(chunks):
        opcode = Opcode.TEXT if i == 0 else Opcode.CONTINUATION
        wire += proto._serialize_frame(opcode, chunk, fin=i == len(chunks) - 1)
    asm = MessageAssembler(client=True)
    out = [asm.frame(f) for f in FrameSplitter(client=True).feed(wire)]
    message, problems = out[-1]
    assert problems == [] and message.text == text and message.frames == len(chunks)


def test_resync_after_a_gap_finds_the_next_json_text_frame():
    key = bytes.fromhex("37fa213d")  # RFC 6455's example key: the same bytes every run
    frames = []
    for i in range(5):
        payload = f'{{"echo":{i}}}'.encode()
        masked = bytes(b ^ key[j % 4] for j, b in enumerate(payload))
        frames.append(bytes([0x81, 0x80 | len(payload)]) + key + masked)
    wire = b"".join(frames)
    splitter = FrameSplitter(client=True)
    got = splitter.feed(wire[:20])
    splitter.gap(7)
    got += splitter.feed(wire[27:])
    texts = [f.payload for f in got]
    assert texts[0] == b'{"echo":0}' and texts[-2:] == [b'{"echo":3}', b'{"echo":4}']
    assert b'{"echo":1}' not in texts


# --------------------------------------------------------------------------- JSON messages


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"tremor":{"connect":{"protocol":"echo"}}}', m.Connect("echo", "echo")),
        (
            '{"tremor":{"connect":{"protocol":"pubsub","alias":"ps","headers":{"command.policy":"non-strict"}}}}',
            m.Connect("pubsub", "ps", {}, {"command.policy": "non-strict"}),
        ),
        ('{"tremor":{"connect-ack":{"protocol":"echo","alias":"e"}}}', m.ConnectAck("echo", "e")),
        ('{"tremor":{"disconnect":"e"}}', m.Disconnect("e", "rfc")),
        ('{"tremor":{"disconnect":{"alias":"e"}}}', m.Disconnect("e", "prototype")),
        ('{"tremor":{"disconnect-ack":{"alias":"e"}}}', m.DisconnectAck("e")),
        ('{"tremor":"close"}', m.Close()),
        ('{"tremor":{"close-ack":"ok"}}', m.CloseAck("ok")),
        (
            '{"tremor":{"close":"0.207: Protocol session not connected error"}}',
            m.ErrorClose("0.207: Protocol session not connected error"),
        ),
        ('{"tremor":"version"}', m.VersionRequest()),
        ('{"tremor":{"version":"0.10.2"}}', m.VersionInfo("0.10.2")),
        ('{"echo":"beep"}', m.StreamMessage("echo", "beep")),
    ],
)
def test_messages_parse_and_encode_back(text, message):
    assert m.parse(text) == message
    if not (isinstance(message, m.Connect) and "alias" not in text):
        assert m.encode(message) == text


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{nope", "0.101"),
        ('"snot"', "0.203"),
        ('{"fleek":1,"flook":2}', "0.205"),
        ("{}", "0.205"),
        ('{"tremor":{"connect":{"alias":"x"}}}', "0.201"),
        ('{"tremor":"frobnicate"}', "0.202"),
        ('{"tremor":{"disconnect":{}}}', "0.204"),
    ],
)
def test_refused_messages_carry_the_prototypes_codes(text, code):
    with pytest.raises(m.MessageError) as err:
        m.parse(text)
    assert err.value.code == code


def test_status_texts_are_the_prototypes():
    assert m.status_text("0.205") == "0.205: Protocol operation - record requires one field only"
    assert m.ErrorClose("0.203: Protocol operation expected a record").code == "0.203"
    assert m.ErrorClose("unknown server error").code is None


@settings(max_examples=200, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    ),
    alias=st.text(min_size=1, max_size=10).filter(lambda a: a != "tremor"),
)
def test_any_stream_value_round_trips(value, alias):
    text = m.encode(m.StreamMessage(alias, value))
    assert m.parse(text) == m.StreamMessage(alias, value)


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(st.binary(min_size=4, max_size=4), min_size=3, max_size=8),
    sizes=st.lists(st.integers(0, 150), min_size=8, max_size=8),
    data=st.data(),
)
def test_resync_never_invents_a_frame(keys, sizes, data):
    """Whatever is lost inside a frame, reading resumes at a real frame boundary, never between."""
    frames = []
    for i, key in enumerate(keys):
        payload = ('{"echo":"' + "x" * sizes[i] + '"}').encode()
        head = (
            bytes([0x81, 0x80 | len(payload)]) if len(payload) < 126 else bytes([0x81, 0xFE, 0, len(payload)])
        )
        frames.append(head + key + bytes(b ^ key[j % 4] for j, b in enumerate(payload)))
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    wire = b"".join(frames)
    cut = data.draw(st.integers(1, len(wire) - 1))
    lost = data.draw(st.integers(1, len(wire) - cut))
    splitter = FrameSplitter(client=True)
    got = splitter.feed(wire[:cut])
    splitter.gap(lost)
    got += splitter.feed(wire[cut + lost :])
    after = [f for f in got if f.offset >= cut]
    assert all(f.offset in starts for f in after)
    if after:  # from the first frame found on, nothing is skipped
        first = starts.index(after[0].offset)
        assert [f.offset for f in after] == starts[first:]


# --------------------------------------------------------------------------- what the node takes as JSON


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"e":NaN}', "NaN is not JSON"),
        ('{"e":[Infinity]}', "Infinity is not JSON"),
        ('{"e":-Infinity}', "-Infinity is not JSON"),
        ('{"e":1e400}', "out of range"),
        ('{"e":"\\ud800"}', "lone surrogate"),  # a high half with nothing after it
        ('{"e":"a\\udfffb"}', "lone surrogate"),  # a low half on its own
        ('{"\\ud800":1}', "lone surrogate"),  # in a key
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 512"),
        ('{"e":' * 513 + "1" + "}" * 513, "nested deeper than 512"),
    ],
)
def test_values_no_json_text_could_send_back_are_malformed(text, detail):
    """simd-json (the real node's parser) refuses NaN, Infinity and lone surrogates; the rest
    Python would read but could not write back, so the node refuses them too (0.101)."""
    with pytest.raises(m.MessageError) as err:
        m.parse_json(text)
    assert err.value.code == "0.101" and detail in err.value.detail


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"e":"\\ud83d\\ude00"}', {"e": "\U0001f600"}),  # a surrogate pair is one character
        ('{"e":"\\\\ud800"}', {"e": "\\ud800"}),  # an escaped backslash, then plain letters
        ('{"e":"[[[[{{{{"}', {"e": "[[[[{{{{"}),  # brackets in strings do not nest
        ('{"e":1.5e300}', {"e": 1.5e300}),
    ],
)
def test_unusual_but_valid_json_is_taken(text, value):
    assert m.parse_json(text) == value


def test_nesting_up_to_the_limit_is_taken_and_echoed_back():
    text = '{"e":' * 512 + "1" + "}" * 512
    assert m.encode(m.parse(text)) == text


@pytest.mark.parametrize("text", ['"snot"', '""', "42", "-1.5", "true", "null", "[1]"])
def test_any_non_record_json_value_is_0_203(text):
    with pytest.raises(m.MessageError) as err:
        m.parse(text)
    assert err.value.code == "0.203"


def test_nan_is_refused_on_the_way_out_too():
    with pytest.raises(ValueError):
        m.dumps({"e": float("nan")})
    with pytest.raises(ValueError):
        m.encode(m.StreamMessage("e", float("-inf")))
