"""QDRANT_URL / VECTOR_DB_URL: an http(s) URL with a host, checked at load; its port is the
port the client speaks gRPC to (prefer_grpc), 6334 when it names none."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.settings import Env, SettingsError
from services.retrieval.config import index_settings
from services.retrieval.index.server import QdrantServerIndex


@pytest.mark.parametrize("name", ["QDRANT_URL", "VECTOR_DB_URL"])
@pytest.mark.parametrize(
    "url", ["qdrant:6333", "localhost:6333", "grpc://qdrant:6334", "http://", "http://:6334"]
)
def test_a_qdrant_url_that_is_no_http_url_with_a_host_is_a_bad_setting(
    tmp_path: Path, name: str, url: str
) -> None:
    with pytest.raises(SettingsError, match=rf"^{name}="):
        index_settings(Env({name: url}), tmp_path)


@pytest.mark.parametrize(
    "url", ["http://qdrant:6334", "https://q.example.com", "http://[::1]:7334"]
)
def test_an_http_url_with_a_host_is_taken(tmp_path: Path, url: str) -> None:
    assert index_settings(Env({"QDRANT_URL": url}), tmp_path).qdrant_url == url


def _client(url: str, **options: bool):
    index = QdrantServerIndex.from_url(url, "chunks", 8, timeout=1, **options)
    return index, index.client._client  # the remote client holds the resolved address


@pytest.mark.parametrize(
    ("url", "host", "grpc_port"),
    [
        ("http://qdrant.example:7334", "qdrant.example", 7334),
        ("https://qdrant.example:443", "qdrant.example", 443),
        ("http://qdrant.example", "qdrant.example", 6334),
        # Qdrant's REST port, as its docs and Cloud console write the URL: gRPC's default.
        ("http://qdrant.example:6333", "qdrant.example", 6334),
        ("http://qdrant.example:6334", "qdrant.example", 6334),
    ],
)
def test_the_urls_port_is_the_grpc_port_the_client_uses(url: str, host: str, grpc_port: int):
    index, remote = _client(url)
    try:
        assert index.client.init_options["prefer_grpc"] is True
        assert (remote._host, remote._grpc_port) == (host, grpc_port)
    finally:
        index.close()


def test_without_grpc_the_urls_port_is_the_rest_port() -> None:
    index, remote = _client("http://qdrant.example:7333", prefer_grpc=False)
    try:
        assert (remote._port, remote._grpc_port) == (7333, 6334)
    finally:
        index.close()
