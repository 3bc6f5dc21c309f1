"""The local cross-encoder reranker over a tiny real ONNX cross-encoder built by the tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

from services.common.settings import Env, SettingsError
from services.retrieval.config import rerank_settings
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.factories import build_embedder, build_reranker
from services.retrieval.intra_op import usable_cpus
from services.retrieval.local_rerank import LocalCrossEncoder
from services.retrieval.rerank import (
    THREADS_LIMIT,
    Reranker,
    RerankError,
    RerankSettings,
)
from tests.fakes.tiny_cross_encoder import reference_logit, reference_score, write_model_dir
from tests.unit.test_search import fill, make_stack, q

QUERY = "ldap integration setup"
TEXTS = [
    "weather report for today",  # logit -2
    "ldap integration guide",  # 2 shared words: 1
    "setup of the ldap integration",  # 3 shared: 2.5
    "ldap guide relevant relevant",  # 1 shared + 2 x relevant: 5.5
    "irrelevant ldap",  # 1 shared - irrelevant: -3.5
]
ORDER = [3, 2, 1, 0, 4]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_model_dir(tmp_path / "model")


def encoder(path: Path, **kw: Any) -> LocalCrossEncoder:
    return LocalCrossEncoder(RerankSettings(model_path=str(path), **kw))


class SpySession:
    """Wraps the encoder's ONNX session: records each run's inputs and how many runs overlap;
    `delay_s` makes each run slow (a big model on a busy machine)."""

    def __init__(self, real: Any, delay_s: float = 0.0) -> None:
        self.real, self.delay_s = real, delay_s
        self.feeds: list[dict[str, np.ndarray]] = []
        self.running = self.most_at_once = 0
        self._lock = threading.Lock()

    def run(self, names: Any, feeds: dict[str, np.ndarray], options: Any = None) -> Any:
        with self._lock:
            self.feeds.append(feeds)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(self.delay_s)
            return self.real.run(names, feeds, options)
        finally:
            with self._lock:
                self.running -= 1

    @property
    def batches(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.feeds]


def spy(enc: LocalCrossEncoder, delay_s: float = 0.0) -> SpySession:
    session = SpySession(enc._session, delay_s)
    enc._session = session  # type: ignore[assignment]
    return session


@pytest.mark.parametrize(
    "graph",
    [
        {},
        {"token_type_ids": False},
        {"head": "n"},
        {"head": "n2"},
        {"int_type": TensorProto.INT32},
        {"int_type": TensorProto.INT32, "token_type_ids": False, "head": "n2"},
    ],
    ids=["bert", "no-token-types", "flat-logits", "two-classes", "int32", "int32-two-classes"],
)
async def test_the_order_and_scores_are_the_models(tmp_path, graph):
    enc = encoder(write_model_dir(tmp_path / "m", **graph))
    results = await enc.rerank(QUERY, TEXTS)
    assert [r.index for r in results] == ORDER
    for r in results:
        assert 0.0 <= r.score <= 1.0
        # (n, 2) heads score softmax's positive column: the same as the (n, 1) head here.
        assert r.score == pytest.approx(reference_score(QUERY, TEXTS[r.index]), abs=1e-6)
    assert results[0].score > 0.99 and results[-1].score < 0.03


async def test_the_inputs_are_the_ones_the_graph_declares(tmp_path):
    enc = encoder(write_model_dir(tmp_path / "a"))
    bert = spy(enc)
    await enc.rerank(QUERY, TEXTS[:2])
    feeds = bert.feeds[0]
    assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids"}
    assert {a.dtype for a in feeds.values()} == {np.dtype(np.int64)}
    # [CLS] ldap integration setup [SEP] | weather report for today [SEP], and padding:
    assert feeds["token_type_ids"].tolist()[0] == [0] * 5 + [1] * 5
    assert feeds["attention_mask"].tolist() == [[1] * 10, [1] * 9 + [0]]

    other = encoder(
        write_model_dir(tmp_path / "b", token_type_ids=False, int_type=TensorProto.INT32)
    )
    plain = spy(other)
    await other.rerank(QUERY, TEXTS[:2])
    assert set(plain.feeds[0]) == {"input_ids", "attention_mask"}
    assert {a.dtype for a in plain.feeds[0].values()} == {np.dtype(np.int32)}


@pytest.mark.parametrize("layout", ["onnx/model.onnx", "custom"])
async def test_model_file_layouts(tmp_path, layout):
    if layout == "custom":
        root = write_model_dir(tmp_path / "m", model_file="onnx/model_quantized.onnx")
        env = {"RERANK_MODEL_PATH": str(root), "RERANK_MODEL_FILE": "onnx/model_quantized.onnx"}
    else:
        root = write_model_dir(tmp_path / "m", model_file=layout)
        env = {"RERANK_MODEL_PATH": str(root)}
    settings = rerank_settings(Env(env))
    assert settings.enabled and not settings.url
    reranker: Reranker | None = build_reranker(settings)
    assert isinstance(reranker, LocalCrossEncoder)
    assert reranker.model_file == root / (
        "onnx/model_quantized.onnx" if layout == "custom" else layout
    )
    assert [r.index for r in await reranker.rerank(QUERY, TEXTS)] == ORDER


async def test_a_passage_longer_than_max_length_is_cut(model_dir):
    enc = encoder(model_dir, max_length=16)
    query = "ldap setup"  # 2 tokens + [CLS] [SEP] [SEP]: 11 passage tokens fit
    head = "ldap " + "today " * 10
    long = head + "today " * 30 + "relevant relevant"
    results = await enc.rerank(query, [long, head, "relevant"])
    scores = {r.index: r.score for r in results}
    # The "relevant"s past the cut are not read: the long passage scores as its first 11 words.
    assert scores[0] == pytest.approx(reference_score(query, head), abs=1e-6)
    assert scores[0] == pytest.approx(scores[1])
    assert scores[2] > scores[0]
    full = await encoder(model_dir).rerank(query, [long])  # 512 tokens: everything is read
    assert full[0].score == pytest.approx(reference_score(query, long), abs=1e-6)


async def test_max_length_is_capped_by_the_models_own_limit(tmp_path):
    assert encoder(write_model_dir(tmp_path / "a")).max_length == 512
    assert encoder(write_model_dir(tmp_path / "a"), max_length=64).max_length == 64
    stated = write_model_dir(tmp_path / "b", tokenizer_max_length=12)
    assert encoder(stated).max_length == 12
    configured = write_model_dir(tmp_path / "c")
    (configured / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10}))
    assert encoder(configured).max_length == 10
    results = await encoder(configured).rerank("ldap", ["ldap " + "today " * 20 + "relevant"])
    assert results[0].score == pytest.approx(reference_score("ldap", "ldap " + "today " * 5))
    # transformers writes 1e30 when the model states no limit.
    (configured / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1e30}))
    assert encoder(configured).max_length == 512


async def test_a_fixed_sequence_length_pads_every_pair_to_it(tmp_path):
    enc = encoder(write_model_dir(tmp_path / "m", sequence=24))
    session = spy(enc)
    assert enc.max_length == 24
    long = "ldap " + "today " * 40 + "relevant"
    results = await enc.rerank(QUERY, [*TEXTS, long])
    # 24 - 3 specials - 3 query tokens: the long passage is read as its first 18 words.
    assert [r.index for r in results] == [3, 2, 1, 5, 0, 4]
    assert results[3].score == pytest.approx(reference_score(QUERY, "ldap " + "today " * 17))
    assert {f["input_ids"].shape for f in session.feeds} == {(6, 24)}


async def test_batches_score_as_one_by_one(model_dir):
    # Lengths differ, so every batch pads; "relevant"s make the scores differ too.
    texts = [TEXTS[i % 5] + " today" * (i % 7) + " relevant" * (i % 3) for i in range(23)]
    batched = encoder(model_dir, batch_size=4)
    session = spy(batched)
    many = await batched.rerank(QUERY, texts)
    assert session.batches == [4, 4, 4, 4, 4, 3]
    single = encoder(model_dir, batch_size=1)
    ones = await single.rerank(QUERY, texts)
    assert [r.index for r in many] == [r.index for r in ones]
    assert [r.score for r in many] == pytest.approx([r.score for r in ones], abs=1e-6)
    assert {r.index for r in many} == set(range(23))
    for r in many:
        assert r.score == pytest.approx(reference_score(QUERY, texts[r.index]), abs=1e-6)


async def test_empty_texts_run_nothing(model_dir):
    enc = encoder(model_dir)
    session = spy(enc)
    assert await enc.rerank(QUERY, []) == []
    assert session.batches == []


async def test_top_n_and_max_candidates(model_dir):
    enc = encoder(model_dir, top_n=2, max_candidates=4)
    assert [r.index for r in await enc.rerank(QUERY, TEXTS)] == [3, 2]
    assert [r.index for r in await enc.rerank(QUERY, TEXTS, top_n=0)] == [3, 2, 1, 0]
    assert [r.index for r in await enc.rerank(QUERY, TEXTS, top_n=1)] == [3]


async def test_one_call_at_a_time_and_the_loop_keeps_running(model_dir):
    enc = encoder(model_dir, batch_size=2)
    session = spy(enc, delay_s=0.05)
    ticks = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    first, second = await asyncio.gather(enc.rerank(QUERY, TEXTS), enc.rerank("ldap", TEXTS))
    done.set()
    await ticker
    assert [r.index for r in first] == ORDER
    assert {r.index for r in second} == set(range(5))
    assert len(session.batches) == 6 and session.most_at_once == 1
    assert ticks >= 10  # 6 runs of 50 ms in threads: the event loop was never blocked


async def test_a_slow_model_times_out_and_stops_its_batches(model_dir):
    enc = encoder(model_dir, batch_size=1, timeout_s=0.1)
    session = spy(enc, delay_s=0.3)
    with pytest.raises(RerankError) as info:
        await enc.rerank(QUERY, TEXTS)
    assert info.value.reason == "timeout"
    # A second search waits for the model (still finishing the first run), then gives up.
    with pytest.raises(RerankError) as busy:
        await enc.rerank(QUERY, TEXTS, timeout_s=0.05)
    assert busy.value.reason == "timeout"
    session.delay_s = 0.0
    results = await enc.rerank(QUERY, TEXTS, timeout_s=5)  # the model is free again
    assert [r.index for r in results] == ORDER
    # The timed-out call stopped after the run in progress, not after all five.
    assert session.batches[0] == 1 and len(session.batches) == 1 + len(TEXTS)


def test_settings_from_env_for_a_local_model(model_dir):
    settings = rerank_settings(
        Env(
            {
                "RERANK_MODEL_PATH": str(model_dir),
                "RERANK_THREADS": "3",
                "RERANK_TIMEOUT_S": "0.5",
            }
        )
    )
    assert (settings.model_path, settings.max_length, settings.threads) == (
        str(model_dir), 512, 3,
    )  # fmt: skip
    assert settings.batch_size == 16 and settings.timeout_s == 0.5 and settings.enabled
    assert encoder(model_dir, threads=3).threads == 3
    assert encoder(model_dir).threads == max(1, usable_cpus() // 2)
    http = rerank_settings(Env({"RERANK_MODEL_URL": "http://tei:8080"}))
    assert http.batch_size == 32 and not http.model_path
    assert not rerank_settings(Env({"RETR_RERANK_MODEL_PATH": str(model_dir)})).enabled


@pytest.mark.parametrize(
    ("name", "ok", "bad"),
    [
        ("RERANK_THREADS", 0, -1),
        ("RERANK_THREADS", THREADS_LIMIT, THREADS_LIMIT + 1),
    ],
)
def test_limits_at_and_past_them(model_dir, name, ok, bad):
    base = {"RERANK_MODEL_PATH": str(model_dir)}
    assert rerank_settings(Env({**base, name: str(ok)})).threads == ok
    with pytest.raises(SettingsError, match=name):
        rerank_settings(Env({**base, name: str(bad)}))


async def test_the_shortest_max_length_still_scores(model_dir):
    results = await encoder(model_dir, max_length=8).rerank(QUERY, TEXTS)
    assert len(results) == len(TEXTS) and all(0 <= r.score <= 1 for r in results)


def test_url_and_path_together_are_refused(model_dir):
    with pytest.raises(SettingsError, match="both set"):
        rerank_settings(
            Env({"RERANK_MODEL_URL": "http://tei:8080", "RERANK_MODEL_PATH": str(model_dir)})
        )
    with pytest.raises(SettingsError, match="RERANK_MODEL_FILE"):
        rerank_settings(Env({"RERANK_MODEL_FILE": "model.onnx"}))


def _missing_tokenizer(root: Path) -> None:
    (root / "tokenizer.json").unlink()


def _no_model(root: Path) -> None:
    (root / "model.onnx").unlink()


@pytest.mark.parametrize(
    ("breakage", "says"),
    [(_missing_tokenizer, r"no tokenizer\.json"), (_no_model, "no ONNX model")],
)
def test_missing_files_are_settings_errors_naming_the_path(model_dir, breakage, says):
    breakage(model_dir)
    with pytest.raises(SettingsError, match=says) as info:
        rerank_settings(Env({"RERANK_MODEL_PATH": str(model_dir)}))
    assert str(model_dir) in str(info.value)
    with pytest.raises(SettingsError, match=says):
        build_reranker(RerankSettings(model_path=str(model_dir)))


def test_a_missing_directory_or_model_file_is_a_settings_error(tmp_path, model_dir):
    with pytest.raises(SettingsError, match="not a directory") as info:
        rerank_settings(Env({"RERANK_MODEL_PATH": str(tmp_path / "nope")}))
    assert str(tmp_path / "nope") in str(info.value)
    with pytest.raises(SettingsError, match=r"other\.onnx"):
        rerank_settings(
            Env({"RERANK_MODEL_PATH": str(model_dir), "RERANK_MODEL_FILE": "other.onnx"})
        )


def test_a_corrupt_model_file_is_a_settings_error(model_dir):
    (model_dir / "model.onnx").write_bytes(b"\x08\x07not a protobuf at all" * 20)
    settings = rerank_settings(Env({"RERANK_MODEL_PATH": str(model_dir)}))
    with pytest.raises(SettingsError, match="cannot load the ONNX model") as info:
        build_reranker(settings)
    assert str(model_dir / "model.onnx") in str(info.value)


def test_a_corrupt_tokenizer_is_a_settings_error(model_dir):
    (model_dir / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(SettingsError, match=r"tokenizer\.json") as info:
        encoder(model_dir)
    assert str(model_dir) in str(info.value)


@pytest.mark.parametrize(
    ("graph", "says"),
    [
        ({"input_ids_name": "ids"}, "no input_ids"),
        ({"hidden_output": True}, "no logits output"),
    ],
)
def test_graphs_that_are_not_cross_encoders_are_refused(tmp_path, graph, says):
    root = write_model_dir(tmp_path / "m", **graph)
    with pytest.raises(SettingsError, match=says) as info:
        encoder(root)
    assert str(root / "model.onnx") in str(info.value)


def test_reference_formula_sanity():
    # Guards the fixture itself: the expected order must come from distinct logits.
    logits = [reference_logit(QUERY, t) for t in TEXTS]
    assert logits == [-2.0, 1.0, 2.5, 5.5, -3.5]


# -- through the retrieval engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


async def test_the_engine_reranks_and_falls_back_on_timeout(tmp_path, embedder, model_dir):
    enc = encoder(model_dir, timeout_s=0.1)
    s = make_stack(tmp_path / "stack", embedder, reranker=enc)
    await fill(s)
    plain = await s.engine.search(q(enable_rerank=False, mode="chunk_priority"))
    reranked = await s.engine.search(q(enable_rerank=True, mode="chunk_priority"))
    assert reranked.rerank_used and not plain.rerank_used
    expected = await enc.rerank(q().query, [h.text for h in reranked.hits])
    assert [round(h.score, 6) for h in reranked.hits] == [round(r.score, 6) for r in expected]
    spy(enc, delay_s=0.5)  # the model is now slower than RERANK_TIMEOUT_S
    slow = await s.engine.search(q(enable_rerank=True, mode="chunk_priority"))
    assert not slow.rerank_used
    assert [(h.chunk_id, h.score) for h in slow.hits] == [(h.chunk_id, h.score) for h in plain.hits]
    s.index.close()
