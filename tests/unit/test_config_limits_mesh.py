"""Each service's message limit at the least it accepts still carries every default message:
Respond (a first prompt of listed sections, a whole read) through the Orchestrator and the LLM
service, and ToolsProxy's whole read at its default text limit (MCP_PROXY_MAX_FULL_TEXT_BYTES)."""

from __future__ import annotations

from pathlib import Path

import grpc
from google.protobuf import json_format, struct_pb2
from visior.common.v1 import common_pb2
from visior.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from visior.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from visior.toolsproxy.v1 import toolsproxy_pb2, toolsproxy_pb2_grpc

from services.common.settings import server_fields
from services.common.shared_config import DEFAULT_FULL_TEXT_BYTES
from services.common.topology import SERVICE_BY_KEY, Ports
from services.devtools.inprocess import InProcessMesh
from services.toolsproxy.config import RESULT_ENVELOPE_BYTES

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "docs"
USER = common_pb2.UserContext(user_id="u1", tenant_id="t1")
PARAGRAPH = (
    "Раздел {n}. Администратор настраивает резервное копирование сервера Orion X, "
    "проверяет журнал событий, обновляет лицензию и восстанавливает данные из бэкапа. "
)


def _least(key: str) -> int:
    """The least <prefix>MAX_MESSAGE_BYTES service `key` takes with its other defaults."""
    var = server_fields(SERVICE_BY_KEY[key].env_prefix, Ports().grpc[key]).vars["max_message_bytes"]
    least = int(var.minimum or 0)
    if key == "toolsproxy":
        least = max(least, DEFAULT_FULL_TEXT_BYTES + RESULT_ENVELOPE_BYTES)
    return least


def _long_document() -> bytes:
    """Markdown holding more text than one whole read returns by default."""
    text, n = "# Руководство администратора\n\n", 0
    while len(text.encode()) < DEFAULT_FULL_TEXT_BYTES * 1.2:
        n += 1
        text += (f"## Раздел {n}\n\n" if n % 20 == 1 else "") + PARAGRAPH.format(n=n) * 3 + "\n\n"
    return text.encode()


async def test_every_default_message_fits_the_least_message_limits(tmp_path: Path) -> None:
    limits = {
        SERVICE_BY_KEY[key].env_prefix + "MAX_MESSAGE_BYTES": str(_least(key))
        for key in ("orchestrator", "llm", "toolsproxy")
    }
    async with InProcessMesh(tmp_path, limits) as mesh:
        async with grpc.aio.insecure_channel(mesh.target("retrieval")) as channel:
            ingestion = retrieval_pb2_grpc.IngestionServiceStub(channel)
            docs = {p.stem: p.read_bytes() for p in SAMPLES.glob("*.md")}
            docs["long-guide"] = _long_document()
            for doc_id, content in docs.items():
                await ingestion.IngestDocument(
                    retrieval_pb2.IngestDocumentRequest(
                        tenant_id="t1", doc_id=doc_id, file_name=f"{doc_id}.md",
                        content_type="text/markdown", content=content,
                    ),
                    timeout=300,
                )  # fmt: skip
        async with grpc.aio.insecure_channel(mesh.target("orchestrator")) as channel:
            orchestrator = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            for request in (
                orchestrator_pb2.RespondRequest(query="Как настроить LDAP?", user=USER),
                orchestrator_pb2.RespondRequest(
                    query="Опиши резервное копирование", user=USER, max_results=50
                ),
                orchestrator_pb2.RespondRequest(
                    query="Что в этих документах?",
                    user=USER,
                    doc_ids=["vacation-policy", "orion-x-admin-guide"],
                ),
            ):
                answer = await orchestrator.Respond(request, timeout=120)
                assert answer.answer
        async with grpc.aio.insecure_channel(
            mesh.target("toolsproxy"), options=[("grpc.max_receive_message_length", 16 << 20)]
        ) as channel:
            tools = toolsproxy_pb2_grpc.ToolsProxyServiceStub(channel)
            arguments = struct_pb2.Struct()
            arguments.update({"document_ids": sorted(docs), "include_content": True})
            result = await tools.Execute(
                toolsproxy_pb2.ExecuteRequest(
                    tool_name="load_documents_full", arguments=arguments, user=USER
                ),
                timeout=120,
            )
    assert result.status == "ok", result.error.message
    texts = json_format.MessageToDict(result.result)
    assert texts["truncated"] is True  # the whole read is as large as it gets by default
