"""mock-worker end to end: a real worker process, hand-written connectors on raw sockets.

Every frame the tests send or expect is built here with ``struct`` from the spec's
tables (PROTOCOL-NOTES.md "Frame bodies"), never with the package's encoder, so
the worker is checked against the protocol and not against itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import signal
import socket
import struct
import time

import pytest
from support import Server, run_cli

from wallaroo_proto.protocols.wallaroo.frames import Message
from wallaroo_proto.protocols.wallaroo.worker import MockWorker, WorkerConfig

pytestmark = pytest.mark.timeout(60)

# --- frames by hand ------------------------------------------------------------------------


def sb(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def frame(type_byte: int, body: bytes = b"") -> bytes:
    return struct.pack(">I", 1 + len(body)) + bytes([type_byte]) + body


def hello(
    version: bytes = b"0.0.1", cookie: bytes = b"", program: bytes = b"hand", instance: bytes = b"i1"
) -> bytes:
    return frame(0, sb(version) + sb(cookie) + sb(program) + sb(instance))


def notify(stream_id: int, name: bytes, por: int = 0) -> bytes:
    return frame(3, struct.pack(">Q", stream_id) + sb(name) + struct.pack(">Q", por))


def message(stream_id: int, message_id: int, payload: bytes, key: bytes = b"", event_time: int = 0) -> bytes:
    return frame(5, struct.pack(">QQq", stream_id, message_id, event_time) + sb(key) + payload)


def eos(stream_id: int, message_id: int | None = None) -> bytes:
    tail = b"" if message_id is None else struct.pack(">Q", message_id)
    return frame(8, struct.pack(">Q", stream_id) + tail)


def ok_bytes(credits: int) -> bytes:
    return frame(1, struct.pack(">I", credits))


def notify_ack_bytes(success: int, stream_id: int, por: int) -> bytes:
    return frame(4, bytes([success]) + struct.pack(">QQ", stream_id, por))


def ack_bytes(credits: int, pairs: list[tuple[int, int]]) -> bytes:
    body = struct.pack(">II", credits, len(pairs)) + b"".join(struct.pack(">QQ", s, p) for s, p in pairs)
    return frame(6, body)


def error_bytes(reason: str) -> bytes:
    return frame(2, sb(reason.encode()))


class Connector:
    """A connector written by hand on a blocking socket."""

    def __init__(self, server: Server, timeout: float = 10) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=timeout)
        self.sent = bytearray()
        self.received = bytearray()

    def send(self, *frames: bytes) -> None:
        data = b"".join(frames)
        self.sent += data
        self.sock.sendall(data)

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        self.received += buf
        return bytes(buf)

    def read_frame(self) -> bytes:
        head = self._exactly(4)
        (length,) = struct.unpack(">I", head)
        return head + self._exactly(length)

    def read_until(self, type_byte: int) -> bytes:
        """Skip frames of other types (e.g. refill ACKs) until one of ``type_byte``."""
        for _ in range(100):
            raw = self.read_frame()
            if raw[4] == type_byte:
                return raw
        raise AssertionError(f"no frame of type {type_byte}")

    def error_reason(self) -> str:
        raw = self.read_until(2)
        (n,) = struct.unpack(">H", raw[5:7])
        return raw[7 : 7 + n].decode()

    def assert_closed(self) -> None:
        try:
            rest = self.sock.recv(4096)
        except ConnectionResetError:
            return
        assert rest == b"", f"expected the worker to close, got {rest!r}"

    def handshake(self, credits: int, **kwargs) -> None:
        self.send(hello(**kwargs))
        assert self.read_frame() == ok_bytes(credits)

    def close(self) -> None:
        self.sock.close()


def stop_json(server: Server) -> dict:
    code, out, err = server.stop(signal.SIGTERM)
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


# --- the whole source protocol, byte for byte ---------------------------------------------------


def test_session_exact_bytes_out_file_pcap_and_summary(tmp_path) -> None:
    out, pcap = tmp_path / "out.jsonl", tmp_path / "session.pcap"
    args = ["--credits", "10", "--refill-at", "5", "--checkpoint-every", "3", "--checkpoint-ms", "0"]
    server = Server(
        "mock-worker", "--port", "0", *args, "--out", str(out), "--record", str(pcap), "--format", "json"
    )
    with server:
        c = Connector(server)
        c.send(hello())
        assert c.read_frame() == b"\x00\x00\x00\x05\x01\x00\x00\x00\x0a"  # OK, 10 credits
        c.send(notify(7, b"alpha"))
        assert c.read_frame() == b"\x00\x00\x00\x12\x04\x01" + b"\x00" * 7 + b"\x07" + b"\x00" * 8
        c.send(
            message(7, 0, b"hello", key=b"k", event_time=1000),
            message(7, 1, b"\xff\x00", event_time=-5),
            message(7, 2, "h\u00e9".encode(), key=b"\x80"),
        )
        # Checkpoint after 3 messages: ACK 0 credits, (stream 7, point_of_ref = the last id held, 2).
        assert c.read_frame() == (
            b"\x00\x00\x00\x19\x06\x00\x00\x00\x00\x00\x00\x00\x01" + struct.pack(">QQ", 7, 2)
        )
        # NOTIFY + 4 messages spend 5 of 10 credits: refill ACK tops up by 5, no checkpoint news.
        c.send(message(7, 3, b"four"))
        assert c.read_frame() == b"\x00\x00\x00\x09\x06\x00\x00\x00\x05\x00\x00\x00\x00"
        c.send(message(7, 2, b"replayed"))  # not above the last seen: dropped
        c.send(eos(7, 3))
        assert c.read_frame() == ack_bytes(0, [(7, 3)])

        # The stream may be reopened, on another connection, from the checkpointed point.
        d = Connector(server)
        d.handshake(10, instance=b"i2")
        d.send(notify(7, b"alpha", 0))
        assert d.read_frame() == notify_ack_bytes(1, 7, 3)
        d.send(message(7, 4, b"five"), eos(7))  # shipped EOS form (no message id)
        assert d.read_frame() == ack_bytes(0, [(7, 4)])
        c.close()
        d.close()
        summary = stop_json(server)

    assert summary["messages"] == 5
    assert summary["replays_dropped"] == 1
    assert summary["eos"] == 2
    assert summary["violations"] == 0
    assert summary["streams"] == [
        {
            "stream_id": 7,
            "name": "alpha",
            "delivered": 5,
            "replays": 1,
            "last_seen": 4,
            "point_of_ref": 4,
            "held_by": None,
        }
    ]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [
        {"stream_id": 7, "message_id": 0, "event_time": 1000, "key": "k", "payload": "hello"},
        {"stream_id": 7, "message_id": 1, "event_time": -5, "key": None, "payload_base64": "/wA="},
        {"stream_id": 7, "message_id": 2, "event_time": 0, "key_base64": "gA==", "payload": "h\u00e9"},
        {"stream_id": 7, "message_id": 3, "event_time": 0, "key": None, "payload": "four"},
        {"stream_id": 7, "message_id": 4, "event_time": 0, "key": None, "payload": "five"},
    ]
    assert base64.b64decode(lines[1]["payload_base64"]) == b"\xff\x00"

    # The recording holds both directions of both connections, byte for byte.
    from scapy.all import TCP, rdpcap

    packets = rdpcap(str(pcap))
    server_port = server.port
    to_worker: dict[int, bytes] = {}
    from_worker: dict[int, bytes] = {}
    for p in packets:
        tcp = p[TCP]
        payload = bytes(tcp.payload)
        if tcp.dport == server_port:
            to_worker[tcp.sport] = to_worker.get(tcp.sport, b"") + payload
        else:
            from_worker[tcp.dport] = from_worker.get(tcp.dport, b"") + payload
    assert sorted(to_worker.values()) == sorted([bytes(c.sent), bytes(d.sent)])
    assert sorted(from_worker.values()) == sorted([bytes(c.received), bytes(d.received)])


@pytest.mark.parametrize(
    ("args", "hello_kwargs", "reason"),
    [
        ([], {"version": b"0.0.2"}, "Unknown protocol version: 0.0.2"),
        (["--version", "v7"], {}, "Unknown protocol version: 0.0.1"),
        (["--cookie", "secret"], {"cookie": b"secreT"}, "Bad cookie"),
        ([], {"cookie": b"unexpected"}, "Bad cookie"),
    ],
)
def test_handshake_refused_with_error_then_close(args, hello_kwargs, reason) -> None:
    with Server("mock-worker", "--port", "0", *args) as server:
        c = Connector(server)
        c.send(hello(**hello_kwargs))
        assert c.read_frame() == error_bytes(reason)
        c.assert_closed()


def test_cookie_accepted() -> None:
    with Server("mock-worker", "--port", "0", "--cookie", "secret", "--credits", "3") as server:
        c = Connector(server)
        c.handshake(3, cookie=b"secret")


def test_second_connections_notify_on_a_held_stream_is_refused() -> None:
    with Server("mock-worker", "--port", "0", "--checkpoint-ms", "0") as server:
        a, b = Connector(server), Connector(server)
        a.handshake(100)
        b.handshake(100)
        a.send(notify(5, b"shared", 0))
        assert a.read_frame() == notify_ack_bytes(1, 5, 0)
        a.send(message(5, 0, b"x"))
        b.send(notify(5, b"shared", 0))
        assert b.read_frame() == b"\x00\x00\x00\x12\x04\x00" + struct.pack(">QQ", 5, 0)
        # Refused means refused: MESSAGE on it is a violation for b only.
        b.send(message(5, 1, b"y"))
        assert b.error_reason().startswith("Bad/unregistered stream_id 5 with message_id 1")
        b.assert_closed()
        a.send(message(5, 1, b"x2"), eos(5))
        assert a.read_until(6) == ack_bytes(0, [(5, 1)])
        # Released by EOS: a third connection may take it and resumes after message 1.
        c = Connector(server)
        c.handshake(100)
        c.send(notify(5, b"shared", 0))
        assert c.read_frame() == notify_ack_bytes(1, 5, 1)


# --- violations: ERROR for the offender, the others carry on -------------------------------------

# Each case is a list of sends; the worker answers every send but the last with one frame
# (OK, NOTIFY_ACK), and the last with ERROR. Bytes in one send arrive in one read, so the worker
# sees them before it could have answered the first: a NOTIFY and a MESSAGE sent together are
# a MESSAGE before the NOTIFY_ACK.
VIOLATIONS = [
    ("unknown stream", [hello(), message(99, 1, b"x")], "Bad/unregistered stream_id 99 with message_id 1"),
    (
        "message after refused notify",
        [hello(), notify(13, b"forbidden-topic"), message(13, 0, b"x")],
        "Bad/unregistered stream_id 13 with message_id 0 (stream is Closed",
    ),
    (
        "message before notify_ack",
        [hello(), notify(31, b"eager") + message(31, 0, b"x")],
        "Bad/unregistered stream_id 31 with message_id 0 (stream is Notify-Sent",
    ),
    ("notify before ok", [hello() + notify(32, b"n")], "NOTIFY before the handshake completed with OK"),
    ("message before hello", [message(1, 1, b"x")], "MESSAGE before HELLO"),
    ("hello twice", [hello(), hello()], "HELLO in state Streaming: the handshake happens once"),
    (
        "ok from connector",
        [hello(), frame(1, struct.pack(">I", 5))],
        "Invalid message: OK may only be sent by the worker",
    ),
    (
        "ack from connector",
        [hello(), ack_bytes(1, [])],
        "Invalid message: ACK may only be sent by the worker",
    ),
    (
        "restart from connector",
        [hello(), frame(7)],
        "Invalid message: RESTART may only be sent by the worker",
    ),
    (
        "eos on unknown stream",
        [hello(), eos(77)],
        "EOS_MESSAGE for stream 77, which is not open (never notified)",
    ),
    (
        "oversize frame",
        [hello(), struct.pack(">IB", 2000, 5) + b"x" * 100],
        "length prefix 2000 exceeds the maximum frame size 1024",
    ),
    ("unknown frame type", [hello(), frame(99, b"zz")], "unknown frame type 99"),
    ("garbage", [b"GET / HTTP/1.1\r\n\r\n"], "exceeds the maximum frame size 1024"),
    ("malformed notify", [hello(), frame(3, b"\x00\x01")], "Invalid frame: frame #1 (NOTIFY)"),
]


@pytest.fixture(scope="module")
def strict_worker():
    args = ["--max-frame-size", "1024", "--reject-streams", "^forbidden", "--checkpoint-ms", "0"]
    with Server("mock-worker", "--port", "0", *args) as server:
        yield server


@pytest.mark.parametrize(("name", "frames", "reason"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_violation_gets_error_and_close_while_another_connection_streams(strict_worker, name, frames, reason):
    server = strict_worker
    good = Connector(server)
    good.handshake(100)
    stream = 1000 + VIOLATIONS.index((name, frames, reason))
    good.send(notify(stream, b"good"))
    assert good.read_frame() == notify_ack_bytes(1, stream, 0)
    good.send(*(message(stream, i, b"m") for i in range(5)))

    bad = Connector(server)
    for step in frames[:-1]:
        bad.send(step)
        assert bad.read_frame()[4] in (1, 4)  # OK or NOTIFY_ACK
    bad.send(frames[-1])
    got = bad.error_reason()
    assert reason in got, got
    bad.assert_closed()

    # The good connection was untouched: it goes on and its EOS acknowledges all 10 messages.
    good.send(*(message(stream, i, b"m") for i in range(5, 10)), eos(stream))
    assert good.read_until(6) == ack_bytes(0, [(stream, 9)])
    good.close()


def test_no_credits_is_a_violation_when_strict_and_counted_by_default() -> None:
    # The refill ACK is held back 3 s, so the 4th frame surely arrives with no credit left.
    args = ["--credits", "3", "--refill-at", "0", "--ack-delay", "3000", "--checkpoint-ms", "0"]
    with Server("mock-worker", "--port", "0", *args, "--strict-credits") as strict:
        c = Connector(strict)
        c.handshake(3)
        c.send(notify(1, b"s"))
        assert c.read_frame() == notify_ack_bytes(1, 1, 0)
        c.send(message(1, 0, b"a"), message(1, 1, b"b"), message(1, 2, b"c"))
        assert c.error_reason() == "MESSAGE sent with no credits left"
        c.assert_closed()
        summary = stop_json_text(strict)
        assert "violations 1" in summary
    with Server("mock-worker", "--port", "0", *args, "--format", "json") as lenient:
        c = Connector(lenient)
        c.handshake(3)
        c.send(notify(1, b"s"))
        assert c.read_frame() == notify_ack_bytes(1, 1, 0)
        c.send(message(1, 0, b"a"), message(1, 1, b"b"), message(1, 2, b"c"), eos(1))
        # The held ACK: refill to 3 from an overdraft (core counts 0 left) and the EOS point.
        assert c.read_frame() == ack_bytes(3, [(1, 2)])
        c.close()
        summary = stop_json(lenient)
        assert (summary["messages"], summary["violations"], summary["credit_overdraft"]) == (3, 0, 2)


def stop_json_text(server: Server) -> str:
    code, out, err = server.stop(signal.SIGTERM)
    assert code == 0, err
    return out


# --- fault injection ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], b"\x00\x00\x00\x01\x07"),  # the spec's empty RESTART
        (["--restart-address", "127.0.0.1:7101"], b"\x00\x00\x00\x13\x07\x00\x00\x00\x0e127.0.0.1:7101"),
    ],
)
def test_restart_after_n_messages(args, expected) -> None:
    with Server(
        "mock-worker", "--port", "0", "--restart-after", "3", "--checkpoint-ms", "0", *args
    ) as server:
        c = Connector(server)
        c.handshake(100)
        c.send(notify(4, b"r"))
        assert c.read_frame() == notify_ack_bytes(1, 4, 0)
        c.send(*(message(4, i, b"p") for i in range(6)))
        assert c.read_until(7) == expected
        c.assert_closed()
        # Reconnect: the stream was released; nothing checkpointed yet, so resume from 0 and
        # the worker drops the three it already delivered.
        d = Connector(server)
        d.handshake(100)
        d.send(notify(4, b"r"))
        assert d.read_frame() == notify_ack_bytes(1, 4, 0)
        d.send(*(message(4, i, b"p") for i in range(6)))
        assert d.read_until(7) == expected  # 3 replays (not counted), then 3 new
        code, out, err = server.stop()
    assert code == 0, err


def test_drop_connection_after_n_messages_and_reject_by_id() -> None:
    args = [
        "--drop-connection-after",
        "2",
        "--drop-times",
        "1",
        "--reject-streams",
        "8,9",
        "--checkpoint-ms",
        "0",
        "--format",
        "json",
    ]
    with Server("mock-worker", "--port", "0", *args) as server:
        c = Connector(server)
        c.handshake(100)
        c.send(notify(9, b"nine", 3))
        assert c.read_frame() == notify_ack_bytes(0, 9, 3)
        c.send(notify(1, b"one"))
        assert c.read_frame() == notify_ack_bytes(1, 1, 0)
        c.send(message(1, 0, b"a"), message(1, 1, b"b"), message(1, 2, b"c"))
        with pytest.raises((EOFError, ConnectionResetError)):
            c.read_frame()  # aborted: no ERROR, no RESTART
        # --drop-times 1: the next connection is not dropped, however much it delivers.
        d = Connector(server)
        d.handshake(100)
        d.send(notify(3, b"three"))
        assert d.read_frame() == notify_ack_bytes(1, 3, 0)
        d.send(*(message(3, i, b"p") for i in range(1, 6)), eos(3, 6))
        assert d.read_frame()  # its final ACK: 5 messages delivered and still connected
        summary = stop_json(server)
    assert summary["dropped_connections"] == 1
    assert summary["notify_refused"] == 1
    assert summary["errors"] == []


def test_connection_cap_handshake_and_idle_timeouts() -> None:
    args = ["--max-connections", "1", "--handshake-timeout", "0.5", "--idle-timeout", "1", "--format", "json"]
    with Server("mock-worker", "--port", "0", *args) as server:
        silent = Connector(server)
        time.sleep(0.1)  # let the worker register it before the second one arrives
        extra = Connector(server)
        assert extra.read_frame() == error_bytes("too many connections")
        extra.assert_closed()
        assert silent.read_frame() == error_bytes("handshake timeout: no HELLO within 0.5s")
        silent.assert_closed()
        idle = Connector(server)
        idle.handshake(100)
        assert idle.read_frame() == error_bytes("idle timeout: nothing received for 1s")
        idle.assert_closed()
        summary = stop_json(server)
    assert summary["refused_connections"] == 1
    assert summary["timeouts"] == 2
    assert [e["reason"] for e in summary["errors"]] == [
        "too many connections",
        "handshake timeout: no HELLO within 0.5s",
        "idle timeout: nothing received for 1s",
    ]


# --- durability --------------------------------------------------------------------------------------


def test_state_survives_kill_9_and_the_restarted_worker_resumes_connectors(tmp_path) -> None:
    state, out = tmp_path / "state.json", tmp_path / "out.jsonl"
    args = ["--state", str(state), "--checkpoint-every", "5", "--checkpoint-ms", "0", "--format", "json"]
    args += ["--out", str(out)]
    with Server("mock-worker", "--port", "0", *args) as first:
        c = Connector(first)
        c.handshake(100)
        c.send(notify(11, b"durable", 0))
        assert c.read_frame() == notify_ack_bytes(1, 11, 0)
        c.send(*(message(11, i, b"x") for i in range(10)))
        seen = []
        while 9 not in seen:  # checkpoint ACKs may be coalesced
            raw = c.read_until(6)
            seen += [p for s, p in struct.iter_unpack(">QQ", raw[13:]) if s == 11]
        c.send(*(message(11, i, b"x") for i in range(10, 13)))  # perhaps delivered, never checkpointed
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    doc = json.loads(state.read_text())
    assert doc["streams"] == [{"stream_id": 11, "name": "durable", "point_of_ref": 9}]
    assert doc["out"] == {"path": str(out.resolve()), "bytes": out.stat().st_size}
    # Lines a killed worker wrote after its last checkpoint must not survive: they come again.
    with open(out, "a") as f:
        f.write('{"stream_id":11,"message_id":10,"event_time":0,"key":null,"payload":"x"}\n')

    with Server("mock-worker", "--port", "0", *args) as second:
        c = Connector(second)
        c.handshake(100)
        c.send(notify(11, b"durable", 13))  # the connector's idea differs; the worker's wins
        assert c.read_frame() == notify_ack_bytes(1, 11, 9)
        c.send(message(11, 9, b"old"), *(message(11, i, b"x") for i in range(10, 13)), eos(11))
        assert c.read_until(6) == ack_bytes(0, [(11, 12)])
        summary = stop_json(second)
    assert (summary["messages"], summary["replays_dropped"]) == (3, 1)
    assert json.loads(state.read_text())["streams"][0]["point_of_ref"] == 12
    assert [json.loads(line)["message_id"] for line in out.read_text().splitlines()] == list(range(13))


def test_error_from_the_connector_is_logged_and_the_connection_closed() -> None:
    with Server("mock-worker", "--port", "0", "--format", "json") as server:
        c = Connector(server)
        c.handshake(100)
        c.send(notify(2, b"s"))
        assert c.read_frame() == notify_ack_bytes(1, 2, 0)
        c.send(error_bytes("cannot read my input"))
        c.assert_closed()
        # Its stream was released with the connection.
        d = Connector(server)
        d.handshake(100)
        d.send(notify(2, b"s"))
        assert d.read_frame() == notify_ack_bytes(1, 2, 0)
        summary = stop_json(server)
    assert summary["errors_received"] == [
        {"connection": 1, "peer": summary["errors_received"][0]["peer"], "reason": "cannot read my input"}
    ]
    assert summary["errors"] == []


def test_bad_state_file_is_a_usage_error(tmp_path) -> None:

    state = tmp_path / "state.json"
    state.write_text("{oops")
    result = run_cli("mock-worker", "--port", "0", "--state", str(state))
    assert result.returncode == 2
    assert "not valid JSON" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_a_usage_error() -> None:

    with Server("mock-worker", "--port", "0") as server:
        result = run_cli("mock-worker", "--port", str(server.port))
    assert result.returncode == 2
    assert "cannot listen on" in result.stderr


def test_sigint_also_shuts_down_cleanly_with_text_summary() -> None:
    with Server("mock-worker", "--port", "0") as server:
        c = Connector(server)
        c.handshake(100)
        code, out, err = server.stop(signal.SIGINT)
    assert code == 0, err
    assert "mock-worker summary: 0 messages delivered" in out
    assert "1 connections" in out


# --- the delivery hook: a slow consumer slows the connector down ---------------------------------------


@pytest.mark.timeout(90)
def test_slow_consumer_stops_the_worker_reading_instead_of_buffering() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        delivered: list[int] = []

        class Blocking:
            async def deliver(self, stream_id: int, msg: Message) -> None:
                delivered.append(msg.message_id)
                await gate.wait()

        worker = MockWorker(
            WorkerConfig(port=0, credits=1_000_000, checkpoint_ms=0, checkpoint_every=0),
            consumers=[Blocking()],
        )
        host, port = await worker.start()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(hello())
        assert await reader.readexactly(9) == ok_bytes(1_000_000)
        writer.write(notify(1, b"s"))
        assert await reader.readexactly(22) == notify_ack_bytes(1, 1, 0)
        payload = b"p" * 1000
        sent = 0
        # Push until the socket refuses more (drain blocks): the worker must have stopped reading.
        for i in range(200_000):
            writer.write(message(1, i, payload))
            sent += 1
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
            except TimeoutError:
                break
        else:
            raise AssertionError("the connector was never blocked")
        conn = next(iter(worker.connections.values()))
        read = conn.framed.bytes_in
        assert delivered == [0]
        assert read < 2 * 1024 * 1024, f"worker read {read} bytes while its consumer was stuck"
        assert sent * 1000 > read + 100_000
        gate.set()
        writer.write(eos(1))
        await writer.drain()
        raw = b""
        while True:  # the EOS ACK proves every message got through once the consumer moved
            head = await reader.readexactly(4)
            raw = head + await reader.readexactly(struct.unpack(">I", head)[0])
            if raw[4] == 6 and raw[9:13] == b"\x00\x00\x00\x01":
                break
        assert raw == ack_bytes(0, [(1, sent - 1)])
        assert len(delivered) == sent
        writer.close()
        await worker.close()

    asyncio.run(scenario())


@pytest.mark.timeout(90)
def test_a_failing_consumer_gets_the_connector_an_error_not_a_silent_loss() -> None:
    async def scenario() -> None:
        class Broken:
            async def deliver(self, stream_id: int, msg: Message) -> None:
                if msg.message_id == 2:
                    raise OSError("sink unreachable")

        worker = MockWorker(WorkerConfig(port=0, checkpoint_ms=0), consumers=[Broken()])
        host, port = await worker.start()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(hello())
        assert await reader.readexactly(9) == ok_bytes(100)
        writer.write(notify(3, b"s"))
        assert await reader.readexactly(22) == notify_ack_bytes(1, 3, 0)
        writer.write(b"".join(message(3, i, b"x") for i in range(4)))
        reason = "worker cannot deliver message 2 of stream 3: sink unreachable"
        assert await reader.read() == error_bytes(reason)  # then EOF
        assert worker.registry.streams[3].last_seen == 1  # the failed message is not counted as seen
        writer.close()
        await worker.close()

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_out_to_a_fifo_checkpoints_and_shuts_down_cleanly(tmp_path) -> None:
    """--out into a pipe: nothing to fsync or cut back, so checkpoints, the EOS ACK, shutdown and a
    restart from --state still work."""
    import os
    import threading

    fifo, state = tmp_path / "out.fifo", tmp_path / "state.json"
    os.mkfifo(fifo)
    for run, first_id in enumerate((1, 3)):
        lines: list[bytes] = []

        def drain(lines=lines) -> None:
            with open(fifo, "rb") as f:
                lines.extend(f)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        args = ("--out", str(fifo), "--state", str(state), "--format", "json")
        with Server("mock-worker", "--port", "0", *args) as server:
            conn = Connector(server)
            conn.handshake(100)
            conn.send(notify(1, b"s"))
            assert conn.read_frame() == notify_ack_bytes(1, 1, first_id - 1)
            conn.send(message(1, first_id, b"a"), message(1, first_id + 1, b"b"), eos(1, first_id + 1))
            assert conn.read_until(6) == ack_bytes(0, [(1, first_id + 1)])  # the EOS ACK needs a checkpoint
            conn.close()
            summary = stop_json(server)
        reader.join(timeout=30)
        assert summary["messages"] == 2, f"run {run}"
        assert summary["errors"] == []
        assert len(lines) == 2
    assert "out" not in json.loads(state.read_text())  # a pipe's length is no position


@pytest.mark.timeout(180)
def test_a_connector_that_stops_reading_is_aborted_and_frees_its_streams() -> None:
    """It must not hold its streams, its slot or the worker's shutdown forever."""
    import threading

    args = ("--credits", "1000000", "--write-timeout", "1", "--format", "json")
    with Server("mock-worker", "--port", "0", *args) as server:
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # and it never reads
        stuck.connect((server.host, server.port))
        stuck.sendall(hello())
        assert stuck.recv(9, socket.MSG_WAITALL) == ok_bytes(1000000)  # the last read it ever does
        stuck.sendall(notify(1, b"held"))

        def flood() -> None:
            # NOTIFY_ACKs pile up unread in the worker's socket; it aborts, and sendall fails. Only
            # that ends the flood: a bounded one can end first on a loaded machine, the worker still
            # waiting out its write timeout.
            with contextlib.suppress(OSError):
                for stream_id in itertools.count(2):
                    stuck.sendall(notify(stream_id, b"x"))

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        flooder.join(timeout=120)  # a deadline for a slow, loaded machine: it takes about 1 s
        assert not flooder.is_alive(), "the worker never aborted the connection that stopped reading"
        assert stuck.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 7  # TCP_CLOSE: reset

        other = Connector(server)
        other.handshake(1000000)
        other.send(notify(1, b"held"))
        assert other.read_frame() == notify_ack_bytes(1, 1, 0)  # released by the aborted connection
        other.close()
        stuck.close()
        summary = stop_json(server)
    assert summary["timeouts"] == 1
    [stalled] = [e for e in summary["errors"] if e["kind"] == "stalled"]
    assert "read nothing of our frames for 1 s" in stalled["reason"]


