"""RetrievalService settings (RETR_* and retrieval.md §8 names)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import Env, ServerSettings
from services.docstore.config import docstore_path
from services.retrieval.search import MAX_RESULTS_LIMIT, SearchDefaults

DEFAULT_PORT = 50053


@dataclass(frozen=True)
class RetrievalSettings:
    """Everything the retrieval process reads from the environment, validated at start-up."""

    server: ServerSettings
    """gRPC server knobs (RETR_HOST, RETR_PORT, ...)."""
    defaults: SearchDefaults
    """Search defaults (RETR_MAX_RESULTS, DEFAULT_MAX_DOCS, ...)."""
    docstore_path: str
    """SQLite document store (RETR_DOCSTORE_URL / METADATA_DB_URL / VISIOR_DATA_DIR)."""
    max_document_bytes: int
    """Largest document accepted by IngestDocument (RETR_MAX_DOCUMENT_BYTES)."""
    mock_mode: bool
    """Serve fixed hits from memory (RETR_MOCK_MODE), as retrieval-v1 §5 defines."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> RetrievalSettings:
        env = env or Env()
        max_doc = env.integer(
            "RETR_MAX_DOCUMENT_BYTES", 32 * 1024 * 1024, minimum=1024, maximum=256 * 1024 * 1024
        )
        # A document travels in one message: leave room for it plus the envelope.
        server = ServerSettings.from_env(
            "retrieval", "RETR_", env, DEFAULT_PORT, default_max_message_bytes=max_doc + (1 << 20)
        )
        defaults = SearchDefaults(
            max_results=env.integer("RETR_MAX_RESULTS", 10, minimum=1, maximum=MAX_RESULTS_LIMIT),
            max_docs=env.integer(
                ["RETR_DEFAULT_MAX_DOCS", "DEFAULT_MAX_DOCS"], 20, minimum=1, maximum=100
            ),
            max_sections=env.integer(
                ["RETR_DEFAULT_MAX_SECTIONS", "DEFAULT_MAX_SECTIONS"], 50, minimum=1, maximum=200
            ),
            max_chunks=env.integer(
                ["RETR_DEFAULT_MAX_CHUNKS", "DEFAULT_MAX_CHUNKS"], 40, minimum=1, maximum=200
            ),
            context_token_limit=env.integer(
                ["RETR_DEFAULT_TOKEN_LIMIT", "DEFAULT_TOKEN_LIMIT"], 4096, minimum=1
            ),
            topk_per_doc=env.integer("RETR_TOPK_PER_DOC", 0, minimum=0),
            min_score=env.number("RETR_MIN_SCORE", 0.0, minimum=0.0),
        )
        return cls(
            server=server,
            defaults=defaults,
            docstore_path=docstore_path(env, "RETR_"),
            max_document_bytes=max_doc,
            mock_mode=env.flag("RETR_MOCK_MODE", False),
        )
