"""Forward TCP connections unchanged in both directions, for a proxy between two real peers.

Protocol-agnostic: bytes go through as they come, each read written on before the next
read (so a slow side slows the other, through TCP's own windows, and nothing piles up
here), a half-close is passed on as a half-close and a reset as a reset. What passes
is shown to a ``Tap`` (recording, live dissection) as it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from wallaroo_proto.proxy import faults as fault_steps
from wallaroo_proto.proxy.outlet import Throttled
from wallaroo_proto.proxy.passthrough import Tap, pass_through
from wallaroo_proto.write_watch import reset as reset_transport

#: Bytes read at a time from either side.
READ_SIZE = 1 << 16
#: Connections remembered for naming a violation the checker reports after they ended.
KEEP_ENDS = 100_000


class Budget:
    """What every connection of a proxy holds of frames not yet whole (with fault rules, a
    frame is forwarded only once it is whole), bounded all together: each connection may
    hold its protocol's largest frame, and nothing else bounded the sum."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._held: dict[int, int] = {}

    def hold(self, conn: int, held: int) -> bool:
        """``conn`` now holds ``held`` bytes; False when that is more than before and takes
        the sum past the limit (the connection asking for more is the one to go)."""
        before = self._held.get(conn, 0)
        self.total += held - before
        self._held[conn] = held
        return held <= before or self.total <= self.limit

    def release(self, conn: int) -> None:
        self.total -= self._held.pop(conn, 0)


