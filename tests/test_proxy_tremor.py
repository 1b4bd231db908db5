"""Tremor's WebSocket for the proxy's fault rules: frames, fields, rewrites, the named close.

Golden bytes are RFC 6455's examples (the opening handshake's key and accept, the
masked "Hello" with key 37fa213d) and frames written by hand from its header layout;
a masking key of zero leaves a client's payload readable in the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Server, run_cli
from wsproto.frame_protocol import FrameProtocol, Opcode

from wallaroo_proto.display_filter import compile_filter
from wallaroo_proto.protocols.tremor.peers import MockClient
from wallaroo_proto.protocols.tremor.proxy_faults import NAMED_FAULTS, adapter
from wallaroo_proto.proxy import faults
from wallaroo_proto.proxy.faultkit import FaultError, Frame, Send

REQUEST = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1:9899\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
RESPONSE = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
)
ZERO_KEY = b"\x00\x00\x00\x00"


def server_text(text: bytes) -> bytes:
    """A short FIN text frame from the node: 0x81, its 7-bit length, the text (no mask)."""
    assert len(text) < 126
    return bytes((0x81, len(text))) + text


def client_text(text: bytes) -> bytes:
    """The same from the client: the mask bit set, a zero key, so the text is as sent."""
    assert len(text) < 126
    return bytes((0x81, 0x80 | len(text))) + ZERO_KEY + text


VERSION = server_text(b'{"tremor":{"version":"0.10.2"}}')
CONNECT = client_text(b'{"tremor":{"connect":{"protocol":"echo"}}}')
CONNECT_ACK = server_text(b'{"tremor":{"connect-ack":{"protocol":"echo","alias":"echo"}}}')
BEEP = client_text(b'{"echo":"beep"}')
BEEP_BACK = server_text(b'{"echo":"beep"}')

#: (from the client, bytes as they came), one echo session.
SESSION = [
    (True, REQUEST),
    (False, RESPONSE + VERSION),  # the node pushes its version right after its 101
    (True, CONNECT),
    (False, CONNECT_ACK),
    (True, BEEP),
    (False, BEEP_BACK),
]


def run(session):
    a = adapter()
    out = []
    for from_client, data in session:
        for f in a.frames(from_client, data):
            out.append(Frame(f, from_client, a.fields(f, from_client)))
    return a, out


def test_the_heads_and_each_websocket_frame_are_frames_named_as_dissect_names_them():
    _, frames = run(SESSION)
    assert [f.data for f in frames] == [REQUEST, RESPONSE, VERSION, CONNECT, CONNECT_ACK, BEEP, BEEP_BACK]
    assert [(f.fields["type"], f.fields["sender"]) for f in frames] == [
        ("UPGRADE_REQUEST", "client"),
        ("UPGRADE_RESPONSE", "server"),
        ("version-info", "server"),
        ("connect", "client"),
        ("connect-ack", "server"),
        ("echo", "client"),
        ("echo", "server"),
    ]
    assert frames[0].fields["http_target"] == "/" and frames[1].fields["http_status"] == 101
    connect = frames[3].fields
    assert (connect["ws_opcode"], connect["ws_fin"], connect["ws_masked"]) == (1, True, True)
    assert (connect["ws_length_bits"], connect["ws_payload_len"]) == (7, 42)
    assert connect["alias"] == "echo" and connect["tremor_protocol"] == "echo"
    assert connect["message_json"] == '{"tremor":{"connect":{"protocol":"echo"}}}'
    assert frames[6].fields["ws_masked"] is False


def test_bytes_one_at_a_time_give_the_same_frames():
    whole = [f.data for f in run(SESSION)[1]]
    a = adapter()
    got = []
    for from_client, data in SESSION:
        for i in range(len(data)):
            got += a.frames(from_client, data[i : i + 1])
    assert got == whole


def test_a_fragmented_message_is_named_at_its_last_frame():
    # RFC 6455 5.4: a first frame without FIN, then a continuation with FIN.
    first = b"\x01\x08" + b'{"echo":'
    last = b"\x80\x07" + b'"beep"}'
    _, frames = run([*SESSION[:4], (False, first + last)])
    assert [f.fields["type"] for f in frames[-2:]] == ["TEXT", "echo"]
    assert frames[-1].fields["message_json"] == '{"echo":"beep"}'


def test_a_refused_upgrade_leaves_the_rest_unframed_and_loses_no_byte():
    a, _ = run(SESSION[:1])
    refusal = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\n"
    assert a.frames(False, refusal[:20]) == []
    assert a.frames(False, refusal[20:] + b"n") == [refusal, b"n"]
    assert a.fields(refusal, False) == {"type": "UPGRADE_RESPONSE", "sender": "server", "http_status": 403}
    assert a.fields(b"n", False) == {"type": "INVALID", "sender": "server"}
    assert a.frames(False, b"o") == [b"o"]


def test_a_frame_too_big_to_be_one_ends_the_framing_and_loses_no_byte():
    a, _ = run(SESSION[:2])
    # A text frame claiming 2^32 payload bytes (127: a 64-bit length follows), after a whole one.
    huge = b"\x81\x7f" + (1 << 32).to_bytes(8, "big") + b"abc"
    assert a.frames(False, BEEP_BACK + huge[:5]) == [BEEP_BACK]
    assert a.frames(False, huge[5:]) == [huge]
    assert a.fields(BEEP_BACK, False)["type"] == "stream"  # on a stream this session never connected
    assert a.fields(huge, False) == {"type": "INVALID", "sender": "server"}


def sent_through_engine(*reads: tuple[bool, bytes]) -> dict[bool, bytes]:
    """What the engine sends of each side's reads once both sides end (no rules), by side."""
    engine = faults.ConnectionFaults([], "tremor", adapter=adapter())
    steps = [step for from_client, data in reads for step in engine.feed(from_client, data)]
    steps += engine.end(True) + engine.end(False)
    return {
        side: b"".join(s.data for s in steps if isinstance(s, Send) and s.to_upstream == side)
        for side in (True, False)
    }


