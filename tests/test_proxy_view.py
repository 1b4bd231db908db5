"""The proxy's live view: the checker's state lines between real peers, the view's table, the terminal.

State lines are taken from a relay and its ``Watch`` run here (the checker is its
real child process) between real peers over loopback; the table is rendered from
given state with rich's recording console; the command's view is read from a
pseudo-terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from types import SimpleNamespace

import pytest
from rich.console import Console
from support import COMMAND, Server, run_cli, wait_for

from wallaroo_proto.proxy import checker
from wallaroo_proto.proxy.relay import Relay
from wallaroo_proto.proxy.view import COLUMNS, LiveView, protocol_state
from wallaroo_proto.proxy.watch import Watch

DEADLINE = 60


class WatchedRelay:
    """A relay with its ``Watch`` on a loop thread of the test, every state line kept (by connection)."""

    def __init__(self, upstream_port: int) -> None:
        self.lines: list[dict] = []
        self.watch = Watch(ports=(upstream_port,), on_state=self.lines.extend)
        self.relay = Relay(("127.0.0.1", 0), ("127.0.0.1", upstream_port), self.watch)
        self.loop = asyncio.new_event_loop()
        _, port = self.loop.run_until_complete(self.relay.start())
        self.address = f"127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.stop(), self.loop).result(DEADLINE)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(DEADLINE)
        self.loop.close()
        self.watch.close(DEADLINE)
        assert self.watch.error is None, self.watch.error


@pytest.mark.e2e
def test_the_checker_reports_a_wallaroo_connections_state_while_it_streams_and_once_it_ended() -> None:
    with Server("mock-worker", "--port", "0", "--checkpoint-ms", "20", "--no-live") as worker:
        proxy = WatchedRelay(worker.port)
        try:
            # 2 x 1000 messages at 1000/s: two seconds or more of frames, several state lines.
            source = run_cli(
                *("mock-source", "--connect", proxy.address, "-q", "--streams", "2", "--count", "1000"),
                *("--rate", "1000", "--payload-size", "40"),
                timeout=120,
            )
            assert source.returncode == 0, source.stderr
            # The connection over: a line saying so once the bytes pause.
            wait_for(lambda: any(c["bytes"] is None for c in proxy.lines), "the line of the ended connection")
        finally:
            proxy.close()
        worker.stop()
    final = next(c for c in proxy.lines if c["bytes"] is None)
    summary = proxy.watch.summaries[0]
    assert final["conn_index"] == 1 and final["protocol"] == "wallaroo"
    assert final["frames"] == summary["frames"]
    assert final["violations"] == 0
    assert final["state"]["use"] == "source"
    assert final["state"]["checkpoints"] == summary["checkpoints_acknowledged"] > 0
    streaming = [c for c in proxy.lines if c["bytes"] is not None]
    assert len(streaming) >= 2, proxy.lines
    first = streaming[0]
    assert first["client"][0] == "127.0.0.1" and first["server"][1] == worker.port
    assert 0 < first["frames"] < final["frames"]  # said mid-stream, not only at the end
    sent, received = first["bytes"]
    assert sent > 0 and received > 0
    assert first["state"]["state"] == "Streaming"
    assert first["state"]["streams"] == 2
    assert first["state"]["credits"] is not None
    frames = [c["frames"] for c in proxy.lines]
    assert frames == sorted(frames)


@pytest.mark.e2e
def test_the_checker_reports_a_dcp_connections_open_streams_when_the_flow_pauses() -> None:
    with Server(
        "dcp", "mock-producer", "--port", "0", "--vbuckets", "4", "--items", "300", "--keys", str(10**9)
    ) as producer:
        proxy = WatchedRelay(producer.port)
        try:
            consumer = subprocess.Popen(
                [
                    *COMMAND,
                    "dcp",
                    "mock-consumer",
                    "--connect",
                    proxy.address,
                    "--follow",
                    "--format",
                    "json",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                # --follow: every item streamed, the four streams stay open and the bytes pause.
                wait_for(
                    lambda: any(
                        c["state"].get("streams") == 4 and c["frames"] > 4 * 300 for c in proxy.lines
                    ),
                    "a state line with the four streams open",
                )
            finally:
                consumer.send_signal(signal.SIGTERM)
                consumer.communicate(timeout=DEADLINE)
            wait_for(lambda: any(c["bytes"] is None for c in proxy.lines), "the line of the ended connection")
        finally:
            proxy.close()
        producer.stop()
    following = next(c for c in proxy.lines if c["state"].get("streams") == 4)
    assert following["protocol"] == "dcp"
    assert following["violations"] == 0
    assert following["state"]["buffer"].endswith("/1048576")  # the consumer's flow-control buffer
    assert following["bytes"][1] > following["bytes"][0] > 0  # the producer sent the most
    final = next(c for c in proxy.lines if c["bytes"] is None)
    assert final["frames"] == sum(proxy.watch.summaries[0]["packets_by_type"].values())


OTHERS = {
    "kinesis": (
        ("kinesis", "mock-processor", "--listen", "127.0.0.1:0", "--format", "json", "--retry-delay", "0"),
        ("kinesis", "mock-daemon", "--format", "json", "--shards", "2", "--records", "100", "--shard-end"),
    ),
    "tremor": (
        ("tremor", "mock-node", "--port", "0", "--format", "json"),
        ("tremor", "mock-client", "--format", "json", "--messages", "100"),
    ),
}


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", sorted(OTHERS))
def test_the_checker_reports_each_connections_protocol_state_for_kinesis_and_tremor(protocol: str) -> None:
    upstream, client = OTHERS[protocol]
    with Server(*upstream) as peer:
        proxy = WatchedRelay(peer.port)
        try:
            done = run_cli(*client, "--connect", proxy.address, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            connections = 2 if protocol == "kinesis" else 1
            wait_for(
                lambda: sum(c["bytes"] is None for c in proxy.lines) == connections,
                "a line for each ended connection",
            )
        finally:
            proxy.close()
        peer.stop()
    over = sorted((c for c in proxy.lines if c["bytes"] is None), key=lambda c: c["conn_index"])
    summaries = proxy.watch.summaries
    assert [c["protocol"] for c in over] == [protocol] * len(over)
    assert [c["violations"] for c in over] == [0] * len(over)
    if protocol == "kinesis":
        assert [c["state"]["shard"] for c in over] == [s["shard_id"] for s in summaries]
        assert [c["state"]["records"] for c in over] == [100, 100]
        assert [c["state"]["checkpoint"] for c in over] == ["SHARD_END", "SHARD_END"]
        assert all(
            c["state"]["checkpoints"] == s["checkpoints"] > 0 for c, s in zip(over, summaries, strict=True)
        )
    else:
        (only,) = over
        assert only["state"]["state"] == summaries[0]["state"] == "closed"
        assert only["state"]["messages"] == summaries[0]["messages"] > 100
        assert only["state"]["streams"] == 0


def test_an_ambrosia_socket_not_yet_known_has_a_live_state() -> None:
    from wallaroo_proto.capture.dissector import Dissector
    from wallaroo_proto.protocols.ambrosia.dissect import AmbrosiaTracker

    tracker = AmbrosiaTracker(
        Dissector("x"), 1, (b"\x7f\x00\x00\x01", 40000), (b"\x7f\x00\x00\x01", 2000), True
    )
    state = tracker.live_state()
    assert state["socket"] == "unknown" and state["records"] == 0 and state["checkpoints"] == 0
    assert isinstance(state["phase"], str) and isinstance(state["expecting"], str)


class StubTracker:
    """What the checker reads of a plug-in's tracker, counting how often it is asked its state."""

    def __init__(self, index: int) -> None:
        self.ident = {
            "conn_index": index,
            "protocol": "wallaroo",
            "initiator_addr": "127.0.0.1",
            "initiator_port": 40000 + index,
            "responder_addr": "127.0.0.1",
            "responder_port": 7100,
        }
        self.dirs = {side: SimpleNamespace(half=SimpleNamespace(offset=0)) for side in (True, False)}
        self.frame_index = 0
        self.summary = SimpleNamespace(violations=0)
        self.asked = 0

    def live_state(self) -> dict:
        self.asked += 1
        return {"credits": 10}

    def end(self) -> None:
        for direction in self.dirs.values():
            direction.half = None  # as the dissector releases a connection that is over