@dataclass
class RelayStats:
    """What the relay did, for the closing counts line (-v)."""

    accepted: int = 0
    refused_upstream: int = 0
    #: Connects to the upstream tried again after a refusal (``wait_for_upstream``).
    connect_retries: int = 0
    bytes: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a RST, as the peer that reset ours did."""
    reset_transport(writer.transport)


class Relay:
    """Accept on ``listen``, connect each accepted connection to ``upstream``, pump both ways."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        tap: Tap | None = None,
        *,
        faults: Callable[[], Any] | None = None,
        on_fault: Callable[[int, fault_steps.Applied], None] | None = None,
        numbers: Iterator[int] | None = None,
        stats: RelayStats | None = None,
        wait_for_upstream: float = 0.0,
        say: Callable[[str], None] | None = None,
        budget: Budget | None = None,
    ) -> None:
        """``faults()`` makes one connection's ``faults.ConnectionFaults`` (None: bytes pass
        unframed); ``numbers`` and ``stats`` may be shared by the relays of one proxy;
        ``wait_for_upstream``: seconds a refused connect is tried again before the client is
        refused (a second socket's upstream may listen only once the first is accepted)."""
        self.wait_for_upstream = wait_for_upstream
        #: Told why a connect to the upstream failed, other than a refusal (no descriptors left),
        #: and why a connection was cut for holding too much (``budget``).
        self.say = say
        self._cannot_connect = Throttled(say) if say is not None else None
        #: Bounds what all connections hold of unfinished frames (shared by a proxy's relays).
        self.budget = budget
        self.listen = listen
        self.upstream = upstream
        self.tap = tap
        self.stats = stats or RelayStats()
        self.faults = faults
        self.on_fault = on_fault
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._numbers = numbers or itertools.count(1)
        #: Open connections by the client's (host, port), for ``close_connection``.
        self._open: dict[tuple[str, int], tuple[asyncio.StreamWriter, asyncio.StreamWriter, Any]] = {}
        #: Recent connections' initiating ends -> (number, side), for ``who``.
        self._ends: dict[tuple[str, int], tuple[int, str | None]] = {}

    async def start(self) -> tuple[str, int]:
        """Listen; the address bound (port 0 gives a free one)."""
        self._server = await asyncio.start_server(self._accepted, *self.listen, limit=READ_SIZE)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def stop(self) -> None:
        """Stop accepting and close every relayed connection (first: a server's ``wait_closed``
        waits for its connections to end)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            pass  # stopped: asyncio would report a cancelled connection task as an error
        finally:
            self._tasks.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        conn = next(self._numbers)
        deadline = time.monotonic() + self.wait_for_upstream
        while True:
            try:
                server_r, server_w = await asyncio.open_connection(*self.upstream, limit=READ_SIZE)
                break
            except OSError as err:
                if isinstance(err, ConnectionRefusedError) and time.monotonic() < deadline:
                    self.stats.connect_retries += 1
                    await asyncio.sleep(0.05)  # not listening yet: it may be about to
                    continue
                self.stats.refused_upstream += 1
                client = client_w.get_extra_info("peername")
                _reset(client_w)  # as the upstream refused us, so we refuse our client
                if self._cannot_connect is not None:  # one line a second at most: a flood
                    reason = os.strerror(err.errno) if err.errno and err.errno > 0 else str(err)
                    self._cannot_connect(
                        f"connection #{conn} from {_address(client)}: cannot connect to the upstream "
                        f"{_address(self.upstream)}: {reason}; the client is reset"
                    )
                return
        ups = downs = None
        shaper = self.faults() if self.faults is not None else None
        peer = client_w.get_extra_info("peername")[:2]
        # By the client's address and by the proxy's own end upstream: the initiators of the
        # connection in the recording, one for each side when faults record them apart.
        ends = (peer, server_w.get_extra_info("sockname")[:2])
        for end, side in zip(ends, ("client", "upstream"), strict=True):
            self._open[end] = (client_w, server_w, shaper)
            self._ends[end] = (conn, side if shaper is not None else None)
        while len(self._ends) > KEEP_ENDS:
            del self._ends[next(iter(self._ends))]
        try:
            if shaper is None:
                if self.tap is not None:
                    upstream = server_w.get_extra_info("peername")[:2]
                    self.tap.opened(conn, peer, upstream, time.time())
                ups = asyncio.create_task(
                    pass_through(conn, (client_r, client_w), (server_r, server_w), self.tap, self.stats.bytes)
                )
            else:
                legs = _Legs(conn, self.tap, client_w, server_w)
                ups = asyncio.create_task(self._shaped(conn, True, client_r, legs, shaper))
                downs = asyncio.create_task(self._shaped(conn, False, server_r, legs, shaper))
            await asyncio.gather(*(p for p in (ups, downs) if p is not None))
        except _OverBudget as over:
            for pump in (ups, downs):
                if pump is not None:
                    pump.cancel()
            await asyncio.gather(*(p for p in (ups, downs) if p is not None), return_exceptions=True)
            for w in (client_w, server_w):
                _reset(w)
            legs.cut(True)
            if self.say is not None:
                assert self.budget is not None
                self.say(
                    f"connection #{conn} reset: it holds {_mib(over.held)} of frames not yet whole, "
                    f"and all connections together more than --max-buffered {_mib(self.budget.limit)}"
                )
        except _Cut as cut:
            # A fault ends the connection: the other direction stops too, both sides closed alike.
            for pump in (ups, downs):
                if pump is not None:
                    pump.cancel()
            await asyncio.gather(*(p for p in (ups, downs) if p is not None), return_exceptions=True)
            for w in (client_w, server_w):
                if cut.reset:
                    _reset(w)
            legs.cut(cut.reset)
        except asyncio.CancelledError:
            for pump in (ups, downs):
                if pump is not None:
                    pump.cancel()
            raise
        finally:
            if self.budget is not None:
                self.budget.release(conn)
            for end in ends:
                self._open.pop(end, None)
            for w in (client_w, server_w):
                if not w.transport.is_closing():
                    w.close()

    async def _shaped(
        self, conn: int, from_client: bool, reader: asyncio.StreamReader, legs: _Legs, shaper: Any
    ) -> None:
        """One direction, frame by frame through the fault rules: each step done in order."""
        try:
            await self._shaped_until_over(conn, from_client, reader, legs, shaper)
        finally:
            legs.over.set()  # a direction stalled for ever ends with this one

    async def _shaped_until_over(
        self, conn: int, from_client: bool, reader: asyncio.StreamReader, legs: _Legs, shaper: Any
    ) -> None:
        counts = self.stats.bytes
        own, other = legs.writers[not from_client], legs.writers[from_client]
        held = legs.held
        while True:
            if self.tap is not None:
                await self.tap.room()  # the recording or the checker is behind: the peer waits
            try:
                if shaper.deciding:
                    data = await asyncio.wait_for(reader.read(READ_SIZE), fault_steps.DETECT_WAIT)
                else:
                    data = await reader.read(READ_SIZE)
            except TimeoutError:
                # The first bytes wait for more that may not come before an answer: decide now.
                if not await self._steps(conn, from_client, shaper.settle(), legs, own):
                    return
                continue
            except OSError:  # this side reset (or failed): the other is reset too
                legs.ended(from_client, True)
                _reset(other)
                return
            if not data:
                break
            counts[from_client] += len(data)
            held[from_client] += len(data)  # until a Took step gives it out as a frame
            going_on = await self._steps(conn, from_client, shaper.feed(from_client, data), legs, own)
            if self.budget is not None and not self.budget.hold(conn, held[True] + held[False]):
                raise _OverBudget(held[True] + held[False])
            if not going_on:
                return
        await self._steps(conn, from_client, shaper.end(from_client), legs, own)
        legs.ended(from_client, False)
        if other.can_write_eof() and not other.transport.is_closing():
            with contextlib.suppress(OSError):
                other.write_eof()

    async def _steps(
        self, conn: int, from_client: bool, steps: list, legs: _Legs, own: asyncio.StreamWriter
    ) -> bool:
        """Carry out a shaper's steps; False when the direction is over (its far side gone)."""
        for step in steps:
            if type(step) is fault_steps.Send:
                writer = legs.writers[step.to_upstream]
                if self.tap is not None and self.tap.congested:
                    await self.tap.room()  # recorded on its own leg too: the same bytes again
                legs.sent(step.to_upstream, step.data)
                try:
                    writer.write(step.data)
                    await writer.drain()
                except ConnectionError:
                    _reset(own)
                    return False
            elif type(step) is fault_steps.Took:
                if self.tap is not None and self.tap.congested:
                    await self.tap.room()  # a connection's end may give out many frames at once
                legs.received(step.from_client, step.data)
                legs.held[step.from_client] -= len(step.data)
            elif type(step) is fault_steps.Applied:
                legs.note(step.frame.from_client, fault_steps.describe(step))
                if self.on_fault is not None:
                    self.on_fault(conn, step)
            elif type(step) is fault_steps.Said:
                if self.say is not None:
                    self.say(f"connection #{conn}: {step.text}")
            elif type(step) is fault_steps.Wait:
                await asyncio.sleep(step.seconds)
            elif type(step) is fault_steps.Stall:
                if step.seconds is None:
                    await legs.over.wait()  # until the other direction is over
                    return False
                await asyncio.sleep(step.seconds)
            elif type(step) is fault_steps.Close:
                raise _Cut(step.reset)
        return True

    def who(self, initiator: tuple[str, int]) -> tuple[int, str | None] | None:
        """The connection number, and with faults the side ("client", "upstream"), of a
        recorded connection that this end initiated; None if not one of this relay's."""
        return self._ends.get(initiator)

    def close_connection(self, client: tuple[str, int], first: dict[bool, bytes]) -> bool:
        """End the connection of this client now (``--strict``): ``first[to_client]`` sent
        before each side is closed. False when no such connection is open."""
        entry = self._open.get(client)
        if entry is None:
            return False
        client_w, server_w, _ = entry
        for to_client, writer in ((True, client_w), (False, server_w)):
            if not writer.transport.is_closing():
                if first.get(to_client):
                    # A side the proxy already half-closed (its peer's FIN passed on) takes no
                    # error frame: it is closed all the same.
                    with contextlib.suppress(RuntimeError):
                        writer.write(first[to_client])
                writer.close()
        return True


