"""The retrieval server as `python -m services.retrieval` starts it, with a model runtime configured
for it (a local server speaking the OpenAI chat protocol): section summaries written by the
model, and model-written query variants in a search's meta."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from visior.retrieval.v1 import retrieval_pb2 as pb
from visior.retrieval.v1 import retrieval_pb2_grpc as pbg

from tests.fakes.openai_chat import ChatRequest, FakeChatServer, Reply, text
from tests.retrieval_server import retrieval_channel

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
QUERY = "Как подключить LDAP?"
VARIANTS = ["Настройка LDAP интеграции", "Подключение каталога пользователей"]


def model(request: ChatRequest) -> Reply:
    """Summaries name their section; a query gets two fixed paraphrases (and one repeat)."""
    user = str(request.messages[-1]["content"])
    section = re.search(r'<<<DOCUMENT section="([^"]*)">>>', user)
    if section:
        return text(f"Сводка модели: раздел «{section.group(1).split(' › ')[-1]}».")
    return text(f'```json\n["{VARIANTS[0]}", "{QUERY}", "{VARIANTS[1]}"]\n```')


@pytest.fixture
def runtime() -> Iterator[FakeChatServer]:
    with FakeChatServer(api_key="sk-retr") as server:
        server.respond_with(model)
        yield server


async def test_model_summaries_and_query_variants_through_the_server(tmp_path, runtime):
    env = {
        "LLM_RUNTIME_URL": runtime.url, "DEFAULT_MODEL_NAME": "fake-model",
        "LLM_RUNTIME_API_KEY": "sk-retr", "RETR_OPTIMIZE_QUIET_S": "0",
        "RETR_LLM_SUMMARIES": "true", "RETR_LLM_QUERY_VARIANTS": "true",
    }  # fmt: skip
    async with retrieval_channel(tmp_path, **env) as channel:
        ingest = pbg.IngestionServiceStub(channel)
        for name in ("orion-x-admin-guide.md", "vacation-policy.md"):
            await ingest.IngestDocument(
                pb.IngestDocumentRequest(
                    tenant_id="t1", file_name=name, content=(SAMPLES / name).read_bytes()
                )
            )
        summaries = len(runtime.chat_requests)
        assert summaries >= 5  # one per section of both documents
        search = pbg.RetrievalServiceStub(channel)
        found = await search.Search(
            pb.SearchRequest(tenant_id="t1", query=QUERY, params=pb.SearchParams(expand_query=True))
        )
        again = await search.Search(
            pb.SearchRequest(tenant_id="t1", query=QUERY, params=pb.SearchParams(expand_query=True))
        )
    ldap = [s for s in found.used_sections if "LDAP" in s.title]
    assert ldap and ldap[0].summary == "Сводка модели: раздел «Настройка LDAP интеграции»."
    assert found.hits[0].doc_id == "orion-x-admin-guide"
    assert list(found.meta.query_variants) == VARIANTS
    assert found.meta.query_variants_source == "llm"
    # The second search is served from the expander's cache: one variants call in all.
    assert list(again.meta.query_variants) == VARIANTS
    assert len(runtime.chat_requests) == summaries + 1
    variants_call = runtime.chat_requests[-1]
    assert variants_call.headers["authorization"] == "Bearer sk-retr"
    assert variants_call.json["model"] == "fake-model"