def test_state_lines_carry_only_what_changed_and_a_connection_over_is_said_once() -> None:
    out = io.StringIO()
    trackers = [StubTracker(1), StubTracker(2)]
    lines = checker._StateLines(trackers, out)

    def said() -> list[list[dict]]:
        text = out.getvalue()
        out.seek(0)
        out.truncate()
        return [json.loads(line)["state"] for line in text.splitlines()]

    lines()
    assert [[c["conn_index"] for c in line] for line in said()] == [[1, 2]]
    lines()
    assert said() == []  # nothing changed: no line
    trackers[1].frame_index = 5
    trackers[1].dirs[True].half.offset = 300
    lines()
    ((second,),) = said()
    assert second["conn_index"] == 2 and second["frames"] == 5 and second["bytes"] == [300, 0]
    assert second["state"] == {"credits": 10} and second["client"] == ["127.0.0.1", 40002]
    for ending in (1, 0):  # one after others still open, then the first
        trackers[ending].end()
        lines()
        ((over,),) = said()
        assert over["conn_index"] == ending + 1 and over["bytes"] is None
        asked = [t.asked for t in trackers]
        for _ in range(3):
            lines()
        assert said() == []
        assert trackers[1].asked == asked[1]  # over and said: never read again
    assert trackers[0].asked == asked[0]


