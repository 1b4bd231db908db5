"""Probe upkeep shared by the suites: every probe a case opened is aborted once the case is over."""

from __future__ import annotations

import asyncio
from typing import Any


class ProbeKeeper:
    """A mix-in for a suite's dataclass context, which holds the ``probes`` list.

    A probe is anything with ``abort()`` (it drops its connection at once).
    """

    probes: list[Any]

    def keep(self, probe: Any) -> Any:
        self.probes.append(probe)
        return probe

    def abort_all(self) -> None:
        probes, self.probes = self.probes, []
        for probe in probes:
            probe.abort()

    async def close_all(self) -> None:
        self.abort_all()
        await asyncio.sleep(0)

    async def after_case(self, case: Any, result: Any) -> Any:
        await self.close_all()
        return result
