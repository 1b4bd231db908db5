"""The DCP replay adapter, sans-IO: recorded packets follow the live peer's opaques, uuids, buffer and login.

The packets are built here from the header layout of the protocol notes (24 bytes,
big-endian, ``>BBHBBHIIQ``), not by the codec under test.
"""

from __future__ import annotations

import struct

import pytest

from wallaroo_proto.protocols.dcp import replay, sasl
from wallaroo_proto.replay.adapter import SKIP, Ask, Hold, key_of, noise
from wallaroo_proto.replay.recording import Frame

REQ, RES = 0x80, 0x81
NOOP, STREAM_REQ, GET_FAILOVER_LOG, BUFFER_ACK, CONTROL = 0x5C, 0x53, 0x54, 0x5D, 0x5E
CLOSE_STREAM = 0x52
MUTATION, MARKER, SASL_AUTH, SASL_STEP, OPEN = 0x57, 0x56, 0x21, 0x22, 0x50
FOREVER = 0xFFFF_FFFF_FFFF_FFFF


def pkt(magic, op, *, vb=0, opaque=0, extras=b"", key=b"", value=b"", cas=0) -> bytes:
    body = len(extras) + len(key) + len(value)
    return struct.pack(">BBHBBHIIQ", magic, op, len(key), len(extras), 0, vb, body, opaque, cas) + (
        extras + key + value
    )


def stream_req(vb, opaque, start, uuid, snap_start=None, snap_end=None) -> bytes:
    snap_start = start if snap_start is None else snap_start
    snap_end = start if snap_end is None else snap_end
    extras = struct.pack(">IIQQQQQ", 0, 0, start, FOREVER, uuid, snap_start, snap_end)
    return pkt(REQ, STREAM_REQ, vb=vb, opaque=opaque, extras=extras)


def failover(opaque, *entries, op=STREAM_REQ) -> bytes:
    return pkt(RES, op, opaque=opaque, value=b"".join(struct.pack(">QQ", u, s) for u, s in entries))


def mutation(vb, opaque, seqno, key=b"k") -> bytes:
    extras = struct.pack(">QQIIIHB", seqno, 1, 0, 0, 0, 0, 0)
    return pkt(REQ, MUTATION, vb=vb, opaque=opaque, extras=extras, key=key, value=b"v" * 20)


def marker(vb, opaque, start, end) -> bytes:
    return pkt(REQ, MARKER, vb=vb, opaque=opaque, extras=struct.pack(">QQI", start, end, 1))


def control(opaque, key, value) -> bytes:
    return pkt(REQ, CONTROL, opaque=opaque, key=key, value=value)


def dcp_open(opaque) -> bytes:
    return pkt(REQ, OPEN, opaque=opaque, extras=struct.pack(">II", 0, 1), key=b"replayed")


def ok(op, opaque, value=b"", status=0) -> bytes:
    return pkt(RES, op, vb=status, opaque=opaque, value=value)


class Script:
    """Feeds one adapter the recording's frames (``ours`` / ``peer``) and the live peer's (``live``)."""

    def __init__(self, side: str) -> None:
        self.adapter = replay.Adapter(side)
        self.index = 0

    def frame(self, raw: bytes) -> Frame:
        self.index += 1
        return Frame(self.index, {"type": "?", "conn_index": 1}, raw)

    def ours(self, raw: bytes):
        return self.adapter.outgoing(self.frame(raw))

    def peer(self, raw: bytes) -> None:
        self.adapter.expected(self.frame(raw))

    def live(self, raw: bytes):
        return self.adapter.incoming({"type": "?"}, raw)

    def both(self, recorded: bytes, live: bytes | None = None) -> None:
        """A peer packet as recorded and as the live peer sent it (the same when not given)."""
        self.peer(recorded)
        self.live(recorded if live is None else live)


def opened(side: str, buffer: bytes | None = None) -> Script:
    """A conversation past DCP_OPEN (and a connection_buffer_size control), both views."""
    s = Script(side)
    if side == "consumer":
        assert s.ours(dcp_open(1)) == dcp_open(1)
        s.both(ok(OPEN, 1))
        if buffer is not None:
            assert s.ours(control(2, b"connection_buffer_size", buffer)) == control(
                2, b"connection_buffer_size", buffer
            )
            s.both(ok(CONTROL, 2))
    return s


