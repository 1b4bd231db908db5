"""What a proxy sees, recorded and checked as it passes.

The relayed bytes are written as a pcap (``pcap_writer``: the same synthesised
packets as a mock's ``--record``) to the recording file if asked, and always, raw
(``proxy.chunks``), into the pipe of a checker process (``proxy.checker``) that
rebuilds the same packets and runs the capture ``Dissector`` over them. So the
live checks, the violations and the summary are ``dissect``'s of that very
recording, rule for rule: a proxy run and ``dissect`` of its recording cannot
disagree.

Neither output is written from the relay's loop: each is a ``outlet.Spool``, written by a
thread of its own. While either holds more than ``HIGH`` bytes the relay reads nothing more
from the peers (``congested``, ``when_room``): a checker or a recording reader that falls
behind slows the peers, as a slow peer does, and memory stays flat. One that takes nothing
for ``STALL_SECONDS`` is given up with one line, and the traffic goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from functools import partial

from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.proxy.chunks import ChunkPipe, widen_pipe
from wallaroo_proto.proxy.outlet import Spool, SpoolFile

#: How long a checker may take to start before the proxy serves without waiting for it.
READY_SECONDS = 60
#: Bytes an output (the recording, the checker's pipe) may hold unwritten before the relay
#: stops reading from the peers until it drains (beyond the pipe's own 1 MiB).
HIGH = 4 << 20
#: Bytes past which an output is given up: the relay may read once more on each connection
#: after ``HIGH``, so this bounds what those reads add.
LIMIT = 64 << 20
#: Seconds an output may take nothing while the relay waits for it, before it is given up
#: (``stall_seconds``, the proxy's ``--stall-timeout``).
STALL_SECONDS = 5.0
#: How often the relay looks whether a congested output drained.
_POLL = 0.02


def _set(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Watch:
    """A ``passthrough.Tap``: records every connection and checks it live.

    ``on_violation(record)`` is called on a reader thread for each frame with a
    violation (``record["violations"]``), ``on_state(connections)`` with the checker's
    state of the connections that changed (``checker.connection_state``), about every
    half second while frames flow; ``close()`` ends the recording and waits
    for the checker, then ``summaries`` are ``dissect --summary``'s.
    """

    def __init__(
        self,
        *,
        record: str | None = None,
        protocol: str | None = None,
        ports: Iterable[int] = (),
        on_violation: Callable[[dict], None] | None = None,
        notes: bool = False,
        on_state: Callable[[list[dict]], None] | None = None,
        say: Callable[[str], None] | None = None,
        max_held: int | None = None,
        on_given_up: Callable[[dict], None] | None = None,
        stall_seconds: float = STALL_SECONDS,
    ) -> None:
        """``notes``: the recording is pcapng, its packets commented with the faults applied;
        ``say(line)``: how an output given up is told (one line, from any thread);
        ``max_held``: the bytes the checker may keep of frames not yet whole over all
        connections (``checker.HeldBound``), ``on_given_up(item)`` called on a reader thread
        for each connection it stops checking past it (its ident, ``held``, ``limit``)."""
        self._on_given_up = on_given_up
        self._say = say or (lambda line: None)
        self._stall = stall_seconds
        #: Why the recording was given up (a full disk, a reader that takes nothing), or None.
        self.recording_stopped: str | None = None
        self._record_spool: Spool | None = None
        self._record: PcapWriter | None = None
        if record is not None:
            if record == "-":
                fd, owned = sys.__stdout__.fileno(), False
            else:
                fd, owned = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), True
            self._record_spool = Spool(
                fd, limit=LIMIT, on_stop=self._recording_stopped, close_fd=owned, name="recording"
            )
            self._record = PcapWriter(SpoolFile(self._record_spool), pcapng=notes)
        self._checker = subprocess.Popen(
            [
                *(sys.executable, "-m", "wallaroo_proto.proxy.checker"),
                *(record or "proxy", protocol or "-", ",".join(map(str, ports))),
                "-" if max_held is None else str(max_held),
                *(["state"] if on_state is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        widen_pipe(self._checker.stdin.fileno())
        # A checker that dies is reported by close(); the relay and the recording carry on.
        self._check_spool = Spool(
            self._checker.stdin.fileno(), limit=LIMIT, on_stop=self._checks_stopped, name="checker-pipe"
        )
        self._spools = [s for s in (self._record_spool, self._check_spool) if s is not None]
        self._pipe = ChunkPipe(self._check_spool)
        self._waiting: list[Callable[[], None]] = []
        self._polling = False
        self.checks_stopped: str | None = None
        self._on_violation = on_violation
        self._on_state = on_state
        #: Each open connection's (or leg's) number on the pipe, and its recording.
        self._ids: dict[Hashable, int] = {}
        self._count = 0
        self._half_closed: set[Hashable] = set()
        self._sessions: dict[Hashable, TcpSession] = {}
        self._notes: dict[tuple[Hashable, bool], str] = {}
        self.summaries: list[dict] = []
        self.error: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="proxy-checker", daemon=True)
        self._reader.start()
        # Checking from the first byte on: the traffic waits for no checker still starting.
        self._ready.wait(READY_SECONDS)

    def _read(self) -> None:
        finished = False
        for line in self._checker.stdout:
            item = json.loads(line)
            if "ready" in item:
                self._ready.set()
            elif "summaries" in item:
                self.summaries = item["summaries"]
                self.error = item["error"]
                finished = True
            elif "given_up" in item and "violations" not in item:
                if self._on_given_up is not None:
                    try:
                        self._on_given_up(item["given_up"])
                    except Exception as err:  # noqa: BLE001 - the checker's output must still be read
                        self.error = f"reporting a connection given up failed: {err}"
            elif "state" in item and "violations" not in item:  # a state line
                if self._on_state is not None:
                    try:
                        self._on_state(item["state"])
                    except Exception as err:  # noqa: BLE001 - the checker's output must still be read
                        self.error = f"showing the live state failed: {err}"
            elif self._on_violation is not None:
                try:
                    self._on_violation(item)
                except Exception as err:  # noqa: BLE001 - the checker's output must still be read
                    self.error = f"reporting a violation failed: {err}"
        self._ready.set()  # a checker that stopped before it was ready: close() says so
        if not finished:
            self._checker.wait()
            self.error = f"the checker stopped before the end (exit {self._checker.returncode})"

    def _recording_stopped(self, reason: str) -> None:
        self.recording_stopped = reason
        self._say(f"recording stopped: {reason}; the relay goes on")

    def _checks_stopped(self, reason: str) -> None:
        if reason == os.strerror(errno.EPIPE):
            return  # the checker died: its reader says how
        self.checks_stopped = f"the checker was given up: {reason}"
        self._say(f"live checks stopped: {reason}; the relay goes on")

    # back-pressure ------------------------------------------------------------------------

    @property
    def congested(self) -> bool:
        """An output holds more than ``HIGH`` bytes: the relay should read no more for now."""
        return any(s.backlog > HIGH for s in self._spools)

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the relay's loop once no output is congested (one given up for
        taking nothing for ``STALL_SECONDS`` makes room too)."""
        self._waiting.append(callback)
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_later(_POLL, self._poll)

    def _poll(self) -> None:
        now = time.monotonic()
        for spool in self._spools:
            if spool.backlog > HIGH and now - spool.progress_at > self._stall:
                spool.stop(f"its reader took nothing for {self._stall:g} s")
        if self.congested:
            asyncio.get_running_loop().call_later(_POLL, self._poll)
            return
        self._polling = False
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()

    async def room(self) -> None:
        """Wait until no output is congested (again, if another waiter filled it first: the
        end of many connections, each giving out a whole frame held, comes all at once)."""
        while self.congested:
            ready = asyncio.get_running_loop().create_future()
            self.when_room(partial(_set, ready))
            await ready

    # passthrough.Tap -------------------------------------------------------------------------

    def opened(self, conn: Hashable, client: tuple[str, int], server: tuple[str, int], when: float) -> None:
        self._count += 1
        number = self._ids[conn] = self._count
        self._pipe.opened(number, client, server, when)
        if self._record is not None:
            self._sessions[conn] = self._record.tcp_session(client, server, timestamp=when)

    def data(self, conn: Hashable, from_client: bool, data: bytes, when: float) -> None:
        number = self._ids.get(conn)
        if number is None:
            return
        comment = self._notes.pop((conn, from_client), None) if self._notes else None
        if comment is not None:
            self._pipe.note(number, from_client, comment, when)
        self._pipe.data(number, from_client, data, when)
        session = self._sessions.get(conn)
        if session is not None:
            session.send(from_client, data, when, comment)

    def note(self, conn: Hashable, from_client: bool, text: str, when: float) -> None:
        """A note on the next bytes this side sends on ``conn``: the frame a fault acted at."""
        key = (conn, from_client)
        self._notes[key] = f"{self._notes[key]}; {text}" if key in self._notes else text

    def ended(self, conn: Hashable, from_client: bool, reset: bool, when: float) -> None:
        number = self._ids.get(conn)
        if number is None:
            return
        self._pipe.ended(number, from_client, reset, when)
        if reset or conn in self._half_closed:  # over: its number is not needed any more
            del self._ids[conn]
            self._half_closed.discard(conn)
        else:
            self._half_closed.add(conn)
        session = self._sessions.get(conn)
        if session is not None:
            if reset:
                session.reset(from_client, when)
            else:
                session.fin(from_client, when)
            if session.closed:
                del self._sessions[conn]

    # the end ------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """End the recording (open connections stay open in it) and let the checker finish,
        as long as each keeps taking what waits for it (``STALL_SECONDS`` at most without)."""
        if self._record_spool is not None and not self._record_spool.close(self._stall):
            self._record_spool.stop(f"its reader took nothing for {self._stall:g} s at the end")
        if not self._check_spool.close(self._stall):
            self._check_spool.stop(f"the checker took nothing for {self._stall:g} s at the end")
        if self.checks_stopped is not None:
            self._checker.kill()  # it may sit on a half event; what it said is all there is
        with contextlib.suppress(OSError):
            self._checker.stdin.close()
        self._reader.join(timeout)
        self._checker.wait(timeout)
        if self.checks_stopped is not None:
            self.error = self.checks_stopped
