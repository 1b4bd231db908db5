"""``proxy`` between real processes over loopback: forwarding, half-close and reset, live checks.

The ground truth is what each end saw (the worker's ``--out``, the bytes a socket
received), and ``dissect`` of the proxy's own recording.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest
from support import Server, delivered, run_cli, wait_for

from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import SOURCE_VERSION, Hello, Message
from wallaroo_proto.protocols.wallaroo.inputs import stream_id_for

DEADLINE = 60


class Upstream:
    """A one-connection TCP server run by the test: ``script(conn)`` plays the real peer."""

    def __init__(self, script) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, args=(script,), daemon=True)
        self.thread.start()

    def _serve(self, script) -> None:
        try:
            self.sock.settimeout(DEADLINE)
            conn, _ = self.sock.accept()
            conn.settimeout(DEADLINE)
            script(conn)
        except BaseException as err:
            self.error = err

    def join(self) -> None:
        self.thread.join(DEADLINE)
        self.sock.close()
        assert self.error is None, self.error


def read_all(sock: socket.socket) -> bytes:
    parts = []
    while chunk := sock.recv(65536):
        parts.append(chunk)
    return b"".join(parts)


@pytest.mark.e2e
def test_a_source_through_the_proxy_reaches_the_worker_exactly_once_and_the_recording_is_dissects(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    recording = tmp_path / "proxy.pcap"
    with Server(
        "mock-worker", "--port", "0", "--out", str(out), "--checkpoint-ms", "20", "--no-live"
    ) as worker:
        with Server(
            "proxy", "--listen", "127.0.0.1:0", "--upstream", worker.address, "--record", str(recording)
        ) as proxy:
            source = run_cli(
                *("mock-source", "--connect", proxy.address, "--format", "json", "-q"),
                *("--streams", "6", "--count", "200", "--payload-size", "40"),
                timeout=90,
            )
            assert source.returncode == 0, source.stderr
            code, stdout, stderr = proxy.stop()
        worker.stop()
    assert code == 0, stderr
    per_stream = delivered(out)
    for i in range(6):
        name = f"stream-{i}"
        got = per_stream[stream_id_for(name)]
        assert [n for n, _ in got] == list(range(1, 201))
        assert all(payload.startswith(f"{name}:{n}:") for n, payload in got)
    assert json.loads(source.stdout.splitlines()[-1])["acknowledged"] == 1200
    # The proxy's own summary is dissect's of its recording, line for line.
    summary = run_cli("dissect", str(recording), "--summary")
    assert summary.returncode == 0, summary.stderr
    shown = stdout.split("\n", 1)[1]  # after the ready line
    assert shown.strip() == summary.stdout.strip()
    frames = [
        json.loads(line)
        for line in run_cli("dissect", str(recording), "--format", "jsonl").stdout.splitlines()
    ]
    assert sum(1 for r in frames if r["type"] == "MESSAGE") == 1200
    assert not any(r.get("violations") for r in frames)
    assert "violation" not in stderr.lower()


@pytest.mark.e2e
def test_a_violation_is_reported_while_the_proxy_runs() -> None:
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        with Server(
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            worker.address,
            "--protocol",
            "wallaroo",
            "--no-summary",
        ) as proxy:
            client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
            # A source's HELLO, the worker's OK (frame 1), then a MESSAGE on a stream never
            # notified. Waiting for the OK fixes the frames' order: a MESSAGE the relay read
            # before it would be frame 1, and after a sink's HELLO, refused with ERROR and FIN,
            # no violation at all.
            client.sendall(encode(Hello(SOURCE_VERSION, b"", "proxy-test", "i1")))
            assert client.makefile("rb").read(9)[4:5] == b"\x01"  # the OK: a length of 5, type 1
            client.sendall(encode(Message(7, 1, 0, b"", b"not notified")))
            try:
                wait_for(lambda: "client→upstream" in proxy.stderr(), "the violation line")
            except AssertionError as err:
                state = Path(f"/proc/{proxy.proc.pid}/status").read_text().splitlines()[1:3]
                raise AssertionError(f"{err}; the proxy ({state}) said: {proxy.stderr()!r}") from None
            line = next(x for x in proxy.stderr().splitlines() if "client→upstream" in x)
            said = "wallaroo-proto proxy: connection #1 client→upstream frame 2 MESSAGE: Bad/unregistered"
            assert line.startswith(said + " stream_id 7")
            assert proxy.proc.poll() is None  # reported live, while it serves
            client.close()
            code, _, stderr = proxy.stop()
        worker.stop()
    assert code == 0, stderr


@pytest.mark.e2e
def test_half_close_is_passed_on_and_the_other_way_keeps_flowing() -> None:
    def peer(conn: socket.socket) -> None:
        got = read_all(conn)  # until the client's half-close arrives through the proxy
        conn.sendall(b"you sent " + str(len(got)).encode())
        conn.close()

    upstream = Upstream(peer)
    with Server(
        "proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.port}", "-q"
    ) as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        client.sendall(b"x" * 300_000)
        client.shutdown(socket.SHUT_WR)
        assert read_all(client) == b"you sent 300000"
        client.close()
        upstream.join()
        code, _, stderr = proxy.stop()
    assert code == 0, stderr


@pytest.mark.e2e
def test_a_reset_is_passed_on_as_a_reset() -> None:
    def peer(conn: socket.socket) -> None:
        assert conn.recv(5) == b"hello"
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # an abortive close: RST

    upstream = Upstream(peer)
    with Server(
        "proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.port}", "-q"
    ) as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        client.sendall(b"hello")
        upstream.join()
        with pytest.raises(ConnectionResetError):
            read_all(client)
        client.close()
        code, _, stderr = proxy.stop()
    assert code == 0, stderr


@pytest.mark.e2e
def test_an_upstream_that_refuses_is_a_refused_client_and_the_proxy_serves_on() -> None:
    # Bound but not listening: a connect is refused, and no other process can take the port.
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]
    try:
        with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{port}", "-v") as proxy:
            for _ in range(2):
                # Reset: it may come before the connect is seen done, before the write (a broken
                # pipe), or after it.
                refused = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
                with (
                    pytest.raises(refused),
                    socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE) as client,
                ):
                    client.sendall(b"x")
                    read_all(client)
            code, _, stderr = proxy.stop()
    finally:
        refusing.close()
    assert code == 0, stderr
    assert "2 refused by the upstream" in stderr


@pytest.mark.e2e
def test_a_refused_upstream_is_one_line_naming_it_and_the_client_without_verbose() -> None:
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))  # bound, not listening: a connect is refused
    port = refusing.getsockname()[1]
    try:
        with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{port}") as proxy:
            client = socket.socket()
            client.settimeout(DEADLINE)
            client.bind(("127.0.0.1", 0))
            here = client.getsockname()[1]
            with pytest.raises((ConnectionResetError, ConnectionAbortedError, BrokenPipeError)), client:
                # The proxy resets the client once the upstream refuses: maybe before connect returns.
                client.connect((proxy.host, proxy.port))
                client.sendall(b"x")
                read_all(client)
            wait_for(lambda: "cannot connect" in proxy.stderr(), "the line", DEADLINE)
            code, _, stderr = proxy.stop()
    finally:
        refusing.close()
    assert code == 0, stderr
    assert stderr.splitlines() == [
        f"wallaroo-proto proxy: connection #1 from 127.0.0.1:{here}: cannot connect to the upstream "
        f"127.0.0.1:{port}: Connection refused; the client is reset"
    ]


def test_a_port_in_use_is_a_clear_error() -> None:
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        result = run_cli(
            "proxy", "--listen", f"127.0.0.1:{busy.getsockname()[1]}", "--upstream", "127.0.0.1:9"
        )
    finally:
        busy.close()
    assert result.returncode == 2
    assert "cannot listen on" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.e2e
def test_dcp_consumer_through_the_proxy_streams_every_item_and_the_proxy_sees_no_violation(
    tmp_path: Path,
) -> None:
    recording = tmp_path / "dcp.pcap"
    with Server(
        "dcp", "mock-producer", "--port", "0", "--vbuckets", "4", "--items", "500", "--keys", str(10**9)
    ) as producer:
        with Server(
            "proxy", "--listen", "127.0.0.1:0", "--upstream", producer.address, "--record", str(recording)
        ) as proxy:
            consumer = run_cli(
                "dcp", "mock-consumer", "--connect", proxy.address, "--format", "json", timeout=90
            )
            assert consumer.returncode == 0, consumer.stdout + consumer.stderr
            code, stdout, stderr = proxy.stop()
        producer.stop()
    assert code == 0, stderr
    assert json.loads(consumer.stdout.splitlines()[-1])["items_received"] == 4 * 500
    assert "violation" not in stderr.lower()
    summary = run_cli("dissect", str(recording), "--port", str(producer.port), "--summary")
    assert stdout.split("\n", 1)[1].strip() == summary.stdout.strip()
    frames = run_cli("dissect", str(recording), "--port", str(producer.port), "--format", "jsonl").stdout
    items = {"DCP_MUTATION", "DCP_DELETION", "DCP_EXPIRATION"}
    assert sum(json.loads(line)["type"] in items for line in frames.splitlines()) == 4 * 500


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.e2e
def test_an_ipv6_client_is_relayed_and_recorded(tmp_path: Path) -> None:
    recording = tmp_path / "v6.pcap"

    def peer(conn: socket.socket) -> None:
        conn.sendall(b"echo " + read_all(conn))
        conn.close()

    upstream = Upstream(peer)
    with Server(
        *("proxy", "--listen", "[::1]:0", "--upstream", f"127.0.0.1:{upstream.port}"),
        *("--record", str(recording), "-q"),
    ) as proxy:
        client = socket.create_connection(("::1", proxy.port), timeout=DEADLINE)
        client.sendall(b"over six")
        client.shutdown(socket.SHUT_WR)
        assert read_all(client) == b"echo over six"
        client.close()
        upstream.join()
        code, _, stderr = proxy.stop()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    # The IPv4 upstream is named by its IPv4-mapped address beside the IPv6 client.
    packets = subprocess.run(
        ["tshark", "-r", str(recording), "-T", "fields", "-e", "ipv6.src", "-e", "tcp.len"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    if packets.returncode != 0 and "not found" in packets.stderr:
        pytest.skip("tshark is not installed")
    rows = [line.split("\t") for line in packets.stdout.splitlines()]
    assert ["::1", "8"] in rows and ["::ffff:127.0.0.1", "13"] in rows


@pytest.mark.e2e
def test_stopping_with_a_connection_open_is_clean() -> None:
    def peer(conn: socket.socket) -> None:
        read_all(conn)  # until the proxy closes it on the way out
        conn.close()

    upstream = Upstream(peer)
    with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.port}") as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
        client.sendall(b"still open")
        wait_for(lambda: len(children(proxy.proc.pid)) == 1 and upstream.thread.is_alive(), "the relay")
        code, _, stderr = proxy.stop(signal.SIGINT)
        assert read_all(client) == b""  # closed by the proxy
        client.close()
        upstream.join()
    assert code == 0, stderr
    assert "Traceback" not in stderr and "Exception" not in stderr


@pytest.mark.e2e
def test_a_checker_that_dies_is_reported_and_the_exit_is_1() -> None:
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        with Server("proxy", "--listen", "127.0.0.1:0", "--upstream", worker.address) as proxy:
            wait_for(lambda: children(proxy.proc.pid), "the checker process")
            (checker,) = children(proxy.proc.pid)
            os.kill(checker, signal.SIGKILL)
            client = socket.create_connection((proxy.host, proxy.port), timeout=DEADLINE)
            client.sendall(encode(Hello("v0.0.1", b"", "proxy-test", "i1")))  # still relayed
            assert client.recv(100)  # the worker's answer came through
            client.close()
            code, _, stderr = proxy.stop()
        worker.stop()
    assert code == 1, stderr
    assert "live checks incomplete: the checker stopped before the end (exit -9)" in stderr
    assert "Traceback" not in stderr


def test_a_proxys_relays_share_numbers_counts_and_with_fault_rules_one_budget() -> None:
    """``relay.proxy_relays``: the second socket's relay retries a refused connect (its upstream
    listens once the first is accepted); bytes are budgeted only where fault rules frame them."""
    from wallaroo_proto.proxy import faults
    from wallaroo_proto.proxy.relay import proxy_relays

    pairs = [(("127.0.0.1", 0), ("127.0.0.1", 2000)), (("127.0.0.1", 0), ("127.0.0.1", 2001))]
    plain = proxy_relays(pairs, None, rules=[], protocol=None, max_buffered=1 << 20)
    assert [r.wait_for_upstream for r in plain] == [0.0, 10.0]
    assert plain[0].stats is plain[1].stats and plain[0]._numbers is plain[1]._numbers
    assert [r.budget for r in plain] == [None, None] and [r.faults for r in plain] == [None, None]
    rules = faults.parse_rules(["drop type=ACK count=1"], [], "wallaroo")
    shaped = proxy_relays(pairs, None, rules=rules, protocol="wallaroo", max_buffered=1 << 20)
    assert shaped[0].budget is shaped[1].budget is not None
    assert all(r.faults is not None for r in shaped)
