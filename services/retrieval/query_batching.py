"""Concurrent searches' query embeddings, coalesced into shared model calls (group commit).

A model that streams its weights once per call (the fast profile's USE: 13.5 MB of dense
layers for one query or for thirty) spends most of a lone query's time on that stream, so
queries that arrive together are cheaper embedded together (measured with
bench/retrieval_search.py: 1.54 ms a query alone, 0.60 at 32 a call).

No timer and no extra thread: a caller that finds no model call running makes one at once
with every query waiting (a search alone is never delayed); callers that arrive while a
call runs wait for it to end, and the first of them to wake embeds what has queued since.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np

from services.retrieval.embeddings import Embedder, QueryStage


class _Slot:
    __slots__ = ("done", "error", "result", "texts")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False


class CoalescingQueryEmbedder(QueryStage):
    """`embed_queries` calls from several threads share model calls of up to `max_batch` texts.

    One model call at a time; a caller whose texts alone exceed `max_batch` still gets one
    call of its own. When a shared call fails, each caller's texts are embedded again on
    their own, so one caller's bad input (or a backend error) only fails the callers it
    really fails. Passages pass straight through. Thread-safe.
    """

    def __init__(self, inner: Embedder, max_batch: int) -> None:
        if max_batch < 2:
            raise ValueError("max_batch must be at least 2 (1 means: do not wrap)")
        super().__init__(inner)
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: deque[_Slot] = deque()
        self._busy = False
        self.calls = 0
        """Model calls made for queries."""
        self.queries = 0
        """Queries those calls embedded."""

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query embeddings, in a model call shared with whichever callers are waiting."""
        slot = _Slot(list(texts))
        if not slot.texts:
            return np.empty((0, self.dim), dtype=np.float32)
        cond = self._cond
        with cond:
            self._queue.append(slot)
            while True:
                while self._busy and not slot.done:
                    cond.wait()
                if slot.done:
                    break
                batch = self._take()
                self._busy = True
                cond.release()
                try:
                    self._run(batch)
                finally:
                    cond.acquire()
                    self._busy = False
                    cond.notify_all()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    def _take(self) -> list[_Slot]:
        """The queue's first slots, up to max_batch texts (always at least one slot)."""
        batch = [self._queue.popleft()]
        size = len(batch[0].texts)
        while self._queue and size + len(self._queue[0].texts) <= self.max_batch:
            slot = self._queue.popleft()
            size += len(slot.texts)
            batch.append(slot)
        return batch

    def _run(self, batch: list[_Slot]) -> None:
        """Fill every slot of `batch` with its rows or its error and mark it done (never raises)."""
        texts = [t for slot in batch for t in slot.texts]
        self.calls += 1  # only the one caller making the model call writes these
        self.queries += len(texts)
        try:
            rows = self.inner.embed_queries(texts)
            if len(rows) != len(texts):
                raise RuntimeError(f"the embedder returned {len(rows)} rows for {len(texts)} texts")
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].error = exc
                batch[0].done = True
            else:  # retried caller by caller: whose texts fail, only they see it
                for slot in batch:
                    self._run([slot])
            return
        start = 0
        for slot in batch:
            end = start + len(slot.texts)
            slot.result = rows[start:end]
            slot.done = True
            start = end
