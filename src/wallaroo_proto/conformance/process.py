"""The implementation under test as a process: started per case with its placeholders filled, then stopped.

Suites that play the server side for a client (an LB, a DCP consumer) start the
client's COMMAND for each case, with ``{name}`` placeholders in its arguments
replaced (a port, a state file), keep the last lines it prints for a failure's
"seen", and stop its whole process group afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import Mapping, Sequence

from .runner import SuiteUnavailable

#: Lines of a process's output kept for a failure.
OUTPUT_LINES = 8


class Started:
    """One run of the command: the process and its last lines of output (stdout and stderr)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.drain = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output.append(line.decode("utf-8", "replace").rstrip())

    def tail(self) -> str:
        return "\n".join(self.output)

    async def exited(self, seconds: float = 1.0) -> str:
        """After the process ended: its output up to the end (waited for at most ``seconds``)."""
        await asyncio.wait({self.drain}, timeout=seconds)  # not cancelled: later output still arrives
        return self.tail()

    async def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 5 s."""
        proc = self.proc
        if proc.returncode is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 30.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await proc.wait()
                        break
        self.drain.cancel()
        await asyncio.gather(self.drain, return_exceptions=True)


async def start(command: Sequence[str], fill: Mapping[str, str], env: Mapping[str, str]) -> Started:
    """Start ``command`` with ``{name}`` placeholders filled and ``env`` added (SuiteUnavailable if not)."""
    args = list(command)
    try:
        args = [arg.format(**fill) if "{" in arg else arg for arg in command]
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    except (OSError, KeyError, IndexError, ValueError) as err:
        what = err.strerror if isinstance(err, OSError) else f"bad placeholder {err}"
        raise SuiteUnavailable(f"cannot run {args[0]!r}: {what or err}") from None
    return Started(proc)