def test_an_unwritable_state_file_is_refused_at_start(tmp_path) -> None:
    result = run_cli("mock-worker", "--port", "0", "--state", str(tmp_path / "no-such-dir" / "state.json"))
    assert result.returncode == 2
    assert "cannot write --state" in result.stderr
    assert "No such file or directory" in result.stderr


def test_notify_twice_on_one_connection_is_refused_like_the_shipped_worker() -> None:
    """PROTOCOL-NOTES: a NOTIFY for a stream already pending or active gets NOTIFY_ACK 0."""
    with Server("mock-worker", "--port", "0") as server:
        conn = Connector(server)
        conn.handshake(100)
        conn.send(notify(21, b"n"))
        assert conn.read_frame() == notify_ack_bytes(1, 21, 0)
        conn.send(notify(21, b"n"))
        assert conn.read_frame() == notify_ack_bytes(0, 21, 0)
        conn.send(message(21, 0, b"still open"), eos(21, 0))
        assert conn.read_until(6) == ack_bytes(0, [(21, 0)])
        conn.close()


def test_streams_per_connection_are_capped() -> None:
    with Server("mock-worker", "--port", "0", "--max-streams", "2") as server:
        conn = Connector(server)
        conn.handshake(100)
        for stream_id in (1, 2):
            conn.send(notify(stream_id, b"s"))
            assert conn.read_frame() == notify_ack_bytes(1, stream_id, 0)
        conn.send(notify(3, b"s"))
        assert conn.error_reason() == "too many streams on one connection (limit 2)"
        conn.assert_closed()


