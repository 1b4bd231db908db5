"""``proxy`` against what the hostile campaign (issue 36) found: stalled output pipes, a full
disk, SIGTERM to the process group, ``--strict`` after a half-close, bad rules files,
violation floods, file descriptors running out. Real processes over loopback; each test
waits on conditions with generous deadlines, never on fixed sleeps."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support import COMMAND, READY, Server, as_foreground, wait_for

from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Hello

DEADLINE = 90


class Echo:
    """A TCP echo server of threads: each connection's bytes back, its FIN as a FIN."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self.sock.getsockname()[1]
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def __enter__(self) -> Echo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


class Proxy:
    """``wallaroo-proto proxy ARGS`` with the given stdout and stderr (a pipe nobody reads, say);
    the ready line is read from whichever of the two the test gives as ``PIPE``."""

    def __init__(self, *args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen) -> None:
        self.proc = subprocess.Popen(
            [*COMMAND, "proxy", "--no-live", *args],
            stdout=stdout,
            stderr=stderr,
            preexec_fn=popen.pop("preexec_fn", as_foreground),
            **popen,
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        ready = self.proc.stdout if stdout == subprocess.PIPE else self.proc.stderr
        seen = self.out if ready is self.proc.stdout else self.err
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            line = ready.readline()
            assert line, f"proxy exited before its ready line: {b''.join(seen)!r}"
            seen.append(line)
            match = READY.search(line.decode())
            if match:
                self.host, self.port = match.group(1).strip("[]"), int(match.group(2))
                break
        self.threads = []
        for pipe, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            if pipe is not None:
                thread = threading.Thread(target=lambda p=pipe, i=into: i.extend(iter(p.readline, b"")))
                thread.daemon = True
                thread.start()
                self.threads.append(thread)

    def stderr(self) -> str:
        return b"".join(self.err).decode()

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        return self.wait()

    def wait(self) -> tuple[int, str, str]:
        code = self.proc.wait(DEADLINE)
        for thread in self.threads:
            thread.join(DEADLINE)
        return code, b"".join(self.out).decode(), self.stderr()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(DEADLINE)


def echoed(port: int, data: bytes, host: str = "127.0.0.1") -> bytes:
    """Send ``data`` through the proxy while reading what comes back, then a FIN; all that came."""
    sock = socket.create_connection((host, port), timeout=DEADLINE)
    got: list[bytes] = []
    failed: list[OSError] = []

    def read() -> None:
        try:
            got.extend(iter(lambda: sock.recv(1 << 20), b""))
        except OSError as err:  # a reset: the caller's, not a stray thread's, to judge
            failed.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    finally:
        reader.join(DEADLINE)
        sock.close()
    if failed:
        raise failed[0]
    return b"".join(got)


@pytest.mark.e2e
def test_a_recording_pipe_nobody_reads_costs_the_recording_and_never_the_traffic() -> None:
    """It was: every connection frozen, Ctrl-C ignored, the proxy asleep in a pipe write."""
    quiet_r, quiet_w = os.pipe()  # the recording's reader, which never reads
    try:
        with Echo() as echo, Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--record", "-",
                                   stdout=quiet_w) as proxy:  # fmt: skip
            os.close(quiet_w)
            data = os.urandom(24 << 20)  # far past what the pipe and the proxy's bound hold
            assert echoed(proxy.port, data) == data
            assert echoed(proxy.port, b"and after") == b"and after"
            code, _, stderr = proxy.stop()
    finally:
        os.close(quiet_r)
    assert stderr.count("wallaroo-proto proxy: recording stopped: its reader took nothing for 5 s") == 1, (
        stderr
    )
    assert code == 1 and "Traceback" not in stderr


@pytest.mark.e2e
def test_a_stderr_nobody_reads_while_violations_flow_stalls_nothing() -> None:
    """Kinesis garbage is a violation a line; with stderr unread, relaying used to stop at 6.6 MiB."""
    quiet_r, quiet_w = os.pipe()
    try:
        with Echo() as echo, Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address,
                                   "--protocol", "kinesis",
                                   stderr=quiet_w) as proxy:  # fmt: skip
            os.close(quiet_w)
            data = os.urandom(20 << 20)
            assert echoed(proxy.port, data) == data
            assert echoed(proxy.port, b"other\n") == b"other\n"
            code, summary, _ = proxy.stop()
    finally:
        os.close(quiet_r)
    assert code == 0
    assert "violations" in summary


