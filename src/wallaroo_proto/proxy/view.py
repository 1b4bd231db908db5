"""The proxy's live view: each connection as the relay and the live checker see it.

``LiveView`` stands in front of the proxy's ``Watch`` as the relay's tap: it counts
each connection's bytes both ways as they pass (the relay's own counts, one addition
per read) and hands everything on. The checker's state lines (``Watch``'s
``on_state``) give each connection's protocol, frames, violations and protocol
state; ``fault()`` counts the faults applied. ``renderable()`` makes the rich table
``cli/proxy.py`` shows on stderr, rates taken over the last second or so.

With fault rules the relay records each side of a connection as a connection of its
own (the client's leg and the upstream's leg, which see different frames): each leg
is a row of its own, numbered ``N client`` and ``N upstream``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from wallaroo_proto.proxy.passthrough import Tap

#: Seconds a rate is measured over (at least): steadier than between two refreshes.
RATE_WINDOW = 1.0
#: Rows shown at most; closed connections are kept for a while after the open ones.
MAX_ROWS = 30
KEEP_CLOSED = 10
COLUMNS = (
    "#",
    "client",
    "protocol",
    "state",
    "frames/s",
    "bytes/s c→u",
    "bytes/s u→c",
    "violations",
    "faults",
    "protocol state",
)

_NUMBERS = {"frames/s", "bytes/s c→u", "bytes/s u→c", "violations"}


class _Rate:
    """Units per second of a growing count, measured over at least ``RATE_WINDOW``."""

    __slots__ = ("count", "at", "rate")

    def __init__(self, now: float) -> None:
        self.count, self.at, self.rate = 0, now, 0.0

    def update(self, count: int, now: float) -> float:
        if now - self.at >= RATE_WINDOW:
            self.rate = max(count - self.count, 0) / (now - self.at)
            self.count, self.at = count, now
        return self.rate


class _Row:
    """One recorded connection (a relay connection, or one leg of it under fault rules)."""

    __slots__ = (
        "number",
        "leg",
        "client",
        "bytes",
        "ends",
        "reset",
        "checked",
        "faults",
        "last_fault",
        "frame_rate",
        "byte_rates",
        "closed_at",
    )

    def __init__(self, number: int, leg: str | None, client: tuple[str, int], now: float) -> None:
        self.number = number
        self.leg = leg
        self.client = client
        self.bytes = {True: 0, False: 0}  # by from_client
        self.ends: set[bool] = set()
        self.reset = False
        self.checked: dict[str, Any] = {}  # the checker's latest state line for it
        self.faults = 0
        self.last_fault = ""
        self.frame_rate = _Rate(now)
        self.byte_rates = {True: _Rate(now), False: _Rate(now)}
        self.closed_at: float | None = None

    @property
    def state(self) -> str:
        if self.reset:
            return "reset"
        if len(self.ends) == 2 or (self.checked and self.checked.get("bytes", 0) is None):
            return "closed"
        if self.ends:
            return "half-closed"
        return "open"


def format_address(address: tuple[str, int] | list) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def protocol_state(state: dict) -> str:
    """A tracker's ``live_state()`` as words: ``credits 100  streams 3``."""
    return "  ".join(f"{key} {value}" for key, value in state.items() if value is not None)


