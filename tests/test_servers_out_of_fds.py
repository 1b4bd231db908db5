"""Mock servers out of file descriptors: one line a second at most, no traceback, then serving again."""

from __future__ import annotations

import os
import resource
import socket

import pytest
from support import Server, run_cli, wait_for

SERVERS = {
    "mock-worker": ["mock-worker", "--listen", "127.0.0.1:0", "-q"],
    "tremor mock-node": ["tremor", "mock-node", "--listen", "127.0.0.1:0", "-q"],
}


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_a_server_out_of_fds_says_so_once_a_second_and_serves_again(name):
    server = Server(*SERVERS[name])
    try:
        held = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        soft, hard = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (held + 3, hard))
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(10)]
        wait_for(lambda: "cannot accept a connection" in server.stderr(), "the out-of-fds line")
        for sock in socks:
            sock.close()
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
        if name == "mock-worker":
            done = run_cli("mock-source", "--connect", server.address, "--count", "10")
        else:
            done = run_cli("tremor", "mock-client", "--connect", server.address)
        assert done.returncode == 0, done.stderr
    finally:
        code, _, err = server.stop()
    assert code == 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "cannot accept" in line]
    assert lines[0] == f"wallaroo-proto {name}: cannot accept a connection: Too many open files; trying again"
