"""services.common.http.check_base_url: the one rule for an upstream's base URL (the model
runtime's LLM_RUNTIME_URL, ToolsProxy's MCP_PROXY_TAVILY_URL)."""

import pytest

from services.common.http import check_base_url
from services.common.settings import SettingsError


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
