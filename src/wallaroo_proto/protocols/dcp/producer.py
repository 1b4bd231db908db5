"""The mock DCP producer: a memcached-protocol server that streams vbuckets to DCP consumers.

Each connection gets a ``core.Connection`` that judges what the consumer sends
and tracks the requests, controls, streams and flow-control window; the
producer answers as the server does (order of the stream-request checks, the
rollback rule, the failover log on success) and pumps the streams'
snapshots round-robin while the consumer's buffer has room. Noops go out at
the negotiated interval once ``enable_noop=true``. A slow consumer only slows
its own connection: writes wait for the socket to drain.

Faults: vbuckets answered NOT_MY_VBUCKET, vbuckets that move to a second node
(a second port) when first asked for, as in a rebalance, streams ended early with a chosen
STREAM_END reason (once per vbucket, so a consumer that asks again gets the
rest), and connections dropped abruptly after N items (the first
``drop_times`` connections). ``--failover`` is done by the CLI on the bucket
before serving.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import add, attrgetter
from typing import Any

from wallaroo_proto.judge import End, Kind
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.runtime import quiet_accept_errors
from wallaroo_proto.write_watch import WriteWatch

from . import cluster, codec, controls, errormap, sasl
from .codec import (
    FOREVER,
    SUCCESS,
    Control,
    Open,
    Packet,
    PacketSplitter,
    ProtocolError,
    StreamReq,
    decode_packet,
)
from .core import CONSUMER, PRODUCER, Connection, needs_rollback
from .store import CAS_AT, EXPIRATION, MUTATION, OPAQUE_AT, Bucket, VBucket, Version

#: HELLO features granted, those a data node grants that this producer honours: TcpNoDelay, Xattr
#: (it holds no xattrs), XERROR, SelectBucket, Duplex (it sends no server requests), and
#: ClustermapChangeNotification with Duplex. It pushes no config: the config changes only when a
#: vbucket moves, and then reaches the client that asked for the vbucket in NOT_MY_VBUCKET's body, as
#: on a node with ``dedupe_nmvb_maps`` (other connections see it at their next GET_CLUSTER_CONFIG).
FEATURES = (0x03, 0x06, 0x07, 0x08, 0x0C, 0x0D)
_DUPLEX, _CLUSTERMAP_NOTIFICATION = 0x0C, 0x0D
DEFAULT_NOOP_INTERVAL = 20.0
#: A connection's replies waiting to be sent beyond which its next command waits for the socket
#: (memcached's ``max_send_queue_size``): a peer that pipelines requests and never reads cannot
#: make the producer buffer replies without bound.
MAX_SEND_QUEUE = 1024 * 1024
#: DCP opcodes a connection may send before DCP_OPEN (the server refuses the others with EINVAL).
_BEFORE_OPEN = frozenset((codec.OPEN, codec.GET_FAILOVER_LOG))
_DCP_OPCODES = frozenset(op for op in codec.OPCODES if 0x50 <= op <= 0x64)
#: Commands a connection may send before it authenticated (the server answers the others EACCESS).
_BEFORE_AUTH = frozenset(
    (codec.HELLO, codec.SASL_LIST_MECHS, codec.SASL_AUTH, codec.SASL_STEP, codec.GET_ERROR_MAP)
)
#: Commands the "no bucket" bucket answers NO_BUCKET.
_NEED_BUCKET = frozenset(
    (codec.OPEN, codec.GET_ALL_VB_SEQNOS, codec.GET_FAILOVER_LOG, codec.GET_CLUSTER_CONFIG)
)
#: DCP_OPEN flags the validator takes: Producer, IncludeXattrs, NoValue, IncludeDeleteTimes,
#: NoValueWithUnderlyingDatatype, IncludeDeletedUserXattrs, SkipDeletesInInitialBackfill.
_INCLUDE_XATTRS, _NO_VALUE, _NO_VALUE_WITH_DATATYPE = 0x04, 0x08, 0x40
_INCLUDE_DELETE_TIMES, _INCLUDE_DELETED_USER_XATTRS, _SKIP_DELETES = 0x20, 0x100, 0x200
_OPEN_FLAGS = (
    codec.OPEN_PRODUCER
    | _INCLUDE_XATTRS
    | _NO_VALUE
    | _INCLUDE_DELETE_TIMES
    | _NO_VALUE_WITH_DATATYPE
    | _INCLUDE_DELETED_USER_XATTRS
    | _SKIP_DELETES
)
_BATCH = 512
#: Items encoded at a time: what a stream holds encoded beyond the socket's buffer is bounded by this.
_CHUNK_ITEMS = 1024


@dataclass
class Faults:
    not_my_vbucket: frozenset[int] = frozenset()
    #: Vbuckets that move to the second node at their first stream request: NOT_MY_VBUCKET with a
    #: newer config that maps them there, then served by that node only.
    move: frozenset[int] = frozenset()
    end_after: int = 0  # end each vbucket's stream once after this many items
    end_reason: int = codec.END_STATE_CHANGED
    drop_after: int = 0  # abort a connection after sending this many items
    drop_times: int = 1


def parse_stream_end(spec: str) -> tuple[int, int]:
    """``REASON@N`` (``--stream-end``): the STREAM_END reason's code, and after how many items each
    vbucket's stream ends (at least one, so that the stream began)."""
    reasons = {name: value for value, name in codec.END_REASONS.items()}
    reason, _, after = spec.partition("@")
    if reason not in reasons or not after.isdigit() or int(after) < 1:
        raise ValueError(f"{spec!r}: use REASON@N, e.g. too_slow@10")
    return reasons[reason], int(after)