# ----------------------------------------------------------------------------- playing the consumer


def test_each_live_noop_is_answered_as_it_comes_and_the_recorded_replies_are_not_sent():
    s = opened("consumer")
    assert s.adapter.owed() is None
    where = {"type": "DCP_NOOP", "conn_index": 1}  # the live NOOP's record: its connection
    s.peer(pkt(REQ, NOOP, opaque=0x00989681))
    s.adapter.incoming(where, pkt(REQ, NOOP, opaque=0x01020304))
    assert s.adapter.owed() == (where, ok(NOOP, 0x01020304))
    assert s.adapter.owed() is None
    assert s.ours(ok(NOOP, 0x00989681)) == SKIP
    assert s.ours(ok(NOOP, 0x00989682)) == SKIP  # a recorded NOOP the live producer never sent
    s.adapter.incoming(where, pkt(REQ, NOOP, opaque=0x01020305))  # one the recording never had
    assert s.adapter.owed() == (where, ok(NOOP, 0x01020305))


def test_noops_are_neither_expected_nor_compared():
    assert replay.units({"type": "DCP_NOOP", "opaque": 1}) == []
    assert replay.units({"type": "DCP_NOOP_RESPONSE", "opaque": 1}) == []
    assert replay.units({"type": "DCP_MUTATION", "seqno": 3}) == [{"type": "DCP_MUTATION", "seqno": 3}]


def test_a_stream_request_names_the_live_uuid_where_the_recorded_one_stood_in_its_failover_log():
    s = opened("consumer")
    assert s.ours(stream_req(3, 0x10, 0, 0)) == stream_req(3, 0x10, 0, 0)  # uuid 0 goes as it is
    s.both(
        failover(0x10, (0xAAAA, 30), (0xBBBB, 0)),
        failover(0x10, (0x1111, 30), (0x2222, 0)),
    )
    s.both(pkt(REQ, 0x55, vb=3, opaque=0x10, extras=b"\0\0\0\x04"))  # STREAM_END too_slow
    # asked again with the older entry's uuid: the live log's older entry
    assert s.ours(stream_req(3, 0x11, 12, 0xBBBB)) == stream_req(3, 0x11, 12, 0x2222)
    s.both(failover(0x11, (0xAAAA, 30), (0xBBBB, 0)), failover(0x11, (0x1111, 30), (0x2222, 0)))
    s.both(pkt(REQ, 0x55, vb=3, opaque=0x11, extras=b"\0\0\0\x04"))
    assert s.ours(stream_req(3, 0x12, 12, 0xAAAA)) == stream_req(3, 0x12, 12, 0x1111)


def test_a_recorded_uuid_maps_to_the_live_entry_beginning_at_the_same_seqno():
    s = opened("consumer")
    s.ours(stream_req(3, 0x10, 0, 0))
    # the live node failed over once more than the recorded one (a newer entry at 50)
    s.both(failover(0x10, (0xAAAA, 30), (0xBBBB, 0)), failover(0x10, (0x3333, 50), (0x1111, 30), (0x2222, 0)))
    s.both(pkt(REQ, 0x55, vb=3, opaque=0x10, extras=b"\0\0\0\x04"))
    assert s.ours(stream_req(3, 0x11, 40, 0xAAAA)) == stream_req(3, 0x11, 40, 0x1111)
    s.both(failover(0x11, (0xAAAA, 30), (0xBBBB, 0)), failover(0x11, (0x4444, 10)))
    s.both(pkt(REQ, 0x55, vb=3, opaque=0x11, extras=b"\0\0\0\x04"))
    # no live entry begins at 30: the one as many entries from the oldest (here the only one)
    assert s.ours(stream_req(3, 0x12, 40, 0xAAAA)) == stream_req(3, 0x12, 40, 0x4444)


def test_a_resuming_stream_request_asks_the_live_failover_log_first_and_its_answer_is_not_compared():
    s = opened("consumer")
    asked = s.ours(stream_req(5, 0x10, 40, 0xAAAA))
    want = pkt(REQ, GET_FAILOVER_LOG, vb=5, opaque=0xD0C00000)
    assert isinstance(asked, Ask) and asked.data == want
    assert isinstance(s.ours(stream_req(5, 0x10, 40, 0xAAAA)), Hold)  # until the answer comes
    assert s.live(failover(0xD0C00000, (0x5555, 0), op=GET_FAILOVER_LOG)) is True
    assert s.ours(stream_req(5, 0x10, 40, 0xAAAA)) == stream_req(5, 0x10, 40, 0x5555)
    assert not s.live(failover(0x10, (0x5555, 0)))  # the recording's answer is compared


