"""Envoy's body and header limits are sized from Retrieval's own limits, so a request the
service takes is never refused at the gateway."""

import base64
import json
from urllib.parse import urlencode

from visior.retrieval.v1 import retrieval_pb2

from services.common.document_limits import MAX_DOC_ID_CHARS, is_doc_id
from services.common.settings import Env
from services.devtools.envoy_config import (
    INGEST_MAX_REQUEST_BYTES,
    MAX_REQUEST_HEADERS_KB,
    ROUTE_RULES,
)
from services.retrieval.config import RetrievalSettings
from services.retrieval.limits import DEFAULT_MAX_DOCUMENT_BYTES
from services.retrieval.listing import MAX_LISTED_IDS


def test_the_ingestion_route_takes_the_largest_default_document_in_base64():
    settings = RetrievalSettings.from_env(Env({}))
    assert settings.max_document_bytes == DEFAULT_MAX_DOCUMENT_BYTES
    document = b"x" * DEFAULT_MAX_DOCUMENT_BYTES
    body = json.dumps({
        "tenant_id": "t", "doc_id": "d" * MAX_DOC_ID_CHARS, "file_name": "f.md",
        "title": "т" * 1024, "tags": ["т" * 128] * 32, "content": base64.b64encode(document).decode(),
    })  # fmt: skip
    assert len(body.encode()) <= INGEST_MAX_REQUEST_BYTES
    # and what one byte past the document adds still fits the body limit's envelope
    assert len(base64.b64encode(document + b"xxx")) < INGEST_MAX_REQUEST_BYTES
    rule = next(r for r in ROUTE_RULES if r.path == "/internal/retrieval/documents" and r.method)
    assert rule.max_request_bytes == INGEST_MAX_REQUEST_BYTES
    # A body at Envoy's limit decodes to a message Retrieval's gRPC server receives.
    message = retrieval_pb2.IngestDocumentRequest(
        tenant_id="t", content=b"x" * (INGEST_MAX_REQUEST_BYTES * 3 // 4)
    )
    assert message.ByteSize() <= settings.server.max_message_bytes


def test_the_retrieval_listener_takes_the_longest_list_request():
    longest = "𠀀" * MAX_DOC_ID_CHARS  # four UTF-8 bytes a character
    assert is_doc_id(longest) and not is_doc_id(longest + "𠀀")
    query = urlencode({"tenant_id": "t" * 128, "doc_ids": [longest] * MAX_LISTED_IDS}, doseq=True)
    line = f"GET /internal/retrieval/documents?{query} HTTP/1.1\r\n"
    assert len(line) + 60 * 1024 <= MAX_REQUEST_HEADERS_KB * 1024
    assert MAX_REQUEST_HEADERS_KB <= 8192  # Envoy's ceiling for max_request_headers_kb
