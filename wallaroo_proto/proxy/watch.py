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
from collections.abc import Callable, Iterable

from wallaroo_proto.pcap_writer import PcapWriter, TcpSession
from wallaroo_proto.proxy.chunks import ChunkPipe, widen_pipe


class Watch:
    """A ``relay.Tap``: records every connection and checks it live.

    ``on_violation(record)`` is called on a reader thread for each frame with a
    violation (``record["violations"]``); ``close()`` ends the recording and waits
    for the checker, then ``summaries`` are ``dissect --summary``'s.
    """

    def __init__(
        self,
        *,
        record: str | None = None,
        protocol: str | None = None,
        ports: Iterable[int] = (),
        on_violation: Callable[[dict], None] | None = None,
    ) -> None:
        self._record = PcapWriter(record) if record is not None else None
        self._checker = subprocess.Popen(
            [
                *(sys.executable, "-m", "wallaroo_proto.proxy.checker"),
                *(record or "proxy", protocol or "-", ",".join(map(str, ports))),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        widen_pipe(self._checker.stdin.fileno())
        # A checker that dies is reported by close(); the relay and the recording carry on.
        self._pipe = ChunkPipe(self._checker.stdin.fileno())
        self._on_violation = on_violation
        self._sessions: dict[int, TcpSession] = {}
        self.summaries: list[dict] = []
        self.error: str | None = None
        self._reader = threading.Thread(target=self._read, name="proxy-checker", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        finished = False
        for line in self._checker.stdout:
            item = json.loads(line)
            if "summaries" in item:
                self.summaries = item["summaries"]
                self.error = item["error"]
                finished = True
            elif self._on_violation is not None:
                try:
                    self._on_violation(item)
                except Exception as err:  # noqa: BLE001 - the checker's output must still be read
                    self.error = f"reporting a violation failed: {err}"
        if not finished:
            self._checker.wait()
            self.error = f"the checker stopped before the end (exit {self._checker.returncode})"

    # relay.Tap -------------------------------------------------------------------------

    def opened(self, conn: int, client: tuple[str, int], server: tuple[str, int], when: float) -> None:
        self._pipe.opened(conn, client, server, when)
        if self._record is not None:
            self._sessions[conn] = self._record.tcp_session(client, server, timestamp=when)

    def data(self, conn: int, from_client: bool, data: bytes, when: float) -> None:
        self._pipe.data(conn, from_client, data, when)
        session = self._sessions.get(conn)
        if session is not None:
            session.send(from_client, data, when)

    def ended(self, conn: int, from_client: bool, reset: bool, when: float) -> None:
        self._pipe.ended(conn, from_client, reset, when)
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