@pytest.mark.timeout(60)
def test_eos_during_a_checkpoint_gets_its_final_ack_at_the_last_id() -> None:
    """A checkpoint under way when EOS arrives covers part of the stream: its ACK is not the final one."""

    async def scenario() -> None:
        gate = asyncio.Event()
        syncing = asyncio.Event()

        class SlowSync:
            async def deliver(self, stream_id: int, msg: Message) -> None:
                pass

            async def sync(self) -> None:
                if not gate.is_set():
                    syncing.set()
                    await gate.wait()

        worker = MockWorker(
            WorkerConfig(port=0, checkpoint_ms=0, checkpoint_every=0, refill_at=0), consumers=[SlowSync()]
        )
        host, port = await worker.start()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(hello())
        assert await reader.readexactly(9) == ok_bytes(100)
        writer.write(notify(3, b"s"))
        assert await reader.readexactly(22) == notify_ack_bytes(1, 3, 0)
        writer.write(b"".join(message(3, i, b"m") for i in range(1, 6)))
        registry = worker.registry.streams
        while 3 not in registry or registry[3].last_seen != 5:
            await asyncio.sleep(0.01)
        first = asyncio.create_task(worker.checkpoint())  # covers 1..5, then waits in sync()
        await syncing.wait()
        writer.write(b"".join(message(3, i, b"m") for i in range(6, 8)) + eos(3))
        conn = next(iter(worker.connections.values()))
        while 3 not in conn._eos_pending:
            await asyncio.sleep(0.01)
        gate.set()
        await first
        acks = []
        while (3, 7) not in acks:
            head = await asyncio.wait_for(reader.readexactly(4), 30)
            body = await reader.readexactly(struct.unpack(">I", head)[0])
            assert body[0] == 6, body
            acks += list(struct.iter_unpack(">QQ", body[9:]))
        # The first checkpoint's ACK (5) may be coalesced into the last; none goes past 7.
        assert acks[-1] == (3, 7) and set(acks) <= {(3, 5), (3, 7)}
        writer.close()
        await worker.close()

    asyncio.run(scenario())


