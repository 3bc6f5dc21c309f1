"""The embedder is part of a document's generation (services/retrieval/ingestion.py
`embedding_identity`): after a switch to another model of the same width, or another passage
prefix, ingesting a document again embeds it again instead of answering unchanged with the
old model's vectors; with the same embedder the unchanged shortcut and recovery hold."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from services.common import errors
from services.docstore.errors import StoreUnavailableError
from services.docstore.summaries import mix_generation
from services.retrieval import ingestion
from services.retrieval.embeddings import CachedQueryEmbedder, EmbeddingSettings, RemoteEmbedder
from services.retrieval.factories import build_embedder
from services.retrieval.index.base import IndexFilter
from services.retrieval.ingestion import Ingestor, embedding_identity
from services.retrieval.journal import IngestJournal
from services.retrieval.query_batching import CoalescingQueryEmbedder
from tests.unit.test_ingestion import V1, ModelSummaries, guide
from tests.unit.test_search import make_stack

QUERY = "how long are backups kept"


@pytest.fixture(scope="module")
def embedder():
    return build_embedder(EmbeddingSettings(profile="fast"))


class OtherModel:
    """Another model of the same width: the real one's vectors, dimensions permuted."""

    def __init__(self, inner, name: str = "other-512d-model") -> None:
        self.inner, self.name, self.dim = inner, name, inner.dim
        self.perm = np.random.default_rng(0).permutation(inner.dim)

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)[:, self.perm]

    def embed_passages(self, texts):
        return self.inner.embed_passages(texts)[:, self.perm]


class Prefixed:
    """A remote-style model that puts `passage_prefix` before each passage it embeds."""

    def __init__(self, inner, passage_prefix: str) -> None:
        self.inner, self.name, self.dim = inner, "remote/e5-like", inner.dim
        self.passage_prefix = passage_prefix

    def embed_queries(self, texts):
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts):
        return self.inner.embed_passages([self.passage_prefix + t for t in texts])


def remote(passage_prefix: str, model: str = "intfloat/e5-small") -> RemoteEmbedder:
    never = httpx.MockTransport(lambda request: httpx.Response(500))
    return RemoteEmbedder("http://embed.invalid", model, dim=384, passage_prefix=passage_prefix,
                          client=httpx.Client(transport=never))  # fmt: skip


def test_the_identity_names_the_model_and_the_passage_prefix_behind_the_query_stages():
    plain, prefixed = remote(""), remote("passage: ")
    wrapped = CachedQueryEmbedder(CoalescingQueryEmbedder(remote("passage: "), 4), 16)
    assert embedding_identity(wrapped) == embedding_identity(prefixed)
    assert embedding_identity(plain) != embedding_identity(prefixed)
    assert embedding_identity(remote("", model="other")) != embedding_identity(plain)
    assert embedding_identity(remote("passage: ")) == embedding_identity(prefixed)  # stable


def test_the_identity_of_the_local_profiles_is_their_model(embedder):
    assert embedding_identity(embedder) == f"embedder={embedder.name}\0passage_prefix="
    assert embedding_identity(OtherModel(embedder)) != embedding_identity(embedder)


def best_score(s, model) -> float:
    (hit,) = s.index.search_dense(model.embed_queries([QUERY])[0], IndexFilter("a"), 1)
    return hit.score


def switched(s, tmp_path, model, name: str) -> Ingestor:
    """The service started again with `model` over the same store and index."""
    return Ingestor(store=s.store, index=s.index, embedder=model, sections=s.sections,
                    journal=IngestJournal(tmp_path / f"{name}.jsonl"),
                    max_document_bytes=1 << 20)  # fmt: skip