def _address(address: tuple | None) -> str:
    if not address:
        return "?"
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _OverBudget(Exception):
    """The connection's unfinished frames took all connections' past ``Budget.limit``."""

    def __init__(self, held: int) -> None:
        super().__init__("over budget")
        self.held = held


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n % (1 << 20) else f"{n >> 20} MiB"


class _Cut(Exception):
    """A fault closed the whole connection: both pumps stop."""

    def __init__(self, reset: bool) -> None:
        super().__init__("cut")
        self.reset = reset


class _Legs:
    """With faults the two sides see different bytes: each side is a connection of its own
    in the recording, the client's to the proxy and the proxy's to the upstream."""

    def __init__(
        self, conn: int, tap: Tap | None, client_w: asyncio.StreamWriter, server_w: asyncio.StreamWriter
    ):
        self.tap = tap
        self.client = (conn, "client")
        self.upstream = (conn, "upstream")
        self.writers = {True: server_w, False: client_w}
        #: Bytes each side sent that the fault rules hold, not yet a whole frame (``Budget``).
        self.held = {True: 0, False: 0}
        #: Set once either direction is over.
        self.over = asyncio.Event()
        if tap is not None:
            now = time.time()
            tap.opened(
                self.client,
                client_w.get_extra_info("peername")[:2],
                client_w.get_extra_info("sockname")[:2],
                now,
            )
            tap.opened(
                self.upstream,
                server_w.get_extra_info("sockname")[:2],
                server_w.get_extra_info("peername")[:2],
                now,
            )

    def received(self, from_client: bool, data: bytes) -> None:
        if self.tap is not None:
            self.tap.data(self.client if from_client else self.upstream, from_client, data, time.time())

    def sent(self, to_upstream: bool, data: bytes) -> None:
        if self.tap is not None:
            self.tap.data(self.upstream if to_upstream else self.client, to_upstream, data, time.time())

    def ended(self, from_client: bool, reset: bool) -> None:
        """One side ended: recorded as it came on its own leg, and as passed on on the other."""
        if self.tap is not None:
            now = time.time()
            self.tap.ended(self.client, from_client, reset, now)
            self.tap.ended(self.upstream, from_client, reset, now)

    def cut(self, reset: bool) -> None:
        """The proxy ended both sides: its reset on each, or its FIN and the peer's."""
        if self.tap is None:
            return
        now = time.time()
        for leg, proxy_is_client in ((self.client, False), (self.upstream, True)):
            self.tap.ended(leg, proxy_is_client, reset, now)
            if not reset:
                self.tap.ended(leg, not proxy_is_client, False, now)

    def note(self, from_client: bool, text: str) -> None:
        if self.tap is not None:
            self.tap.note(self.client if from_client else self.upstream, from_client, text, time.time())