def test_a_head_or_a_frame_cut_short_at_the_end_still_goes_on():
    """An upgrade request cut before its blank line; a node's frame cut inside its payload:
    every byte goes on when the sides end."""
    head = REQUEST[:25]
    assert sent_through_engine((True, head[:10]), (True, head[10:])) == {True: head, False: b""}
    node = RESPONSE + VERSION + CONNECT_ACK[:7]
    sent = sent_through_engine((True, REQUEST), (False, node[:100]), (False, node[100:]))
    assert sent == {True: REQUEST, False: node}


def test_the_close_fault_sends_a_close_with_the_status_to_the_frames_receiver():
    fault = NAMED_FAULTS["close"]
    assert fault.direction == "client" and fault.params["status"] == (int, 1011)
    _, frames = run(SESSION)
    match = compile_filter(fault.where)
    assert [f.fields["type"] for f in frames if match(dict(f.fields))] == [
        "version-info",
        "connect",
        "connect-ack",
        "echo",
        "echo",
    ]
    a = adapter()
    # To the client: a node's close, unmasked: 88, length 5, status 1011 (03 f3), "bye".
    sent = fault.act(frames[6], {"status": 1011, "reason": "bye"}, a)
    assert sent == [Send(False, b"\x88\x05\x03\xf3bye")]
    # To the node: a client's close, masked with a fresh key.
    (send,) = fault.act(frames[5], {"status": 4000, "reason": ""}, a)
    assert send.to_upstream and send.data[:2] == b"\x88\x82"
    key = send.data[2:6]
    assert bytes(b ^ key[i] for i, b in enumerate(send.data[6:])) == b"\x0f\xa0"  # 4000


def test_a_close_reason_is_cut_to_fit_a_control_frame_at_a_character():
    (send,) = NAMED_FAULTS["close"].act(run(SESSION)[1][6], {"status": 1000, "reason": "é" * 100}, adapter())
    # 125 bytes at most: the status's 2 and 61 "é" of 2 bytes (a 62nd would need 2 more than fit).
    assert send.data == b"\x88\x7c\x03\xe8" + "é".encode() * 61


def test_rewriting_a_masked_frame_masks_it_again_with_its_key():
    a, _ = run(SESSION[:2])
    hello = b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"  # RFC 6455 5.7: masked "Hello"
    (data,) = a.frames(True, hello)
    frame = Frame(data, True, a.fields(data, True))
    assert frame.fields["type"] == "INVALID"  # not a Tremor message
    # "Hellp": the last byte 'p' (70) masked with the key's first byte (37) is 47.
    assert a.rewrite(frame, "message_json", "Hellp") == b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x47"


def test_rewriting_a_close_code_keeps_its_reason_and_its_mask():
    a, _ = run(SESSION[:2])
    # A client's close 1000 masked with 37fa213d: 03^37 = 34, e8^fa = 12.
    (data,) = a.frames(True, b"\x88\x82\x37\xfa\x21\x3d\x34\x12")
    frame = Frame(data, True, a.fields(data, True))
    assert frame.fields["ws_close_code"] == 1000
    # 1001 is 03 e9: e9^fa = 13.
    assert a.rewrite(frame, "ws_close_code", 1001) == b"\x88\x82\x37\xfa\x21\x3d\x34\x13"
    (data,) = a.frames(False, b"\x88\x04\x03\xe8ok")
    frame = Frame(data, False, a.fields(data, False))
    assert a.rewrite(frame, "ws_close_code", 1011) == b"\x88\x04\x03\xf3ok"


