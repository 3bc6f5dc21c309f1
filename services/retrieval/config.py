"""RetrievalService settings (RETR_* and retrieval.md §8 names)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common.search_contract import MAX_RESULTS_LIMIT
from services.common.settings import Env, ServerSettings, SettingsError
from services.docstore.config import DocstoreSettings, docstore_settings
from services.retrieval.embeddings import EmbeddingSettings
from services.retrieval.engine import FUSIONS, EngineSettings
from services.retrieval.index.base import QUANTIZATIONS
from services.retrieval.llm_assist import LlmAssistSettings
from services.retrieval.rerank import RerankSettings
from services.retrieval.search import SearchDefaults

DEFAULT_PORT = 50053
MAX_OPTIMIZE_QUIET_S = 86_400.0


@dataclass(frozen=True)
class RetrievalSettings:
    """Everything the retrieval process reads from the environment, validated at start-up."""

    server: ServerSettings
    """gRPC server knobs (RETR_HOST, RETR_PORT, ...)."""
    defaults: SearchDefaults
    """Search defaults (RETR_MAX_RESULTS, DEFAULT_MAX_DOCS, ...)."""
    docstore: DocstoreSettings
    """Document store, SQLite or PostgreSQL (RETR_DOCSTORE_URL / METADATA_DB_URL /
    VISIOR_DATA_DIR, RETR_DOCSTORE_POOL_SIZE / DOCSTORE_POOL_SIZE); repr masks the password."""
    max_document_bytes: int
    """Largest document accepted by IngestDocument (RETR_MAX_DOCUMENT_BYTES)."""
    mock_mode: bool
    """Serve fixed hits from memory (RETR_MOCK_MODE), as retrieval-v1 §5 defines."""
    engine: EngineSettings
    """Ranking knobs: hybrid, fusion, weights, retries, fallback (see EngineSettings)."""
    index_backend: str
    """"edge" (Qdrant Edge in-process, default) or "qdrant" (server; RETR_INDEX_BACKEND)."""
    index_path: str
    """Qdrant Edge shard directory (RETR_INDEX_PATH; default VISIOR_DATA_DIR/index)."""
    qdrant_url: str
    """Qdrant server URL for the "qdrant" backend (QDRANT_URL / VECTOR_DB_URL)."""
    qdrant_api_key: str
    """Qdrant server API key (QDRANT_API_KEY); never logged."""
    qdrant_collection: str
    """Collection name on the Qdrant server (QDRANT_COLLECTION)."""
    index_timeout_s: float
    """Timeout of one Qdrant server call (RETR_INDEX_TIMEOUT_S)."""
    hnsw_ef: int
    """HNSW search beam (RETR_HNSW_EF): wider finds more of the exact top-k, slower."""
    quantization: str
    """Dense-vector quantization, "int8" or "none" (RETR_QUANTIZATION; index/base.QUANTIZATIONS)."""
    indexing_threshold_kb: int
    """Edge: vector data (KB) above which a segment gets HNSW and the quantized copy when
    optimized (RETR_INDEXING_THRESHOLD_KB; 0 = the engine's default)."""
    optimize_quiet_s: float
    """Edge: run the index optimizers once writes have paused this long (RETR_OPTIMIZE_QUIET_S;
    0 = never, e.g. when an operator runs them)."""
    breaker_failures: int
    """Consecutive index failures that open the circuit breaker (RETR_BREAKER_FAILURES)."""
    breaker_reset_s: float
    """Seconds the breaker stays open before a trial call (RETR_BREAKER_RESET_S)."""
    embedding: EmbeddingSettings
    """Dense embedder (RETR_EMBEDDING_*)."""
    rerank: RerankSettings
    """Optional reranker (RERANK_*)."""
    synonyms_path: str
    """Extra synonyms for query expansion (RETR_SYNONYMS_PATH); built-in table when empty."""
    llm: LlmAssistSettings
    """Model-written section summaries and query variants (RETR_LLM_*; llm_assist.py)."""
    production: bool
    """Health fails when the backend is down (RETR_PRODUCTION)."""
    journal_path: str
    """The ingest journal (VISIOR_DATA_DIR/ingest-journal.jsonl)."""
    chunk_tokens: int
    """Chunk size in tokens (RETR_CHUNK_TOKENS)."""
    chunk_overlap_tokens: int
    """Overlap between consecutive chunks in tokens (RETR_CHUNK_OVERLAP_TOKENS)."""

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
        if defaults.min_score > 1.0:  # scores are in [0, 1]: every search would come back empty
            raise SettingsError(f"RETR_MIN_SCORE={defaults.min_score} is above the maximum 1.0")
        embedding = EmbeddingSettings.from_env(env)
        fusion = env.text("RETR_FUSION", "weighted")
        if fusion not in FUSIONS:
            raise SettingsError(f"RETR_FUSION={fusion!r} must be one of {', '.join(FUSIONS)}")
        engine = EngineSettings(
            enable_hybrid=env.flag(["RETR_ENABLE_HYBRID", "ENABLE_HYBRID"], True),
            enable_rerank=env.flag(["RETR_ENABLE_RERANK", "ENABLE_RERANK"], False),
            fusion=fusion,
            dense_weight=env.number("RETR_DENSE_WEIGHT", 0.7, minimum=0.0),
            sparse_weight=env.number("RETR_SPARSE_WEIGHT", 0.3, minimum=0.0),
            rrf_k=env.integer("RETR_RRF_K", 60, minimum=1, maximum=1000),
            candidate_factor=env.integer("RETR_CANDIDATE_FACTOR", 2, minimum=1, maximum=20),
            # The reranker's own setting (rerank.py reads both spellings): one value for both.
            rerank_candidates=env.integer(
                ["RETR_RERANK_MAX_CANDIDATES", "RERANK_MAX_CANDIDATES"], 40, minimum=1, maximum=200
            ),
            expand_query=env.flag("RETR_EXPAND_QUERY", False),
            max_query_variants=env.integer("RETR_MAX_QUERY_VARIANTS", 3, minimum=0, maximum=10),
            retries=env.integer("RETR_BACKEND_RETRIES", 2, minimum=0, maximum=2),
            empty_on_backend_error=env.flag("RETR_EMPTY_ON_BACKEND_ERROR", False),
            # On the quality set it helped e5's hybrid ranking everywhere, while USE's weaker
            # dense list lost as much on English queries as it won on mixed-language ones.
            cross_language=env.flag("RETR_CROSS_LANGUAGE", embedding.profile != "fast"),
            slow_search_ms=env.number("RETR_SLOW_SEARCH_MS", 300.0, minimum=0.0),
        )
        if engine.dense_weight + engine.sparse_weight <= 0:
            raise SettingsError("RETR_DENSE_WEIGHT + RETR_SPARSE_WEIGHT must be above 0")
        backend = env.text("RETR_INDEX_BACKEND", "edge")
        if backend not in ("edge", "qdrant"):
            raise SettingsError(f"RETR_INDEX_BACKEND={backend!r} must be 'edge' or 'qdrant'")
        qdrant_url = env.text(["QDRANT_URL", "VECTOR_DB_URL"], "")
        if backend == "qdrant" and not qdrant_url:
            raise SettingsError("RETR_INDEX_BACKEND=qdrant needs QDRANT_URL (or VECTOR_DB_URL)")
        data_dir = Path(env.text("VISIOR_DATA_DIR", "data"))
        quantization = env.text("RETR_QUANTIZATION", "int8").lower()
        if quantization not in QUANTIZATIONS:
            raise SettingsError(
                f"RETR_QUANTIZATION={quantization!r} must be one of {', '.join(QUANTIZATIONS)}"
            )
        optimize_quiet_s = env.number("RETR_OPTIMIZE_QUIET_S", 10.0, minimum=0.0)
        if optimize_quiet_s > MAX_OPTIMIZE_QUIET_S:
            raise SettingsError(f"RETR_OPTIMIZE_QUIET_S must be at most {MAX_OPTIMIZE_QUIET_S:g}")
        chunk_tokens = env.integer("RETR_CHUNK_TOKENS", 200, minimum=32, maximum=2048)
        overlap = env.integer("RETR_CHUNK_OVERLAP_TOKENS", 32, minimum=0, maximum=512)
        if overlap >= chunk_tokens:
            raise SettingsError("RETR_CHUNK_OVERLAP_TOKENS must be below RETR_CHUNK_TOKENS")
        return cls(
            server=server,
            defaults=defaults,
            docstore=docstore_settings(env, "RETR_"),
            max_document_bytes=max_doc,
            mock_mode=env.flag("RETR_MOCK_MODE", False),
            engine=engine,
            index_backend=backend,
            index_path=env.text("RETR_INDEX_PATH", str(data_dir / "index")),
            qdrant_url=qdrant_url,
            qdrant_api_key=env.text("QDRANT_API_KEY", ""),
            qdrant_collection=env.text("QDRANT_COLLECTION", "visior_chunks"),
            index_timeout_s=env.number("RETR_INDEX_TIMEOUT_S", 2.0, minimum=0.01),
            hnsw_ef=env.integer("RETR_HNSW_EF", 128, minimum=8, maximum=4096),
            quantization=quantization,
            indexing_threshold_kb=env.integer(
                "RETR_INDEXING_THRESHOLD_KB", 0, minimum=0, maximum=100_000_000
            ),
            optimize_quiet_s=optimize_quiet_s,
            breaker_failures=env.integer("RETR_BREAKER_FAILURES", 5, minimum=1, maximum=100),
            breaker_reset_s=env.number("RETR_BREAKER_RESET_S", 10.0, minimum=0.1),
            embedding=embedding,
            rerank=RerankSettings.from_env(env),
            synonyms_path=env.text("RETR_SYNONYMS_PATH", ""),
            llm=LlmAssistSettings.from_env(env),
            production=env.flag("RETR_PRODUCTION", False),
            journal_path=str(data_dir / "ingest-journal.jsonl"),
            chunk_tokens=chunk_tokens,
            chunk_overlap_tokens=overlap,
        )