class LiveView:
    """What the live view shows, fed by the relay (as its tap), the checker and the fault rules.

    The relay calls the tap methods on its event loop, the checker's lines arrive
    on ``Watch``'s reader thread and ``renderable()`` runs on rich's refresh
    thread: a lock keeps the rows whole between them (not taken per read).
    """

    def __init__(self, title: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.title = title
        self.clock = clock
        self.inner: Tap | None = None
        self._rows: dict[Hashable, _Row] = {}
        self._by_client: dict[tuple[str, int], Hashable] = {}
        self._lock = threading.Lock()
        self.accepted = 0

    def wrap(self, inner: Tap | None) -> LiveView:
        """Stand in front of ``inner`` (the ``Watch``) as the relay's tap."""
        self.inner = inner
        return self

    # passthrough.Tap ----------------------------------------------------------------------------

    def opened(self, conn: Hashable, client: tuple[str, int], server: tuple[str, int], when: float) -> None:
        number, leg = conn if isinstance(conn, tuple) else (conn, None)
        with self._lock:
            if leg is None or leg == "client":
                self.accepted += 1
            self._rows[conn] = _Row(number, leg, (client[0], client[1]), self.clock())
            self._by_client[(client[0], client[1])] = conn
            self._forget_closed()
        if self.inner is not None:
            self.inner.opened(conn, client, server, when)

    def data(self, conn: Hashable, from_client: bool, data: bytes, when: float) -> None:
        row = self._rows.get(conn)
        if row is not None:
            row.bytes[from_client] += len(data)
        if self.inner is not None:
            self.inner.data(conn, from_client, data, when)

    def note(self, conn: Hashable, from_client: bool, text: str, when: float) -> None:
        if self.inner is not None:
            self.inner.note(conn, from_client, text, when)

    @property
    def congested(self) -> bool:
        return self.inner is not None and self.inner.congested

    def when_room(self, callback: Callable[[], None]) -> None:
        if self.inner is not None:
            self.inner.when_room(callback)

    async def room(self) -> None:
        if self.inner is not None:
            await self.inner.room()

    def ended(self, conn: Hashable, from_client: bool, reset: bool, when: float) -> None:
        row = self._rows.get(conn)
        if row is not None:
            row.ends.add(from_client)
            row.reset = row.reset or reset
            if len(row.ends) == 2 or reset:
                row.closed_at = self.clock()
        if self.inner is not None:
            self.inner.ended(conn, from_client, reset, when)

    # the checker and the fault rules -------------------------------------------------------

    def state(self, connections: list[dict]) -> None:
        """``Watch``'s ``on_state``: the checker's lines for the connections that changed."""
        with self._lock:
            for line in connections:
                client = (line["client"][0], line["client"][1])
                conn = self._by_client.get(client)
                row = self._rows.get(conn) if conn is not None else None
                if row is None:
                    if line["bytes"] is None:  # over, and its row already gone
                        continue
                    conn = ("checked", line["conn_index"])  # not seen opening here: shown anyway
                    row = self._rows.get(conn)
                    if row is None:
                        row = self._rows[conn] = _Row(line["conn_index"], None, client, self.clock())
                row.checked = line
                if line.get("bytes") is None and row.closed_at is None:
                    row.closed_at = self.clock()

    def fault(self, conn: int, from_client: bool, what: str) -> None:
        """A fault rule acted on relay connection ``conn`` at a frame from the client (or not):
        counted on the leg that frame came in on, ``what`` shown as its latest."""
        with self._lock:
            row = self._rows.get((conn, "client" if from_client else "upstream")) or self._rows.get(conn)
            if row is not None:
                row.faults += 1
                row.last_fault = what

    # rendering --------------------------------------------------------------------------

    def _forget_closed(self) -> None:
        closed = [key for key, row in self._rows.items() if row.closed_at is not None]
        for key in closed[: max(len(closed) - KEEP_CLOSED, 0)]:
            row = self._rows.pop(key)
            if self._by_client.get(row.client) == key:
                del self._by_client[row.client]

    def renderable(self) -> RenderableType:
        """The head line and the connections table, rates as of now."""
        now = self.clock()
        with self._lock:
            rows = list(self._rows.values())
        open_numbers = {r.number for r in rows if r.closed_at is None}  # a connection's legs count once
        violations = sum(r.checked.get("violations", 0) for r in rows if r.checked)
        faults = sum(r.faults for r in rows)
        head = (
            f"[bold]wallaroo-proto proxy[/] {escape(self.title)}  connections {len(open_numbers)} open,"
            f" {self.accepted} in all  violations {violations}  faults applied {faults}"
        )
        table = Table(expand=False)
        for col in COLUMNS:
            table.add_column(
                col, justify="right" if "/s" in col or col in ("violations", "faults") else "left"
            )
        shown = sorted(rows, key=lambda r: (r.closed_at is not None, r.number, r.leg or ""))[:MAX_ROWS]
        for row in shown:
            checked = row.checked
            frames = checked.get("frames")
            frame_rate = row.frame_rate.update(frames, now) if frames is not None else None
            rates = [row.byte_rates[side].update(row.bytes[side], now) for side in (True, False)]
            table.add_row(
                f"{row.number} {row.leg}" if row.leg else str(row.number),
                format_address(row.client),
                checked.get("protocol", ""),
                row.state,
                "" if frame_rate is None else f"{frame_rate:,.0f}",
                f"{rates[0]:,.0f}",
                f"{rates[1]:,.0f}",
                str(checked.get("violations", "")),
                f"{row.faults} ({row.last_fault})" if row.faults else "0",
                escape(protocol_state(checked.get("state", {}))),
            )
        parts: list[RenderableType] = [head, table]
        if len(rows) > MAX_ROWS:
            parts.append(f"  ... and {len(rows) - MAX_ROWS} more connections")
        return Group(*parts)

    @contextmanager
    def shown(self, console: Console):
        """Show the view on ``console`` (refreshed by rich's own thread) until the block ends.

        Lines printed to stderr meanwhile go above it; stdout is left alone (the ready line,
        ``--record -``'s pcap)."""
        with Live(
            console=console,
            get_renderable=self.renderable,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,
        ):
            yield self