def test_an_out_file_shorter_than_its_checkpoint_is_refused(tmp_path) -> None:
    state, out = tmp_path / "state.json", tmp_path / "out.jsonl"
    doc = {"format": "wallaroo-proto mock-worker state", "version": 2, "checkpoints": 1, "streams": []}
    doc["out"] = {"path": str(out.resolve()), "bytes": 500}
    state.write_text(json.dumps(doc))
    out.write_text("short\n")
    result = run_cli("mock-worker", "--port", "0", "--no-live", "--state", str(state), "--out", str(out))
    assert result.returncode == 2
    assert f"--out {out} holds 6 bytes, but the --state checkpoint says 500 were written" in result.stderr
    assert "Traceback" not in result.stderr


# --- the command-line grammar (docs/cli.md) -------------------------------------------------------


def test_the_grammars_words_listen_output_and_protocol_version(tmp_path) -> None:
    out = tmp_path / "delivered.jsonl"
    args = ["--listen", "127.0.0.1:0", "-o", str(out), "--protocol-version", "0.0.9", "--checkpoint-ms", "0"]
    with Server("mock-worker", *args, "--format", "json") as server:
        c = Connector(server)
        c.handshake(100, version=b"0.0.9")
        c.send(notify(1, b"one"))
        assert c.read_frame() == notify_ack_bytes(1, 1, 0)
        c.send(message(1, 0, b"hello"))
        c.close()
        summary = stop_json(server)
    assert summary["messages"] == 1
    assert json.loads(out.read_text())["payload"] == "hello"