def test_after_a_live_rollback_to_an_earlier_seqno_the_request_resumes_from_there():
    s = opened("consumer")
    s.ours(stream_req(0, 0x10, 0, 0))
    s.both(failover(0x10, (0xAAAA, 0)), failover(0x10, (0x1111, 0)))
    s.both(pkt(REQ, 0x55, vb=0, opaque=0x10, extras=b"\0\0\0\x02"))
    s.ours(stream_req(0, 0x11, 30, 0xAAAA))
    s.both(
        pkt(RES, STREAM_REQ, vb=0x23, opaque=0x11, value=struct.pack(">Q", 20)),
        pkt(RES, STREAM_REQ, vb=0x23, opaque=0x11, value=struct.pack(">Q", 10)),
    )
    # the recording resumed from its rollback point 20; the live node said 10
    assert s.ours(stream_req(0, 0x12, 20, 0xAAAA)) == stream_req(0, 0x12, 10, 0x1111)


def test_a_buffer_ack_acknowledges_the_live_counterparts_and_never_more_than_came_live():
    s = opened("consumer", buffer=b"1000")
    s.ours(stream_req(0, 0x10, 0, 0))
    s.both(failover(0x10, (0xAAAA, 0)), failover(0x10, (0x1111, 0)))
    s.both(marker(0, 0x10, 0, 9))  # 44 bytes both ways
    s.peer(mutation(0, 0x10, 1, b"key-1"))  # 80 bytes recorded
    s.live(mutation(0, 0x10, 1, b"key-12345"))  # 84 bytes live
    s.peer(mutation(0, 0x10, 2, b"key-2"))  # recorded: 204 sent, the ack covers the first 124
    # the live counterparts of the marker and the first item: 128 bytes
    assert s.ours(pkt(REQ, BUFFER_ACK, extras=struct.pack(">I", 124))) == pkt(
        REQ, BUFFER_ACK, extras=struct.pack(">I", 128)
    )
    # the recording acknowledged two more; one came live: that one
    s.peer(mutation(0, 0x10, 3, b"key-3"))
    s.live(mutation(0, 0x10, 2, b"key-2"))
    assert s.ours(pkt(REQ, BUFFER_ACK, extras=struct.pack(">I", 160))) == pkt(
        REQ, BUFFER_ACK, extras=struct.pack(">I", 80)
    )
    # nothing new came live: no acknowledgement at all
    s.peer(mutation(0, 0x10, 4, b"key-4"))
    assert s.ours(pkt(REQ, BUFFER_ACK, extras=struct.pack(">I", 80))) == SKIP


def test_a_buffer_ack_stops_waiting_for_the_recorded_messages_once_the_live_window_is_full():
    s = opened("consumer", buffer=b"200")
    s.ours(stream_req(0, 0x10, 0, 0))
    s.both(failover(0x10, (0xAAAA, 0)), failover(0x10, (0x1111, 0)))
    ack = Frame(99, {"type": "DCP_BUFFER_ACKNOWLEDGEMENT", "conn_index": 1}, b"")
    s.live(marker(0, 0x10, 0, 9))
    s.live(mutation(0, 0x10, 1, b"key-1"))
    assert s.adapter.waits(ack)  # 124 of 200: the live producer may send more
    s.live(mutation(0, 0x10, 2, b"key-2"))
    assert not s.adapter.waits(ack)  # 204 of 200: it sends nothing more until acknowledged