def test_rewriting_an_error_closes_status_writes_the_prototypes_text_for_it():
    before = b'{"tremor":{"close":"0.207: Protocol session not connected error"}}'
    after = b'{"tremor":{"close":"0.203: Protocol operation expected a record"}}'
    _, frames = run([*SESSION[:2], (False, server_text(before))])
    assert frames[-1].fields["type"] == "error-close" and frames[-1].fields["status_code"] == "0.207"
    assert adapter().rewrite(frames[-1], "status_code", "0.203") == server_text(after)


@pytest.mark.parametrize(
    ("index", "field_name", "message"),
    [
        (0, "message_json", "UPGRADE_REQUEST is an HTTP head"),
        (3, "ws_close_code", "of a CLOSE frame only"),
        (3, "status_code", "in an error-close message only"),
        (3, "alias", "these can: ws_close_code, status_code, message_json"),
    ],
)
def test_a_rewrite_that_cannot_be_done_says_why(index, field_name, message):
    _, frames = run(SESSION)
    with pytest.raises(FaultError, match=message):
        adapter().rewrite(frames[index], field_name, "x")


def test_strict_closes_with_1002_and_the_reason():
    a = adapter()
    assert a.error_frame("bad", to_client=True) == b"\x88\x05\x03\xeabad"
    masked = a.error_frame("bad", to_client=False)
    assert masked[:2] == b"\x88\x85"
    assert bytes(b ^ masked[2 + i % 4] for i, b in enumerate(masked[6:])) == b"\x03\xeabad"


_OPCODES = st.sampled_from([Opcode.TEXT, Opcode.BINARY, Opcode.PING, Opcode.CLOSE])


@settings(max_examples=100, deadline=None)
@given(
    client=st.booleans(),
    items=st.lists(st.tuples(_OPCODES, st.binary(max_size=70_000)), max_size=5),
    cuts=st.lists(st.integers(1, 5000), max_size=30),
    short=st.integers(0, 200),
)
def test_frames_wsproto_writes_come_out_whole_whatever_the_chunking(client, items, cuts, short):
    """wsproto's FrameProtocol serialises (masking a client's); each frame comes out as its own bytes.
    With the stream ``short`` of its end, the frames cut short are the tail, every byte of it."""
    proto = FrameProtocol(client=client, extensions=[])
    written = []
    for opcode, payload in items:
        if opcode in (Opcode.PING, Opcode.CLOSE):
            written.append(proto._serialize_frame(opcode, payload[:125]))
        else:
            written.append(proto._serialize_frame(opcode, payload))
    head = REQUEST if client else RESPONSE
    whole = [head, *written]
    wire = b"".join(whole)
    wire = wire[: len(wire) - short]
    a = adapter()
    if not client:
        a.fields(*a.frames(True, REQUEST), True)
    got, pos = [], 0
    for cut in cuts:
        got += a.frames(client, wire[pos : pos + cut])
        pos += cut
    got += a.frames(client, wire[pos:])
    ends = [sum(map(len, whole[: i + 1])) for i in range(len(whole))]
    assert got == [f for f, end in zip(whole, ends, strict=True) if end <= len(wire)]
    assert b"".join(got) + a.tail(client) == wire
    types = [a.fields(f, client)["type"] for f in got]
    assert types[:1] == (["UPGRADE_REQUEST" if client else "UPGRADE_RESPONSE"] if got else [])


# ----------------------------------------------------------------------------- real peers through the proxy


