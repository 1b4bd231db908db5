"""Keep Ctrl-C and SIGTERM on the main thread when a helper thread starts.

The kernel hands a process signal to any thread that does not block it. Python only sets a
flag when it lands on a helper thread (a progress bar's refresher, an input pump), so a main
thread blocked in ``read()`` on a pipe or FIFO would wait for data before it saw the signal.
Threads inherit the signal mask of the thread that starts them: started with these signals
blocked, they never take them.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Threads started inside never take SIGINT or SIGTERM; the caller's mask is given back."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def entered_without_signals(manager: AbstractContextManager[T]) -> Iterator[T]:
    """Enter ``manager`` (say, rich's status, whose ``__enter__`` starts a thread) with the
    signals blocked, then run the body with them back."""
    with contextlib.ExitStack() as stack:
        with signals_blocked():
            value = stack.enter_context(manager)
        yield value


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM until the body is done, then deliver them: a child started
    inside (``subprocess.Popen`` returns only once it has run ``exec``) is always known to the
    caller, which can stop it, instead of being orphaned by an interrupt between the fork and
    the return. Main thread only."""
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, _frame: caught.append(number)) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for number in dict.fromkeys(caught):
            signal.raise_signal(number)
