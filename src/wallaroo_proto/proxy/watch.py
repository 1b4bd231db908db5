"""What a proxy sees, recorded and checked as it passes.

The relayed bytes are written as a pcap (``pcap_writer``: the same synthesised
packets as a mock's ``--record``) to the recording file if asked, and always, raw
(``proxy.chunks``), into the pipe of a checker process (``proxy.checker``) that
rebuilds the same packets and runs the capture ``Dissector`` over them. So the
live checks, the violations and the summary are ``dissect``'s of that very
recording, rule for rule: a proxy run and ``dissect`` of its recording cannot
disagree. The pipe is bounded (1 MiB): a checker that falls behind slows the relay,
and memory stays flat.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable, Iterable

from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.proxy.chunks import ChunkPipe, widen_pipe

#: How long a checker may take to start before the proxy serves without waiting for it.
READY_SECONDS = 60


class Watch:
    """A ``relay.Tap``: records every connection and checks it live.

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
    ) -> None:
        """``notes``: the recording is pcapng, its packets commented with the faults applied."""
        self._record = PcapWriter(record, pcapng=notes) if record is not None else None
        self._checker = subprocess.Popen(
            [
                *(sys.executable, "-m", "wallaroo_proto.proxy.checker"),
                *(record or "proxy", protocol or "-", ",".join(map(str, ports))),
                *(["state"] if on_state is not None else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        widen_pipe(self._checker.stdin.fileno())
        # A checker that dies is reported by close(); the relay and the recording carry on.
        self._pipe = ChunkPipe(self._checker.stdin.fileno())
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

    # relay.Tap -------------------------------------------------------------------------

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
        """End the recording (open connections stay open in it) and let the checker finish."""
        if self._record is not None:
            self._record.close()
        with contextlib.suppress(BrokenPipeError):
            self._checker.stdin.close()
        self._reader.join(timeout)
        self._checker.wait(timeout)
