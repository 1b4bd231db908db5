"""The mock producer against hostile and odd peers, in process over loopback: refusals, bounds, timeouts.

Requests are written by hand (24-byte header: magic, opcode, key length, extras length,
datatype, vbucket, body length, opaque, cas; then extras, key, value), and answers are
read by hand from their headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time

import pytest

from wallaroo_proto.protocols.dcp.producer import (
    MAX_SEND_QUEUE,
    MockProducer,
    ProducerConfig,
    parse_stream_end,
)
from wallaroo_proto.protocols.dcp.store import Bucket

HEADER = struct.Struct(">BBHBBHIIQ")
EINVAL, SUCCESS = 0x04, 0x00


def req(
    opcode: int, opaque: int, extras: bytes = b"", key: bytes = b"", value: bytes = b"", vb: int = 0
) -> bytes:
    body = extras + key + value
    return HEADER.pack(0x80, opcode, len(key), len(extras), 0, vb, len(body), opaque, 0) + body


#: DCP_OPEN "c" as a producer: extras seqno 0, flags 1.
OPEN = req(0x50, 1, bytes(4) + b"\x00\x00\x00\x01", b"c")


def control(key: str, value: str, opaque: int) -> bytes:
    return req(0x5E, opaque, key=key.encode(), value=value.encode())


def stream_req(vb: int, opaque: int, start: int = 0, end: int = 2**64 - 1) -> bytes:
    """Flags 0, reserved 0, start, end, vbucket uuid 0, snapshot start and end = start."""
    return req(0x53, opaque, struct.pack(">IIQQQQQ", 0, 0, start, end, 0, start, start), vb=vb)


class Peer:
    """A raw client: write bytes, read whole answers (header fields and body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def packet(self, timeout: float = 30) -> tuple[int, int, int, int, bytes]:
        """(magic, opcode, status, opaque, body) of the next packet."""
        head = await asyncio.wait_for(self.reader.readexactly(24), timeout)
        magic, opcode, _k, _e, _d, status, body, opaque, _c = HEADER.unpack(head)
        return magic, opcode, status, opaque, await asyncio.wait_for(self.reader.readexactly(body), timeout)

    async def answer(self, opaque: int, timeout: float = 30) -> tuple[int, int, bytes]:
        """(opcode, status, body) of the response with this opaque, skipping what comes before it."""
        while True:
            magic, opcode, status, got, body = await self.packet(timeout)
            if magic == 0x81 and got == opaque:
                return opcode, status, body

    async def closed(self, timeout: float = 30) -> bool:
        """True once the producer closed or reset the connection (reading what comes before)."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), timeout):
                pass
        except (ConnectionError, OSError):
            pass
        return True


@contextlib.asynccontextmanager
async def serving(vbuckets: int = 2, items: int = 0, data: Bucket | None = None, **config):
    bucket = data
    if bucket is None:
        bucket = Bucket.new(vbuckets, random.Random(7))
        bucket.generate(items, random.Random(7), 20, 64)
    lines: list[str] = []
    producer = MockProducer(ProducerConfig(port=0, **config), bucket, lines.append)
    host, port = await producer.start()
    producer.lines = lines
    producer.address = (host, port)
    try:
        yield producer
    finally:
        await producer.stop()


async def connect(producer: MockProducer, rcvbuf: int | None = None) -> Peer:
    if rcvbuf is None:
        return Peer(*await asyncio.open_connection(*producer.address))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, producer.address)
    return Peer(*await asyncio.open_connection(sock=sock))


async def until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def run(coro) -> None:
    asyncio.run(coro)


# ------------------------------------------------------------------------------ lengths that do not add up


@pytest.mark.parametrize(
    "packet, opcode",
    [
        # DCP_CONTROL: key 50 + extras 4 in a 10-byte body.
        (bytes.fromhex("805e0032040000000000000a00000009") + bytes(8) + b"x" * 10, 0x5E),
        # Alt-magic DCP_STREAM_REQ: framing extras 200 + extras 48 in a 48-byte body.
        (bytes.fromhex("0853c800300000000000003000000009") + bytes(8) + bytes(48), 0x53),
    ],
    ids=["key-and-extras", "framing-extras"],
)
def test_a_packet_whose_parts_exceed_its_body_gets_einval_one_line_and_a_close(packet, opcode):
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(OPEN)
            assert (await peer.answer(1))[1] == SUCCESS
            await peer.send(packet)
            assert await peer.answer(9) == (opcode, EINVAL, b"")
            assert await peer.closed()
            await until(lambda: not producer.sessions)
            assert (
                len(producer.stats.violations) == 1
                and "exceed the body length" in producer.stats.violations[0]
            )
            assert len(producer.lines) == 1 and "at byte offset 33" in producer.lines[0]  # after OPEN

    run(main())


# ------------------------------------------------------------------------------ replies wait for the socket


def test_pipelined_requests_from_a_peer_that_never_reads_wait_for_the_socket():
    """2,000 GET_ALL_VB_SEQNOS (10 KiB answers each with 1,024 vbuckets) from a peer that reads nothing."""

    async def main():
        async with serving(vbuckets=1024, write_timeout=0) as producer:
            peer = await connect(producer, rcvbuf=4096)
            await peer.send(req(0x48, 5) * 2000)
            await until(lambda: producer.sessions)
            (session,) = producer.sessions
            buffered = session.writer.transport.get_write_buffer_size
            await until(lambda: buffered() >= MAX_SEND_QUEUE)
            for _ in range(20):  # let it go on as far as it would
                await asyncio.sleep(0.01)
            assert buffered() < MAX_SEND_QUEUE + 24 + 1024 * 10
            peer.writer.transport.abort()

    run(main())


# ------------------------------------------------------------------------- controls as the server judges them


@pytest.mark.parametrize(
    "key, value, status",
    [
        ("set_noop_interval", "nan", EINVAL),
        ("set_noop_interval", "inf", EINVAL),
        ("set_noop_interval", "-inf", EINVAL),
        ("set_noop_interval", "1e39", EINVAL),  # beyond a C float
        ("set_noop_interval", "0.05", EINVAL),  # under the connection manager's 0.1 s
        ("set_noop_interval", "5x", EINVAL),
        ("set_noop_interval", "1_0", EINVAL),  # Python's float() takes it, C's strtof does not
        ("set_noop_interval", " 2.5 and more", SUCCESS),  # strtof: leading spaces, stops at a space
        ("set_noop_interval", "0x10", SUCCESS),  # strtof reads hex floats
        ("set_noop_interval", "0.1", SUCCESS),
        ("connection_buffer_size", "4294967296", EINVAL),  # above u32
        ("connection_buffer_size", "-1", EINVAL),
        ("connection_buffer_size", "12ab", EINVAL),
        ("connection_buffer_size", "4294967295", SUCCESS),
        ("connection_buffer_size", "+100 ", SUCCESS),
        ("set_priority", "urgent", EINVAL),
        ("set_priority", "high", SUCCESS),
        ("enable_stream_id", "false", EINVAL),
        ("backfill_order", "random", EINVAL),
        ("stream_buffer_size", "100", 0x83),
        ("enable_sync_writes", "true", EINVAL),  # not done by this producer
        ("no_such_key", "true", EINVAL),
    ],
)
def test_controls_are_answered_as_the_server_judges_them(key, value, status):
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(OPEN + control(key, value, 2))
            assert (await peer.answer(2))[1] == status

    run(main())


def test_a_refused_noop_interval_leaves_the_noops_at_their_default():
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(OPEN + control("set_noop_interval", "nan", 2) + control("enable_noop", "true", 3))
            assert (await peer.answer(3))[1] == SUCCESS
            with pytest.raises(asyncio.TimeoutError):  # the default interval is 20 s
                await peer.packet(timeout=1)
            (session,) = producer.sessions
            assert session.noop_interval == 20.0

    run(main())


def test_a_buffer_size_with_spaces_sets_flow_control_as_the_server_reads_it():
    async def main():
        async with serving(items=50) as producer:
            peer = await connect(producer)
            await peer.send(OPEN + control("connection_buffer_size", " 200 ", 2) + stream_req(0, 3))
            assert (await peer.answer(3))[1] == SUCCESS
            (session,) = producer.sessions
            await until(lambda: session.conn.outstanding >= 200)
            assert session.conn.buffer_size == 200 and session.conn.outstanding < 200 + 24 + 31 + 64 + 64

    run(main())


# ------------------------------------------------------------------------------ DCP commands before DCP_OPEN


def test_a_stream_request_before_dcp_open_is_refused_and_the_connection_kept():
    async def main():
        async with serving(items=10) as producer:
            peer = await connect(producer)
            await peer.send(stream_req(0, 7) + control("enable_noop", "true", 8))
            assert await peer.answer(7) == (0x53, EINVAL, b"")
            assert await peer.answer(8) == (0x5E, EINVAL, b"")
            await peer.send(req(0x54, 9))  # GET_FAILOVER_LOG: taken on any connection
            opcode, status, body = await peer.answer(9)
            assert (opcode, status, len(body)) == (0x54, SUCCESS, 16)
            await peer.send(OPEN + stream_req(0, 10))
            assert (await peer.answer(10))[1] == SUCCESS
            assert producer.stats.streams == 1
            assert len(producer.stats.violations) == 2
            assert all("before DCP_OPEN" in v for v in producer.stats.violations)

    run(main())


# ------------------------------------------------------------------------------ write and idle timeouts


def test_a_peer_that_reads_nothing_of_its_stream_is_reset_after_the_write_timeout():
    async def main():
        async with serving(vbuckets=1, items=20000, write_timeout=0.5) as producer:
            peer = await connect(producer, rcvbuf=4096)
            await peer.send(OPEN + stream_req(0, 3))
            await until(lambda: producer.stats.timeouts == 1)
            await until(lambda: not producer.sessions)
            assert "read nothing of ours for 0.5 s" in producer.lines[-1]
            with pytest.raises((ConnectionError, OSError)):
                while await peer.reader.read(1 << 20):
                    pass

    run(main())


def test_a_peer_that_reads_slowly_is_not_reset():
    """Each read takes a little: progress, so no timeout however long the stream."""

    async def main():
        async with serving(vbuckets=1, items=3000, write_timeout=0.5) as producer:
            peer = await connect(producer, rcvbuf=4096)
            await peer.send(OPEN + stream_req(0, 3, end=3000))
            got = 0
            while True:
                magic, opcode, *_ = await peer.packet()
                got += opcode == 0x57
                if opcode == 0x55:
                    break
                await asyncio.sleep(0.0005)
            assert got > 0 and producer.stats.timeouts == 0

    run(main())


def test_a_silent_peer_with_noops_on_is_closed_after_the_idle_timeout_and_one_without_is_kept():
    async def main():
        async with serving(idle_timeout=0.5) as producer:
            quiet = await connect(producer)
            await quiet.send(OPEN)
            silent = await connect(producer)
            await silent.send(
                OPEN + control("enable_noop", "true", 2) + control("set_noop_interval", "60", 3)
            )
            assert await silent.closed()
            assert producer.stats.timeouts == 1 and "nothing received for 0.5 s" in producer.lines[-1]
            assert (await quiet.answer(1))[1] == SUCCESS
            with pytest.raises(asyncio.TimeoutError):  # memcached has no idle timeout of its own
                await quiet.packet(timeout=1.5)
            assert len(producer.sessions) == 1

    run(main())


# ------------------------------------------------------------------------------ refusals kept, as a data node


def test_a_validator_failure_and_an_unknown_opcode_keep_the_connection():
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(
                OPEN + req(0x5E, 2, b"\0\0\0\0", b"enable_noop", b"true") + req(0xEE, 3) + req(0x0B, 4)
            )
            assert (await peer.answer(2))[:2] == (0x5E, EINVAL)
            assert (await peer.answer(3))[:2] == (0xEE, 0x81)  # UNKNOWN_COMMAND
            assert (await peer.answer(4))[:2] == (0x0B, SUCCESS)  # VERSION: still served
            assert len(producer.stats.violations) == 1  # the bad control; an unknown opcode is legal

    run(main())


def scram_client_final(
    mechanism: str, user: str, password: str, nonce: str, server_first: bytes
) -> tuple[bytes, bytes]:
    """The client's side of RFC 5802, written here from the RFC: (client-final, expected server signature)."""
    import base64
    import hashlib
    import hmac

    name = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}[mechanism]
    attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
    assert attrs["r"].startswith(nonce)
    salted = hashlib.pbkdf2_hmac(name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"n={user},r={nonce},{server_first.decode()},{without_proof}".encode()
    signature = hmac.new(hashlib.new(name, client_key).digest(), auth, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_sig = hmac.new(hmac.new(salted, b"Server Key", name).digest(), auth, name).digest()
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode(), b"v=" + base64.b64encode(
        server_sig
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_with_require_auth_a_connection_authenticates_with_scram_selects_the_bucket_and_opens(mechanism):
    async def main():
        async with serving(require_auth=True, username="dcp", password="s3cret", bucket="beer") as producer:
            peer = await connect(producer)
            await peer.send(OPEN + req(0x20, 2))  # DCP_OPEN before SASL, then SASL_LIST_MECHS
            assert (await peer.answer(1))[1] == 0x24  # EACCESS
            assert (await peer.answer(2))[2] == b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN"
            nonce = "abcdefghijklmnop"
            await peer.send(req(0x21, 3, key=mechanism.encode(), value=f"n,,n=dcp,r={nonce}".encode()))
            _, status, server_first = await peer.answer(3)
            assert status == 0x21  # AUTH_CONTINUE
            final, signature = scram_client_final(mechanism, "dcp", "s3cret", nonce, server_first)
            await peer.send(req(0x22, 4, key=mechanism.encode(), value=final))
            assert (await peer.answer(4))[1:] == (SUCCESS, signature)
            await peer.send(OPEN)
            assert (await peer.answer(1))[1] == 0x08  # NO_BUCKET
            await peer.send(req(0x89, 5, key=b"default") + req(0x89, 6, key=b"beer") + OPEN)
            assert (await peer.answer(5))[1] == 0x01  # KEY_ENOENT: no such bucket
            assert (await peer.answer(6))[1] == SUCCESS
            assert (await peer.answer(1))[1] == SUCCESS
            await peer.send(OPEN + req(0x50, 7, b"\0\0\0\0\0\0\0\x03", b"c2"))  # again; flag 0x02
            assert (await peer.answer(1))[1] == EINVAL
            assert (await peer.answer(7))[1] == EINVAL

    run(main())


def test_a_wrong_password_gets_auth_error_and_the_connection_may_try_again():
    async def main():
        async with serving(require_auth=True) as producer:
            peer = await connect(producer)
            await peer.send(req(0x21, 2, key=b"PLAIN", value=b"\0Administrator\0wrong"))
            assert (await peer.answer(2))[1] == 0x20  # AUTH_ERROR
            await peer.send(req(0x21, 3, key=b"PLAIN", value=b"\0Administrator\0password"))
            assert (await peer.answer(3))[1] == SUCCESS
            assert "authentication failed" in producer.lines[0]

    run(main())


# ------------------------------------------------------------------------------ the bucket config


def test_get_cluster_config_and_not_my_vbucket_carry_the_bucket_config():
    import json

    from wallaroo_proto.protocols.dcp.producer import Faults

    async def main():
        async with serving(vbuckets=8, faults=Faults(not_my_vbucket=frozenset({3}))) as producer:
            peer = await connect(producer)
            await peer.send(req(0xB5, 2) + OPEN + stream_req(3, 4))
            for opaque, opcode, status in ((2, 0xB5, SUCCESS), (4, 0x53, 0x07)):
                got_opcode, got_status, body = await peer.answer(opaque)
                assert (got_opcode, got_status) == (opcode, status)
                config = json.loads(body)
                port = producer.address[1]
                assert config["nodeLocator"] == "vbucket" and config["name"] == "default"
                assert config["rev"] >= 1 and "revEpoch" in config
                assert config["vBucketServerMap"]["serverList"] == [f"127.0.0.1:{port}"]
                assert config["vBucketServerMap"]["vBucketMap"] == [[0]] * 8
                (node,) = config["nodesExt"]
                assert node["services"]["kv"] == port and "hostname" not in node

    run(main())


def test_a_vbucket_that_moves_is_refused_with_a_newer_config_naming_the_second_node_which_serves_it():
    import json

    from wallaroo_proto.protocols.dcp.producer import Faults

    async def main():
        async with serving(vbuckets=4, items=3, faults=Faults(move=frozenset({2, 9}))) as producer:
            first, second = producer.ports
            home = await connect(producer)
            await home.send(req(0xB5, 2))
            _, _, body = await home.answer(2)
            before = json.loads(body)
            assert before["rev"] == 1 and before["vBucketServerMap"]["vBucketMap"] == [[0]] * 4
            assert [n["services"]["kv"] for n in before["nodesExt"]] == [first, second]
            # Vbucket 9 is none of the bucket's: it cannot move, the config stays at rev 1.
            await home.send(OPEN + stream_req(9, 3))
            opcode, status, body = await home.answer(3)
            assert (opcode, status, json.loads(body)["rev"]) == (0x53, 0x07, 1)
            # The stream request finds vbucket 2 gone: NOT_MY_VBUCKET, its body the config of rev 2.
            await home.send(stream_req(2, 4) + stream_req(1, 5) + req(0xB5, 6))
            opcode, status, body = await home.answer(4)
            assert (opcode, status) == (0x53, 0x07)
            moved = json.loads(body)
            assert moved["rev"] == 2
            assert moved["vBucketServerMap"]["vBucketMap"] == [[0], [0], [1], [0]]
            assert moved["vBucketServerMap"]["serverList"] == [f"127.0.0.1:{first}", f"127.0.0.1:{second}"]
            mine, other = moved["nodesExt"]
            assert mine["thisNode"] and "hostname" not in mine
            assert other == {"services": {"kv": second, "mgmt": 8092}, "hostname": "127.0.0.1"}
            assert (await home.answer(5))[:2] == (0x53, SUCCESS)  # the others stay
            assert json.loads((await home.answer(6))[2])["rev"] == 2
            # The second node serves vbucket 2 and no other, and names itself thisNode.
            away = Peer(*await asyncio.open_connection("127.0.0.1", second))
            seqnos = req(0x48, 7, struct.pack(">I", 1))
            await away.send(OPEN + stream_req(2, 4) + stream_req(1, 5) + req(0xB5, 6) + seqnos)
            assert (await away.answer(4))[:2] == (0x53, SUCCESS)
            assert (await away.answer(5))[:2] == (0x53, 0x07)
            there = json.loads((await away.answer(6))[2])
            assert there["rev"] == 2 and there["nodesExt"][1]["thisNode"]
            assert "hostname" in there["nodesExt"][0]
            assert (await away.answer(7))[2] == struct.pack(">HQ", 2, 3)
            summary = producer.summary()
            assert summary["moved"] == [2] and summary["not_my_vbucket"] == 3

    run(main())


# ------------------------------------------------------------------------------ the error map


def test_get_error_map_answers_the_version_asked_for_at_most_2_and_refuses_a_malformed_request():
    import json

    async def main():
        async with serving(require_auth=True) as producer:  # allowed before authentication
            peer = await connect(producer)
            ask = [req(0xFE, 10 + v, value=struct.pack(">H", v)) for v in (0, 1, 2, 9)]
            await peer.send(
                b"".join(ask) + req(0xFE, 20, value=b"\x02") + req(0xFE, 21, value=b"\x00\x02", vb=3)
            )
            assert (await peer.answer(10))[:2] == (0xFE, 0x01)  # no version 0: KEY_ENOENT
            maps = {}
            for v in (1, 2, 9):
                _, status, body = await peer.answer(10 + v)
                assert status == SUCCESS
                maps[v] = json.loads(body)
            assert maps[2] == maps[9] and maps[2]["version"] == 2 and maps[1]["version"] == 1
            assert maps[1]["revision"] == maps[2]["revision"] + 4
            errors = maps[2]["errors"]
            # Every status the producer sends, keyed in lower-case hex as the server's map is.
            sent = {"0", "1", "2", "4", "7", "8", "20", "21", "22", "23", "24", "81", "83", "8d"}
            assert set(errors) == sent
            assert errors["7"]["name"] == "NOT_MY_VBUCKET" and "fetch-config" in errors["7"]["attrs"]
            assert errors["20"]["attrs"] == ["conn-state-invalidated", "auth"]
            assert errors["23"]["attrs"] == ["dcp", "special-handling"]
            assert all(e["desc"] for e in errors.values())
            # A value that is no 2-byte version, or a vbucket other than 0: EINVAL, connection kept.
            assert (await peer.answer(20))[:2] == (0xFE, EINVAL)
            assert (await peer.answer(21))[:2] == (0xFE, EINVAL)
            await peer.send(req(0xFE, 22, value=b"\x00\x01"))
            assert json.loads((await peer.answer(22))[2]) == maps[1]

    run(main())


# ------------------------------------------------------------------------------ items as the connection asked


@pytest.mark.parametrize(
    "flags, expiry, deletion, expiration",
    [
        (0x01, "false", (0x58, 18), (0x58, 18)),  # V1 deletions; an expiration is a deletion
        (0x01, "true", (0x58, 18), (0x58, 18)),  # the expiry opcode needs IncludeDeleteTimes
        (0x21, "false", (0x58, 21), (0x58, 21)),  # IncludeDeleteTimes: V2 deletions
        (0x21, "true", (0x58, 21), (0x59, 20)),  # and with enable_expiry_opcode, DCP_EXPIRATION
    ],
)
def test_deletions_and_expirations_come_in_the_form_the_connection_asked_for(
    flags, expiry, deletion, expiration
):
    bucket = Bucket.new(1, random.Random(1))
    vb = bucket.vbuckets[0]
    vb.add("a", "mutation", "1", now_ns=5 << 32)
    vb.add("b", "deletion", now_ns=5 << 32)  # the same instant: the logical counter moves the CAS on
    vb.add("c", "expiration", now_ns=7 << 32)

    async def main():
        async with serving(data=bucket) as producer:
            peer = await connect(producer)
            open_ = req(0x50, 1, bytes(4) + flags.to_bytes(4, "big"), b"c")
            await peer.send(open_ + control("enable_expiry_opcode", expiry, 2) + stream_req(0, 3, end=3))
            assert (await peer.answer(3))[1] == SUCCESS
            got = []
            while len(got) < 3:
                head = await peer.reader.readexactly(24)
                magic, opcode, _k, extlen, _d, _vb, body, _o, cas = HEADER.unpack(head)
                await peer.reader.readexactly(body)
                if opcode in (0x57, 0x58, 0x59):
                    got.append((opcode, extlen, cas))
            assert [g[:2] for g in got] == [(0x57, 31), deletion, expiration]
            assert [g[2] for g in got] == [5 << 32, (5 << 32) + 1, 7 << 32]

    run(main())


def test_the_packets_before_a_bad_header_are_answered_before_the_close():
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(OPEN + req(0x0B, 2) + b"\x42" + bytes(23))  # then a header of magic 0x42
            assert (await peer.answer(1))[1] == SUCCESS
            assert (await peer.answer(2))[:2] == (0x0B, SUCCESS)
            assert await peer.closed()
            assert len(producer.stats.violations) == 1 and "bad magic 0x42" in producer.lines[-1]

    run(main())


@pytest.mark.parametrize(
    "asked, granted",
    [
        # java-dcp-client's list: Datatype (retired), Xattr, XERROR, SelectBucket, Snappy, Duplex,
        # ClustermapChangeNotification
        ([0x01, 0x06, 0x07, 0x08, 0x0A, 0x0C, 0x0D], [0x06, 0x07, 0x08, 0x0C, 0x0D]),
        ([0x03, 0x0D], [0x03]),  # change notifications need Duplex
        ([0x0B, 0x12], []),  # JSON and collections: not honoured, not granted
    ],
)
def test_hello_grants_what_a_node_grants_and_this_producer_honours(asked, granted):
    async def main():
        async with serving() as producer:
            peer = await connect(producer)
            await peer.send(req(0x1F, 2, key=b"c", value=b"".join(f.to_bytes(2, "big") for f in asked)))
            _, status, body = await peer.answer(2)
            assert (
                status == SUCCESS
                and [int.from_bytes(body[i : i + 2], "big") for i in range(0, len(body), 2)] == granted
            )

    run(main())


@pytest.mark.parametrize(
    ("spec", "end"), [("too_slow@10", (4, 10)), ("ok@1", (0, 1)), ("rollback@250", (6, 250))]
)
def test_a_stream_end_fault_names_a_reason_and_the_items_before_it(spec, end):
    assert parse_stream_end(spec) == end


@pytest.mark.parametrize(
    "spec", ["sleepy@3", "too_slow", "too_slow@", "too_slow@0", "too_slow@-1", "@5", "ok@x"]
)
def test_a_stream_end_fault_without_a_known_reason_or_a_count_of_one_or_more_is_refused(spec):
    with pytest.raises(ValueError) as refused:
        parse_stream_end(spec)
    assert str(refused.value) == f"{spec!r}: use REASON@N, e.g. too_slow@10"
