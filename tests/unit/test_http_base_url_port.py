"""An upstream's base URL with a port that is no port (`http://rt:80a`, `:0`, `:65536`) is
refused at start, naming the setting: urlsplit does not read the port until asked, and httpx
refuses it only at the first request, with InvalidURL, which no client treats as the
upstream failing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.common.http import check_base_url
from services.common.settings import Env, SettingsError
from tests.unit.test_base_url import READERS


@pytest.mark.parametrize(
    "url",
    ["http://rt:0", "http://rt:65536", "http://rt:99999999999", "http://rt:80a",
     "http://rt:-1", "http://rt:+80", "http://rt:\uff18\uff10", "https://rt:443:1",
     "http://[::1]:0", "http://[::1]:80a/v1"],
)  # fmt: skip
def test_a_port_that_is_not_1_to_65535_is_refused_naming_the_setting(url: str) -> None:
    with pytest.raises(SettingsError, match=r"^X_URL=.*: the port is not a number in 1\.\.65535"):
        check_base_url(url, "X_URL")


@pytest.mark.parametrize(
    ("url", "port"),
    [("http://rt:1", 1), ("http://rt:65535", 65535), ("https://rt/v1", None),
     ("http://rt:/v1", None), ("http://[::1]:8080", 8080), ("http://rt:00080", 80)],
)  # fmt: skip
def test_a_port_in_1_to_65535_or_none_is_taken(url: str, port: int | None) -> None:
    assert check_base_url(url, "X_URL").port == port


def test_credentials_are_refused_before_the_port_without_echoing_the_url() -> None:
    with pytest.raises(SettingsError, match="X_URL must not carry") as info:
        check_base_url("http://user:key@rt:80a", "X_URL")
    assert "key" not in str(info.value)


@pytest.mark.parametrize(("name", "read", "rest"), READERS, ids=[r[0] for r in READERS])
def test_every_upstream_url_setting_refuses_a_port_that_is_no_port(
    name: str, read: Callable[[Env], object], rest: dict[str, str]
) -> None:
    for url in ("http://127.0.0.1:80a", "https://127.0.0.1:65536/v1"):
        with pytest.raises(SettingsError, match=rf"^{name}=.*: the port is not a number"):
            read(Env({name: url, **rest}))
