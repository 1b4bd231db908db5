"""What a proxy sees, recorded and dissected as it passes.

The relayed bytes are written as a pcap (``pcap_writer``: the same synthesised
packets as a mock's ``--record``) to the recording file if asked, and always into a
pipe read by the capture ``Dissector`` on a thread of its own. So the live checks,
the violations and the summary are ``dissect``'s of that very recording, rule for
rule: a proxy run and ``dissect`` of its recording cannot disagree. The pipe is
bounded: a dissector that falls behind slows the relay, memory stays flat.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.frame_block import FrameBlock
from wallaroo_proto.pcap_writer import PcapWriter, TcpSession


class Watch:
    """A ``relay.Tap``: records every connection and dissects it live.

    ``on_record(record)`` is called on the dissector's thread for each frame
    (violations in ``record["violations"]``); ``close()`` ends the recording
    and waits for the dissector, then ``summaries()`` are ``dissect --summary``'s.
    """

    def __init__(
        self,
        *,
        record: str | None = None,
        protocol: str | None = None,
        ports: Iterable[int] | None = None,
        on_record: Callable[[dict], None] | None = None,
    ) -> None:
        self._writers: list[PcapWriter] = []
        if record is not None:
            self._writers.append(PcapWriter(record))
        read_end, write_end = os.pipe()
        self._pipe = PcapWriter(os.fdopen(write_end, "wb"))
        self._writers.append(self._pipe)
        self._pipe_file = self._pipe._file
        self.dissector = Dissector(record or "proxy", protocol=protocol, ports=ports)
        self._on_record = on_record
        self._sessions: dict[int, list[TcpSession]] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._dissect, args=(os.fdopen(read_end, "rb"),), name="proxy-dissect", daemon=True
        )
        self._thread.start()

    def _dissect(self, source) -> None:
        try:
            with source:
                for item in self.dissector.frames(source):
                    if self._on_record is None:
                        continue
                    for r in item.records() if type(item) is FrameBlock else (item,):
                        self._on_record(r)
        except BaseException as err:  # reported by close(): the relay must not die of it
            self.error = err

    # relay.Tap -------------------------------------------------------------------------

    def opened(self, conn: int, client: tuple[str, int], server: tuple[str, int], when: float) -> None:
        self._sessions[conn] = [w.tcp_session(client, server, timestamp=when) for w in self._writers]

    def data(self, conn: int, from_client: bool, data: bytes, when: float) -> None:
        for session in self._sessions.get(conn, ()):
            session.send(from_client, data, when)

    def ended(self, conn: int, from_client: bool, reset: bool, when: float) -> None:
        sessions = self._sessions.get(conn, ())
        for session in sessions:
            if reset:
                session.reset(from_client, when)
            else:
                session.fin(from_client, when)
        if sessions and sessions[0].closed:
            del self._sessions[conn]

    # the end ------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """End the recording (open connections stay open in it) and let the dissector finish."""
        for writer in self._writers:
            writer.close()
        self._pipe_file.close()
        self._thread.join(timeout)

    def summaries(self) -> list[dict]:
        return self.dissector.summaries()
