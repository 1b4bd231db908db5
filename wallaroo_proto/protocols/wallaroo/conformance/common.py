"""What the three Wallaroo suites share: where the rules are written, ids, probe upkeep."""

from __future__ import annotations

import asyncio
import random

from wallaroo_proto.conformance.runner import Result

from .probe import Probe

SPEC = "spec"
NOTES = "protocol-notes"


def spec(section: str) -> str:
    """A section of the connector protocol v3 specification."""
    return f"{SPEC}: {section}"


def notes(section: str) -> str:
    """Shipped behaviour, as a section of docs/protocol-notes.md records it."""
    return f"{NOTES}: {section}"


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