def test_an_address_in_use_is_named_as_host_port_with_the_reason() -> None:
    with Server("mock-worker", "--listen", ":0") as server:
        result = run_cli("mock-worker", "--listen", f"127.0.0.1:{server.port}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"wallaroo-proto mock-worker: cannot listen on 127.0.0.1:{server.port}: Address already in use"
    )


def test_an_output_path_through_a_file_says_what_is_wrong(tmp_path) -> None:
    (tmp_path / "five.txt").write_text("a file\n")
    result = run_cli("mock-worker", "--listen", ":0", "-o", str(tmp_path / "five.txt" / "out.jsonl"))
    assert result.returncode == 2
    assert "a part of that path is a file where a folder is needed" in result.stderr
    assert "File exists" not in result.stderr and "Not a directory" not in result.stderr


@pytest.mark.e2e
def test_a_sink_never_reached_is_one_line_and_a_bounded_wait() -> None:
    with socket.socket() as bound:  # bound, never listening: a connection to it is refused
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        result = run_cli(
            "mock-worker", "--listen", ":0", "--sink-connect", f"127.0.0.1:{port}", "--sink-wait", "2",
            "--no-live", timeout=60,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"wallaroo-proto mock-worker: sink: cannot connect to the sink at 127.0.0.1:{port}: "
        "Connection refused (retrying for up to 2 s)",
        f"wallaroo-proto mock-worker: stopped: sink: cannot connect to the sink at 127.0.0.1:{port}: "
        "Connection refused (tried for 2 s)",
    ]
    assert "None" not in result.stdout


