"""The mock Immortal Coordinator: plays the IC for a language binding under test.

It listens on the receive port (the LB's messages) and, once an LB connected
there, on the send port (the IC's log records), as the IC does: an LB that
connects to the send port first is refused. Each LB connection is one run of
the IC: a first start when no checkpoint is stored (TakeBecomingPrimaryCheckpoint,
the LB's InitialMessage and first checkpoint, then record 0 echoing the
InitialMessage), else a recovery (the checkpoint record and its bytes, the log
after it replayed byte for byte, TakeBecomingPrimaryCheckpoint, or
UpgradeTakeCheckpoint with ``upgrade``). Then it delivers the input RPCs in
records, logging each before sending it, and the LB's self calls come back
through the log like any other RPC; replayed self calls it already logged are
dropped, so each takes effect once. A checkpoint is asked for every
``checkpoint_every`` records, when the LB asks, and once all RPCs are in.
Then the sockets stay open, as a real IC's do, unless ``exit_when_done``.

An LB that breaks a rule ends the IC: both sockets closed, as the real IC's
``OnError`` kills its local worker. An LB that goes away, or that reads none of
the records for ``write_timeout`` seconds (reset then), ends the run; the next
LB to connect gets a recovery from the store, as a restarted IC would give.
Faults: wrong check bytes on the wire for one record, a skipped sequence id, a
kill -9 of the IC right after a record is logged.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.write_watch import WriteWatch, reset

from .codec import (
    CHECKPOINT,
    INITIAL_MESSAGE,
    RPC,
    RPC_BATCH,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    TAKE_CHECKPOINT,
    UPGRADE_TAKE_CHECKPOINT,
    Blob,
    Garbage,
    MalformedError,
    MessageFrame,
    MessageSplitter,
    batch_messages,
    checkpoint_length,
    checkpoint_record,
    control_record,
    decode_rpc,
    encode_incoming_rpc,
    encode_message,
    encode_record,
    read_header,
    type_name,
)
from .core import IC, LB, Session
from .immortal import RpcSource
from .store import DirStore, IcCheckpoint, LoggedRecord, MemoryStore

DIALECTS = ("current", "seed")
#: The most records built, logged and sent at once.
MAX_BURST = 64
#: Input lines read ahead of the log when they are streamed in.
MAX_HELD_LINES = 10_000


@dataclass
class IcConfig:
    source: RpcSource
    host: str = "127.0.0.1"
    receive_port: int = 0
    send_port: int = 0
    send_host: str | None = None  # the send port's host, when not ``host``
    log_dir: str | None = None
    fsync: bool = True
    batch: int = 100
    checkpoint_every: int = 0
    committer: int | None = None
    bad_check_at: int | None = None
    gap_at: int | None = None
    crash_at: int | None = None
    upgrade: bool = False
    dialect: str = "current"
    exit_when_done: bool = False
    write_timeout: float = 30.0
    #: Seconds a receive-port connection may wait for its send-port one (0: forever): a port
    #: scanner or a stray client that connects and never goes on would hold the IC.
    pair_timeout: float = 5.0
    record: str | None = None
    log: Callable[[str], None] = lambda line: None
    #: Lines only a verbose run shows: each LB connection, each checkpoint stored.
    trace: Callable[[str], None] = lambda line: None


@dataclass
class IcStats:
    runs: int = 0
    first_starts: int = 0
    recoveries: int = 0
    records_sent: int = 0
    records_replayed: int = 0
    rpcs_logged: int = 0
    rpcs_before: int | None = None  # input RPCs the log held when this process started
    self_calls_logged: int = 0
    self_calls_dropped: int = 0
    remote_calls: int = 0
    checkpoints: int = 0
    last_checkpoint: dict | None = None
    violations: list[str] = field(default_factory=list)
    fatal: str = ""  # the LB's rule break that ended the IC
    stalls: int = 0
    delivery_seconds: float = 0.0
    done: bool = False
    faults_fired: set[str] = field(default_factory=set)  # "gap_at", "bad_check_at"


class ListenError(OSError):
    """One of the two ports could not be bound: which one, and where."""

    def __init__(self, which: str, host: str, port: int, err: OSError) -> None:
        super().__init__(err.errno, err.strerror)
        self.which, self.address = which, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class LbGone(Exception):
    """The LB closed or reset a socket: this run of the IC is over."""


class _Run:
    """One LB connection: its sockets, the judge, and what its reader found."""

    def __init__(self, outputs: int, durable: int, pending: list[bytes]) -> None:
        self.session = Session(verify_check_bytes=False, judge_own_bodies=False)
        self.outputs = outputs  # LB self calls seen, replayed ones included
        self.durable = durable  # of those, the ones the log (or the checkpoint) holds
        self.pending = pending
        self.initial: bytes | None = None
        self.lb_asks = False
        self.checkpoint: asyncio.Future[bytes] | None = None
        self.gone = asyncio.Event()
        self.wake = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None
        self.lb_writer: asyncio.StreamWriter | None = None
        self.watch: WriteWatch | None = None
        self.fatal: str | None = None  # the first rule the LB broke: the IC ends
        self.stalled: str | None = None
        self.pcap_in = self.pcap_out = None

    def end(self) -> None:
        """Whatever the IC waits for from this LB will not come."""
        self.gone.set()
        self.wake.set()
        if self.checkpoint is not None and not self.checkpoint.done():
            self.checkpoint.set_exception(LbGone())


class MockIC:
    def __init__(self, config: IcConfig) -> None:
        self.config = config
        self.stats = IcStats()
        self.store = DirStore(config.log_dir, fsync=config.fsync) if config.log_dir else MemoryStore()
        loaded = self.store.load()  # a log dir it cannot recover from is refused now, not at the first LB
        last = loaded.records[-1] if loaded.records else None
        #: Where this process's first new record goes, and the input RPCs the log already holds.
        self.next_seq = last.seq + 1 if last else loaded.checkpoint.seq if loaded.checkpoint else 0
        self.held = last.generated if last else loaded.checkpoint.generated if loaded.checkpoint else 0
        self.resumed = loaded.checkpoint is not None
        self.rsock: socket.socket | None = None
        self.ssock: socket.socket | None = None
        self.send_port = config.send_port
        self.pcap = PcapWriter(config.record) if config.record else None
        self._stopping = False
        self._run: _Run | None = None
        self._held = threading.Semaphore(MAX_HELD_LINES)

    # --- sockets ----------------------------------------------------------------------------------

    def bind(self) -> tuple[str, int, int]:
        """Bind both ports (the send port does not listen yet): (host, receive port, send port)."""
        cfg = self.config
        try:
            self.rsock = _bound(cfg.host, cfg.receive_port)
        except OSError as err:
            raise ListenError("the receive port", cfg.host, cfg.receive_port, err) from err
        self.rsock.listen(1)
        try:
            self.ssock = _bound(self.send_host, cfg.send_port)
        except OSError as err:
            raise ListenError("the send port", self.send_host, cfg.send_port, err) from err
        self.send_port = self.ssock.getsockname()[1]
        return cfg.host, self.rsock.getsockname()[1], self.send_port

    @property
    def send_host(self) -> str:
        return self.config.send_host or self.config.host

    def input_records(self) -> int | None:
        """How many new records the input fills (None while it streams in): the LB's self calls may
        fill more. A first start's record 0 is there even without RPCs (it echoes the InitialMessage)."""
        source = self.config.source
        if source.open:
            return None
        left = max(0, source.count - self.held)
        records = -(-left // self.config.batch)
        return max(records, 0 if self.resumed else 1)

    def fault_reach(self) -> tuple[list[str], list[str]]:
        """Faults asked for that cannot fire (refused) and that fire only if self calls fill records
        beyond the input's (warned): a fault names a record this process has yet to log."""
        cfg = self.config
        refused: list[str] = []
        warned: list[str] = []
        records = self.input_records()
        ids = (
            None
            if records is None
            else records + (cfg.gap_at is not None and cfg.gap_at < self.next_seq + records)
        )
        for option, seq in (
            ("--bad-check-at", cfg.bad_check_at),
            ("--gap-at", cfg.gap_at),
            ("--crash-at", cfg.crash_at),
        ):
            if seq is None:
                continue
            if seq < 0:
                refused.append(f"{option} {seq} can never fire: sequence ids start at 0")
            elif seq < self.next_seq:
                refused.append(
                    f"{option} {seq} can never fire: the log in {cfg.log_dir} already holds records up to "
                    f"{self.next_seq - 1}; a fault fires on a record logged now (a new --log-dir starts at 0)"
                )
            elif ids is not None and seq >= self.next_seq + ids:
                span = f"records {self.next_seq}-{self.next_seq + ids - 1}" if ids else "no record"
                warned.append(
                    f"fault {option} {seq} fires only if the LB's self calls fill records beyond "
                    f"the input's: --rpcs/--input and --batch make {span}"
                )
        return refused, warned

    def resume_note(self) -> str | None:
        """What a restart on a log skips, and why; None on a first start."""
        if not self.resumed:
            return None
        source = self.config.source
        left = "" if source.open else f", {max(0, source.count - self.held):,} of {source.count:,} to deliver"
        note = (
            f"resumed from {self.config.log_dir} at record {self.next_seq}: {self.held:,} input RPCs "
            f"already logged are skipped{left}"
        )
        if not source.open and self.held >= source.count:
            note += " (nothing new: --rpcs is the log's total; raise it or use a new --log-dir)"
        return note

    async def _accept_pair(self) -> tuple[socket.socket, socket.socket]:
        """The next LB's two connections; a receive-port one whose send-port one does not come
        within ``pair_timeout`` is closed with a line, and the IC waits for the next LB."""
        loop = asyncio.get_running_loop()
        wait = self.config.pair_timeout or None
        while True:
            conn_r, peer = await loop.sock_accept(self.rsock)
            self.ssock.listen(1)
            try:
                conn_s, _ = await asyncio.wait_for(loop.sock_accept(self.ssock), wait)
            except TimeoutError:
                conn_r.close()
                self.config.log(
                    f"a connection from {peer[0]} to the receive port had no send-port "
                    f"connection within {wait:g} s; closed it, waiting for an LB"
                )
                continue
            finally:
                self.ssock.close()  # refuse until the next LB's receive-port connection
                self.ssock = _bound(self.send_host, self.send_port)
            return conn_r, conn_s

    def stream_input(self, stream) -> None:
        """Feed the source from ``stream`` (a binary file, stdin) line by line as lines come, at most
        ``MAX_HELD_LINES`` ahead of the log; a thread reads, the loop takes each line."""
        loop = asyncio.get_running_loop()

        def read() -> None:
            try:
                while not self._stopping:
                    self._held.acquire()
                    line = stream.readline()
                    if not line:
                        break
                    loop.call_soon_threadsafe(self._line_in, line.rstrip(b"\r\n"))
            except (OSError, ValueError):
                pass
            loop.call_soon_threadsafe(self._input_ended)

        threading.Thread(target=read, daemon=True, name="mock-ic input").start()

    def _line_in(self, line: bytes) -> None:
        if not self.config.source.feed(line):
            self._held.release()
        if self._run is not None:
            self._run.wake.set()

    def _input_ended(self) -> None:
        self.config.source.end()
        if self._run is not None:
            self._run.wake.set()

    def _release_input(self, generated: int) -> None:
        for _ in range(self.config.source.release(generated)):
            self._held.release()

    def stop(self) -> None:
        """Finish the current run at the next record boundary and return."""
        self._stopping = True
        run = self._run
        if run is not None:
            run.gone.set()
            run.wake.set()
            if run.checkpoint is not None and not run.checkpoint.done():
                run.checkpoint.set_exception(LbGone("stopping"))

    def close(self) -> None:
        for sock in (self.rsock, self.ssock):
            if sock is not None:
                sock.close()
        self.store.close()
        if self.pcap is not None:
            self.pcap.close()

    # --- runs -------------------------------------------------------------------------------------

    async def serve(self) -> IcStats:
        """Serve LB after LB until every RPC is delivered and checkpointed (or ``stop``)."""
        while not self._stopping:
            conn_r, conn_s = await self._accept_pair()
            self.stats.runs += 1
            self.config.trace(
                f"an LB connected from {_v4(conn_r.getpeername()[:2])[0]} (run {self.stats.runs})"
            )
            try:
                finished = await self._serve_one(conn_r, conn_s)
            finally:
                conn_r.close()
                conn_s.close()
            if self.stats.fatal:
                break
            if finished and self.config.exit_when_done:
                self.stats.done = True
                break
        return self.stats

    async def _serve_one(self, conn_r: socket.socket, conn_s: socket.socket) -> bool:
        cfg = self.config
        lb_reader, lb_writer = await asyncio.open_connection(sock=conn_r)
        rec_reader, writer = await asyncio.open_connection(sock=conn_s)
        loaded = self.store.load()
        if loaded.cut:
            cfg.log(f"log: {loaded.cut}")
        ck = loaded.checkpoint
        records = loaded.records
        held = records[-1].generated if records else ck.generated if ck else 0
        self._release_input(held)
        if self.stats.rpcs_before is None:
            self.stats.rpcs_before = held
        if ck is None:
            run = _Run(0, 0, [])
        else:
            last = records[-1] if records else None
            run = _Run(ck.outputs, last.outputs if last else ck.outputs, [] if records else list(ck.pending))
        run.writer, run.lb_writer = writer, lb_writer
        if cfg.write_timeout:
            run.watch = WriteWatch(
                writer.transport, cfg.write_timeout, lambda why: self._stalled(run, why), "the LB"
            )
        if self.pcap is not None:
            lb_addr, ic_addr = conn_r.getpeername()[:2], conn_r.getsockname()[:2]
            run.pcap_in = self.pcap.tcp_session(_v4(lb_addr), _v4(ic_addr))
            run.pcap_out = self.pcap.tcp_session(_v4(conn_s.getpeername()[:2]), _v4(conn_s.getsockname()[:2]))
        self._run = run
        tasks = [
            asyncio.ensure_future(self._read_lb(run, lb_reader)),
            asyncio.ensure_future(_watch_eof(run, rec_reader)),
        ]
        finished = False
        try:
            if ck is None:
                finished = await self._first_start(run)
            else:
                finished = await self._recover(run, ck, records)
            return finished
        except (LbGone, ConnectionError) as err:
            if run.fatal:
                self.stats.fatal = run.fatal
                cfg.log(
                    f"the LB broke a rule; both sockets closed, the IC ends as the real one does: {run.fatal}"
                )
            elif run.stalled:
                cfg.log(f"{run.stalled}; the next LB gets a recovery")
            else:
                cfg.log(f"the LB went away ({err or 'closed'}); the next LB gets a recovery")
            return False
        finally:
            if run.watch is not None:
                run.watch.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (writer, lb_writer):
                w.close()
            for session in (run.pcap_in, run.pcap_out):
                if session is None:
                    continue
                if finished or run.fatal:
                    session.close(False)  # the IC closes both sockets
                elif run.stalled:
                    session.reset(False)
                else:
                    session.reset(True)  # the LB went away
            self._run = None

    async def _first_start(self, run: _Run) -> bool:
        cfg = self.config
        self.stats.first_starts += 1
        committer = cfg.committer if cfg.committer is not None else random.randint(-(1 << 30), (1 << 30) - 1)
        cfg.log(f"first start: committer id {committer}")
        blob = await self._ask_checkpoint(run, committer, TAKE_BECOMING_PRIMARY_CHECKPOINT)
        await self._save(IcCheckpoint(committer, 0, 0, run.outputs, list(run.pending), blob))
        echo = encode_message(INITIAL_MESSAGE, run.initial or b"")
        return await self._deliver(run, committer, 0, 0, echo)

    async def _recover(self, run: _Run, ck: IcCheckpoint, records: list[LoggedRecord]) -> bool:
        cfg = self.config
        self.stats.recoveries += 1
        cfg.log(
            f"recovery: checkpoint at record {ck.seq} ({len(ck.blob)} bytes), {len(records)} records replayed"
        )
        await self._send(run, checkpoint_record(ck.committer, ck.blob))
        for record in records:
            await self._send(run, record.wire)
            self.stats.records_replayed += 1
        seq = records[-1].seq + 1 if records else ck.seq
        generated = records[-1].generated if records else ck.generated
        kind = UPGRADE_TAKE_CHECKPOINT if cfg.upgrade else TAKE_BECOMING_PRIMARY_CHECKPOINT
        blob = await self._ask_checkpoint(run, ck.committer, kind)
        await self._save(IcCheckpoint(ck.committer, seq, generated, run.outputs, list(run.pending), blob))
        if cfg.upgrade and cfg.dialect == "current":
            blob = await self._ask_checkpoint(run, ck.committer, TAKE_CHECKPOINT)
            await self._save(IcCheckpoint(ck.committer, seq, generated, run.outputs, list(run.pending), blob))
        return await self._deliver(run, ck.committer, seq, generated, b"")

    async def _deliver(self, run: _Run, committer: int, seq: int, generated: int, prefix: bytes) -> bool:
        """Records of pending self calls and input RPCs, checkpoints between; True when all are in.

        Records go in bursts: built, logged in one write (one fsync), then sent in one write. A
        burst starts at one record after each checkpoint and doubles up to ``MAX_BURST``, so the
        LB gets the first record at once and the system calls are paid once a burst later on."""
        cfg = self.config
        source = cfg.source
        since = 0
        dirty = bool(prefix)
        start = time.perf_counter()
        gap_done = False
        said_done = False
        burst_size = 1
        while not self._stopping:
            if prefix or run.pending or generated < source.count:
                room = cfg.checkpoint_every - since if cfg.checkpoint_every else MAX_BURST
                burst: list[LoggedRecord] = []
                crash = False
                size = min(burst_size, room)
                while len(burst) < size and (prefix or run.pending or generated < source.count):
                    gap = cfg.gap_at is not None and seq == cfg.gap_at and not gap_done
                    if burst and cfg.crash_at is not None and seq + gap == cfg.crash_at:
                        break  # the record to crash after goes alone: the ones before it are sent
                    take = min(cfg.batch, source.count - generated)
                    parts = [prefix, *run.pending, source.body(generated, generated + take)]
                    self.stats.self_calls_logged += len(run.pending)
                    self.stats.rpcs_logged += take
                    run.pending.clear()
                    prefix = b""
                    generated += take
                    if gap:
                        seq += 1  # fault: a sequence id never sent
                        gap_done = True
                        self.stats.faults_fired.add("gap_at")
                    wire = encode_record(committer, seq, b"".join(parts))
                    burst.append(LoggedRecord(wire, seq, generated, run.outputs))
                    crash = cfg.crash_at is not None and seq == cfg.crash_at
                    seq += 1
                    if crash:
                        break
                self.store.append_many(burst)
                self._release_input(generated)
                if crash:
                    cfg.log(f"fault: kill -9 after logging record {burst[-1].seq}")
                    os.kill(os.getpid(), signal.SIGKILL)
                wires = [r.wire for r in burst]
                for i, r in enumerate(burst):
                    if r.seq == cfg.bad_check_at:
                        wires[i] = _bad_check(r.wire)
                        self.stats.faults_fired.add("bad_check_at")
                await self._send_all(run, wires)
                self.stats.delivery_seconds = time.perf_counter() - start
                since += len(burst)
                burst_size = min(2 * burst_size, MAX_BURST)
                dirty = True
                if (cfg.checkpoint_every and since >= cfg.checkpoint_every) or run.lb_asks:
                    run.lb_asks = False
                    since = 0
                    dirty = False
                    burst_size = 1
                    blob = await self._ask_checkpoint(run, committer, TAKE_CHECKPOINT)
                    await self._save(
                        IcCheckpoint(committer, seq, generated, run.outputs, list(run.pending), blob)
                    )
                continue
            if (dirty and not source.open) or run.lb_asks:  # all in: a checkpoint, nothing more to come
                run.lb_asks = False
                dirty = False
                since = 0
                blob = await self._ask_checkpoint(run, committer, TAKE_CHECKPOINT)
                await self._save(
                    IcCheckpoint(committer, seq, generated, run.outputs, list(run.pending), blob)
                )
                continue
            if not source.open:
                if self.config.exit_when_done:
                    return True
                if not said_done:
                    said_done = self.stats.done = True
                    cfg.log(f"all {generated} input RPCs are in and checkpointed; up until stopped")
            run.wake.clear()
            if run.gone.is_set():
                raise LbGone()
            await run.wake.wait()
        return False

    # --- sending and asking -----------------------------------------------------------------------

    async def _send(self, run: _Run, wire: bytes) -> None:
        await self._send_all(run, [wire])

    async def _send_all(self, run: _Run, wires: list[bytes]) -> None:
        """Records (each with what follows it on the wire), judged in order, then sent in one write."""
        if run.gone.is_set():
            raise LbGone()
        normal = 0
        for wire in wires:
            header = read_header(wire)
            # Its own records keep the judge's phase right; their flaws are the faults it was told to make.
            run.session.feed(IC, (header, wire[24 : header.size]))
            if run.pcap_out is not None:
                run.pcap_out.send(False, wire)
            normal += header.seq >= 0
        data = wires[0] if len(wires) == 1 else b"".join(wires)
        if run.watch is not None:
            run.watch.wrote(len(data))
        run.writer.write(data)
        await run.writer.drain()
        if run.gone.is_set():
            raise LbGone()
        self.stats.records_sent += normal

    async def _ask_checkpoint(self, run: _Run, committer: int, kind: int) -> bytes:
        run.checkpoint = asyncio.get_running_loop().create_future()
        await self._send(run, control_record(committer, kind))
        if run.gone.is_set():
            raise LbGone()
        try:
            return await run.checkpoint
        finally:
            run.checkpoint = None

    async def _save(self, ck: IcCheckpoint) -> None:
        """The checkpoint, stored before any record after it is sent. Only an fsync waits long enough
        to be worth a worker thread: the IC has nothing else to do meanwhile but read the LB."""
        if self.config.log_dir and self.config.fsync:
            await asyncio.get_running_loop().run_in_executor(None, self.store.save_checkpoint, ck)
        else:
            self.store.save_checkpoint(ck)
        self.stats.checkpoints += 1
        self.stats.last_checkpoint = {"seq": ck.seq, "bytes": len(ck.blob), "blob": ck.blob}
        self.config.trace(f"checkpoint stored before record {ck.seq}: {len(ck.blob)} bytes")

    def _violation(self, side: str, reasons: tuple[str, ...], fatal: bool = True) -> None:
        for reason in reasons:
            self.stats.violations.append(f"{side}: {reason}")
            self.config.log(f"violation ({side}): {reason}")
        run = self._run
        if fatal and run is not None and run.fatal is None and reasons:
            run.fatal = f"{side}: {reasons[0]}"

    def _stalled(self, run: _Run, why: str) -> None:
        """The LB took none of the records for ``write_timeout``: both sockets reset, the run over."""
        run.stalled = why
        self.stats.stalls += 1
        for w in (run.writer, run.lb_writer):
            reset(w.transport)
        run.end()

    # --- the LB's messages ------------------------------------------------------------------------

    async def _read_lb(self, run: _Run, reader: asyncio.StreamReader) -> None:
        splitter = MessageSplitter()
        blob: list[bytes] = []
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if run.pcap_in is not None:
                    run.pcap_in.send(True, data)
                for frame in splitter.feed(data):
                    if type(frame) is MessageFrame:
                        if self._lb_message(run, frame, splitter.max_size) and not checkpoint_length(
                            frame.message
                        ):
                            self._checkpoint_in(run, b"")
                    elif type(frame) is Blob:
                        blob.append(frame.data)
                        if not frame.remaining:
                            self._checkpoint_in(run, b"".join(blob))
                            blob.clear()
                    elif type(frame) is Garbage:
                        self._violation("lb", (f"framing: {frame.reason} (stream offset {frame.offset})",))
                    if run.fatal:
                        return
            verdict = run.session.end(LB, blob_left=splitter.blob_left)
            if verdict is not None:  # the LB went away mid-checkpoint: noted, the run is over anyway
                self._violation("lb", verdict.violations, fatal=False)
        except ConnectionError:
            pass
        finally:
            run.end()

    def _lb_message(self, run: _Run, frame: MessageFrame, max_blob: int) -> bool:
        """Judge and act on one LB message; True for a well-formed Checkpoint."""
        msg = frame.message
        verdict, self_calls = run.session.from_lb_self_calls(msg)
        if not verdict.ok:
            self._violation("lb", verdict.violations)
            return False
        kind = msg.type
        if self_calls is not None:  # a batch of plain self calls, read in one pass
            self._self_calls(run, self_calls)
        elif kind == RPC:
            self._outgoing(run, msg.data)
        elif kind == RPC_BATCH:
            try:
                for inner in batch_messages(msg)[2]:
                    if inner.type == RPC:
                        self._outgoing(run, inner.data)
            except MalformedError:
                pass
        elif kind == INITIAL_MESSAGE:
            run.initial = msg.data
        elif kind == TAKE_CHECKPOINT:
            run.lb_asks = True
            run.wake.set()
        elif kind == CHECKPOINT:
            try:
                size = checkpoint_length(msg)
            except MalformedError:
                return False
            if size > max_blob:  # stored whole: refused, not buffered
                self._violation(
                    "lb",
                    (f"checkpoint-message: a checkpoint of {size} bytes is above the {max_blob}-byte limit",),
                )
                return False
            return True
        return False

    def _outgoing(self, run: _Run, data: bytes) -> None:
        try:
            rpc = decode_rpc(data, outgoing=True)
        except MalformedError:
            return
        if rpc.destination:
            self.stats.remote_calls += 1  # no other immortal here: counted, not delivered
            return
        run.outputs += 1
        if run.outputs <= run.durable:
            self.stats.self_calls_dropped += 1  # a replay's self call the log already holds
            return
        run.pending.append(encode_incoming_rpc(rpc.method_id, rpc.rpc_type, rpc.args, rpc.reserved))
        run.wake.set()

    def _self_calls(self, run: _Run, calls: list[bytes]) -> None:
        """``_outgoing`` for self calls already encoded as the IC delivers them."""
        seen = run.outputs
        run.outputs += len(calls)
        logged = min(len(calls), max(0, run.durable - seen))  # a replay's self calls the log holds
        self.stats.self_calls_dropped += logged
        if logged < len(calls):
            run.pending += calls[logged:]
            run.wake.set()

    def _checkpoint_in(self, run: _Run, blob: bytes) -> None:
        future = run.checkpoint
        if future is not None and not future.done():
            future.set_result(blob)
        else:
            self.config.log(f"ignored an unsolicited {type_name(CHECKPOINT)} of {len(blob)} bytes")

    def summary(self) -> dict:
        s = self.stats
        last = s.last_checkpoint
        state = _state_of(last["blob"]) if last is not None else None
        return {
            "runs": s.runs,
            "first_starts": s.first_starts,
            "recoveries": s.recoveries,
            "records_sent": s.records_sent,
            "records_replayed": s.records_replayed,
            "rpcs_logged": s.rpcs_logged,
            "rpcs_total": self.config.source.count,
            "rpcs_before": s.rpcs_before or 0,
            "self_calls_logged": s.self_calls_logged,
            "self_calls_dropped": s.self_calls_dropped,
            "remote_calls": s.remote_calls,
            "checkpoints": s.checkpoints,
            "last_checkpoint": None
            if last is None
            else {"seq": last["seq"], "bytes": last["bytes"], "state": state},
            "violations": s.violations,
            "fatal": s.fatal,
            "stalls": s.stalls,
            "delivery_seconds": round(s.delivery_seconds, 6),
            "rpcs_per_second": round(s.rpcs_logged / s.delivery_seconds) if s.delivery_seconds else 0,
            "done": s.done,
            "resumed": self.resume_note(),
            "faults_not_fired": self._faults_not_fired(),
        }

    def _faults_not_fired(self) -> list[str]:
        return [
            f"--{name.replace('_', '-')} {getattr(self.config, name)}"
            for name in ("bad_check_at", "gap_at", "crash_at")
            if getattr(self.config, name) is not None and name not in self.stats.faults_fired
        ]

    def unfired_notes(self, interrupted: bool) -> list[str]:
        """A line per fault asked for that never fired, for the end of the log: a run that tested
        less than asked says so. A --crash-at a stop came before is no news."""
        return [
            f"fault {fault} never fired: no record with that sequence id was logged"
            for fault in self._faults_not_fired()
            if not fault.startswith("--crash-at") or not interrupted
        ]


#: The Node binding's simple checkpoint producer writes its JSON after this tag.
_NODE_STATE_TAG = b"{__ACSv1__}"


def _state_of(blob: bytes) -> object:
    """A checkpoint's state for the summary, where it is JSON (the Node binding's after its tag)."""
    if blob.startswith(_NODE_STATE_TAG):
        blob = blob[len(_NODE_STATE_TAG) :]
    try:
        return json.loads(blob) if blob else None
    except (ValueError, RecursionError):
        return None


def _bad_check(wire: bytes) -> bytes:
    """Fault: the record with its check bytes inverted (on the wire only; the log has them right)."""
    return wire[:8] + bytes(b ^ 0xFF for b in wire[8:16]) + wire[16:]


async def _watch_eof(run: _Run, reader: asyncio.StreamReader) -> None:
    """The LB sends nothing on the send port: any end of it means the LB is gone."""
    try:
        while await reader.read(1 << 12):
            pass
    except ConnectionError:
        pass
    run.end()


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setblocking(False)
    sock.bind((host, port))
    return sock


def _v4(addr: tuple) -> tuple[str, int]:
    host, port = addr[0], addr[1]
    return (host if "." in host else "127.0.0.1", port)
