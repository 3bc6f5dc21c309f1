"""services.common.http.check_base_url: the one rule for an upstream's URL, and every
setting naming one (the model runtime's, Tavily's, the bank's, the embedder's and the
reranker's) read through it."""

from collections.abc import Callable

import pytest

from services.common.http import check_base_url
from services.common.settings import Env, SettingsError
from services.model_runtime.config import runtime_settings
from services.retrieval.config import embedding_settings, rerank_settings
from services.toolsproxy.config import cbr_settings, tavily_settings


@pytest.mark.parametrize("url", ["http://h:1", "https://api.example.com/v1", "http://127.0.0.1"])
def test_an_http_url_with_a_host_passes(url: str) -> None:
    assert check_base_url(url, "X_URL").hostname


@pytest.mark.parametrize("url", ["ftp://h", "h:8000", "https://", "", "//h"])
def test_not_http_or_no_host_is_refused_naming_the_setting(url: str) -> None:
    with pytest.raises(SettingsError, match=r"^X_URL=.* is not an http\(s\) URL"):
        check_base_url(url, "X_URL")


@pytest.mark.parametrize(
    "url", ["http://user:key@h", "http://key@h", "http://h/?key=k", "http://h/#k"]
)
def test_credentials_query_or_fragment_are_refused_without_echoing_the_url(url: str) -> None:
    with pytest.raises(SettingsError, match="X_URL must not carry") as info:
        check_base_url(url, "X_URL")
    assert "key" not in str(info.value) and "#k" not in str(info.value)


def test_a_url_with_credentials_and_a_bad_scheme_is_not_echoed() -> None:
    with pytest.raises(SettingsError, match="X_URL must not carry") as info:
        check_base_url("ftp://user:key@h", "X_URL")
    assert "key" not in str(info.value)


READERS: list[tuple[str, Callable[[Env], object], dict[str, str]]] = [
    ("LLM_RUNTIME_URL", runtime_settings, {"DEFAULT_MODEL_NAME": "m"}),
    ("MCP_PROXY_TAVILY_URL", tavily_settings, {}),
    ("MCP_PROXY_CBR_URL", cbr_settings, {}),
    ("RETR_EMBEDDING_URL", embedding_settings, {"RETR_EMBEDDING_PROFILE": "remote"}),
    ("RERANK_MODEL_URL", rerank_settings, {}),
]
"""Every setting that names an upstream's URL, read by its service's config module."""


@pytest.mark.parametrize(("name", "read", "rest"), READERS, ids=[r[0] for r in READERS])
def test_every_upstream_url_setting_follows_the_rule(
    name: str, read: Callable[[Env], object], rest: dict[str, str]
) -> None:
    for url in ("https://user:key@api.example.com/v1", "https://api.example.com/v1?key=k"):
        with pytest.raises(SettingsError, match=f"{name} must not carry") as info:
            read(Env({name: url, **rest}))
        assert "key" not in str(info.value)
    with pytest.raises(SettingsError, match=rf"^{name}='h:8000' is not an http\(s\) URL"):
        read(Env({name: "h:8000", **rest}))