# --- the view's table, from given state -----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Inner:
    """A tap behind the view: every call it is handed."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def opened(self, *args) -> None:
        self.calls.append(("opened", *args))

    def data(self, *args) -> None:
        self.calls.append(("data", *args))

    def note(self, *args) -> None:
        self.calls.append(("note", *args))

    def ended(self, *args) -> None:
        self.calls.append(("ended", *args))


def rendered(view: LiveView) -> tuple[str, dict[str, dict[str, str]]]:
    """The view as text, and each row's cells by column header, by its # cell."""
    console = Console(record=True, width=300, color_system=None)
    console.print(view.renderable())
    text = console.export_text()
    lines = text.splitlines()
    header = next(line for line in lines if "┃" in line)
    names = [cell.strip() for cell in header.split("┃")[1:-1]]
    rows = {}
    for line in lines:
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.split("│")[1:-1]]
            rows[cells[0]] = dict(zip(names, cells, strict=True))
    return text, rows


def checked(conn_index: int, client: tuple[str, int], frames: int, violations: int = 0, **state) -> dict:
    return {
        "conn_index": conn_index,
        "protocol": "wallaroo",
        "client": list(client),
        "server": ["127.0.0.1", 7100],
        "frames": frames,
        "bytes": [0, 0],
        "violations": violations,
        "state": state,
    }


