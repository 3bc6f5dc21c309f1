"""The rerank client against a real local server speaking the TEI and Cohere/Jina wire formats."""

import json
from typing import Any

import httpx
import pytest

from services.common.settings import Env, SettingsError
from services.common.topology import free_ports
from services.retrieval.config import RetrievalSettings, rerank_settings
from services.retrieval.factories import build_reranker
from services.retrieval.rerank import (
    MAX_RESPONSE_BYTES,
    RerankClient,
    Reranker,
    RerankError,
    RerankResult,
    RerankSettings,
)
from tests.fakes.rerank_server import FakeRerankServer

QUERY = "ldap integration setup"
TEXTS = [
    "weather report for today",  # 0 of 3 query words
    "ldap integration guide",  # 2
    "setup of the ldap integration",  # 3
    "ldap basics",  # 1
]


@pytest.fixture
def server():
    with FakeRerankServer() as srv:
        yield srv


def client_for(server: FakeRerankServer, **kw) -> RerankClient:
    settings = RerankSettings(url=server.url, **kw)
    return RerankClient(settings)


@pytest.mark.parametrize("style", ["tei", "cohere"])
async def test_both_styles_order_by_score(server, style):
    async with client_for(server, api_style=style, model="rerank-v3.5") as client:
        results = await client.rerank(QUERY, TEXTS)
    assert [r.index for r in results] == [2, 1, 3, 0]
    assert results[0].score == pytest.approx(1.0)
    assert results[1].score == pytest.approx(2 / 3)
    assert results[-1].score == 0.0
    request = server.requests[-1]
    if style == "tei":
        assert request.path == "/rerank"
        assert request.body == {
            "query": QUERY,
            "texts": TEXTS,
            "raw_scores": False,
            "truncate": True,
        }
    else:
        assert request.path == "/v1/rerank"
        assert request.body == {
            "query": QUERY,
            "documents": TEXTS,
            "model": "rerank-v3.5",
            "top_n": 4,
        }


@pytest.mark.parametrize("style", ["tei", "cohere"])
async def test_top_n_caps_results(server, style):
    async with client_for(server, api_style=style, model="m", top_n=3) as client:
        assert [r.index for r in await client.rerank(QUERY, TEXTS)] == [2, 1, 3]
        assert [r.index for r in await client.rerank(QUERY, TEXTS, top_n=1)] == [2]
    if style == "cohere":
        assert server.requests[-1].body["top_n"] == 1


async def test_max_candidates_limits_what_is_sent(server):
    async with client_for(server, max_candidates=2) as client:
        results = await client.rerank(QUERY, TEXTS)
    assert server.requests[-1].body["texts"] == TEXTS[:2]
    assert [r.index for r in results] == [1, 0]


async def test_tei_batches_keep_global_indices(server):
    texts = [f"doc {i}" for i in range(5)] + ["ldap integration setup"]
    async with client_for(server, batch_size=2) as client:
        results = await client.rerank(QUERY, texts)
    assert len(server.requests) == 3
    assert all(len(r.body["texts"]) <= 2 for r in server.requests)
    assert results[0] == RerankResult(5, 1.0)
    assert sorted(r.index for r in results) == list(range(6))


async def test_empty_input_makes_no_request(server):
    async with client_for(server) as client:
        assert await client.rerank(QUERY, []) == []
    assert server.requests == []


@pytest.mark.parametrize("style", ["tei", "cohere"])
async def test_api_key_is_sent_as_bearer(style):
    with FakeRerankServer(api_key="s3cret") as server:
        settings = RerankSettings(url=server.url, api_style=style, model="m", api_key="s3cret")
        async with RerankClient(settings) as client:
            await client.rerank(QUERY, TEXTS)
        assert server.requests[-1].headers["Authorization"] == "Bearer s3cret"
        assert "s3cret" not in repr(settings)

        wrong = RerankSettings(url=server.url, api_style=style, model="m", api_key="nope")
        async with RerankClient(wrong) as client:
            with pytest.raises(RerankError) as info:
                await client.rerank(QUERY, TEXTS)
        assert info.value.reason == "rejected"
        assert info.value.status == 401
        assert "nope" not in str(info.value)