def test_stderr_lines_past_the_bound_are_dropped_and_counted_never_waited_for() -> None:
    from wallaroo_proto.proxy.outlet import Spool

    r, w = os.pipe()
    spool = Spool(w, limit=1 << 16, drop_lines=True, dropped_line=lambda n: b"%d dropped\n" % n)
    line = b"x" * 99 + b"\n"
    started = time.monotonic()
    for _ in range(20_000):  # 2 MB of lines into a 64 KiB pipe and a 64 KiB bound
        spool.write(line)
    assert time.monotonic() - started < DEADLINE  # the writer never waited for the reader
    assert spool.dropped > 0
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(iter(lambda: os.read(r, 1 << 20), b"")))
    reader.start()
    assert spool.close(DEADLINE)
    os.close(w)
    reader.join(DEADLINE)
    os.close(r)
    lines = b"".join(got).splitlines()
    notes = [int(x.split()[0]) for x in lines if x.endswith(b" dropped")]
    kept = [x for x in lines if not x.endswith(b" dropped")]
    assert notes and all(x == line[:-1] for x in kept)
    assert len(kept) + sum(notes) == 20_000


@pytest.mark.e2e
def test_a_full_disk_stops_the_recording_with_one_line_and_the_relay_goes_on() -> None:
    """/dev/full fails every write with ENOSPC, as a filled filesystem does."""
    with (
        Echo() as echo,
        Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--record", "/dev/full") as proxy,
    ):
        for size in (1000, 256 << 10, 1 << 20):
            data = os.urandom(size)
            assert echoed(proxy.port, data) == data
        code, summary, stderr = proxy.stop()
    assert stderr.count("recording stopped") == 1, stderr
    assert "wallaroo-proto proxy: recording stopped: No space left on device; the relay goes on" in stderr
    assert "Traceback" not in stderr and "Errno" not in stderr
    assert code == 1
    assert summary.count("connection") >= 3  # the summary of each, as ever


@pytest.mark.e2e
def test_sigterm_to_the_whole_process_group_is_a_clean_stop_with_the_summary() -> None:
    """As timeout(1), a service manager or a container's stop send it: the checker must live on."""
    with Echo() as echo, Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address,
                               preexec_fn=None, start_new_session=True) as proxy:  # fmt: skip
        assert echoed(proxy.port, b"some bytes") == b"some bytes"
        os.killpg(proxy.proc.pid, signal.SIGTERM)
        code, summary, stderr = proxy.wait()
    assert code == 0, stderr
    assert "live checks incomplete" not in stderr
    assert "connection" in summary


@pytest.mark.e2e
def test_strict_after_the_upstream_half_closed_closes_without_a_traceback() -> None:
    """The proxy passed the upstream's FIN on to the client; --strict's error frame then has
    nowhere to go, and ``write()`` after ``write_eof()`` raised."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def upstream() -> None:
        conn, _ = listener.accept()
        held.append(conn)
        conn.shutdown(socket.SHUT_WR)  # a FIN at once, still reading
        with conn:
            while conn.recv(1 << 16):
                pass

    thread = threading.Thread(target=upstream, daemon=True)
    thread.start()
    up = f"127.0.0.1:{listener.getsockname()[1]}"
    with Proxy("--listen", "127.0.0.1:0", "--upstream", up, "--protocol", "wallaroo", "--strict") as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        assert client.recv(100) == b""  # the upstream's FIN, passed on: now the violation
        client.sendall(encode(Hello("v0.0.1", b"", "strict", "i1")) + b"\x00\x00\x00\x03\x74zz")
        wait_for(lambda: "UNKNOWN(116)" in proxy.stderr(), "the violation", DEADLINE)
        thread.join(DEADLINE)  # the proxy closed the upstream side: its reader saw the end
        client.close()
        code, _, stderr = proxy.stop()
    listener.close()
    assert code == 1
    assert "Traceback" not in stderr and "RuntimeError" not in stderr


@pytest.mark.e2e
def test_kinesis_garbage_repeats_are_summarised_not_a_line_each() -> None:
    """A violation a bad line: 154k stderr lines for 20 MiB, 8.4 s of the proxy's CPU."""
    with (
        Echo() as echo,
        Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--protocol", "kinesis") as proxy,
    ):
        data = b"not json at all\n" * 500
        assert echoed(proxy.port, data) == data
        wait_for(lambda: "counted in the summary" in proxy.stderr(), "the repeats summarised", DEADLINE)
        code, summary, stderr = proxy.stop()
    lines = [x for x in stderr.splitlines() if "INVALID" in x]
    # The processor's 500 bad lines (the echo's, the daemon's side, are not judged before an
    # initialize): ten shown, the tenth saying the rest are counted.
    assert len(lines) == 10, stderr
    assert lines[-1].endswith("(more INVALID this way on #1: counted in the summary, not shown)")
    assert code == 0
    assert re.search(r"violations +500\b", summary), summary


