"""The case runner shared by every protocol's conformance suites.

A suite plays the other side against an implementation under test. It opens a
context once (``Suite.open``: reach the target, keep options), then runs its
cases one at a time, each under a deadline. A case is an async function that
returns what it saw when the rule held, raises ``CaseFailed`` with the reason
when it did not, and ``CaseSkipped`` when it cannot be judged here. Whatever a
case logged to its ``Trace`` is the "seen" of a failure or a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"
#: Trace lines kept for a case's "seen": the last ones tell what went wrong.
TRACE_LINES = 12


class CaseFailed(Exception):
    """The implementation broke the case's rule; ``seen`` says what it did instead."""

    def __init__(self, reason: str, seen: str = "") -> None:
        self.reason = reason
        self.seen = seen
        super().__init__(reason)


class CaseSkipped(Exception):
    """The case cannot be judged here (an option missing, a limit out of reach)."""


class SuiteUnavailable(Exception):
    """The target cannot be tested at all (unreachable, a command that does not start): exit 2."""


class Trace:
    """What a case sent and saw, in order, for its report."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def tail(self, n: int = TRACE_LINES) -> str:
        shown = self.lines[-n:]
        more = len(self.lines) - len(shown)
        return "\n".join(([f"... {more} earlier"] if more else []) + shown)


@dataclass(frozen=True)
class Case:
    """One rule: ``id`` to select it, ``ref`` where it is written, ``expect`` in one line."""

    id: str
    ref: str
    expect: str
    run: Callable[[Any, Trace], Awaitable[str]]
    #: Seconds this case may take beyond the suite's per-case timeout (it restarts a process, say).
    extra_time: float = 0.0


@dataclass(frozen=True)
class SuiteOption:
    """An option a suite adds to its command line (``--NAME``); ``flag`` for on/off."""

    name: str
    help: str
    default: Any = None
    flag: bool = False
    choices: tuple[str, ...] = ()
    #: Older names still taken, hidden from the help (``--version`` for ``--protocol-version``).
    aliases: tuple[str, ...] = ()
    #: An older option still taken, hidden from the help (its suite reads it into a newer one).
    hidden: bool = False


@dataclass(frozen=True)
class Target:
    """What is under test: an address, or a command to start (or ``listen`` for one started by hand)."""

    address: str | None = None
    command: tuple[str, ...] = ()
    listen: str | None = None

    def describe(self) -> str:
        if self.address:
            return self.address
        if self.command:
            return " ".join(self.command)
        return f"connectors on {self.listen}"


@dataclass(frozen=True)
class Suite:
    """A protocol's suite: ``conformance NAME`` plays the other side of ``target`` kind."""

    name: str
    protocol: str
    help: str
    #: "address" (HOST:PORT of a server under test) or "command" (a client started per case).
    target: str
    cases: tuple[Case, ...]
    #: ``open(target, options)``: an async context manager giving the context every case gets.
    open: Callable[[Target, Mapping[str, Any]], AbstractAsyncContextManager[Any]]
    options: tuple[SuiteOption, ...] = ()
    #: A "command" suite that can also wait for a client started by hand (``--listen``).
    can_listen: bool = False
    #: Command lines shown at the end of the suite's help.
    examples: tuple[str, ...] = ()


@dataclass
class Result:
    case: Case
    status: str
    reason: str = ""
    seen: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.case.id,
            "ref": self.case.ref,
            "expect": self.case.expect,
            "status": self.status,
            "reason": self.reason,
            "seen": self.seen,
            "seconds": round(self.seconds, 3),
        }


def select(cases: Sequence[Case], only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Case]:
    """The cases ``--case``/``--skip`` pick: an id, or a prefix ending at a dot (``handshake``).

    An id that matches no case raises ValueError naming it, so a typo is not a silent pass.
    """

    def matches(case: Case, pattern: str) -> bool:
        return case.id == pattern or case.id.startswith(pattern.rstrip(".") + ".")

    only, skip = list(only), list(skip)
    for pattern in only + skip:
        if not any(matches(c, pattern) for c in cases):
            raise ValueError(f"no case {pattern!r} (see --list)")
    return [
        c
        for c in cases
        if (not only or any(matches(c, p) for p in only)) and not any(matches(c, p) for p in skip)
    ]


async def run_case(case: Case, context: Any, timeout: float) -> Result:
    """Run one case under its deadline; every outcome becomes a Result, never an exception."""
    trace = Trace()
    started = time.monotonic()
    limit = timeout + case.extra_time
    try:
        async with asyncio.timeout(limit):
            seen = await case.run(context, trace)
        result = Result(case, PASS, seen=seen)
    except CaseFailed as failed:
        result = Result(case, FAIL, failed.reason, failed.seen or trace.tail())
    except CaseSkipped as skipped:
        result = Result(case, SKIP, str(skipped), trace.tail())
    except TimeoutError:
        waiting = next((line.strip() for line in reversed(trace.lines) if line.startswith("   waiting")), "")
        reason = f"no conclusion within {limit:g} s" + (f" ({waiting})" if waiting else "")
        result = Result(case, FAIL, reason, trace.tail())
    except (ConnectionError, OSError) as err:
        result = Result(case, FAIL, f"connection failed: {err}", trace.tail())
    result.seconds = time.monotonic() - started
    return result


async def run_suite(
    suite: Suite,
    target: Target,
    options: Mapping[str, Any],
    cases: Sequence[Case],
    *,
    timeout: float = 10.0,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run ``cases`` in order against ``target``; raises SuiteUnavailable if it cannot be reached.

    A context with ``after_case(case, result)`` may amend each result (a server that
    stopped serving after a case fails it) and repair what the case broke.
    """
    results = []
    async with suite.open(target, options) as context:
        after = getattr(context, "after_case", None)
        for case in cases:
            result = await run_case(case, context, timeout)
            if after is not None:
                result = await after(case, result)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
