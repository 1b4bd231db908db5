"""What the three Wallaroo suites share: where the rules are written, addresses, ids, probe upkeep."""

from __future__ import annotations

import asyncio
import contextlib
import random

from wallaroo_proto.conformance.runner import Result, SuiteUnavailable

from .probe import Probe

SPEC = "spec"
NOTES = "protocol-notes"


def spec(section: str) -> str:
    """A section of the connector protocol v3 specification."""
    return f"{SPEC}: {section}"


def notes(section: str) -> str:
    """Shipped behaviour, as a section of docs/protocol-notes.md records it."""
    return f"{NOTES}: {section}"


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SuiteUnavailable(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def new_stream_id() -> int:
    """A stream id no earlier run used, so a worker's memory of old streams cannot matter."""
    return random.getrandbits(62) | 1 << 62


def tag() -> str:
    return f"{random.getrandbits(32):08x}"


class ProbeKeeper:
    """Closes every probe a case opened once the case is over, whatever its outcome.

    A mix-in for the suites' dataclass contexts, which hold the ``probes`` list.
    """

    probes: list[Probe]

    def keep(self, probe: Probe) -> Probe:
        self.probes.append(probe)
        return probe

    async def close_all(self) -> None:
        probes, self.probes = self.probes, []
        for probe in probes:
            probe.abort()
        await asyncio.sleep(0)

    async def after_case(self, case, result: Result) -> Result:
        await self.close_all()
        return result


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