@pytest.mark.e2e
def test_a_wallaroo_frame_that_cannot_be_read_is_named_by_its_frame_number_and_packet() -> None:
    with (
        Echo() as echo,
        Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--protocol", "wallaroo") as proxy,
    ):
        data = encode(Hello("v0.0.1", b"", "bad", "i1")) + b"\xff\xff\xff\xff" + b"z" * 100
        assert echoed(proxy.port, data) == data
        wait_for(lambda: "INVALID" in proxy.stderr(), "the violation", DEADLINE)
        code, _, stderr = proxy.stop()
    assert "frame None" not in stderr  # bytes that are no frame still take the next frame number
    assert re.search(r"client→upstream frame 1 INVALID: packet \d+: ", stderr), stderr


@pytest.mark.e2e
def test_an_ipv6_ready_line_brackets_its_address() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with Echo("::1") as echo, Proxy("--listen", "[::1]:0", "--upstream", echo.address) as proxy:
        ready = b"".join(proxy.out).decode()
        assert re.search(r"listening on \[::1\]:\d+, forwarding to \[::1\]:\d+", ready), ready
        assert echoed(proxy.port, b"six", host="::1") == b"six"
        code, _, _ = proxy.stop()
    assert code == 0


@pytest.mark.e2e
def test_file_descriptors_running_out_is_a_line_not_a_traceback_each_time() -> None:
    """asyncio logs a traceback for each failed accept: 99 of them with ``ulimit -n 100``."""

    def few_fds() -> None:
        as_foreground()
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    with (
        Echo() as echo,
        Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, preexec_fn=few_fds) as proxy,
    ):
        clients = []
        for _ in range(80):  # two descriptors each in the proxy: far past 64
            clients.append(socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE))
        # Out of descriptors at an accept, or at the connect to the upstream after one.
        wait_for(lambda: "cannot " in proxy.stderr(), "the line", DEADLINE)
        for client in clients:
            client.close()
        wait_for(lambda: _echo_works(proxy.port), "the proxy serving again", DEADLINE)
        code, _, stderr = proxy.stop()
    assert "Traceback" not in stderr, stderr
    said = [x for x in stderr.splitlines() if "Too many open files" in x]
    assert said and all(
        re.fullmatch(
            r"wallaroo-proto proxy: (cannot accept a connection: Too many open files; trying again"
            r"|connection #\d+ from 127\.0\.0\.1:\d+: cannot connect to the upstream "
            + re.escape(echo.address)
            + r": Too many open files; the client is reset)( \(\d+ times\))?",
            x,
        )
        for x in said
    ), said


def _echo_works(port: int) -> bool:
    try:
        return echoed(port, b"again") == b"again"
    except OSError:
        return False


@pytest.mark.e2e
def test_frames_not_yet_whole_are_bounded_across_connections_the_one_asking_more_is_reset() -> None:
    """With fault rules a frame goes on once whole: 4 Kinesis lines of 60 MiB, never ended, took
    the proxy to 452 MB. Past --max-buffered the connection whose bytes pass it is reset."""
    never = "--fault", "drop skip=1000000000"  # a rule that frames every line and never acts
    args = "--listen", "127.0.0.1:0", "--protocol", "kinesis", *never, "--max-buffered", "8"
    with Echo() as echo, Proxy(*args, "--upstream", echo.address) as proxy:
        first = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        first.sendall(b'{"action":"initialize","shardId":"' + b"a" * (5 << 20))
        # All of it in the proxy before the second sends: the second is the one asking for more.
        wait_for(lambda: _queues(first) == (0, 0), "the proxy to read the first's bytes", DEADLINE)
        second = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        with contextlib.suppress(OSError):  # the reset may come while it still sends
            second.sendall(b'{"action":"initialize","shardId":"' + b"b" * (5 << 20))
        wait_for(lambda: "reset: it holds" in proxy.stderr(), "the second connection reset", DEADLINE)
        second.settimeout(DEADLINE)
        try:
            ended = second.recv(100) == b""
        except ConnectionResetError:
            ended = True
        assert ended  # reset (or at least ended) while the first goes on
        second.close()
        first.sendall(b'"}\n')  # the first goes on: its line ends, and comes back whole
        first.shutdown(socket.SHUT_WR)
        back = b"".join(iter(lambda: first.recv(1 << 20), b""))
        first.close()
        code, _, stderr = proxy.stop()
    assert back == b'{"action":"initialize","shardId":"' + b"a" * (5 << 20) + b'"}\n'
    lines = [x for x in stderr.splitlines() if "--max-buffered" in x]
    assert len(lines) == 1 and lines[0].startswith("wallaroo-proto proxy: connection #2 reset: it holds ")
    assert lines[0].endswith(
        "of frames not yet whole, and all connections together more than --max-buffered 8 MiB"
    )
    assert code == 0, stderr


