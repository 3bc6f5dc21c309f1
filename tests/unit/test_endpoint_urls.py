"""One rule turns a configured upstream URL into the endpoint requests go to
(services.common.http.endpoint_url): the LLM runtime, the remote embedder and the rerank API
each accept the bare base, the base plus /v1 and the full endpoint."""

from __future__ import annotations

import httpx
import pytest

from services.common.http import endpoint_url
from services.model_runtime.client import RuntimeSettings
from services.retrieval.embeddings import RemoteEmbedder
from services.retrieval.rerank import RerankSettings


@pytest.mark.parametrize(
    ("url", "path", "full_suffix", "endpoint"),
    [
        ("http://h", "/v1/x", "", "http://h/v1/x"),
        ("http://h/api/v1/", "/v1/x", "", "http://h/api/v1/x"),
        ("http://h/api/v1/x", "/v1/x", "", "http://h/api/v1/x"),
        ("http://h/api/x", "/v1/x", "", "http://h/api/v1/x"),
        ("https://[::1]:9/v1", "/v1/x", "", "https://[::1]:9/v1/x"),
        ("http://v1", "/v1/x", "", "http://v1/v1/x"),
        ("http://x", "/v1/x", "", "http://x/v1/x"),
        # A path without /v1 leaves the base's /v1 alone:
        ("http://h/v1", "/x", "", "http://h/v1/x"),
        ("http://h/v1/x", "/x", "", "http://h/v1/x"),
        # A path ending with full_suffix is the endpoint as configured:
        ("http://h/v2/x", "/v1/x", "", "http://h/v2/v1/x"),
        ("http://h/v2/x/", "/v1/x", "/x", "http://h/v2/x"),
        ("http://h/x", "/v1/x", "/x", "http://h/x"),
        ("http://x", "/v1/x", "/x", "http://x/v1/x"),
    ],
)
def test_endpoint_url(url: str, path: str, full_suffix: str, endpoint: str) -> None:
    assert endpoint_url(url, path, full_suffix=full_suffix) == endpoint


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("http://h:1", "http://h:1/v1/chat/completions"),
        ("http://h:1/", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1//", "http://h:1/v1/chat/completions"),
        (" http://h:1/v1 ", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1/chat/completions/", "http://h:1/v1/chat/completions"),
        ("http://h:1/chat/completions", "http://h:1/v1/chat/completions"),
        ("https://openrouter.ai/api/v1", "https://openrouter.ai/api/v1/chat/completions"),
        ("https://openrouter.ai/api", "https://openrouter.ai/api/v1/chat/completions"),
        (
            "https://openrouter.ai/api/v1/chat/completions",
            "https://openrouter.ai/api/v1/chat/completions",
        ),
        ("http://v1:8000", "http://v1:8000/v1/chat/completions"),
        ("http://v1", "http://v1/v1/chat/completions"),  # a host, not a path
    ],
)
def test_runtime_endpoint(url: str, endpoint: str) -> None:
    assert RuntimeSettings(url=url, default_model="m").endpoint == endpoint


def embedder_endpoint(url: str) -> str:
    """The URL a RemoteEmbedder configured with `url` posts to."""
    posted: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(str(request.url))
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0, 0.0]}]})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    with RemoteEmbedder(url, "m", dim=2, client=client) as embedder:
        embedder.embed_queries(["q"])
    return posted[0]


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        # Bases, with or without /v1:
        ("http://h:8080", "http://h:8080/v1/embeddings"),
        ("http://h:8080/", "http://h:8080/v1/embeddings"),
        ("http://h:8080/v1", "http://h:8080/v1/embeddings"),
        ("http://h:8080/v1/", "http://h:8080/v1/embeddings"),
        ("https://api.openai.com/v1", "https://api.openai.com/v1/embeddings"),
        ("http://gw/tei", "http://gw/tei/v1/embeddings"),
        ("http://embeddings", "http://embeddings/v1/embeddings"),  # a host, not a path
        # The full endpoint, surrounding whitespace, a host named v1:
        ("http://h:8080/v1/embeddings", "http://h:8080/v1/embeddings"),
        ("http://h:8080/v1/embeddings/", "http://h:8080/v1/embeddings"),
        ("https://api.openai.com/v1/embeddings", "https://api.openai.com/v1/embeddings"),
        (" http://h:8080/v1 \n", "http://h:8080/v1/embeddings"),
        ("http://v1", "http://v1/v1/embeddings"),
    ],
)
def test_embedder_endpoint(url: str, endpoint: str) -> None:
    assert embedder_endpoint(url) == endpoint


@pytest.mark.parametrize(
    ("url", "style", "endpoint"),
    [
        # Bases and full endpoints (any path ending with /rerank):
        ("http://h:8080", "tei", "http://h:8080/rerank"),
        ("http://h:8080/", "tei", "http://h:8080/rerank"),
        ("http://h:8080/rerank", "tei", "http://h:8080/rerank"),
        ("http://h:8080/rerank/", "tei", "http://h:8080/rerank"),
        ("http://h:8080/v1", "tei", "http://h:8080/v1/rerank"),
        ("http://rerank", "tei", "http://rerank/rerank"),  # a host, not a path
        ("http://h:8080", "cohere", "http://h:8080/v1/rerank"),
        ("http://h:8080/", "cohere", "http://h:8080/v1/rerank"),
        ("http://vllm:8000/rerank", "cohere", "http://vllm:8000/rerank"),
        ("https://api.jina.ai/v1/rerank", "cohere", "https://api.jina.ai/v1/rerank"),
        ("https://api.cohere.com/v2/rerank", "cohere", "https://api.cohere.com/v2/rerank"),
        ("http://rerank", "cohere", "http://rerank/v1/rerank"),
        # A Cohere-style base with /v1, surrounding whitespace:
        ("http://h:8080/v1", "cohere", "http://h:8080/v1/rerank"),
        ("http://h:8080/v1/", "cohere", "http://h:8080/v1/rerank"),
        ("https://api.jina.ai/v1", "cohere", "https://api.jina.ai/v1/rerank"),
        (" http://h:8080/rerank ", "tei", "http://h:8080/rerank"),
        (" http://h:8080 ", "cohere", "http://h:8080/v1/rerank"),
    ],
)
def test_rerank_endpoint(url: str, style: str, endpoint: str) -> None:
    assert RerankSettings(url=url, api_style=style).endpoint() == endpoint