def test_scram_is_redone_with_the_live_servers_nonce():
    s = opened("consumer")
    first = s.ours(pkt(REQ, SASL_AUTH, opaque=3, key=b"SCRAM-SHA256", value=b"n,,n=Administrator,r=recorded"))
    assert first[:24] == pkt(REQ, SASL_AUTH, opaque=3, key=b"SCRAM-SHA256", value=first[36:])[:24]
    client_first = first[24 + len(b"SCRAM-SHA256") :]
    assert b"r=recorded" not in client_first and client_first.startswith(b"n,,n=Administrator,r=")
    server = sasl.ScramServer(sasl.Account("Administrator", "password"), "SCRAM-SHA256")
    server_first = server.first(client_first)
    recorded_step = pkt(REQ, SASL_STEP, opaque=4, key=b"SCRAM-SHA256", value=b"c=biws,r=recorded,p=AAAA")
    s.peer(ok(SASL_AUTH, 3, b"r=recorded-and-more,s=c2FsdA==,i=4096", status=0x21))
    assert isinstance(s.ours(recorded_step), Hold)  # the live nonce has not come
    s.live(ok(SASL_AUTH, 3, server_first, status=0x21))
    step = s.ours(recorded_step)
    server.final(step[24 + len(b"SCRAM-SHA256") :])  # the live server takes the proof (else AuthFailed)


# ----------------------------------------------------------------------------- playing the producer


def producer_with_stream(live_opaque: int, live_start: int = 0, buffer: bytes | None = None) -> Script:
    s = Script("producer")
    s.both(dcp_open(1), dcp_open(0x71))
    assert s.ours(ok(OPEN, 1)) == ok(OPEN, 0x71)
    if buffer is not None:
        s.both(
            control(2, b"connection_buffer_size", buffer), control(0x72, b"connection_buffer_size", buffer)
        )
        assert s.ours(ok(CONTROL, 2)) == ok(CONTROL, 0x72)
    s.both(stream_req(0, 0x0B, 0, 0), stream_req(0, live_opaque, live_start, 0xAAAA if live_start else 0))
    assert s.ours(failover(0x0B, (0xAAAA, 0))) == failover(live_opaque, (0xAAAA, 0))
    return s


def test_answers_and_stream_messages_carry_the_live_requests_opaques():
    s = producer_with_stream(0x77)
    assert s.ours(marker(0, 0x0B, 0, 2)) == marker(0, 0x77, 0, 2)
    assert s.ours(mutation(0, 0x0B, 1)) == mutation(0, 0x77, 1)
    # the producer's own NOOP opaque is its own: as recorded
    assert s.ours(pkt(REQ, NOOP, opaque=0x00989681)) == pkt(REQ, NOOP, opaque=0x00989681)


def test_an_answer_waits_for_the_live_request_it_answers():
    s = Script("producer")
    s.peer(dcp_open(1))
    held = s.ours(ok(OPEN, 1))
    assert isinstance(held, Hold) and "0x00000001" in held.reason
    s.live(dcp_open(9))
    assert s.ours(ok(OPEN, 1)) == ok(OPEN, 9)


def test_requests_pair_by_vbucket_whatever_order_the_live_consumer_asks_in():
    s = Script("producer")
    s.both(dcp_open(1))
    s.ours(ok(OPEN, 1))
    s.peer(stream_req(0, 0x0B, 0, 0))
    s.peer(stream_req(1, 0x0C, 0, 0))
    s.live(stream_req(1, 0x41, 0, 0))
    s.live(stream_req(0, 0x42, 0, 0))
    assert s.ours(failover(0x0B, (0xAAAA, 0))) == failover(0x42, (0xAAAA, 0))
    assert s.ours(failover(0x0C, (0xBBBB, 0))) == failover(0x41, (0xBBBB, 0))


def test_stream_messages_wait_while_the_live_buffer_is_full():
    s = producer_with_stream(0x77, buffer=b"100")
    assert s.ours(marker(0, 0x0B, 0, 3)) == marker(0, 0x77, 0, 3)  # 44 bytes
    assert s.ours(mutation(0, 0x0B, 1)) == mutation(0, 0x77, 1)  # 120 outstanding: one over, as allowed
    held = s.ours(mutation(0, 0x0B, 2))
    assert isinstance(held, Hold) and "120 of 100" in held.reason
    s.both(pkt(REQ, BUFFER_ACK, extras=struct.pack(">I", 120)))
    assert s.ours(mutation(0, 0x0B, 2)) == mutation(0, 0x77, 2)


def test_items_the_live_consumer_resumes_past_are_not_sent():
    s = producer_with_stream(0x77, live_start=2)
    assert s.ours(marker(0, 0x0B, 0, 3)) == marker(0, 0x77, 0, 3)
    assert s.ours(mutation(0, 0x0B, 1)) == SKIP
    assert s.ours(mutation(0, 0x0B, 2)) == SKIP
    assert s.ours(mutation(0, 0x0B, 3)) == mutation(0, 0x77, 3)