@dataclass
class ProducerConfig:
    host: str = "127.0.0.1"
    port: int = 11210
    snapshot_size: int = 64
    record: str | None = None
    faults: Faults = field(default_factory=Faults)
    #: Reset a connection that acknowledged none of our bytes for this long (0: never).
    write_timeout: float = 30.0
    #: Close a DCP connection with noops on that sent nothing for this long (0: never), as the
    #: server's ``dcp_idle_timeout``.
    idle_timeout: float = 360.0
    #: The account SASL checks (PLAIN, SCRAM-SHA512/256/1) and the one bucket's name.
    username: str = "Administrator"
    password: str = "password"
    bucket: str = "default"
    #: Refuse all but HELLO and SASL before authentication, and DCP before SELECT_BUCKET, as a node
    #: does; off, a connection starts authenticated on the bucket.
    require_auth: bool = False


@dataclass
class Stats:
    connections: int = 0
    items: int = 0
    snapshots: int = 0
    streams: int = 0
    rollbacks: int = 0
    not_my_vbucket: int = 0
    stream_ends: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    noops: int = 0
    stalls: int = 0
    timeouts: int = 0
    violations: list[str] = field(default_factory=list)
    per_vbucket: dict[int, int] = field(default_factory=dict)
    node_connections: dict[int, int] = field(default_factory=dict)
    node_items: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Chunk:
    """A run of one stream's messages, encoded together: a snapshot's marker and items (or a piece), its end.

    ``data`` holds the messages back to back and ``ends[k]`` is where message k
    ends, so the pump finds how many fit the flow-control window with one bisect.
    Items are messages ``first_item`` to ``last_item`` (exclusive); with
    ``end_reason`` set the last message is a STREAM_END.
    """

    data: bytes
    ends: list[int]
    first_item: int
    last_item: int
    end_reason: int | None = None


class _Stream:
    """One accepted stream: its chunks, made as the window lets them go, and how far the current one went."""

    __slots__ = ("vb", "opaque", "sid", "chunks", "chunk", "at")

    def __init__(self, vb: VBucket, opaque: int, sid: int | None, chunks: Iterator[_Chunk]) -> None:
        self.vb = vb
        self.opaque = opaque
        self.sid = sid
        self.chunks = chunks
        self.chunk: _Chunk | None = None
        self.at = 0