def test_the_view_shows_each_connection_with_its_rates_state_and_violations() -> None:
    clock, inner = Clock(), Inner()
    view = LiveView("forwarding to 127.0.0.1:7100", clock=clock).wrap(inner)
    client = ("127.0.0.1", 40001)
    view.opened(1, client, ("127.0.0.1", 7100), 0.0)
    view.state([checked(1, client, 10, credits=100, streams=1)])
    text, rows = rendered(view)  # the first look: rates start from here
    assert [n for n in COLUMNS if n in text] == list(COLUMNS)
    clock.now += 2.0
    view.data(1, True, b"x" * 4000, 0.0)
    view.data(1, False, b"y" * 600, 0.0)
    view.state([checked(1, client, 410, violations=2, credits=None, streams=3, checkpoints=7)])
    text, rows = rendered(view)
    row = rows["1"]
    assert row["client"] == "127.0.0.1:40001"
    assert row["protocol"] == "wallaroo"
    assert row["state"] == "open"
    assert row["frames/s"] == "205"  # 410 frames in the 2 s since it opened
    assert row["bytes/s c→u"] == "2,000"
    assert row["bytes/s u→c"] == "300"
    assert row["violations"] == "2"
    assert row["faults"] == "0"
    assert row["protocol state"] == "streams 3  checkpoints 7"  # credits unknown: left out
    assert "connections 1 open, 1 in all  violations 2  faults applied 0" in text
    assert "forwarding to 127.0.0.1:7100" in text
    # Everything reached the tap behind it.
    assert [c[0] for c in inner.calls] == ["opened", "data", "data"]
    view.ended(1, True, False, 0.0)
    assert rendered(view)[1]["1"]["state"] == "half-closed"
    view.ended(1, False, False, 0.0)
    clock.now += 2.0
    text, rows = rendered(view)
    assert rows["1"]["state"] == "closed"
    assert rows["1"]["frames/s"] == "0" and rows["1"]["bytes/s c→u"] == "0"
    assert "connections 0 open, 1 in all" in text


def test_under_fault_rules_each_leg_is_a_row_and_faults_are_counted_on_the_leg_they_hit() -> None:
    clock = Clock()
    view = LiveView(clock=clock).wrap(None)
    client, proxy_end = ("127.0.0.1", 40002), ("127.0.0.1", 50002)
    view.opened((3, "client"), client, ("127.0.0.1", 7101), 0.0)
    view.opened((3, "upstream"), proxy_end, ("127.0.0.1", 7100), 0.0)
    view.state([checked(5, client, 20, 1), checked(6, proxy_end, 19)])
    view.fault(3, True, "drop")
    view.fault(3, True, "delay")
    view.ended((3, "client"), True, True, 0.0)
    text, rows = rendered(view)
    assert rows["3 client"]["client"] == "127.0.0.1:40002"
    assert rows["3 client"]["faults"] == "2 (delay)"
    assert rows["3 client"]["violations"] == "1"
    assert rows["3 client"]["state"] == "reset"
    assert rows["3 upstream"]["client"] == "127.0.0.1:50002"
    assert rows["3 upstream"]["faults"] == "0"
    assert rows["3 upstream"]["state"] == "open"
    assert "connections 1 open, 1 in all  violations 1  faults applied 2" in text


def test_closed_connections_leave_the_view_after_a_while_and_their_late_lines_bring_none_back() -> None:
    view = LiveView(clock=Clock()).wrap(None)
    clients = [("127.0.0.1", 41000 + n) for n in range(1, 16)]
    for n, client in enumerate(clients, 1):
        view.opened(n, client, ("127.0.0.1", 7100), 0.0)
        if n < 15:
            view.ended(n, True, False, 0.0)
            view.ended(n, False, False, 0.0)
    _, rows = rendered(view)
    assert sorted(rows, key=int) == [str(n) for n in range(5, 16)]  # the last 10 closed, and the open one
    gone = checked(1, clients[0], 50)
    gone["bytes"] = None  # the checker's word that connection 1 is over, after its row went
    view.state([gone])
    assert "1" not in rendered(view)[1]


def test_a_protocols_state_reads_as_words_without_unknown_values() -> None:
    state = {"streams": 2, "ended": 1, "snapshot": "vb1 0..64", "buffer": "100/1048576", "shard": None}
    assert protocol_state(state) == "streams 2  ended 1  snapshot vb1 0..64  buffer 100/1048576"


# --- the command's view in a terminal ----------------------------------------------------------------