@pytest.mark.parametrize("password,status", [("password", 0x00), ("wrong", 0x20)])
def test_scram_is_answered_for_the_live_clients_nonce_and_proof(password, status):
    s = Script("producer")
    client = sasl.ScramClient("Administrator", password, "SCRAM-SHA512")
    s.peer(pkt(REQ, SASL_AUTH, opaque=3, key=b"SCRAM-SHA512", value=b"n,,n=Administrator,r=recorded"))
    s.live(pkt(REQ, SASL_AUTH, opaque=3, key=b"SCRAM-SHA512", value=client.first()))
    answer = s.ours(ok(SASL_AUTH, 3, b"r=recorded-and-more,s=c2FsdA==,i=4096", status=0x21))
    assert answer[6:8] == b"\x00\x21"
    final = client.final(answer[24:])
    s.peer(pkt(REQ, SASL_STEP, opaque=4, key=b"SCRAM-SHA512", value=b"c=biws,r=recorded,p=AAAA"))
    s.live(pkt(REQ, SASL_STEP, opaque=4, key=b"SCRAM-SHA512", value=final))
    done = s.ours(ok(SASL_STEP, 4, b"v=recorded"))
    assert done[6:8] == status.to_bytes(2, "big")
    if status == 0:
        client.verify(done[24:])


# ----------------------------------------------------------------------------- keys and noise


def test_frames_match_by_vbucket_and_seqno_and_the_noise_is_what_a_peer_picks():
    key = key_of("dcp")
    assert key({"type": "DCP_MUTATION", "vbucket": 3, "seqno": 7}) == (3, 7)
    assert key({"type": "DCP_SNAPSHOT_MARKER", "vbucket": 3, "snap_start": 5}) == (3, 5)
    assert key({"type": "DCP_STREAM_REQ_RESPONSE", "vbucket": 3, "opaque": 9}) == (3,)
    assert key({"type": "DCP_CONTROL", "control_key": "enable_noop"}) == ("enable_noop",)
    assert {"opaque", "vb_uuid"} <= noise("dcp")
    assert "seqno" not in noise("dcp") and "dcp_key" not in noise("dcp")


def test_a_redone_scram_keeps_the_recorded_user_and_nonce_length():
    s = opened("consumer")
    first = s.ours(
        pkt(REQ, SASL_AUTH, opaque=3, key=b"SCRAM-SHA1", value=b"n,,n=dcp=2Creader,r=" + b"x" * 32)
    )
    client_first = first[24 + len(b"SCRAM-SHA1") :]
    head, _, nonce = client_first.rpartition(b",r=")
    assert head == b"n,,n=dcp=2Creader" and len(nonce) == 32 and nonce != b"x" * 32


def test_a_bucket_config_names_the_port_the_live_client_connected_to():
    recorded_config = (
        b'{"rev":1,"nodeLocator":"vbucket","nodes":[{"hostname":"127.0.0.1:8091","ports":{"direct":41000}}],'
        b'"nodesExt":[{"services":{"kv":41000,"mgmt":8091},"thisNode":true}],'
        b'"vBucketServerMap":{"serverList":["127.0.0.1:41000"],"vBucketMap":[[0],[0]]}}'
    )
    live_config = (
        b'{"rev":1,"nodeLocator":"vbucket","nodes":[{"hostname":"127.0.0.1:8091","ports":{"direct":5123}}],'
        b'"nodesExt":[{"services":{"kv":5123,"mgmt":8091},"thisNode":true}],'
        b'"vBucketServerMap":{"serverList":["127.0.0.1:5123"],"vBucketMap":[[0],[0]]}}'
    )
    s = Script("producer")
    s.adapter.expected(
        Frame(1, {"type": "GET_CLUSTER_CONFIG", "responder_port": 41000}, pkt(REQ, 0xB5, opaque=0))
    )
    s.adapter.incoming({"type": "GET_CLUSTER_CONFIG", "responder_port": 5123}, pkt(REQ, 0xB5, opaque=0))
    recorded = struct.pack(">BBHBBHIIQ", RES, 0xB5, 0, 0, 1, 0, len(recorded_config), 0, 0) + recorded_config
    live = struct.pack(">BBHBBHIIQ", RES, 0xB5, 0, 0, 1, 0, len(live_config), 0, 0) + live_config
    assert s.ours(recorded) == live