class MockProducer:
    def __init__(self, config: ProducerConfig, bucket: Bucket, log: Callable[[str], None]) -> None:
        self.config = config
        self.bucket = bucket
        self.log = log
        self.stats = Stats()
        self.servers: list[asyncio.base_events.Server] = []
        #: Each node's KV port (the second node exists when vbuckets are to move), and the vbuckets moved.
        self.ports: list[int] = []
        self.moved: set[int] = set()
        self.sessions: set[_Session] = set()
        self.ended_once: set[int] = set()
        self.pcap = PcapWriter(config.record) if config.record else None
        self.started = time.monotonic()
        self.account = sasl.Account(config.username, config.password)
        self.bucket_uuid = f"{min((vb.uuid for vb in bucket.vbuckets.values()), default=0):032x}"

    async def start(self) -> tuple[str, int]:
        """Listen (the second node on a free port of the same host); the first node's address."""
        quiet_accept_errors("dcp mock-producer")
        for node, port in enumerate((self.config.port, 0)[: 2 if self.config.faults.move else 1]):
            server = await asyncio.start_server(
                lambda r, w, node=node: self._accept(r, w, node), self.config.host, port
            )
            self.servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return host, port

    @property
    def rev(self) -> int:
        """The bucket config's revision: one more for each vbucket moved."""
        return 1 + len(self.moved)

    def node_of(self, vb: int) -> int:
        """The node a vbucket is active on."""
        return 1 if vb in self.moved else 0

    def move(self, vb: int) -> None:
        self.moved.add(vb)
        self.log(f"vbucket {vb} moved to the node on port {self.ports[1]}; bucket config rev {self.rev}")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: int) -> None:
        session = _Session(self, reader, writer, node)
        self.sessions.add(session)
        try:
            await session.run()
        finally:
            self.sessions.discard(session)

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        for session in list(self.sessions):
            session.close()
        for _ in range(100):
            if not self.sessions:
                break
            await asyncio.sleep(0.01)
        if self.pcap is not None:
            self.pcap.close()

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "connections": s.connections,
            "items_sent": s.items,
            "snapshots": s.snapshots,
            "streams": s.streams,
            "rollbacks": s.rollbacks,
            "not_my_vbucket": s.not_my_vbucket,
            "moved": sorted(self.moved),
            "nodes": [
                {
                    "port": port,
                    "connections": s.node_connections.get(k, 0),
                    "items_sent": s.node_items.get(k, 0),
                }
                for k, port in enumerate(self.ports)
            ],
            "stream_ends": s.stream_ends,
            "dropped_connections": s.dropped,
            "noops": s.noops,
            "flow_control_stalls": s.stalls,
            "timeouts": s.timeouts,
            "violations": s.violations,
            "vbuckets": [
                {
                    "vbucket": vb.vb,
                    "uuid": vb.uuid,
                    "high_seqno": vb.high_seqno,
                    "failover_entries": len(vb.failover),
                    "items_sent": s.per_vbucket.get(vb.vb, 0),
                }
                for vb in self.bucket.vbuckets.values()
            ],
            "seconds": round(time.monotonic() - self.started, 3),
        }