async def test_no_auth_header_without_a_key(server):
    async with client_for(server) as client:
        await client.rerank(QUERY, TEXTS)
    assert "Authorization" not in server.requests[-1].headers


@pytest.mark.parametrize("style", ["tei", "cohere"])
async def test_one_retry_after_503_then_success(server, style):
    server.fail_next(1, 503)
    async with client_for(server, api_style=style, model="m") as client:
        results = await client.rerank(QUERY, TEXTS)
    assert results[0].index == 2
    assert len(server.requests) == 2


async def test_a_429_is_retried_and_a_501_is_not(server):
    server.fail_next(1, 429)
    async with client_for(server) as client:
        assert (await client.rerank(QUERY, TEXTS))[0].index == 2
        assert len(server.requests) == 2
        server.fail_next(1, 501)
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert (info.value.reason, info.value.status) == ("unavailable", 501)
    assert len(server.requests) == 3


async def test_retry_after_dropped_connection(server):
    server.drop_next(1)
    async with client_for(server) as client:
        results = await client.rerank(QUERY, TEXTS)
    assert results[0].index == 2
    assert len(server.requests) == 2


@pytest.mark.parametrize(("style", "text"), [("tei", "overloaded"), ("cohere", "unavailable")])
async def test_two_failures_raise_unavailable_with_the_api_message(server, style, text):
    server.fail_next(2, 503)
    async with client_for(server, api_style=style, model="m") as client:
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert info.value.reason == "unavailable"
    assert info.value.status == 503
    assert text in str(info.value)
    assert len(server.requests) == 2


async def test_4xx_is_not_retried(server):
    async with client_for(server, api_style="cohere") as client:  # no model: Cohere says 400
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert info.value.reason == "rejected"
    assert info.value.status == 400
    assert "model must be specified" in str(info.value)
    assert len(server.requests) == 1


async def test_tei_batch_limit_error_surfaces(server):
    async with client_for(server, batch_size=100) as client:
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, [f"t{i}" for i in range(40)])
    assert info.value.status == 422
    assert "maximum allowed batch size" in str(info.value)


@pytest.mark.parametrize("style", ["tei", "cohere"])
async def test_garbage_body_is_a_bad_response(server, style):
    server.garbage_next(1)
    async with client_for(server, api_style=style, model="m") as client:
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert info.value.reason == "bad_response"


async def rerank_answered(**response: Any) -> list[RerankResult]:
    """A rerank of QUERY over TEXTS by an API that answers 200 with `response` (httpx.Response's
    content, json, headers)."""
    http = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, **response))
    )
    try:
        return await RerankClient(RerankSettings(url="http://reranker"), http).rerank(QUERY, TEXTS)
    finally:
        await http.aclose()


async def bad_response(**response: Any) -> RerankError:
    with pytest.raises(RerankError) as info:
        await rerank_answered(**response)
    assert info.value.reason == "bad_response"
    return info.value


@pytest.mark.parametrize("extra", [0, 1])
async def test_an_answer_is_read_up_to_max_response_bytes(extra):
    """A well-formed answer padded to MAX_RESPONSE_BYTES is read; one byte more is a bad
    response, the rest never read."""
    scores = json.dumps([{"index": i, "score": 1.0 - i / 10} for i in range(4)])
    pad = MAX_RESPONSE_BYTES - len(scores) + extra
    content = (scores[:-1] + " " * pad + "]").encode()
    assert len(content) == MAX_RESPONSE_BYTES + extra
    if extra:
        assert "too large" in str(await bad_response(content=content))
    else:
        ranked = await rerank_answered(content=content)
        assert [r.index for r in ranked] == [0, 1, 2, 3]