def test_a_clients_random_connection_id_is_masked_in_both_records():
    s = Script("producer")
    name = 'java-dcp-client:{"i":"78047F2FC5CA44AB/37D30E02A4513765","a":"java-dcp-client/0.58.0"}'
    recorded = s.adapter.expected(
        Frame(1, {"type": "HELLO", "dcp_key": name}, pkt(REQ, 0x1F, key=name.encode()))
    )
    live = {"type": "HELLO", "dcp_key": name.replace("78047F2FC5CA44AB", "0123456789ABCDEF")}
    s.adapter.incoming(live, pkt(REQ, 0x1F, key=live["dcp_key"].encode()))
    assert (
        recorded["dcp_key"] == live["dcp_key"] == 'java-dcp-client:{"i":"...","a":"java-dcp-client/0.58.0"}'
    )


def test_without_flow_control_the_items_leave_nothing_behind():
    s = opened("consumer")
    s.ours(stream_req(0, 0x10, 0, 0))
    s.both(failover(0x10, (0xAAAA, 0)), failover(0x10, (0x1111, 0)))
    s.both(marker(0, 0x10, 0, 1000))
    for seqno in range(1, 1001):
        s.both(mutation(0, 0x10, seqno))
    assert not s.adapter.recorded_flow.ends and not s.adapter.live_flow.ends


def buffer_ack(nbytes: int) -> bytes:
    return pkt(REQ, BUFFER_ACK, extras=struct.pack(">I", nbytes))


def kept(adapter) -> int:
    """How many requests the producer's adapter holds, in every structure it keeps them in."""
    slots = sum(len(d) for d in (*adapter.recorded_slots.values(), *adapter.live_slots.values()))
    return (
        len(adapter.live_requests)
        + len(adapter.opaques)
        + len(adapter.request_opaques)
        + len(adapter.live_starts)
        + slots
    )


def test_a_long_conversation_keeps_only_the_requests_still_open():
    s = producer_with_stream(0x77, buffer=b"100000")
    assert s.ours(marker(0, 0x0B, 0, 5000)) == marker(0, 0x77, 0, 5000)
    open_stream = kept(s.adapter)
    for n in range(5000):
        assert s.ours(mutation(0, 0x0B, n + 1)) == mutation(0, 0x77, n + 1)
        s.both(buffer_ack(60))  # never answered: nothing to pair or keep
        s.both(control(0x100 + n, b"k", b"v"), control(0x9000 + n, b"k", b"v"))
        assert s.ours(ok(CONTROL, 0x100 + n)) == ok(CONTROL, 0x9000 + n)
    assert kept(s.adapter) == open_stream
    end = pkt(REQ, 0x55, opaque=0x0B, extras=b"\0\0\0\0")  # STREAM_END ok
    assert s.ours(end) == pkt(REQ, 0x55, opaque=0x77, extras=b"\0\0\0\0")
    assert kept(s.adapter) == 0


@pytest.mark.parametrize(
    ("stream_end_follows", "left"), [(False, 0), (True, 3)], ids=["closed", "stream-end-follows"]
)
def test_a_stream_the_consumer_closes_is_forgotten_unless_a_stream_end_follows(stream_end_follows, left):
    s = producer_with_stream(0x77)
    if stream_end_follows:
        key, value = b"send_stream_end_on_client_close_stream", b"true"
        s.both(control(3, key, value), control(0x73, key, value))
        assert s.ours(ok(CONTROL, 3)) == ok(CONTROL, 0x73)
    s.both(pkt(REQ, CLOSE_STREAM, opaque=4), pkt(REQ, CLOSE_STREAM, opaque=0x74))
    assert s.ours(ok(CLOSE_STREAM, 4)) == ok(CLOSE_STREAM, 0x74)
    assert kept(s.adapter) == left  # the stream's request, its pairing and the live one


def test_a_refused_stream_request_is_forgotten():
    s = Script("producer")
    s.both(stream_req(0, 0x0B, 0, 0), stream_req(0, 0x77, 0, 0))
    assert s.ours(ok(STREAM_REQ, 0x0B, status=0x07)) == ok(STREAM_REQ, 0x77, status=0x07)  # NOT_MY_VBUCKET
    assert kept(s.adapter) == 0