async def test_a_model_switch_embeds_a_document_again_and_drops_the_old_vectors(tmp_path, embedder):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(guide(V1))
    assert (await s.ingestor.ingest(guide(V1))).unchanged  # the same model: nothing to do
    before = best_score(s, embedder)
    other = OtherModel(embedder)
    ing = switched(s, tmp_path, other, "other")
    again = await ing.ingest(guide(V1))
    assert not again.unchanged and again.replaced and again.generation != first.generation
    assert s.store.document_generation("a", "guide") == again.generation
    assert s.index.document_generations("a") == {"guide": {again.generation}}
    # The stored vectors are the new model's: its query scores the chunk as the old model's
    # query scored the old vectors (kept, it scored 0.04 in the review's reproduction).
    assert best_score(s, other) == pytest.approx(before, abs=1e-4)
    assert (await ing.ingest(guide(V1))).unchanged
    # And back: the first model's generation again, embedded by it again.
    back = await s.ingestor.ingest(guide(V1))
    assert not back.unchanged and back.generation == first.generation
    assert s.index.document_generations("a") == {"guide": {first.generation}}
    s.index.close()


async def test_another_passage_prefix_embeds_a_document_again(tmp_path, embedder):
    s = make_stack(tmp_path, CachedQueryEmbedder(Prefixed(embedder, ""), 16))
    first = await s.ingestor.ingest(guide(V1))
    ing = switched(s, tmp_path, CachedQueryEmbedder(Prefixed(embedder, "passage: "), 16), "p")
    again = await ing.ingest(guide(V1))
    assert not again.unchanged and again.generation != first.generation
    assert (await ing.ingest(guide(V1))).unchanged
    s.index.close()


async def test_recovery_deletes_the_new_models_points_of_an_ingest_that_did_not_commit(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(guide(V1))
    ing = switched(s, tmp_path, OtherModel(embedder), "other")
    real = s.store.replace

    def down(doc, points=()):
        raise StoreUnavailableError("connection lost")

    s.store.replace = down  # type: ignore[method-assign]
    with pytest.raises(errors.UnavailableError):
        await ing.ingest(guide(V1))
    s.store.replace = real  # type: ignore[method-assign]
    (entry,) = ing._journal.pending()
    assert entry.generation != first.generation and entry.replaces == first.generation
    assert s.index.count_document("a", "guide", entry.generation) > 0  # written, invisible
    restarted = switched(s, tmp_path, OtherModel(embedder), "other")
    assert restarted.recover() == 1
    assert s.index.document_generations("a") == {"guide": {first.generation}}
    done = await restarted.ingest(guide(V1))
    assert done.generation == entry.generation and not done.unchanged
    assert s.index.document_generations("a") == {"guide": {done.generation}}
    s.index.close()


async def test_with_model_summaries_the_generation_holds_both_and_unchanged_still_answers(
    tmp_path, embedder
):
    s = make_stack(tmp_path, embedder, summarizer=ModelSummaries())
    first = await s.ingestor.ingest(guide(V1))
    assert (await s.ingestor.ingest(guide(V1))).unchanged
    stored = s.store.get_document("a", "guide")
    assert stored is not None and all(x.summary.startswith("MODEL") for x in stored.sections)
    ing = Ingestor(store=s.store, index=s.index, embedder=OtherModel(embedder),
                   sections=s.sections, journal=IngestJournal(tmp_path / "other.jsonl"),
                   max_document_bytes=1 << 20, summarizer=ModelSummaries())  # fmt: skip
    again = await ing.ingest(guide(V1))
    assert not again.unchanged and again.generation != first.generation
    assert again.generation != mix_generation(first.generation, ModelSummaries.name)
    assert (await ing.ingest(guide(V1))).unchanged
    s.index.close()


async def test_a_new_points_layout_writes_an_unchanged_document_again(
    tmp_path, embedder, monkeypatch
):
    # POINTS_VERSION is mixed into the generation as the embedder is: a build whose points
    # hold other text for the same document (2: the doc point's BM25 text is all of it)
    # rewrites them on the next ingest, where the unchanged shortcut would keep the old ones.
    s = make_stack(tmp_path, embedder)
    first = await s.ingestor.ingest(guide(V1))
    assert (await s.ingestor.ingest(guide(V1))).unchanged
    monkeypatch.setattr(ingestion, "POINTS_VERSION", ingestion.POINTS_VERSION + 1)
    again = await s.ingestor.ingest(guide(V1))
    assert not again.unchanged and again.replaced and again.generation != first.generation
    assert s.index.document_generations("a") == {"guide": {again.generation}}
    assert (await s.ingestor.ingest(guide(V1))).unchanged