def read_until(fd: int, wanted, what: str) -> str:
    """What a terminal shows until ``wanted(text)``."""
    seen = b""
    deadline = time.monotonic() + DEADLINE
    while not wanted(plain(seen.decode("utf-8", "replace"))):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {seen[-2000:]!r}")
        if select.select([fd], [], [], 0.2)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:  # the terminal's other end closed
                break
    return plain(seen.decode("utf-8", "replace"))


def plain(text: str) -> str:
    """A terminal's text without its escape sequences (colours, cursor moves)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def rows_of(text: str) -> list[list[str]]:
    """The whole table rows on a terminal that show a source streaming on two streams, as cells."""
    return [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in text.splitlines()
        if "use source" in line and "streams 2" in line and line.rstrip().endswith("│")
    ]


@contextlib.contextmanager
def proxy_in_a_terminal(upstream: str, *options: str):
    """The proxy with its stderr on a pseudo-terminal: (the process, the terminal's fd, its address)."""
    terminal, screen = pty.openpty()
    fcntl.ioctl(screen, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 220, 0, 0))
    proxy = subprocess.Popen(
        [*COMMAND, "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream, *options],
        stdout=subprocess.PIPE,
        stderr=screen,
        text=True,
        env={**os.environ, "COLUMNS": "220", "LINES": "50"},  # whatever size the tests' own terminal has
    )
    os.close(screen)
    try:
        ready = proxy.stdout.readline()
        yield proxy, terminal, ready.split("listening on ", 1)[1].split(",", 1)[0]
    finally:
        if proxy.poll() is None:
            proxy.send_signal(signal.SIGTERM)
        proxy.communicate(timeout=DEADLINE)
        os.close(terminal)


def endless_source(address: str) -> subprocess.Popen:
    """A mock-source that streams until killed (two streams, far more messages than a test waits for)."""
    return subprocess.Popen(
        [*COMMAND, "mock-source", "--connect", address, "-q", "--streams", "2", "--count", "100000000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("options", [["--live"], []], ids=["forced", "by-default"])
def test_the_live_view_in_a_terminal_shows_the_connection_and_its_protocol_state(options) -> None:
    with Server("mock-worker", "--port", "0", "--checkpoint-ms", "20", "--no-live") as worker:
        with proxy_in_a_terminal(worker.address, *options) as (proxy, terminal, address):
            source = endless_source(address)
            try:
                shown = read_until(terminal, lambda text: bool(rows_of(text)), "a connection row")
            finally:
                source.kill()
                source.wait(DEADLINE)
        worker.stop()
    cells = rows_of(shown)[0]
    assert cells[0] == "1"
    assert cells[1].startswith("127.0.0.1:")
    assert cells[2:4] == ["wallaroo", "open"]
    assert "state Streaming" in cells[-1]
    assert "forwarding to " + worker.address in shown
    assert proxy.returncode == 0


@pytest.mark.e2e
def test_quiet_leaves_the_live_view_out_even_in_a_terminal() -> None:
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        with proxy_in_a_terminal(worker.address, "-q") as (proxy, terminal, address):
            source = run_cli("mock-source", "--connect", address, "-q", "--streams", "2", "--count", "300")
            assert source.returncode == 0, source.stderr
            proxy.send_signal(signal.SIGTERM)
            shown = read_until(terminal, lambda text: False, "the terminal's end")  # all it ever showed
        worker.stop()
    assert proxy.returncode == 0
    assert "frames/s" not in shown and "protocol state" not in shown


@pytest.mark.e2e
def test_a_fault_applied_shows_on_its_connections_leg_in_the_live_view() -> None:
    with Server("mock-worker", "--port", "0", "--checkpoint-ms", "20", "--no-live") as worker:
        rule = "delay type=ACK ms=1 count=1"
        with proxy_in_a_terminal(worker.address, "--live", "--protocol", "wallaroo", "--fault", rule) as (
            proxy,
            terminal,
            address,
        ):
            source = endless_source(address)
            try:
                shown = read_until(terminal, lambda text: "1 (delay)" in text, "the fault on its row")
            finally:
                source.kill()
                source.wait(DEADLINE)
        worker.stop()
    assert "connection #1 fault delay at upstream→client frame" in shown  # the line above the view
    row = next(line for line in shown.splitlines() if "1 (delay)" in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells[0] == "1 upstream"  # the ACK came from the upstream, on its leg
    assert "faults applied 1" in shown


class Screen:
    """What a terminal shows after the bytes written to it: enough of a VT100 for rich's live view
    (carriage return, line feed, cursor up, erase line; colours and cursor hiding ignored)."""

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.row = self.col = 0
        #: Times the live view went back up to draw itself again.
        self.redraws = 0

    def feed(self, text: str) -> None:
        self.redraws += text.count("\r\x1b[2K")  # how rich's live view begins each redraw
        for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|[^\x1b]", text):
            if token.startswith("\x1b["):
                n = int(token[2:-1]) if token[2:-1].isdigit() else 1
                if token[-1] == "A":
                    self.row = max(self.row - n, 0)
                elif token[-1] == "K":
                    self.lines[self.row] = "" if n == 2 else self.lines[self.row][: self.col]
            elif token == "\r":
                self.col = 0
            elif token == "\n":
                self.row += 1
                self.col = 0  # the terminal's own newline mode, as on a pty
                if self.row == len(self.lines):
                    self.lines.append("")
            else:
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + token + line[self.col + 1 :]
                self.col += 1

    @property
    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.lines)


def watch_screen(fd: int, screen: Screen, wanted, what: str) -> None:
    """Feed ``screen`` what the terminal shows until ``wanted(screen.text)`` (or its other end closed)."""
    deadline = time.monotonic() + DEADLINE
    while not wanted(screen.text):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen.text[-3000:]}")
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the terminal's other end closed
                return
            if not chunk:
                return
            screen.feed(chunk.decode("utf-8", "replace"))


@pytest.mark.e2e
@pytest.mark.parametrize("rule", ["drop type=ACK count=1", "restart skip=2 count=1"])
def test_a_fault_line_stays_on_screen_above_the_live_view_and_the_count_follows(rule: str) -> None:
    fault = re.compile(r"connection #1 fault \S+ at upstream→client frame \d+ ACK: ")
    with Server("mock-worker", "--port", "0", "--checkpoint-ms", "20", "--no-live") as worker:
        with proxy_in_a_terminal(worker.address, "--live", "--fault", rule) as (proxy, terminal, address):
            screen = Screen()
            # As a user starts a client: once the view is on screen (a line printed before it is drawn
            # stays above it whatever the proxy does).
            watch_screen(terminal, screen, lambda text: "faults applied 0" in text, "the view")
            source = endless_source(address)
            try:
                # The view refreshes four times a second: the line must outlive the refreshes
                # that follow it, the head line counting the fault.
                watch_screen(
                    terminal,
                    screen,
                    lambda text: fault.search(text) and text.count("faults applied 1") == 1,
                    "the fault line above a view that counts it",
                )
                seen = screen.redraws
                watch_screen(terminal, screen, lambda text: screen.redraws >= seen + 3, "three more redraws")
                assert fault.search(screen.text) and "faults applied 1" in screen.text, screen.text
            finally:
                source.kill()
                source.wait(DEADLINE)
            proxy.send_signal(signal.SIGTERM)
            watch_screen(terminal, screen, lambda text: False, "the terminal's end")
        worker.stop()
    assert proxy.returncode == 0
    final = screen.text
    assert len(fault.findall(final)) == 1, final  # the line stayed, once
    assert "faults applied 0" not in final, final  # no stale head line left behind
    assert "┘" not in final and "└" not in final, final  # nor an orphan border: the view went whole
