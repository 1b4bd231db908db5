"""How the mock peers run: asyncio's event loop (or uvloop's, on request) and a quiet garbage collector.

uvloop is an optional extra (``pip install wallaroo-proto[fast]``), used only with
``WALLAROO_PROTO_LOOP=uvloop`` in the environment: it measured within noise of asyncio
here, and it reports some operations on a closed transport with RuntimeError where
asyncio's loop raises ConnectionError, which the peers' reconnect paths do not expect yet.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def tune_gc() -> None:
    """Keep the cyclic collector off the per-frame path.

    The peers hold tens of thousands of frames (replay buffers, runs being delivered)
    and build no cycles worth chasing; with the default thresholds the collector walks
    them every few hundred allocations. Start-up objects are frozen out of its way and
    young passes made rare.
    """
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signals(handler: Callable[[], object] | None = None) -> asyncio.Event:
    """SIGINT and SIGTERM on the running loop call ``handler``, by default setting the event
    returned. Installed before a peer's ready line: a signal sent the moment it appears must
    still end the peer cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, handler or stop.set)
    return stop


def loop_factory() -> Any:
    """uvloop's loop factory when asked for and installed, else None (asyncio's own)."""
    if os.environ.get("WALLAROO_PROTO_LOOP", "").lower() != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest loop available, with the collector tuned."""
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def accept_error_handler(say: Callable[[str], None]) -> Callable[[asyncio.AbstractEventLoop, dict], None]:
    """A loop exception handler: an accept that fails (out of file descriptors) is a line given
    to ``say``, which decides how often to show it; asyncio would log a traceback for every retry
    (thousands a second). Anything else is reported as asyncio does."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        err = context.get("exception")
        if isinstance(err, OSError) and "accept" in context.get("message", ""):
            say(f"cannot accept a connection: {err.strerror or err}; trying again")
            return
        loop.default_exception_handler(context)

    return handle


def quiet_accept_errors(name: str) -> None:
    """On the running loop: a failing accept is one line a second at most on stderr, naming the
    server (``accept_error_handler``)."""
    import sys
    import time

    last = [-1.0]

    def say(line: str) -> None:
        now = time.monotonic()
        if last[0] < 0 or now - last[0] >= 1.0:
            last[0] = now
            print(f"wallaroo-proto {name}: {line}", file=sys.stderr, flush=True)

    asyncio.get_running_loop().set_exception_handler(accept_error_handler(say))
