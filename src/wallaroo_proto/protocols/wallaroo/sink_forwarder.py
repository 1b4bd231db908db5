"""The worker's output to a connector sink, committed together with its checkpoints.

``mock-worker --sink`` adds a ``SinkForwarder`` as a delivery consumer: every
delivered message is put to a ``SinkDriver``, and each worker checkpoint runs
one 2PC round ending exactly at the sink offset reached when the checkpoint's
registry snapshot was taken.

Exactly once across worker crashes: the worker writes its state file (stream
positions and the sink position) between the sink's commit vote and PHASE2.
If the worker dies before that write, the sink lists the txn as uncommitted at
the next connection and the restarted worker, not finding it in its state,
aborts it, while the connectors replay from the older positions. If it dies
after, the state names the txn, so the listed txn is committed, and the
connectors resume past it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from .frames import Message, Text, show_text
from .sink_driver import SinkCheckpointFailed, SinkDriver

WriteState = Callable[[dict], Awaitable[None]]


class SinkForwarder:
    """A worker consumer that forwards payloads to a sink and commits at checkpoints."""

    def __init__(self, host: str, port: int, *, saved: dict | None = None, **driver_options) -> None:
        saved = saved or {"offset": 0, "txn": None, "next_cid": 1}
        self._saved_txn = saved["txn"]
        self._write: WriteState | None = None
        self.driver = SinkDriver(
            host,
            port,
            auto_checkpoint=False,
            on_commit_vote=self._on_commit_vote,
            resolve_listed=lambda txn: show_text(txn) == self._saved_txn,
            start_offset=saved["offset"],
            first_checkpoint_id=saved["next_cid"],
            **driver_options,
        )
        self._runner: asyncio.Task | None = None
        #: Set by the worker: ask for a checkpoint now (the buffer drains only at checkpoints).
        self.request_checkpoint: Callable[[], None] = lambda: None
        #: Set by the worker: the driver gave up for good (sink unreachable, HELLO refused).
        self.on_fatal: Callable[[BaseException], None] = lambda err: None

    def start(self) -> None:
        self._runner = asyncio.create_task(self.driver.run(), name="sink-driver")
        self._runner.add_done_callback(self._runner_done)

    def _runner_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.on_fatal(task.exception())

    async def deliver(self, stream_id: int, message: Message) -> None:
        if self.driver.full:
            self.request_checkpoint()  # or put() would wait for a checkpoint nobody asked for
        await self.driver.put(message.payload)

    def mark(self) -> int:
        """The sink offset of everything delivered so far: taken with the registry snapshot."""
        return self.driver.mark()

    async def commit(self, upto: int, write_state: WriteState) -> None:
        """One 2PC round over the output up to ``upto``; ``write_state`` runs before PHASE2."""
        self._write = write_state
        try:
            if not await self.driver.checkpoint(upto):
                raise SinkCheckpointFailed("the sink did not commit this checkpoint's output")
        finally:
            self._write = None

    async def _on_commit_vote(self, txn: Text, end: int) -> None:
        if self._write is None:
            # A round the worker's checkpoint did not ask for (the driver closing with
            # uncheckpointed output): committing it would duplicate what sources replay.
            raise RuntimeError("no worker checkpoint is in progress")
        position = {"offset": end, "txn": show_text(txn), "next_cid": self.driver.next_checkpoint_id}
        await self._write(position)
        self._saved_txn = position["txn"]

    async def aclose(self) -> None:
        """Close after the worker's last checkpoint; output it did not commit is left to recovery."""
        if self._runner is None:
            return
        if self.driver.put_offset <= self.driver.committed and not self._runner.done():
            await self.driver.close()
        self._runner.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._runner