def client(address: str, *args: str) -> tuple[int, dict, str]:
    result = run_cli("tremor", "mock-client", "--format", "json", "--connect", address, *args, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary (exit {result.returncode}): {result.stdout}\n{result.stderr}"
    return result.returncode, json.loads(lines[-1]), result.stderr


def proxied(tmp_path: Path, client_args: tuple[str, ...], *proxy_args: str):
    """mock-client -> proxy -> mock-node: the client's summary, the node's stats, the proxy's end."""
    recording = tmp_path / "proxy.pcap"
    with Server("tremor", "mock-node", "--port", "0", "--format", "json") as node:
        with Server(
            "proxy", "--listen", "127.0.0.1:0", "--upstream", node.address, "--record", str(recording),
            *proxy_args,
        ) as proxy:  # fmt: skip
            ran = client(proxy.address, *client_args)
            proxy_end = proxy.stop()
        code, out, err = node.stop()
    assert code == 0, err
    return ran, json.loads(out.splitlines()[-1]), proxy_end, recording


def proxy_summary_is_dissects(stdout: str, recording: Path) -> None:
    """What the proxy printed after its ready line is ``dissect --summary`` of its own recording."""
    dissected = run_cli("dissect", str(recording), "--summary")
    assert dissected.returncode == 0, dissected.stderr
    assert stdout.split("\n", 1)[1].strip() == dissected.stdout.strip()


@pytest.mark.e2e
def test_the_mock_client_through_the_proxy_to_the_mock_node(tmp_path):
    (code, summary, err), node, (pcode, stdout, stderr), recording = proxied(
        tmp_path, ("--messages", "300", "--window", "16")
    )
    assert code == 0, err
    assert summary["ok"] and summary["echoes"] == 300 and summary["delivered"] == 10
    assert node["sessions"] == 1 and node["violations"] == 0
    assert pcode == 0, stderr
    assert "violation" not in stderr.lower() and "fault" not in stderr.lower()
    proxy_summary_is_dissects(stdout, recording)
    assert re.findall(r"^violations +(\d+)", stdout, re.M) == ["0"]


@pytest.mark.e2e
def test_a_close_injected_by_the_proxy_reaches_the_client_with_its_status():
    rule = "close status=4001 reason=overloaded type=echo"
    with Server("tremor", "mock-node", "--port", "0", "--format", "json") as node:
        with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", node.address, "--fault", rule) as proxy:
            client = MockClient(proxy.host, proxy.port, timeout=60)
            client.connect()
            client.send({"tremor": {"connect": {"protocol": "echo"}}})
            client.settle()
            client.send({"echo": "beep"})
            client.settle()  # returns once the close came instead of the echo
            client.close()
            _, stdout, stderr = proxy.stop()
        code, out, err = node.stop()
    # The client: its session's two control replies, then a close 4001 where the echo was due.
    assert client.closed_by_server == 4001
    assert client.received == 2 and client.session.expects().text == "the server's echo on 'echo'"
    # The node: both messages taken and answered, then the client's close (its answer to 4001).
    assert code == 0, err
    stats = json.loads(out.splitlines()[-1])
    assert (stats["messages_in"], stats["messages_out"], stats["violations"]) == (2, 3, 0)
    # The proxy: where it acted, and each side's close frames as that side saw them.
    faults = [line for line in stderr.splitlines() if " fault " in line]
    assert len(faults) == 1, stderr
    assert re.search(
        r"fault close at upstream→client frame \d+ echo: the frame not forwarded, then a WebSocket close of "
        r"status 4001 \(14 bytes\) sent to the client",
        faults[0],
    )
    client_side, upstream_side = re.findall(r"^close frames +(.*?) *$", stdout, re.M)
    assert client_side.startswith("server 4001, client 4001") and upstream_side.startswith("client 4001")
    # The node's answer to the client's close may come before the proxy stops: on the client's
    # side it follows the injected close, and that side's rules would say so; nothing else is wrong.
    others = [line for line in stderr.splitlines() if " fault " not in line]
    assert all(line.endswith("server sent a frame after its close frame") for line in others), stderr
    assert re.search(rf"fault --fault '{rule}': matched 1, +applied 1", " ".join(stdout.split()))


def test_the_engine_finds_tremor_by_its_upgrade_and_sends_the_close_instead_of_an_echo():
    rules = faults.parse_rules(["close status=1011 type=echo"])
    engine = faults.ConnectionFaults(rules, upstream_port=45678)
    out = []
    for from_client, data in SESSION:
        out += [(s.to_upstream, s.data) for s in engine.feed(from_client, data) if type(s) is Send]
    assert engine.protocol == "tremor"
    # Everything as it came, but the node's echo: a close 1011 (03 f3) goes to the client instead.
    assert out == [
        (True, REQUEST),
        (False, RESPONSE),
        (False, VERSION),
        (True, CONNECT),
        (False, CONNECT_ACK),
        (True, BEEP),
        (False, b"\x88\x02\x03\xf3"),
    ]


def test_a_close_toward_the_node_is_the_rules_direction():
    rules = faults.parse_rules(["close direction=upstream type=echo status=1001"], protocol="tremor")
    engine = faults.ConnectionFaults(rules, "tremor")
    out = []
    for from_client, data in SESSION:
        out += [(s.to_upstream, s.data) for s in engine.feed(from_client, data) if type(s) is Send]
    to_node = out[5]
    assert to_node[0] and to_node[1][:2] == b"\x88\x82"  # the client's beep became its close, masked
    key = to_node[1][2:6]
    assert bytes(b ^ key[i] for i, b in enumerate(to_node[1][6:])) == b"\x03\xe9"
    assert out[6] == (False, BEEP_BACK)