def _status_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmRSS, VmHWM: the peak)."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _children(pid: int) -> list[int]:
    return [
        int(c)
        for t in os.listdir(f"/proc/{pid}/task")
        for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()
    ]


@pytest.mark.e2e
def test_the_checker_bounds_frames_not_yet_whole_across_connections_the_one_asking_more_goes_unchecked() -> (
    None
):
    """4 Kinesis connections each sending a 60 MiB line without its end took the checker to 267 MB.
    Past --max-buffered the connection whose bytes pass it is no longer checked, with one line,
    its traffic goes on, and the others are still checked."""
    sink = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_drain_all, args=(sink,), daemon=True).start()
    up = f"127.0.0.1:{sink.getsockname()[1]}"
    head = b'{"action":"initialize","shardId":"'
    args = "--listen", "127.0.0.1:0", "--upstream", up, "--protocol", "kinesis", "--max-buffered", "8"
    with Proxy(*args) as proxy:
        (checker,) = _children(proxy.proc.pid)
        before = _status_kib(checker, "VmRSS")
        first = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        first.sendall(head + b"a" * (6 << 20))  # under the bound alone
        # All of it in the proxy (so in the checker's pipe) before the second sends: the second asks for more.
        wait_for(lambda: _queues(first) == (0, 0), "the proxy to read the first's bytes", DEADLINE)
        second = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        second.sendall(head + b"b" * (56 << 20))  # passed on whole: nothing is cut for the checker
        wait_for(lambda: _queues(second) == (0, 0), "the proxy to read the second's bytes", DEADLINE)
        # The first is still checked: a line that is no JSON, after all the second's bytes in the pipe.
        first.sendall(b'"}\nnot json\n')
        wait_for(
            lambda: "connection #1 client→upstream frame 1 INVALID" in proxy.stderr(), "#1 checked", DEADLINE
        )
        peak = _status_kib(checker, "VmHWM")
        second.shutdown(socket.SHUT_WR)
        assert second.recv(100) == b""  # the upstream read it all and closed: passed on, never reset
        second.close()
        first.close()
        code, summary, stderr = proxy.stop()
    sink.close()
    lines = [x for x in stderr.splitlines() if "live checks" in x]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("wallaroo-proto proxy: connection #2: live checks given up: it holds "), lines
    bound = "of frames not yet whole, and all connections together more than --max-buffered 8 MiB"
    assert lines[0].endswith(f"{bound}; its traffic goes on"), lines
    # Without the bound the checker held 62 MiB of lines (its peak 60 MiB more than at the start).
    assert peak - before < 32 << 10, (before, peak)
    assert "not checked to its end" in summary.split("connection #2")[1], summary
    assert "not checked" not in summary.split("connection #2")[0], summary
    assert code == 0, stderr


def _queues(sock: socket.socket) -> tuple[int, int] | None:
    """(what ``sock`` sent that its peer's kernel has not taken, what its peer's kernel holds
    unread by the peer's process) from /proc/net/tcp: both 0 once the peer read everything."""
    here, there = sock.getsockname()[1], sock.getpeername()[1]
    sent = unread = None
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, _, queues = row.split()[1:5]
        ports = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
        tx, rx = (int(q, 16) for q in queues.split(":"))
        if ports == (here, there):
            sent = tx
        elif ports == (there, here):
            unread = rx
    return None if sent is None or unread is None else (sent, unread)


