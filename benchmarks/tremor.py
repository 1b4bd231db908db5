"""tremor mock-client -> mock-node echo messages/s, against a bare wsproto loop in the same run.

1. Mock: ``tremor mock-node --port 0`` (the real CLI, its own process) serves
   the library's ``MockClient`` running the generated exchange: echo messages
   with ``--window`` in flight, every message and reply judged by the session
   core on both sides. The rate counts echo messages over the echo phase's
   wall time (connect and close left out).
2. Baseline: a bare wsproto echo server in its own process (accept, then send
   every text message back) and a bare wsproto client sending the same JSON
   texts with the same window, parsing nothing: the WebSocket library's cost
   and nothing else.

The ratio mock/bare is printed; the target is >= 0.5x. Each side runs
``--runs`` times, interleaved, and the best run counts.

Run: ``python benchmarks/tremor.py`` (about 20 s on 2 cores); ``--check`` exits
1 when the ratio is below the target.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from wallaroo_proto.protocols.tremor.messages import dumps
from wallaroo_proto.protocols.tremor.peers import MockClient

TARGET = 0.5
NODE = [sys.executable, "-m", "wallaroo_proto_cli", "tremor", "mock-node", "--port", "0"]

BARE_SERVER = """
import socket
from wsproto import WSConnection, ConnectionType
from wsproto.events import Request, AcceptConnection, TextMessage, CloseConnection
srv = socket.create_server(("127.0.0.1", 0))
print("listening on 127.0.0.1:%d" % srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ws = WSConnection(ConnectionType.SERVER)
    done = False
    while not done:
        data = conn.recv(65536)
        ws.receive_data(data or None)
        out = b""
        for event in ws.events():
            if isinstance(event, Request):
                out += ws.send(AcceptConnection())
            elif isinstance(event, TextMessage):
                out += ws.send(TextMessage(data=event.data, message_finished=event.message_finished))
            elif isinstance(event, CloseConnection):
                done = True
        if out:
            conn.sendall(out)
        if not data:
            done = True
    conn.close()
"""


def _start(command: list[str]) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on \S+:(\d+)", line)
    if not match:
        raise SystemExit(f"no ready line from {command}: {line!r}")
    return proc, int(match.group(1))


def _texts(messages: int, payload: int) -> list[str]:
    return [dumps({"echo": {"n": i, "p": "x" * payload}}) for i in range(messages)]


def mock_run(port: int, messages: int, window: int, payload: int) -> float:
    client = MockClient("127.0.0.1", port, timeout=60)
    client.connect()
    client.send({"tremor": {"connect": {"protocol": "echo"}}})
    client.settle()
    texts = _texts(messages, payload)
    stream = client.session.streams["echo"]
    t0 = time.perf_counter()
    sent = 0
    while sent < messages:
        burst = min(window - len(stream.pending), messages - sent)
        for text in texts[sent : sent + burst]:
            client.send(text)
        sent += burst
        client.receive(lambda: len(stream.pending) <= window // 2, time.monotonic() + 60)
    client.settle()
    elapsed = time.perf_counter() - t0
    assert client.received >= messages and not client.problems
    client.close()
    return messages / elapsed


def bare_run(port: int, messages: int, window: int, payload: int) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host="localhost", target="/")))
    accepted = False
    while not accepted:
        ws.receive_data(sock.recv(65536))
        accepted = any(isinstance(e, AcceptConnection) for e in ws.events())
    texts = _texts(messages, payload)
    t0 = time.perf_counter()
    sent = received = 0
    while received < messages:
        burst = min(window - (sent - received), messages - sent)
        if burst > 0:
            sock.sendall(b"".join(ws.send(TextMessage(data=t)) for t in texts[sent : sent + burst]))
            sent += burst
        while sent - received > window // 2 or (sent == messages and received < messages):
            ws.receive_data(sock.recv(65536))
            received += sum(1 for e in ws.events() if isinstance(e, TextMessage) and e.message_finished)
    elapsed = time.perf_counter() - t0
    sock.close()
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--payload", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    node, node_port = _start(NODE)
    bare, bare_port = _start([sys.executable, "-c", BARE_SERVER])
    try:
        mock_rates, bare_rates = [], []
        for _ in range(args.runs):
            mock_rates.append(mock_run(node_port, args.messages, args.window, args.payload))
            bare_rates.append(bare_run(bare_port, args.messages, args.window, args.payload))
    finally:
        for proc in (node, bare):
            proc.terminate()
            proc.wait(timeout=30)
    mock, base = max(mock_rates), max(bare_rates)
    ratio = mock / base
    print(f"tremor echo, {args.messages:,} messages, window {args.window}, payload {args.payload} B")
    runs = {
        name: ", ".join(f"{r:,.0f}" for r in rates)
        for name, rates in (("mock", mock_rates), ("bare", bare_rates))
    }
    print(f"  mock-client -> mock-node: {mock:12,.0f} messages/s  (runs: {runs['mock']})")
    print(f"  bare wsproto loop:        {base:12,.0f} messages/s  (runs: {runs['bare']})")
    print(f"  ratio {ratio:.2f}x (target >= {TARGET}x): {'ok' if ratio >= TARGET else 'BELOW TARGET'}")
    if args.check and ratio < TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
