"""The mock connector sink: durable two-phase commit over the shared protocol core.

``InstanceStore`` keeps one worker instance's output file and transaction log
and applies the 2PC rules to them; ``SinkServer`` speaks the protocol over
asyncio through ``FramedConnection`` and answers each bad peer alone with
ERROR and a close. Each store's blocking writes and fsyncs run in that store's
own thread, in order, so one instance's disk waits never hold up another's
rounds. Durability order (what a kill -9 at any point relies on):
data bytes are written with ``pwrite``; at PHASE1 they are fsynced, then the
vote record is appended and fsynced, and only then is REPLY sent; a PHASE2
commit is durable once its log record is fsynced; a PHASE2 abort is logged,
then the output is truncated back to the committed offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import traceback
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from wallaroo_proto.judge import Kind
from wallaroo_proto.runtime import quiet_accept_errors

from .errors import ProtocolError
from .faults import NO_FAULTS, Faults
from .frames import (
    DEFAULT_MAX_FRAME_SIZE,
    SINK_VERSION,
    EosMessage,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Text,
    show_text,
)
from .peer import ConnectionClosed, FramedConnection, describe_protocol_error
from .protocol import Side, Use, check_hello
from .twopc import TWOPC_STREAM, ListUncommitted, Phase1, Phase2, Reply, ReplyUncommitted, twopc_frame
from .txnlog import (
    COMPACT_AT,
    LOG_SUFFIX,
    Decision,
    TxnLog,
    TxnLogError,
    Vote,
    instance_paths,
    scan_log,
    txn_bytes,
)
from .wire import as_text

#: Gathered appends are written once they reach this size (or at the end of each received batch).
FLUSH_BYTES = 1 << 20
#: Fault rules count their matches, and the stores' threads consult exit and txn-id rules.
_FAULTS_LOCK = threading.Lock()
#: The shipped test sink's OK credits (the worker ignores them: sinks rely on TCP back-pressure).
SINK_CREDITS = 500
#: Seconds a HELLO for a connected instance waits for that connection to end before its ERROR:
#: a worker that reconnects at once may be ahead of the sink noticing its old connection close.
HANDOVER_GRACE = 5.0


class PeerError(Exception):
    """The worker broke a sink rule: answered with ERROR and a close."""


class StorageError(Exception):
    """The disk refused a write of output data."""


class InstanceStore:
    """One worker instance's output file + transaction log, recovered on open."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        instance_name: Text,
        faults: Faults = NO_FAULTS,
        *,
        compact_at: int = COMPACT_AT,
    ) -> None:
        self.name = instance_name
        self.faults = faults
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-store")
        log_path, out_path = instance_paths(out_dir, instance_name)
        self.out_path = out_path
        self.log = TxnLog(log_path, instance_name, compact_at=compact_at)
        self.fd = os.open(out_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            durable = self.scan.undecided_end
            size = os.fstat(self.fd).st_size
            if size < durable:
                raise TxnLogError(
                    f"{out_path} holds {size} bytes but its log promises {durable}: committed data is missing"
                )
            if size > durable:  # unvoted bytes of a crashed session
                os.ftruncate(self.fd, durable)
                os.fsync(self.fd)
        except BaseException:
            self.close()
            raise
        #: Where the written data ends (committed + undecided + not yet voted).
        self.end = durable
        self._flushed = durable  # end of what is in the file; ``end`` adds the gathered appends
        self._pending: list[bytes] = []
        self._pending_len = 0
        self.recovered_tail = size - durable
        self._crc_start: int | None = self.committed
        self._crc = next((v.crc for v in self.scan.undecided.values()), 0)
        #: Why the next PHASE1 must vote abort (a gap, a mismatching replay, a fault), or None.
        self.doomed: str | None = None

    @property
    def scan(self):
        return self.log.scan

    @property
    def committed(self) -> int:
        return self.scan.committed

    def undecided_ids(self) -> list[bytes]:
        return list(self.scan.undecided)

    def io(self, method: Callable, *args) -> asyncio.Future:
        """Run a blocking method of this store in its thread, after those already queued."""
        return asyncio.get_running_loop().run_in_executor(self._thread, method, *args)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError, AttributeError):
            self.log.close()

    def new_session(self) -> None:
        """A new connection starts clean: earlier bytes stay and are checked as replays."""
        self.doomed = None

    def _exit_at(self, point: str, txn: str = "") -> None:
        with _FAULTS_LOCK:
            code = self.faults.exit_code(point, txn)
        if code is not None:
            os.write(2, f"wallaroo-proto mock-sink: fault: hard exit at {point} (status {code})\n".encode())
            os._exit(code)

    def _refuse_unsettled(self, what: str) -> None:
        if self.scan.undecided:
            txns = ", ".join(repr(show_text(as_text(t))) for t in self.scan.undecided)
            raise PeerError(f"{what} while txn {txns} (voted commit) awaits its PHASE2; settle it first")

    def data(self, offset: int, payload: bytes) -> bool:
        """Apply a data MESSAGE whose id is its byte offset; True when the gathered appends
        are due to be written (``flush``). A replay (below ``end``) reads the file."""
        if self.scan.undecided:
            self._refuse_unsettled(f"data at offset {offset}")
        if self.doomed is not None:
            return False
        end = self.end
        if offset > end:
            self.doomed = f"gap: data at offset {offset} but the output ends at {end}"
            return False
        if offset < end:  # a replay: the overlap must match what we hold
            overlap = min(len(payload), end - offset)
            if offset + overlap > self._flushed:
                self.flush()
            held = os.pread(self.fd, overlap, offset)
            if held != payload[:overlap]:
                self.doomed = f"replay at offset {offset} differs from the {overlap} bytes the sink holds"
                return False
            payload = payload[overlap:]
            if not payload:
                return False
        # Appends are gathered and written with one pwrite per received batch (``flush``).
        self._pending.append(payload)
        self._pending_len += len(payload)
        self.end = end + len(payload)
        if self._crc_start is not None:
            self._crc = zlib.crc32(payload, self._crc)
        return self._pending_len >= FLUSH_BYTES

    def flush(self) -> None:
        """Write the gathered appends to the output file (not yet fsynced: PHASE1 does that)."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        start = self._flushed
        self._pending.clear()
        self._pending_len = 0
        try:
            done = 0
            while done < len(data):  # a short write is retried, so a full disk shows its errno
                written = os.pwrite(self.fd, memoryview(data)[done:], start + done)
                if written <= 0:
                    raise OSError(f"no progress writing after {done} of {len(data)} bytes")
                done += written
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            self.end = start
            self._crc_start = None
            self.doomed = f"storage: {err}"
            raise StorageError(
                f"writing {len(data)} bytes at offset {start} of {self.out_path}: {err}"
            ) from err
        self._flushed = start + len(data)
        self._exit_at("after_data_write")

    def _range_crc(self, start: int, end: int) -> int:
        if start == self._crc_start and end == self.end:
            return self._crc
        self.flush()
        crc, pos = 0, start
        while pos < end:
            chunk = os.pread(self.fd, min(end - pos, 1 << 20), pos)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            pos += len(chunk)
        return crc

    def validate(
        self, where: tuple[tuple[int, int, int], ...], data_stream: int | None
    ) -> tuple[str | None, int]:
        """(reason to vote abort or None, end of the range) for a where-list over ``data_stream``."""
        if not where:
            return "empty where-list", self.committed
        expected = self.committed
        for stream_id, start, end in where:
            if stream_id != data_stream:
                if data_stream is None:
                    return f"where-list names stream {stream_id}, but no data stream was NOTIFYed", expected
                return (
                    f"where-list names stream {stream_id}; this connection's data stream is {data_stream}",
                    expected,
                )
            if start != expected:
                return (
                    f"where-list range starts at {start}, expected {expected} (last committed offset)",
                    expected,
                )
            if start > end:
                return f"where-list range [{start}, {end}) is reversed", expected
            if end > self.end:
                return f"where-list range ends at {end}, past the {self.end} bytes written", expected
            expected = end
        if expected < self.end:  # the shipped sink commits such a round, then exits at its PHASE2
            return (
                f"where-list range ends at {expected}, short of the {self.end} bytes written",
                self.committed,
            )
        return None, expected

    def vote(
        self, txn_id: Text, where: tuple[tuple[int, int, int], ...], data_stream: int | None
    ) -> tuple[bool, str]:
        """Decide and durably log the vote; data is fsynced first on a commit vote."""
        self._refuse_unsettled(f"PHASE1 of txn {show_text(txn_id)!r}")
        shown = show_text(txn_id)
        reason, end = self.validate(where, data_stream)
        if reason is None and self.doomed is None:
            with _FAULTS_LOCK:
                reason = self.faults.abort_vote_for_txn(shown)
        reason = reason or self.doomed
        start = self.committed
        self.flush()
        self._exit_at("before_phase1_fsync", shown)
        crc = 0
        if reason is None:
            try:
                os.fsync(self.fd)
            except OSError as err:
                raise StorageError(f"fsync of {self.out_path} failed: {err}") from err
            crc = self._range_crc(start, end)
        self.log.append(Vote(txn_bytes(txn_id), reason is None, start, end, crc))
        if reason is not None:
            self.doomed = reason
        return reason is None, reason or ""

    def phase2(self, txn_id: Text, commit: bool) -> str:
        """Apply a decision; returns what was done, for the event log."""
        key = txn_bytes(txn_id)
        shown = show_text(txn_id)
        self._exit_at("before_phase2_apply", shown)
        vote = self.scan.undecided.get(key)
        if commit:
            if vote is None:
                if self.scan.decided.get(key) is True:
                    return "already committed"
                why = "voted abort" if key in self.scan.decided else "never voted commit by this sink"
                raise PeerError(f"PHASE2 commit for txn {shown!r}, which was {why}")
            self.log.append(Decision(key, True))
            if self.end == vote.end:
                self._crc_start, self._crc = vote.end, 0
            else:
                self._crc_start = None
            self.doomed = None
            return f"committed [{vote.start}, {vote.end})"
        self.log.append(Decision(key, False))
        target = self.scan.undecided_end
        self._pending.clear()
        self._pending_len = 0
        if self._flushed != target:
            try:
                os.ftruncate(self.fd, target)
            except OSError as err:
                raise StorageError(f"truncating {self.out_path} to {target} bytes: {err}") from err
            self._flushed = target
        dropped = self.end - target
        self.end = target
        self._crc_start, self._crc = target, next((v.crc for v in self.scan.undecided.values()), 0)
        if self.scan.undecided:
            self._crc_start = None
        self.doomed = None
        return f"aborted, {dropped} bytes dropped back to offset {target}"


@dataclass(slots=True)
class SinkStats:
    connections: int = 0
    errors: int = 0
    commits: int = 0
    aborts: int = 0
    messages: int = 0
    bytes: int = 0
    instances: set = field(default_factory=set)

    def as_dict(self) -> dict:
        return {
            "connections": self.connections,
            "errors": self.errors,
            "commits": self.commits,
            "aborts": self.aborts,
            "messages": self.messages,
            "bytes": self.bytes,
            "instances": sorted(self.instances),
        }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class SinkServer:
    """Serves any number of workers; each instance name has its own store and one connection at most."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        *,
        version: str = SINK_VERSION,
        cookie: bytes = b"",
        faults: Faults = NO_FAULTS,
        credits: int = SINK_CREDITS,
        reply_phase2: bool = False,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        log: Callable[[str], None] = _stderr,
        compact_at: int = COMPACT_AT,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        #: A line per 2PC step (PHASE1 vote, PHASE2 decision); ``log`` has the rest.
        self.trace = log if trace is None else trace
        self.compact_at = compact_at
        self.version = version
        self.cookie = cookie
        self.faults = faults
        self.credits = credits
        self.reply_phase2 = reply_phase2
        self.max_frame_size = max_frame_size
        self.log = log
        self.stores: dict[str, InstanceStore] = {}
        self.broken: dict[str, str] = {}
        #: Instances with a connection -> set when that connection lets go of the instance.
        self.connected: dict[str, asyncio.Event] = {}
        self.stats = SinkStats()
        self._tasks: set[asyncio.Task] = set()
        self._payload_rules = bool(faults.payload_rules(0) or faults.payload_rules(1))

    def recover_all(self) -> list[str]:
        """Open every instance found in the output directory now, so its files are consistent."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        notes = []
        for log_path in sorted(self.out_dir.glob(f"*{LOG_SUFFIX}")):
            key = str(log_path)
            try:
                name = scan_log(log_path).instance_name
                if name is None:
                    continue
                store = self._store(as_text(name))
            except (TxnLogError, StorageError, OSError) as err:
                self.broken[key] = str(err)
                notes.append(f"instance log {log_path.name}: unusable: {err}")
                continue
            notes.append(
                f"instance {show_text(store.name)!r}: committed {store.committed} bytes, "
                f"{len(store.scan.undecided)} undecided txn(s)"
                + (f", dropped {store.recovered_tail} unvoted bytes" if store.recovered_tail else "")
                + (f", ignored a torn log record ({store.scan.torn_reason})" if store.scan.torn_bytes else "")
            )
        return notes

    def _store(self, name: Text) -> InstanceStore:
        key = str(instance_paths(self.out_dir, name)[0])
        if key in self.broken:
            raise TxnLogError(self.broken[key])
        store = self.stores.get(key)
        if store is None:
            try:
                store = self.stores[key] = InstanceStore(
                    self.out_dir, name, self.faults, compact_at=self.compact_at
                )
            except OSError as err:
                raise StorageError(f"opening the files of instance {show_text(name)!r}: {err}") from err
        return store

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()

    async def start(self, host: str = "127.0.0.1", port: int = 7200) -> asyncio.base_events.Server:
        quiet_accept_errors("mock-sink")
        return await asyncio.start_server(self.handle, host, port)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FramedConnection(
            reader, writer, use=Use.SINK, our_side=Side.CONNECTOR, max_frame_size=self.max_frame_size
        )
        self.stats.connections += 1
        session = _Session(conn)
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._serve(session)
        except (ConnectionClosed, asyncio.CancelledError):
            pass
        except (ConnectionError, OSError) as err:
            self.log(f"{session.who}: connection lost: {err}")
        except ProtocolError as err:
            await self._fail(session, describe_protocol_error(err))
        except PeerError as err:
            await self._fail(session, str(err))
        except (TxnLogError, StorageError) as err:
            self.log(f"STORAGE FAILURE for {session.who}: {err}")
            await self._fail(session, f"sink storage failure: {err}")
        except Exception as err:  # never let one peer take the server down
            self.log(f"{session.who}: internal error: {err!r}\n{traceback.format_exc()}")
            await self._fail(session, f"internal error in the sink: {err!r}")
        finally:
            self._tasks.discard(task)
            if session.key is not None:
                self.connected.pop(session.key).set()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.close()

    async def shutdown(self) -> None:
        """Close every worker connection (on SIGINT/SIGTERM); the stores stay consistent."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _fail(self, session: _Session, reason: str) -> None:
        self.stats.errors += 1
        self.log(f"{session.who}: ERROR {reason}")
        await session.conn.fail(reason)

    async def _serve(self, session: _Session) -> None:
        conn = session.conn
        while True:
            for frame, outcome in await conn.receive_runs():
                if type(frame) is list:  # data MESSAGEs the core accepted as one run
                    for message in frame:
                        await self._frame(session, message, None)
                    continue
                if outcome.kind is Kind.VIOLATION:
                    raise PeerError(outcome.reason)
                if outcome.kind is Kind.IGNORED:
                    continue
                if await self._frame(session, frame, outcome.twopc):
                    return
            store = session.store
            if store is not None and store._pending:  # unflushed appends stay with the store
                await store.io(store.flush)

    async def _frame(self, session: _Session, frame, twopc) -> bool:
        """Handle one frame; True when the connection is to be closed."""
        conn = session.conn
        if isinstance(frame, Message):
            store = session.store
            is_data = frame.stream_id != TWOPC_STREAM  # the core lets data only on the NOTIFYed stream
            if self._payload_rules:
                payload_fault = self.faults.payload_abort(int(is_data), frame.payload)  # rules: 1 = data
                if payload_fault and store is not None:
                    store.doomed = store.doomed or payload_fault
            if is_data:
                self.stats.messages += 1
                self.stats.bytes += len(frame.payload)
                if frame.message_id < store.end:  # a replay, compared with the file
                    due = await store.io(store.data, frame.message_id, frame.payload)
                else:
                    due = store.data(frame.message_id, frame.payload)
                if due:
                    await store.io(store.flush)
                return False
            return await self._twopc(session, twopc)
        if isinstance(frame, Hello):
            reason = check_hello(frame, version=self.version, cookie=self.cookie)
            if reason is not None:
                raise PeerError(reason)
            name = frame.instance_name
            key = str(instance_paths(self.out_dir, name)[0])
            session.who = f"{conn.peer} ({show_text(name)})"
            if key in self.connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.connected[key].wait(), HANDOVER_GRACE)
                if key in self.connected:
                    raise PeerError(f"instance {show_text(name)!r} is already connected to this sink")
            session.store = self._store(name)
            session.key = key
            self.connected[key] = asyncio.Event()
            self.stats.instances.add(show_text(name))
            session.store.new_session()
            await conn.send(Ok(self.credits))
            return False
        if isinstance(frame, Notify):
            # One output per instance, so one data stream per connection: the first one NOTIFYed
            # (the shipped worker's is 1). Another stream, stream 0 or a repeat is refused.
            ok = session.data_stream is None and frame.stream_id != TWOPC_STREAM
            if ok:
                session.data_stream = frame.stream_id
            await conn.send(NotifyAck(ok, frame.stream_id, session.store.committed if ok else 0))
            return False
        if isinstance(frame, EosMessage):
            return False
        return False  # WORKERS_LEFT and the like: informational

    async def _twopc(self, session: _Session, msg) -> bool:
        conn, store, faults = session.conn, session.store, self.faults
        if isinstance(msg, ListUncommitted):
            await _delay(faults.delay_ms("uncommitted"))
            ids = tuple(as_text(t) for t in store.undecided_ids())
            await conn.send(twopc_frame(ReplyUncommitted(msg.rtag, ids)))
            return False
        if isinstance(msg, Phase1):
            shown = show_text(msg.txn_id)
            commit, reason = await store.io(store.vote, msg.txn_id, msg.where, session.data_stream)
            self._compaction_note(session)
            where = ", ".join(f"stream {w[0]} bytes {w[1]}-{w[2]}" for w in msg.where)
            self.trace(
                f"{session.who}: PHASE1 {shown!r} ({where or 'no data'}) -> vote "
                + ("commit" if commit else f"abort: {reason}")
            )
            if faults.should_close("before_phase1_reply", shown):
                self.log(f"{session.who}: fault: closing before the phase-1 reply")
                return True
            await _delay(faults.delay_ms("phase1", shown))
            await conn.send(twopc_frame(Reply(msg.txn_id, commit)))
            store._exit_at("after_phase1_reply", shown)
            if faults.should_close("after_phase1_reply", shown):
                self.log(f"{session.who}: fault: closing after the phase-1 reply")
                return True
            return False
        if isinstance(msg, Phase2):
            done = await store.io(store.phase2, msg.txn_id, msg.commit)
            self._compaction_note(session)
            if msg.commit:
                self.stats.commits += 1
            else:
                self.stats.aborts += 1
            self.trace(
                f"{session.who}: PHASE2 {show_text(msg.txn_id)!r} "
                f"{'commit' if msg.commit else 'abort'}: {done}"
            )
            if self.reply_phase2:
                await _delay(faults.delay_ms("phase2", show_text(msg.txn_id)))
                await conn.send(twopc_frame(Reply(msg.txn_id, msg.commit)))
            return False
        return False

    def _compaction_note(self, session: _Session) -> None:
        log = session.store.log
        if log.compaction_error:
            self.log(f"{session.who}: {log.compaction_error}")
            log.compaction_error = ""


async def _delay(ms: int) -> None:
    if ms:
        await asyncio.sleep(ms / 1000)


@dataclass(slots=True)
class _Session:
    conn: FramedConnection
    store: InstanceStore | None = None
    key: str | None = None
    who: str = ""
    #: The stream the worker NOTIFYed for its output on this connection.
    data_stream: int | None = None

    def __post_init__(self) -> None:
        self.who = self.conn.peer