async def test_a_transient_failure_too_large_to_read_is_still_retried():
    answers = [
        httpx.Response(503, content=b"<html>" + b" " * MAX_RESPONSE_BYTES),
        httpx.Response(200, json=[{"index": i, "score": 1.0 - i / 10} for i in range(4)]),
    ]
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: answers.pop(0)))
    client = RerankClient(RerankSettings(url="http://reranker"), http)
    assert [r.index for r in await client.rerank(QUERY, TEXTS)] == [0, 1, 2, 3]
    assert answers == []
    await http.aclose()


async def test_an_answer_that_does_not_decode_is_a_bad_response():
    await bad_response(content=b"not gzip", headers={"Content-Encoding": "gzip"})


@pytest.mark.parametrize(
    "payload",
    [
        [{"index": 0, "score": 0.5}],  # too few scores
        [{"index": 9, "score": 0.5}] * 4,  # out of range
        [{"index": i, "score": "x"} for i in range(4)],  # not numeric
        [{"index": 0, "score": 0.5}] * 4,  # repeated
    ],
)
async def test_malformed_tei_answers_are_refused(payload):
    await bad_response(json=payload)


async def test_hanging_server_times_out(server):
    server.hang_next(1)
    async with client_for(server, timeout_s=0.3) as client:
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert info.value.reason == "timeout"
    assert len(server.requests) == 1  # the budget is spent: no retry


async def test_nothing_listening_is_unavailable():
    settings = RerankSettings(url=f"http://127.0.0.1:{free_ports(1)[0]}")
    async with RerankClient(settings) as client:
        with pytest.raises(RerankError) as info:
            await client.rerank(QUERY, TEXTS)
    assert info.value.reason == "unavailable"


async def test_injected_client_is_not_closed(server):
    http = httpx.AsyncClient()
    async with RerankClient(RerankSettings(url=server.url), http) as client:
        await client.rerank(QUERY, TEXTS)
    assert not http.is_closed
    await http.aclose()


def test_endpoint_from_base_or_full_url():
    assert RerankSettings(url="http://h:8080").endpoint() == "http://h:8080/rerank"
    assert (
        RerankSettings(url="http://h:8080/", api_style="cohere").endpoint()
        == "http://h:8080/v1/rerank"
    )
    assert (
        RerankSettings(url="https://api.cohere.com/v2/rerank", api_style="cohere").endpoint()
        == "https://api.cohere.com/v2/rerank"
    )


def test_settings_from_env():
    settings = rerank_settings(
        Env(
            {
                "RERANK_MODEL_URL": "https://api.jina.ai/v1/rerank",
                "RERANK_API_STYLE": "jina",
                "RERANK_MODEL": "jina-reranker-v2-base-multilingual",
                "RERANK_API_KEY": "k",
                "RERANK_TIMEOUT_S": "0.5",
                "RERANK_MAX_CANDIDATES": "40",
            }
        )
    )
    assert settings.enabled
    assert settings.api_style == "cohere"
    assert (settings.timeout_s, settings.top_n, settings.max_candidates) == (0.5, 0, 40)
    assert settings.api_key == "k" and "'k'" not in repr(settings)
    off = rerank_settings(Env({}))
    assert not off.enabled
    assert build_reranker(off) is None
    with pytest.raises(SettingsError):
        rerank_settings(Env({"RERANK_MODEL_URL": "tei:8080"}))
    with pytest.raises(SettingsError):
        rerank_settings(Env({"RERANK_MODEL_URL": "http://x", "RERANK_API_STYLE": "x"}))


@pytest.mark.parametrize("name", ["RERANK_MAX_CANDIDATES"])
def test_the_engine_sends_the_reranker_as_many_candidates_as_it_takes(name):
    s = RetrievalSettings.from_env(Env({"RERANK_MODEL_URL": "http://tei:8080", name: "10"}))
    assert s.engine.rerank_candidates == s.rerank.max_candidates == 10


async def test_client_is_a_reranker(server):
    reranker: Reranker | None = build_reranker(RerankSettings(url=server.url))
    assert reranker is not None
    assert (await reranker.rerank(QUERY, TEXTS, top_n=1))[0].index == 2
    assert isinstance(reranker, RerankClient)
    await reranker.aclose()
