"""Index optimisation for the embedded Edge shard.

Qdrant Edge runs no optimizers of its own: HNSW graphs, the quantized copy, segment merges
and vacuum happen only when `optimize()` is called, and it blocks until it is done.
Without this module a shard filled through IngestDocument would be searched unindexed
forever (a plain scan per tenant, ~5x slower at 100k chunks, docs/architecture.md §3).

`IndexOptimizer` runs `optimize()` once at start-up, before the server serves (instant
when there is nothing to do), and then watches the index's write counter: once writes
have paused for `quiet_s` (so a bulk ingest is not interrupted after every document) it
runs `optimize()` again on a daemon thread.

qdrant-edge-py 0.9 holds the GIL for the whole `optimize()` call: while it runs the
process answers nothing (bench/index_engine.py --incremental: at 100k chunks of 512-d,
10 s after +5,000 new chunks, during which another Python thread got 0 % of its rate; a
few hundred new chunks leave nothing to do). That is the price of an indexed shard with
this engine; RETR_OPTIMIZE_QUIET_S=0 turns both runs off.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("visior.retrieval.optimizer")


class Optimizable(Protocol):
    """What the optimizer needs of an index (EdgeIndex)."""

    @property
    def write_count(self) -> int:
        """Writes (upserts, deletes) since the index was opened."""
        ...

    def optimize(self) -> None: ...


class IndexOptimizer:
    """Runs `index.optimize()` after writes have been quiet for `quiet_s` seconds.

    `poll_s` is how often the write counter is read; `busy()` True (an ingest still parsing
    or embedding, about to write) counts as a write, so a document that takes longer than
    `quiet_s` to embed does not find its writes queued behind an optimize. A failed optimize
    is logged and tried again after the next quiet period; it never stops the server.
    """

    def __init__(
        self,
        index: Optimizable,
        *,
        quiet_s: float,
        poll_s: float | None = None,
        busy: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if quiet_s <= 0:
            raise ValueError("quiet_s must be positive")
        self._index = index
        self.quiet_s = quiet_s
        self._poll_s = poll_s if poll_s is not None else min(1.0, quiet_s / 4)
        self._busy_fn = busy
        self._clock = clock
        self._seen = index.write_count
        self._changed_at = clock()
        self._done: int | None = None  # write count the last finished optimize covered
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self.runs = 0
        """Optimize calls finished (successfully or not)."""
        self.last_error = ""
        self.last_seconds = 0.0

    @property
    def running(self) -> bool:
        """Whether an optimize is in progress."""
        return self._busy

    def due(self) -> bool:
        """Whether an optimize should start now (read the counter, note a change)."""
        count = self._index.write_count
        now = self._clock()
        if count != self._seen or (self._busy_fn is not None and self._busy_fn()):
            self._seen, self._changed_at = count, now
        if self.running or count == self._done:
            return False
        return now - self._changed_at >= self.quiet_s

    def run_blocking(self) -> None:
        """Optimize on the calling thread (start-up, before the server serves)."""
        self._optimize(self._index.write_count, "start-up")

    async def run_once(self) -> None:
        """Optimize on a daemon thread and wait for it (the process may exit meanwhile)."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        covers = self._index.write_count

        def work() -> None:
            try:
                self._optimize(covers, "after writes")
            finally:
                if not loop.is_closed():
                    loop.call_soon_threadsafe(_resolve, finished)

        self._busy = True
        threading.Thread(target=work, name="index-optimize", daemon=True).start()
        await finished

    def _optimize(self, covers: int, why: str) -> None:
        self._busy = True
        log.info("index optimize started", extra={"reason": why, "writes": covers})
        started = time.perf_counter()
        try:
            self._index.optimize()
            self._done, self.last_error = covers, ""
        except Exception as exc:  # logged; tried again after the next quiet period
            self.last_error = str(exc)[:300]
            self._changed_at = self._clock()
            log.warning("index optimize failed", extra={"error": self.last_error})
        finally:
            self.last_seconds = time.perf_counter() - started
            self.runs += 1
            self._busy = False
        if not self.last_error:
            log.info("index optimize finished", extra={"seconds": round(self.last_seconds, 3)})

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            if self.due():
                await self.run_once()

    def start(self) -> None:
        """Start watching (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop watching; an optimize already running goes on (the index's close waits)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self.running:
            log.info("waiting for the running index optimize before closing the index")

    def details(self) -> dict[str, str]:
        """Health details."""
        out = {"optimizing": str(self.running).lower(), "optimize_runs": str(self.runs)}
        if self.last_error:
            out["optimize_error"] = self.last_error
        return out


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