#: Seconds a pair after the first tries again a connect its upstream refused.
SECOND_SOCKET_WAIT = 10.0


def proxy_relays(
    pairs: Iterable[tuple[tuple[str, int], tuple[str, int]]],
    tap: Tap | None,
    *,
    rules: list,
    protocol: str | None,
    max_buffered: int,
    on_fault: Callable[[int, fault_steps.Applied], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> list[Relay]:
    """One proxy's relays, one a (listen, upstream) pair: one numbering of connections and one
    count for all, and with fault ``rules`` one budget of ``max_buffered`` bytes (without rules
    bytes pass as they come). A second socket's upstream (AMBROSIA's IC send port) listens only
    once the first is accepted, so a pair after the first tries a refused connect again."""
    numbers, stats = itertools.count(1), RelayStats()
    budget = Budget(max_buffered) if rules else None
    return [
        Relay(
            *(here, there, tap),
            faults=partial(fault_steps.ConnectionFaults, rules, protocol, there[1]) if rules else None,
            on_fault=on_fault,
            numbers=numbers,
            stats=stats,
            wait_for_upstream=SECOND_SOCKET_WAIT if n else 0.0,
            say=say,
            budget=budget,
        )
        for n, (here, there) in enumerate(pairs)
    ]


# --- a violation's connection, among the relays (the live checks and --strict) ---------------


def connection_of(r: dict, relays: list[Relay]) -> tuple[int, str | None]:
    """A violation's connection, numbered as the relay numbers connections (and fault lines),
    and with faults its side ("client", "upstream")."""
    initiator = (r["initiator_addr"], r["initiator_port"])
    found = next((who for relay in relays if (who := relay.who(initiator)) is not None), None)
    return found if found is not None else (r["conn_index"], None)


def numbered_summary(s: dict, relays: list[Relay]) -> dict:
    """A summary's connection numbered as the live view, the violation and the fault lines number
    it, and with faults its side named: the checker numbers connections in its own order."""
    ends = []  # the initiator first: a plug-in may have turned a connection round (AMBROSIA's send port)
    for end in s.get("connection", "").split(" > "):
        host, _, port = end.rpartition(":")
        if port.isdigit():
            ends.append((host.strip("[]"), int(port)))
    found = next((who for end in ends for relay in relays if (who := relay.who(end)) is not None), None)
    if found is None:
        return s
    conn, side = found
    return {**s, "conn_index": f"{conn} ({side} side)" if side else conn}


def sent_by_a_peer(r: dict, side: str | None) -> bool:
    """Whether a peer, not the proxy, sent the violating frame: with faults each side is
    recorded apart, and what the proxy sent on a side may be its own fault's doing."""
    from_initiator = r["direction"].startswith("initiator")
    return side is None or (side == "client") == from_initiator


def close_for_violation(relays: list[Relay], r: dict) -> None:
    """``--strict``: the connection of this violation ends now, its sender told with the
    protocol's own error where it has one."""
    sender_is_client = r["direction"].startswith("initiator")
    adapter = fault_steps.make_adapter(r.get("protocol", ""))
    reason = "; ".join(r["violations"])
    error = adapter.error_frame(reason, sender_is_client) if adapter is not None else None
    for relay in relays:
        if relay.close_connection(
            (r["initiator_addr"], r["initiator_port"]), {sender_is_client: error or b""}
        ):
            return
