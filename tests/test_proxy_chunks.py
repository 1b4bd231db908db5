"""The relay's raw events to its checker: rebuilt into exactly the segments its recording holds."""

from __future__ import annotations

import io
import os
import threading

import pytest
from support import Server
from test_proxy import children

from wallaroo_proto.capture.pcap import WAIT, CaptureError, read_segments
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.proxy.chunks import ChunkPipe, segments
from wallaroo_proto.proxy.outlet import Spool

V4 = (("127.0.0.1", 51000), ("127.0.0.1", 7100))
V6 = (("::1", 51001), ("127.0.0.1", 7100))  # a dual-stack peer: recorded as IPv4-mapped IPv6
BIG = bytes(range(256)) * 300  # 76,800 bytes: more than one synthesised segment


def events(tap) -> None:
    """Two connections interleaved, as a relay shows them to its tap."""
    tap.opened(1, *V4, 1.000001)
    tap.opened(2, *V6, 1.5)
    tap.data(1, True, b"hello", 1.25)
    tap.data(2, True, b"v6 says hi", 1.6)
    tap.note(1, False, "fault: delay 5 ms", 1.7)  # on the packet that completes the next bytes
    tap.data(1, False, BIG, 1.9999999)  # rounds up to the next second's first microsecond
    tap.ended(1, True, False, 2.1)
    tap.data(1, False, b"after the client's FIN", 2.2)
    tap.ended(1, False, False, 2.3)
    tap.ended(2, False, True, 2.4)


class Recording:
    """The tap a recording is: one TcpSession per connection in a PcapWriter."""

    def __init__(self) -> None:
        self.file = io.BytesIO()
        self.writer = PcapWriter(self.file, pcapng=True)
        self.sessions = {}
        self.notes = {}

    def opened(self, conn, client, server, when) -> None:
        self.sessions[conn] = self.writer.tcp_session(client, server, timestamp=when)

    def data(self, conn, from_client, data, when) -> None:
        self.sessions[conn].send(from_client, data, when, self.notes.pop((conn, from_client), None))

    def note(self, conn, from_client, text, when) -> None:
        self.notes[(conn, from_client)] = text

    def ended(self, conn, from_client, reset, when) -> None:
        session = self.sessions[conn]
        (session.reset if reset else session.fin)(from_client, when)


def piped(write, stats: dict | None = None) -> list:
    """What ``segments`` makes of what ``write(fd)`` puts into a pipe (a thread: a pipe is small)."""
    r, w = os.pipe()

    def writer() -> None:
        try:
            write(w)
        finally:
            os.close(w)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        return [s for s in segments(lambda n: os.read(r, n), stats) if not s[4] & WAIT]
    finally:
        thread.join()
        os.close(r)


def test_the_checker_rebuilds_the_recordings_segments_numbers_times_and_notes() -> None:
    recording = Recording()
    events(recording)
    recorded: dict = {}
    expected = list(read_segments(io.BytesIO(recording.file.getvalue()), recorded))
    rebuilt: dict = {}
    got = piped(lambda fd: spooled(fd, events), rebuilt)
    assert got == expected
    assert rebuilt["comments"] == recorded["comments"] and len(recorded["comments"]) == 1
    assert len(expected) > 10 and max(len(s[5]) for s in expected) < len(BIG)  # BIG was split


def spooled(fd: int, write) -> None:
    """``write(tap)`` through a ``ChunkPipe`` and its spool, all of it out before returning."""
    spool = Spool(fd, limit=1 << 30)
    write(ChunkPipe(spool))
    assert spool.close(60)


def test_a_stream_cut_mid_event_is_a_capture_error_after_everything_before_it() -> None:
    r, w = os.pipe()

    def whole_then_cut(tap: ChunkPipe) -> None:
        tap.opened(1, *V4, 1.0)
        tap.data(1, True, b"whole", 1.1)
        tap.spool.write(b"\x03\x01\x00")  # three bytes of a 17-byte header: the relay was killed there

    spooled(w, whole_then_cut)
    os.close(w)
    got = []
    with pytest.raises(CaptureError, match="ends mid-event") as err:
        for s in segments(lambda n: os.read(r, n)):
            got.append(s)
    os.close(r)
    assert err.value.cut
    assert [s[5] for s in got if s[5]] == [b"whole"]


def test_a_checker_gone_stops_the_writes_without_an_error() -> None:
    r, w = os.pipe()
    os.close(r)
    stopped: list[str] = []
    spool = Spool(w, limit=1 << 20, on_stop=stopped.append)
    tap = ChunkPipe(spool)
    tap.opened(1, *V4, 1.0)  # EPIPE: the checker is gone
    spool.close(60)
    assert stopped == ["Broken pipe"]
    tap.data(1, True, b"more", 1.1)  # nothing written, nothing raised
    assert spool.backlog == 0
    os.close(w)


@pytest.mark.e2e
def test_the_proxy_is_ready_once_its_checker_is_and_the_checker_runs_second_for_the_cpu() -> None:
    """Checked from the first byte on; the checker's work waits in the pipe, the relay's and
    the peers' holds up the traffic."""
    with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9") as proxy:
        (checker,) = children(proxy.proc.pid)  # at the ready line: started, and already niced
        relay = os.getpriority(os.PRIO_PROCESS, proxy.proc.pid)
        assert os.getpriority(os.PRIO_PROCESS, checker) - relay == 10
        code, _, stderr = proxy.stop()
    assert code == 0, stderr