class _Session:
    """One consumer connection."""

    def __init__(
        self,
        producer: MockProducer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        node: int = 0,
    ) -> None:
        self.producer = producer
        self.node = node
        producer.stats.node_connections[node] = producer.stats.node_connections.get(node, 0) + 1
        self.reader = reader
        self.writer = writer
        self.conn = Connection()
        self.splitter = PacketSplitter()
        self.streams: dict[int, _Stream] = {}
        self.order: deque[int] = deque()
        self.wake = asyncio.Event()
        self.closed = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self.last_noop = time.monotonic()
        self.noop_opaque = 10_000_000
        self.items = 0
        self.end_on_close = False
        self.last_received = time.monotonic()
        open_access = not producer.config.require_auth
        self.authenticated = open_access
        self.bucket_name: str | None = producer.config.bucket if open_access else None
        self.scram: sasl.ScramServer | None = None
        self.open_flags = 0
        self.expiry_opcode = False
        producer.stats.connections += 1
        self.index = producer.stats.connections
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        self.name = f"{peer[0]}:{peer[1]}"
        self.tcp = None
        if producer.pcap is not None:
            me = writer.get_extra_info("sockname")
            with contextlib.suppress(ValueError):
                self.tcp = producer.pcap.tcp_session(peer[:2], me[:2], timestamp=time.time())
        timeout = producer.config.write_timeout
        self.watch = WriteWatch(writer.transport, timeout, self.stalled, "the consumer") if timeout else None

    def stalled(self, reason: str) -> None:
        self.producer.stats.timeouts += 1
        self.producer.log(f"connection {self.index} ({self.name}): {reason}")
        if self.tcp is not None:
            self.tcp.reset(False, time.time())
            self.tcp = None
        self.closed = True
        self.wake.set()

    # ----------------------------------------------------------------------------- plumbing

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.tcp is not None:
            self.tcp.send(False, data, time.time())
        if self.watch is not None:
            self.watch.wrote(len(data))
        self.writer.write(data)

    def respond(
        self, p: Packet, status: int = SUCCESS, value: bytes = b"", extras: bytes = b"", datatype: int = 0
    ) -> None:
        wire = codec.response(
            p.opcode, status, opaque=p.opaque, value=value, extras=extras, datatype=datatype
        )
        verdict = self.conn.feed(PRODUCER, decode_packet(wire))
        if verdict.kind is not Kind.ACCEPTED:
            self.producer.stats.violations.append(f"connection {self.index}: own response: {verdict.reason}")
        self.send(wire)

    def close(self, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.wake.set()
        if self.watch is not None and abort:
            self.watch.stop()  # else it watches the flush of what is left to send
        if self.tcp is not None:
            (self.tcp.reset if abort else self.tcp.close)(False, time.time())
        if abort:
            self.writer.transport.abort()
        else:
            self.writer.close()

    async def run(self) -> None:
        pump = asyncio.ensure_future(self.pump())
        idle = asyncio.ensure_future(self.idle_watch()) if self.producer.config.idle_timeout else None
        try:
            while not self.closed:
                data = await self.reader.read(256 * 1024)
                if not data:
                    self.conn.end(
                        CONSUMER, End.CUT if self.splitter.pending() else End.CLOSED, self.splitter.pending()
                    )
                    break
                if self.tcp is not None:
                    self.tcp.send(True, data, time.time())
                bad = None
                try:
                    packets = self.splitter.feed(data)
                except ProtocolError as err:
                    bad, packets = err, err.packets  # the whole packets before the bad header go first
                for offset, wire in packets:
                    if not await self.take(offset, wire):
                        break
                self.wake.set()
                if bad is not None and not self.closed:
                    self.producer.log(f"connection {self.index} ({self.name}): {bad}; closing")
                    self.producer.stats.violations.append(f"connection {self.index}: {bad}")
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            if not self.closed and self.tcp is not None:
                self.tcp.close(True, time.time())
                self.tcp = None
            self.close()
            for task in (pump, idle):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                        await task

    async def take(self, offset: int, wire: bytes) -> bool:
        """Handle one packet, then wait while the replies waiting to be sent fill the send queue.

        False when the connection is closed.
        """
        try:
            p = decode_packet(wire, 0, offset)
        except ProtocolError as err:
            self.refuse(wire, err)
            return False
        self.last_received = time.monotonic()
        self.handle(p, offset)
        if self.closed:
            return False
        if self.writer.transport.get_write_buffer_size() >= MAX_SEND_QUEUE:
            await self.writer.drain()  # bounded in time by the write timeout
        return not self.closed

    def refuse(self, wire: bytes, err: ProtocolError) -> None:
        """A packet whose lengths do not add up: EINVAL to its opcode and opaque, and close."""
        self.producer.log(f"connection {self.index} ({self.name}): {err}; closing")
        self.producer.stats.violations.append(f"connection {self.index}: {err}")
        if wire[0] in codec.REQUEST_MAGICS:
            self.send(codec.response(wire[1], codec.EINVAL, opaque=int.from_bytes(wire[12:16], "big")))
        self.close()

    async def idle_watch(self) -> None:
        """Close a connection with noops on that sent nothing for the idle timeout (``dcp_idle_timeout``)."""
        timeout = self.producer.config.idle_timeout
        while not self.closed:
            left = self.last_received + timeout - time.monotonic()
            if left <= 0 and self.conn.noop_enabled:
                self.producer.stats.timeouts += 1
                self.producer.log(
                    f"connection {self.index} ({self.name}): nothing received for {timeout:g} s "
                    "with noops on; closing"
                )
                self.close()
                return
            await asyncio.sleep(max(left, min(timeout, 1.0)))

    # ----------------------------------------------------------------------------- commands

    def handle(self, p: Packet, offset: int) -> None:
        op = p.opcode
        if p.is_request and op not in codec.OPCODES:  # legal to send, not judged (mcbp Cookie::validate)
            status = codec.UNKNOWN_COMMAND if self.authenticated else codec.EACCESS
            self.send(codec.response(op, status, opaque=p.opaque))
            return
        verdict = self.conn.feed(CONSUMER, p, offset=offset)
        stats = self.producer.stats
        if verdict.kind is not Kind.ACCEPTED:
            stats.violations.append(f"connection {self.index} offset {offset}: {verdict.reason}")
            self.producer.log(f"connection {self.index} ({self.name}): {verdict.reason}")
            if verdict.kind is Kind.MALFORMED:
                if not p.is_request:
                    self.close()
                else:  # the validator's EINVAL; the connection stays, as on a data node
                    self.respond(p, codec.EINVAL)
                return
            if not p.is_request and op == codec.NOOP and p.status == SUCCESS:
                # A successful reply matching no NOOP goes to the producer's error handler, which
                # disconnects (producer.cc handleResponse).
                self.close()
                return
        if not p.is_request:
            if op == codec.NOOP:
                stats.noops += 1
            return
        msg = verdict.message
        if not self.authenticated and op not in _BEFORE_AUTH:
            self.respond(p, codec.EACCESS)
            return
        if op in _DCP_OPCODES and op not in _BEFORE_OPEN and self.conn.opened is None:
            self.respond(p, codec.EINVAL)  # "only on a DCP connection": refused, the connection kept
            return
        if op in _NEED_BUCKET and self.bucket_name is None:
            self.respond(p, codec.NO_BUCKET)
            return
        if op == codec.STREAM_REQ:
            self.stream_req(p, msg)
        elif op == codec.BUFFER_ACK:
            self.wake.set()
        elif op == codec.OPEN:
            self.respond(p, self.open_status(p, msg))
        elif op == codec.CONTROL:
            self.respond(p, self.control(msg))
        elif op == codec.GET_ALL_VB_SEQNOS:
            producer = self.producer
            entries = [
                (vb.vb, vb.high_seqno)
                for vb in producer.bucket.vbuckets.values()
                if producer.node_of(vb.vb) == self.node
            ]
            self.respond(p, value=codec.vb_seqnos_value(entries))
        elif op == codec.GET_FAILOVER_LOG:
            vb = self.vbucket(p.vbucket)
            if vb is None:
                self.not_my_vbucket(p)
            else:
                self.respond(p, value=codec.failover_log_value(vb.failover))
        elif op == codec.CLOSE_STREAM:
            self.close_stream(p)
        elif op == codec.GET_CLUSTER_CONFIG:
            self.respond(p, value=self.cluster_config(), datatype=codec.DATATYPE_JSON)
        elif op in (codec.HELLO, codec.VERSION, codec.SASL_LIST_MECHS, codec.SASL_AUTH, codec.SASL_STEP):
            self.setup(p)
        elif op == codec.SELECT_BUCKET:
            self.respond(p, self.select_bucket(p.key))
        elif op == codec.GET_ERROR_MAP:
            body = errormap.error_map(msg.version)
            if body is None:
                self.respond(p, codec.KEY_ENOENT)
            else:
                self.respond(p, value=body, datatype=codec.DATATYPE_JSON)
        else:
            self.respond(p, codec.NOT_SUPPORTED)

    def setup(self, p: Packet) -> None:
        """HELLO, VERSION and SASL, as a data node answers them."""
        op = p.opcode
        if op == codec.HELLO:
            wanted = {int.from_bytes(p.value[i : i + 2], "big") for i in range(0, len(p.value) - 1, 2)}
            if _DUPLEX not in wanted:
                wanted.discard(_CLUSTERMAP_NOTIFICATION)
            granted = b"".join(f.to_bytes(2, "big") for f in FEATURES if f in wanted)
            self.respond(p, value=granted)
        elif op == codec.VERSION:
            self.respond(p, value=b"7.6.0-wallaroo-proto-mock")
        elif op == codec.SASL_LIST_MECHS:
            self.respond(p, value=" ".join(sasl.MECHANISMS).encode())
        else:
            self.sasl(p)

    def sasl(self, p: Packet) -> None:
        """SASL_AUTH (PLAIN, or SCRAM's first message) and SASL_STEP (SCRAM's final message)."""
        account = self.producer.account
        mechanism = p.key.decode("ascii", "replace")
        try:
            if p.opcode == codec.SASL_AUTH:
                self.scram = None
                if mechanism == "PLAIN":
                    account.plain(p.value)
                    self.authenticated = True
                    self.respond(p)
                    return
                if mechanism not in sasl.MECHANISMS:
                    self.respond(p, codec.AUTH_ERROR)
                    return
                self.scram = sasl.ScramServer(account, mechanism)
                self.respond(p, codec.AUTH_CONTINUE, value=self.scram.first(p.value))
                return
            if self.scram is None or self.scram.mechanism != mechanism:
                raise sasl.AuthFailed(f"SASL_STEP {mechanism} with no exchange of it under way")
            final = self.scram.final(p.value)
            self.scram = None
            self.authenticated = True
            self.respond(p, value=final)
        except sasl.AuthFailed as err:
            self.scram = None
            self.producer.log(f"connection {self.index} ({self.name}): authentication failed: {err}")
            self.respond(p, codec.AUTH_ERROR)

    def select_bucket(self, name: bytes) -> int:
        """SELECT_BUCKET as a data node answers an administrator: the one bucket, or KEY_ENOENT."""
        if self.conn.opened is not None:
            return codec.NOT_SUPPORTED  # "DCP connections cannot change bucket"
        if name == b"@no bucket@":
            self.bucket_name = None
            return SUCCESS
        if name.decode("utf-8", "replace") != self.producer.config.bucket:
            return codec.KEY_ENOENT
        self.bucket_name = self.producer.config.bucket
        return SUCCESS

    def open_status(self, p: Packet, msg: Open) -> int:
        """DCP_OPEN's answer: the validator's checks (flags, value), one open a connection, producers only."""
        flags = msg.flags
        if self.conn.opened is not None or flags & ~_OPEN_FLAGS:
            return codec.EINVAL
        if flags & _SKIP_DELETES and not flags & codec.OPEN_PRODUCER:
            return codec.EINVAL
        if flags & _NO_VALUE and flags & _NO_VALUE_WITH_DATATYPE:
            return codec.EINVAL
        if flags & _INCLUDE_DELETED_USER_XATTRS and not flags & _INCLUDE_XATTRS:
            return codec.EINVAL
        if p.value:
            if p.datatype != codec.DATATYPE_JSON:
                return codec.EINVAL
            try:
                obj = json.loads(p.value)
            except ValueError:
                return codec.EINVAL
            if not isinstance(obj, dict) or any(
                k != "consumer_name" or flags & codec.OPEN_PRODUCER or not isinstance(v, str)
                for k, v in obj.items()
            ):
                return codec.EINVAL
        elif p.datatype:
            return codec.EINVAL
        if not msg.producer:
            return codec.NOT_SUPPORTED  # this mock plays the producer side only
        self.open_flags = flags
        return SUCCESS

    def cluster_config(self) -> bytes:
        """The bucket config as this node gives it, at the address the client connected to."""
        host = self.writer.get_extra_info("sockname")[0]
        producer = self.producer
        vbuckets = max(producer.bucket.vbuckets, default=-1) + 1
        owners = [producer.node_of(vb) for vb in range(vbuckets)]
        name, uuid = producer.config.bucket, producer.bucket_uuid
        return cluster.bucket_config(name, uuid, owners, host, producer.ports, self.node, producer.rev)

    def not_my_vbucket(self, p: Packet) -> None:
        """NOT_MY_VBUCKET carries the bucket config, from which a client learns where the vbucket went."""
        self.respond(p, codec.NOT_MY_VBUCKET, value=self.cluster_config(), datatype=codec.DATATYPE_JSON)

    def control(self, c: Control) -> int:
        status = controls.control_status(c.key, c.value)
        if status != SUCCESS:
            return status
        if c.key == "set_noop_interval":
            self.noop_interval = controls.noop_interval(c.value)
        elif c.key == "send_stream_end_on_client_close_stream" and c.value == "true":
            self.end_on_close = True
        elif c.key == "enable_expiry_opcode":
            self.expiry_opcode = c.value == "true"
        return SUCCESS

    def vbucket(self, vb: int) -> VBucket | None:
        """The vbucket if it is active on this node, else None (NOT_MY_VBUCKET)."""
        producer = self.producer
        if vb in producer.config.faults.not_my_vbucket or producer.node_of(vb) != self.node:
            return None
        return producer.bucket.vbuckets.get(vb)

    def stream_req(self, p: Packet, req: StreamReq) -> None:
        producer = self.producer
        stats = producer.stats
        vbid = p.vbucket
        moving = producer.config.faults.move.difference(producer.moved)
        if vbid in moving and vbid in producer.bucket.vbuckets and self.node == 0:
            producer.move(vbid)  # the rebalance ends as the request arrives
        vb = self.vbucket(p.vbucket)
        if vb is None:
            stats.not_my_vbucket += 1
            self.not_my_vbucket(p)
            return
        if req.start > req.end or not req.snap_start <= req.start <= req.snap_end:
            self.respond(p, codec.ERANGE)
            return
        sid = None
        if req.json:
            try:
                sid = json.loads(req.json).get("sid")
            except (ValueError, AttributeError):
                self.respond(p, codec.EINVAL)
                return
        if (sid is not None) != self.conn.stream_ids:
            self.respond(p, codec.STREAMID_INVALID)
            return
        if any(s.vb.vb == vb.vb and s.sid == sid for s in self.streams.values()):
            self.respond(p, codec.KEY_EEXISTS)
            return
        rollback = needs_rollback(
            req.start, req.vbucket_uuid, req.snap_start, req.snap_end, vb.failover, vb.high_seqno
        )
        if rollback is not None:
            stats.rollbacks += 1
            wire = codec.rollback_response(p.opaque, rollback)
            self.conn.feed(PRODUCER, decode_packet(wire))
            self.send(wire)
            return
        if req.start > vb.high_seqno:
            self.respond(p, codec.ERANGE)
            return
        self.respond(p, value=codec.failover_log_value(vb.failover))
        stats.streams += 1
        stream = _Stream(vb, p.opaque, sid, self.chunks(vb, p.opaque, req, sid))
        self.streams[p.opaque] = stream
        self.order.append(p.opaque)
        self.wake.set()

    def close_stream(self, p: Packet) -> None:
        for opaque, s in list(self.streams.items()):
            if s.vb.vb == p.vbucket:
                if os.environ.get("WALLAROO_PROTO_PLANT") == "close-stream-goes-on":
                    self.respond(p)  # a rule broken on purpose, for fuzz's tests: the stream goes on
                    return
                del self.streams[opaque]
                self.respond(p)
                if self.end_on_close:
                    self.send(codec.stream_end(s.vb.vb, opaque, codec.END_CLOSED, s.sid))
                self.conn.end_stream(opaque, "closed")
                return
        self.respond(p, codec.KEY_ENOENT)

    # ----------------------------------------------------------------------------- streaming

    def chunks(self, vb: VBucket, opaque: int, req: StreamReq, sid: int | None) -> Iterator[_Chunk]:
        """The stream's messages a snapshot (or a piece of a large one) at a time, encoded when sent."""
        faults = self.producer.config.faults
        stats = self.producer.stats
        ended_once = self.producer.ended_once
        sent = 0
        vbid = vb.vb
        opaque_bytes = opaque.to_bytes(4, "big")
        for snap in vb.snapshots(req.start, req.end, self.producer.config.snapshot_size):
            stats.snapshots += 1
            versions = snap.versions
            end_reason = None
            if faults.end_after and vbid not in ended_once and sent + len(versions) > faults.end_after:
                versions = versions[: max(0, faults.end_after - sent)]
                ended_once.add(vbid)
                end_reason = faults.end_reason
            sent += len(versions)
            marker = codec.snapshot_marker(vbid, opaque, snap.start, snap.end, snap.flags, sid)
            for at in range(0, max(len(versions), 1), _CHUNK_ITEMS):  # a large backfill in pieces
                piece = versions[at : at + _CHUNK_ITEMS]
                lead = [] if at else [marker]
                if sid is None and not self.delete_times:  # the stored packets with this stream's opaque
                    tails = list(map(_TAIL, piece))
                    body = chain.from_iterable(zip(map(_HEAD, piece), repeat(opaque_bytes), tails))
                    data = b"".join(chain(lead, body))
                    sizes = map(add, map(len, tails), repeat(len(opaque_bytes) + OPAQUE_AT))
                    ends = list(accumulate(chain(map(len, lead), sizes)))
                else:
                    wires = lead + [self.item_packet(vbid, opaque, v, sid) for v in piece]
                    data, ends = b"".join(wires), list(accumulate(map(len, wires)))
                last = at + _CHUNK_ITEMS >= len(versions)
                reason = end_reason if last else None
                if reason is not None:
                    end_wire = codec.stream_end(vbid, opaque, reason, sid)
                    data += end_wire
                    ends.append(ends[-1] + len(end_wire) if ends else len(end_wire))
                yield _Chunk(data, ends, len(lead), len(lead) + len(piece), reason)
            if end_reason is not None:
                return
        if req.end != FOREVER and req.end <= vb.high_seqno:
            end_wire = codec.stream_end(vbid, opaque, codec.END_OK, sid)
            yield _Chunk(end_wire, [len(end_wire)], 0, 0, codec.END_OK)

    @property
    def delete_times(self) -> bool:
        """Deletions as V2 (with a delete time): the connection opened with IncludeDeleteTimes."""
        return bool(self.open_flags & _INCLUDE_DELETE_TIMES)

    def item_packet(self, vbid: int, opaque: int, v: Version, sid: int | None) -> bytes:
        """One version's packet in this connection's form (stream id, deletion V1 or V2, expirations).

        An expiration is DCP_EXPIRATION only after IncludeDeleteTimes and ``enable_expiry_opcode=true``,
        else a deletion, as the server sends it; the delete time is the CAS's seconds.
        """
        key = v.key.encode()
        when = v.cas // 1_000_000_000 & 0xFFFF_FFFF
        if v.op == MUTATION:
            wire = codec.mutation(vbid, opaque, v.seqno, v.rev, key, v.value.encode(), sid=sid)
        elif v.op == EXPIRATION and self.expiry_opcode and self.delete_times:
            wire = codec.expiration(vbid, opaque, v.seqno, v.rev, key, when, sid)
        elif self.delete_times:
            extras = _DELETION_V2.pack(v.seqno, v.rev, when, 0)
            wire = codec.request(codec.DELETION, vbucket=vbid, opaque=opaque, extras=extras, key=key, sid=sid)
        else:
            wire = codec.deletion(vbid, opaque, v.seqno, v.rev, key, sid)
        return wire[:CAS_AT] + v.cas.to_bytes(8, "big") + wire[CAS_AT + 8 :]  # the header's CAS

    def _noop_due(self, now: float) -> float | None:
        """Seconds until the next noop (0: now), or None when noops are off."""
        if not self.conn.noop_enabled or self.conn.noop_pending is not None:
            return None
        return max(0.0, self.last_noop + self.noop_interval - now)

    async def pump(self) -> None:
        conn = self.conn
        while not self.closed:
            now = time.monotonic()
            due = self._noop_due(now)
            if due == 0:
                self.noop_opaque += 1
                opaque = self.noop_opaque
                wire = codec.noop(opaque)
                conn.feed(PRODUCER, decode_packet(wire))
                self.send(wire)
                self.last_noop = now
                due = None
            batch: list[bytes | memoryview] = []
            if not self.fill(batch):
                return
            if batch:
                self.send(b"".join(batch))
                await self.writer.drain()
                continue
            self.wake.clear()
            timeout = None if due is None else max(due, 0.01)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def fill(self, batch: list[bytes | memoryview]) -> bool:
        """Stream messages into ``batch``, round-robin a run per stream, while the window has room.

        A run goes as one slice of its chunk's bytes; a batch holds at most ``_BATCH`` messages.

        Every message goes while fewer bytes than the buffer are unacknowledged, as
        ``Connection.may_send`` says per message. Returns False when a fault dropped the connection.
        """
        conn = self.conn
        stats = self.producer.stats
        faults = self.producer.config.faults
        order = self.order
        room = _BATCH
        while order and conn.may_send() and room > 0:
            opaque = order[0]
            stream = self.streams.get(opaque)
            if stream is None:
                order.popleft()
                continue
            chunk = stream.chunk
            if chunk is None or stream.at >= len(chunk.ends):
                chunk = stream.chunk = next(stream.chunks, None)
                stream.at = 0
                if chunk is None:  # open-ended stream with nothing more to send: idle
                    order.popleft()
                    continue
            ends = chunk.ends
            i = stream.at
            base = ends[i - 1] if i else 0
            j = min(len(ends), i + room)
            if conn.buffer_size:  # message m may go while the bytes before it leave the window open
                j = min(j, bisect.bisect_left(ends, base + conn.buffer_size - conn.outstanding, i) + 1)
            items = max(0, min(j, chunk.last_item) - max(i, chunk.first_item))
            drop = (
                faults.drop_after
                and stats.dropped < faults.drop_times
                and self.items + items >= faults.drop_after
            )
            if drop:
                items = faults.drop_after - self.items
                j = max(i, chunk.first_item) + items
            # Only the run's last message can fill the buffer: one count for the run is exact.
            if conn.count_sent(ends[j - 1] - base):
                stats.stalls += 1
            if j > i:
                batch.append(memoryview(chunk.data)[base : ends[j - 1]])
                room -= j - i
            stream.at = j
            if items:
                stats.items += items
                self.items += items
                vbid = stream.vb.vb
                stats.per_vbucket[vbid] = stats.per_vbucket.get(vbid, 0) + items
                stats.node_items[self.node] = stats.node_items.get(self.node, 0) + items
            if drop:
                stats.dropped += 1
                self.send(b"".join(batch))
                self.producer.log(f"connection {self.index}: dropped after {self.items} items")
                self.close(abort=True)
                return False
            if chunk.end_reason is not None and j == len(ends):
                reason = codec.END_REASONS[chunk.end_reason]
                stats.stream_ends[reason] = stats.stream_ends.get(reason, 0) + 1
                conn.end_stream(opaque, reason)
                del self.streams[opaque]
                order.popleft()
                continue
            order.rotate(-1)
        return True


#: A DCP_DELETION's V2 extras: seqno, rev seqno, delete time, collection length (0: no collections).
_DELETION_V2 = struct.Struct(">QQIB")


_HEAD, _TAIL = attrgetter("head"), attrgetter("tail")