@pytest.mark.e2e
def test_with_fault_rules_and_a_forced_protocol_both_sides_are_checked_live() -> None:
    """The client's side is recorded as a connection to the proxy's own port, which garbage's
    first bytes do not tell: only the upstream's side was checked."""
    never = "--fault", "drop skip=1000000000"
    with Echo() as echo, Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--protocol", "kinesis",
                               *never) as proxy:  # fmt: skip
        data = b"not json\n" * 3
        assert echoed(proxy.port, data) == data
        wait_for(
            lambda: "(client side)" in proxy.stderr() and "(upstream side)" in proxy.stderr(),
            "violations from both sides",
            DEADLINE,
        )
        code, _, stderr = proxy.stop()
    assert code == 0
    client = [x for x in stderr.splitlines() if "(client side) client→upstream" in x and "INVALID" in x]
    upstream = [x for x in stderr.splitlines() if "(upstream side) client→upstream" in x and "INVALID" in x]
    assert len(client) == len(upstream) == 3, stderr


@pytest.mark.e2e
def test_tremor_bytes_that_are_no_http_upgrade_are_a_violation_not_silence() -> None:
    """Garbage with no HTTP head's end was judged nowhere: 0 violations, though the node answered 400."""
    with (
        Server("tremor", "mock-node", "--listen", "127.0.0.1:0") as node,
        Proxy("--listen", "127.0.0.1:0", "--upstream", node.address, "--protocol", "tremor") as proxy,
    ):
        answer = echoed(proxy.port, b"garbage that is not http\n" * 4)
        wait_for(lambda: "INVALID" in proxy.stderr(), "the violation", DEADLINE)
        code, summary, stderr = proxy.stop()
    assert answer.startswith(b"HTTP/1.1 400")
    assert "client→upstream" in stderr and (
        "INVALID: no HTTP upgrade request before its end: the client sent 100 bytes that are none" in stderr
    ), stderr
    assert re.search(r"violations +1\b", summary) and "-> 400" in summary, summary
    assert code == 0


@pytest.mark.e2e
@pytest.mark.parametrize("rules", [(), ("--fault", "drop skip=1000000000")], ids=["unframed", "faults"])
def test_many_connections_of_long_unfinished_frames_keep_the_checks(rules: tuple[str, ...]) -> None:
    """The checker's pipe bound holds: with fault rules each connection's end gives out what it
    held at once (frames cut short overran it, the live checks given up); without
    rules, the same load through the unframed path (a guard: it held before too)."""
    sink = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_drain_all, args=(sink,), daemon=True).start()
    never = rules
    up = f"127.0.0.1:{sink.getsockname()[1]}"
    # The checker runs niced: on a loaded machine it may take nothing for more than the default
    # 5 s while it works through 80 MiB; what is checked here is the bound, not its pace.
    patient = ("--stall-timeout", "300")
    with Proxy(
        "--listen", "127.0.0.1:0", "--upstream", up, "--protocol", "kinesis", *never, *patient
    ) as proxy:
        clients = [socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE) for _ in range(2)]
        for client in clients:  # each more than half the bound: its side and the other's, recorded
            client.sendall(b'{"action":"initialize","shardId":"' + b"s" * (40 << 20))
        for client in clients:
            wait_for(lambda c=client: _queues(c) == (0, 0), "the proxy to hold every byte", DEADLINE)
        for client in clients:
            client.shutdown(socket.SHUT_WR)
        for client in clients:
            assert client.recv(100) == b""  # the upstream read all, and closed: passed on
            client.close()
        code, _, stderr = proxy.stop()
    sink.close()
    assert "live checks" not in stderr, stderr
    assert code == 0


def _drain_all(server: socket.socket) -> None:
    """Each connection read to its end, then closed."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=_drain, args=(conn,), daemon=True).start()


def _drain(conn: socket.socket) -> None:
    with conn:
        while conn.recv(1 << 20):
            pass


@pytest.mark.e2e
def test_a_recording_whose_reader_went_away_is_one_line_with_the_commands_name() -> None:
    """It said 'recording stopped: its pipe's reader went away' without saying whose."""
    gone_r, gone_w = os.pipe()
    os.close(gone_r)  # the reader, gone before the first packet
    with Echo() as echo, Proxy("--listen", "127.0.0.1:0", "--upstream", echo.address, "--record", "-",
                               stdout=gone_w) as proxy:  # fmt: skip
        os.close(gone_w)
        assert echoed(proxy.port, b"still relayed") == b"still relayed"
        wait_for(lambda: "recording stopped" in proxy.stderr(), "the line", DEADLINE)
        code, _, stderr = proxy.stop()
    assert [x for x in stderr.splitlines() if "recording" in x] == [
        "wallaroo-proto proxy: recording stopped: Broken pipe; the relay goes on"
    ]
    assert code == 1 and "Traceback" not in stderr