def test_a_fault_that_never_fired_is_said() -> None:
    with Server("mock-worker", "--listen", ":0", "--restart-after", "1000", "--checkpoint-ms", "0") as server:
        c = Connector(server)
        c.handshake(100)
        c.send(notify(1, b"one"))
        assert c.read_frame() == notify_ack_bytes(1, 1, 0)
        c.send(*(message(1, i, b"p") for i in range(3)))
        c.close()
        code, _out, err = server.stop()
    assert code == 0, err
    assert (
        "wallaroo-proto mock-worker: --restart-after 1000 never fired: no connection delivered 1,000 "
        "messages (3 delivered in all)"
    ) in err


def test_out_resumes_at_the_checkpointed_length_only_when_the_state_knows_the_file(tmp_path) -> None:
    """``Registry.resume_out``: the rule that keeps --out free of lines delivered again."""
    from wallaroo_proto.protocols.wallaroo.registry import Registry

    out = tmp_path / "out.jsonl"
    out.write_bytes(b"x" * 100)
    registry = Registry()
    assert registry.resume_out(str(tmp_path / "absent.jsonl")) is None  # nothing to resume
    assert registry.resume_out(str(out)) is None  # no state at all: the file starts afresh
    registry.notify(1, b"s", owner="c")
    assert registry.resume_out(str(out)) == 100  # a state that never saw this file: appended to
    registry.out = {"path": str(out.resolve()), "bytes": 60}
    assert registry.resume_out(str(out)) == 60  # the checkpointed length
    assert registry.out is None  # from now on this run's checkpoints say
    registry.out = {"path": str(tmp_path / "other.jsonl"), "bytes": 60}
    assert registry.resume_out(str(out)) == 100
    registry.out = {"path": str(out.resolve()), "bytes": 60}
    assert registry.resume_out(None) is None  # a run with no --out: the earlier run's mark is stale
    assert registry.out is None


def test_the_faults_asked_for_that_never_fired_are_named_by_their_options() -> None:
    config = WorkerConfig(restart_after=1000, drop_connection_after=5)
    summary = {"messages": 1234, "restarts_sent": 0, "dropped_connections": 1}
    assert config.faults_not_fired(summary) == [
        "--restart-after 1000 never fired: no connection delivered 1,000 messages (1,234 delivered in all)"
    ]
    assert WorkerConfig().faults_not_fired({**summary, "dropped_connections": 0}) == []
