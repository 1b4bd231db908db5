"""Where a network target is: HOST:PORT parsed, and a check that something listens there."""

from __future__ import annotations

import asyncio
import contextlib

from .runner import SuiteUnavailable


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (``[v6]:PORT`` too; an empty host is 127.0.0.1); SuiteUnavailable otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SuiteUnavailable(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


async def reachable(host: str, port: int, timeout: float = 10.0) -> None:
    """Raise SuiteUnavailable unless something accepts connections at host:port."""
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as err:
        raise SuiteUnavailable(f"cannot connect to {host}:{port}: {err or 'timed out'}") from None
    writer.transport.abort()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
