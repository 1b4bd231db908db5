"""Tremor mock-node in-process over loopback: its own failures and the peers that would hold it."""

from __future__ import annotations

import asyncio
import time

from wallaroo_proto.protocols.tremor import peers
from wallaroo_proto.protocols.tremor.peers import MockClient, MockNode


def _serve(node: MockNode, client_side) -> object:
    """Run ``client_side(host, port)`` in a thread while the node serves; its result."""

    async def main():
        host, port = await node.start()
        try:
            return await asyncio.to_thread(client_side, host, port)
        finally:
            await node.stop()

    return asyncio.run(main())


def test_a_failure_of_the_nodes_own_closes_that_connection_with_1011_and_one_line(monkeypatch):
    def broken(self, texts):
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    lines: list[str] = []
    node = MockNode(port=0, log=lines.append)
    monkeypatch.setattr(peers._NodeConnection, "_send_texts", broken)

    def client(host, port):
        c = MockClient(host, port, timeout=60)
        c.connect()  # the upgrade is accepted; sending the greeting after it fails
        c.receive(lambda: False, time.monotonic() + 60)
        c.close()
        return c.closed_by_server

    assert _serve(node, client) == 1011
    assert node.stats.internal_errors == 1
    assert lines == [
        "session 1: internal error: UnicodeEncodeError: 'utf-8' codec can't encode "
        "character '\\ud800' in position 0: surrogates not allowed"
    ]
