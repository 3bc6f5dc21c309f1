"""RetrievalService settings (RETR_* and retrieval.md §8 names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.common.breaker import BreakerPolicy
from services.common.http import check_base_url
from services.common.search_contract import MAX_RESULTS_LIMIT
from services.common.settings import (
    MAX_TIMEOUT_SECONDS,
    Env,
    Fields,
    ServerSettings,
    SettingsError,
    check_directory,
    flag,
    integer,
    number,
    text,
)
from services.common.shared_config import DATA_DIR, data_dir
from services.docstore.chunking import ChunkingConfig
from services.docstore.config import DocstoreSettings, check_store_path, docstore_settings
from services.model_runtime import config as runtime_config
from services.model_runtime.client import RuntimeSettings
from services.retrieval.embeddings import E5_DIM, PROFILES, USE_DIM, EmbeddingSettings
from services.retrieval.engine import EngineSettings
from services.retrieval.fusion import FUSIONS
from services.retrieval.index.base import QUANTIZATIONS
from services.retrieval.intra_op import AUTO, usable_cpus
from services.retrieval.limits import DEFAULT_MAX_DOCUMENT_BYTES
from services.retrieval.llm_assist import LlmAssistSettings
from services.retrieval.query import load_synonyms
from services.retrieval.rerank import (
    API_STYLES,
    THREADS_LIMIT,
    RerankSettings,
    local_model_files,
)
from services.retrieval.search import (
    MAX_CONTEXT_TOKEN_LIMIT,
    MAX_TOPK_PER_DOC,
    PARAM_LIMITS,
    SearchDefaults,
)

MAX_OPTIMIZE_QUIET_S = 86_400.0
LOCAL_RERANK_BATCH_SIZE = 16
"""Pairs per local reranker run; an API gets RerankSettings' default batch (32)."""


@dataclass(frozen=True)
class IndexSettings:
    """The vector index Retrieval searches and ingestion writes (services/retrieval/index/)."""

    backend: str
    """"edge" (Qdrant Edge in-process) or "qdrant" (server; RETR_INDEX_BACKEND); "qdrant" when
    QDRANT_URL (or VECTOR_DB_URL) is set, else "edge". "edge" with a URL is refused."""
    path: str
    """Qdrant Edge shard directory (RETR_INDEX_PATH; default VISIOR_DATA_DIR/index)."""
    qdrant_url: str
    """Qdrant server URL for the "qdrant" backend (QDRANT_URL / VECTOR_DB_URL):
    http(s)://HOST[:PORT][/PREFIX]; https for TLS. Retrieval speaks gRPC to the server, so PORT
    is Qdrant's gRPC port (its service.grpc_port), 6334 when the URL names none or Qdrant's
    REST port 6333 (the form Qdrant's docs give)."""
    qdrant_api_key: str
    """Qdrant server API key (QDRANT_API_KEY); never logged."""
    qdrant_collection: str
    """Collection name on the Qdrant server (QDRANT_COLLECTION)."""
    timeout_s: float
    """Timeout of one Qdrant server call (RETR_INDEX_TIMEOUT_S), rounded up to whole seconds
    (qdrant-client's unit): 0.25 and 1 give 1 s, 1.5 gives 2 s."""
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
    breaker: BreakerPolicy = BreakerPolicy(failures=5, reset_s=10.0)
    """Consecutive index failures that open the circuit breaker, and the seconds it stays
    open before a trial call."""


@dataclass(frozen=True)
class RetrievalSettings:
    """Everything the retrieval process reads from the environment, validated at start-up."""

    server: ServerSettings
    """gRPC server knobs (RETR_HOST, RETR_PORT, ...)."""
    defaults: SearchDefaults
    """Search defaults (RETR_MAX_RESULTS, DEFAULT_MAX_DOCS, ...)."""
    docstore: DocstoreSettings
    """Document store, SQLite or PostgreSQL (METADATA_DB_URL / VISIOR_DATA_DIR,
    RETR_DOCSTORE_POOL_SIZE, RETR_DOCSTORE_TIMEOUT_S); repr masks the password."""
    max_document_bytes: int
    """Largest document accepted by IngestDocument (RETR_MAX_DOCUMENT_BYTES); Retrieval's gRPC
    message limit is this plus 1 MiB."""
    mock_mode: bool
    """Serve fixed hits from memory (RETR_MOCK_MODE), as retrieval-v1 §5 defines."""
    engine: EngineSettings
    """Ranking knobs: hybrid, fusion, weights, retries, fallback (see EngineSettings)."""
    index: IndexSettings
    """The vector index: backend, where it is, search beam, quantization, breaker."""
    embedding: EmbeddingSettings
    """Dense embedder (RETR_EMBEDDING_*)."""
    rerank: RerankSettings
    """Optional reranker (RERANK_*)."""
    synonyms_path: str
    """Extra synonyms for query expansion (RETR_SYNONYMS_PATH): a file of JSON or text groups
    (retrieval/query.py SynonymTable.load), read and checked at start; the built-in table
    when empty."""
    llm: LlmAssistSettings
    """Model-written section summaries and query variants (RETR_LLM_*; llm_assist.py)."""
    production: bool
    """Health fails when the backend is down (RETR_PRODUCTION)."""
    journal_path: str
    """The ingest journal (VISIOR_DATA_DIR/ingest-journal.jsonl)."""
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    """How ingested documents are cut into chunks (RETR_CHUNK_TOKENS, RETR_CHUNK_OVERLAP_TOKENS)."""

    @classmethod
    def from_env(cls, env: Env | None = None) -> RetrievalSettings:
        env = env or Env()
        max_doc = MAX_DOCUMENT_BYTES.read(env)
        embedding = embedding_settings(env)
        root = data_dir(env)
        settings = SETTINGS.read(
            env,
            # A document travels in one message: leave room for it plus the envelope.
            server=ServerSettings.for_service("retrieval", env, max_message_bytes=max_doc + (1 << 20)),
            defaults=search_defaults(env),
            docstore=docstore_settings(env, "RETR_"),
            max_document_bytes=max_doc,
            engine=engine_settings(env, embedding.profile),
            embedding=embedding,
            rerank=rerank_settings(env),
            llm=llm_assist_settings(env),
            journal_path=str(root / "ingest-journal.jsonl"),
            index=index_settings(env, root),
            chunking=chunking(env),
        )  # fmt: skip
        check_synonyms(settings.synonyms_path)
        if not settings.mock_mode:  # mock mode opens no store
            check_paths(env, settings)
        return settings


def check_paths(env: Env, settings: RetrievalSettings) -> None:
    """SettingsError naming the setting when the data directory, the Edge index's directory or
    the SQLite document store's file is under a regular file (or is the wrong kind), so it
    cannot be made or opened at start (`settings.check_directory`)."""
    data = ("VISIOR_DATA_DIR", DATA_DIR.read(env))
    check_directory(data[1], *data)
    if settings.index.backend == "edge":
        check_directory(settings.index.path, *(INDEX.vars["path"].found(env) or data))
    check_store_path(env, settings.docstore)


def check_synonyms(path: str) -> None:
    """SettingsError naming RETR_SYNONYMS_PATH unless `path` is empty or a synonyms file that
    loads (it exists, is a file, and parses)."""
    if not path:
        return
    try:
        load_synonyms(path)
    except OSError as exc:
        raise SettingsError(f"RETR_SYNONYMS_PATH={path!r}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise SettingsError(f"RETR_SYNONYMS_PATH={path!r}: {exc}") from None


def search_defaults(env: Env) -> SearchDefaults:
    """What a search uses when the request does not say (retrieval.md §8.1, retrieval-v1 §6)."""
    return SEARCH.read(env)


def engine_settings(env: Env, profile: str) -> EngineSettings:
    """How searches rank. Cross-language imputation helped e5's hybrid ranking on the quality
    set everywhere, while USE's weaker dense list lost as much on English queries as it won on
    mixed-language ones: on by default except with the fast profile."""
    engine = ENGINE.read(env, {"cross_language": profile != "fast"})
    if engine.dense_weight + engine.sparse_weight <= 0:
        raise SettingsError("RETR_DENSE_WEIGHT + RETR_SPARSE_WEIGHT must be above 0")
    return engine


def index_settings(env: Env, data: Path) -> IndexSettings:
    """The vector index (RETR_INDEX_*, QDRANT_*, HNSW, quantization, optimizers)."""
    found = INDEX.vars["qdrant_url"].found(env)
    if found is not None:
        check_base_url(found[1], found[0])
    backend = "qdrant" if found else "edge"
    index = INDEX.read(env, {"path": str(data / "index"), "backend": backend})
    if index.backend == "qdrant" and not index.qdrant_url:
        raise SettingsError("RETR_INDEX_BACKEND=qdrant needs QDRANT_URL (or VECTOR_DB_URL)")
    if index.backend == "edge" and index.qdrant_url:
        # Each replica would keep an index of its own while the operator meant one server.
        raise SettingsError(
            "RETR_INDEX_BACKEND=edge keeps the index in-process, but QDRANT_URL (or "
            "VECTOR_DB_URL) names a Qdrant server: unset one of them"
        )
    return index


def chunking(env: Env) -> ChunkingConfig:
    """Chunk size and overlap in tokens, as the chunker (ChunkingConfig) accepts them."""
    values = CHUNKS.values(env)
    try:
        return ChunkingConfig(**values)
    except ValueError as exc:
        size, overlap = values["chunk_tokens"], values["overlap_tokens"]
        raise SettingsError(
            f"RETR_CHUNK_TOKENS={size}, RETR_CHUNK_OVERLAP_TOKENS={overlap}: {exc}"
        ) from None


def embedding_settings(env: Env, *, cpus: int | None = None) -> EmbeddingSettings:
    """The embedder's settings (RETR_EMBEDDING_*); errors name the variable. `cpus` bounds
    RETR_EMBEDDING_THREADS (default: the CPUs this process may use)."""
    var = EMBEDDING.vars
    profile = var["profile"].read(env)
    url = var["url"].read(env) or None
    if url is not None:
        check_base_url(url, "RETR_EMBEDDING_URL")
    model = var["model"].read(env) or None
    for name, value in (("RETR_EMBEDDING_URL", url), ("RETR_EMBEDDING_MODEL", model)):
        if profile == "remote" and value is None:
            raise SettingsError(f"{name} is required when RETR_EMBEDDING_PROFILE=remote")
    dim = var["dim"].read(env)
    local_dim = {"e5": E5_DIM, "fast": USE_DIM}.get(profile)
    if dim is not None and local_dim is not None and dim != local_dim:
        raise SettingsError(
            f"RETR_EMBEDDING_DIM={dim} does not match the {profile} profile's {local_dim}"
        )
    # Env strips values, so "query: " arrives as "query:"; the separating space is restored.
    prefixes = {f: var[f].read(env) for f in ("query_prefix", "passage_prefix")}
    return EMBEDDING.read(
        env,
        profile=profile,
        url=url,
        model=model,
        api_key=var["api_key"].read(env) or None,
        dim=dim,
        threads=_threads(env, cpus or usable_cpus()),
        **{f: p + " " if p else "" for f, p in prefixes.items()},
    )


def _threads(env: Env, cpus: int) -> int | None:
    found = EMBEDDING.vars["threads"].found(env)
    if found is None or found[1].lower() == AUTO:
        return None
    try:
        value = int(found[1])
    except ValueError:
        raise SettingsError(
            f"RETR_EMBEDDING_THREADS={found[1]!r} is neither {AUTO!r} nor an integer"
        ) from None
    if not 1 <= value <= cpus:
        raise SettingsError(
            f"RETR_EMBEDDING_THREADS={value} is outside 1..{cpus} (the CPUs this process may use)"
        )
    return value


def rerank_settings(env: Env) -> RerankSettings:
    """The rerank API or the local model (RERANK_*); the local model's files must exist."""
    var = RERANK.vars
    url = var["url"].read(env)
    if url:
        check_base_url(url, "RERANK_MODEL_URL")
    model_path, model_file = var["model_path"].read(env), var["model_file"].read(env)
    if url and model_path:
        raise SettingsError(
            "RERANK_MODEL_URL and RERANK_MODEL_PATH are both set: "
            "rerank through the API or the local model, not both"
        )
    if model_file and not model_path:
        raise SettingsError("RERANK_MODEL_FILE is set without RERANK_MODEL_PATH")
    if model_path:
        local_model_files(model_path, model_file)
    style = var["api_style"].read(env)
    style = "cohere" if style == "jina" else style
    if style not in API_STYLES:
        raise SettingsError(f"RERANK_API_STYLE={style!r}: expected one of {API_STYLES}")
    # One setting with the engine's candidates; unset, the reranker keeps its own cap.
    candidates = (
        RERANK_CANDIDATES.read(env)
        if RERANK_CANDIDATES.found(env)
        else RerankSettings.max_candidates
    )
    return RERANK.read(
        env,
        **({"batch_size": LOCAL_RERANK_BATCH_SIZE} if model_path else {}),
        url=url,
        api_style=style,
        model_path=model_path,
        model_file=model_file,
        max_candidates=candidates,
    )


def llm_assist_settings(env: Env) -> LlmAssistSettings:
    """Model-written section summaries and query variants (RETR_LLM_SUMMARIES,
    RETR_LLM_QUERY_VARIANTS), both off unless set: every service of the mesh sees
    LLM_RUNTIME_URL, and a model call per section of every ingested document is a cost an
    operator should opt into. Either one needs the model runtime (LLM_RUNTIME_*,
    DEFAULT_MODEL_NAME: the same settings group the LLM service reads)."""
    values = ASSIST.values(env)
    if values["summaries"] or values["query_variants"]:
        values["runtime"] = _assist_runtime(env, values["summaries"], values["query_variants"])
    return LlmAssistSettings(**values)


def _assist_runtime(env: Env, summaries: bool, variants: bool) -> RuntimeSettings:
    on = ", ".join(
        n for n, v in (("RETR_LLM_SUMMARIES", summaries), ("RETR_LLM_QUERY_VARIANTS", variants)) if v
    )  # fmt: skip
    for var in (runtime_config.URL, runtime_config.DEFAULT_MODEL):
        if not var.read(env):
            raise SettingsError(f"{on} needs {var.name}")
    try:
        runtime = runtime_config.runtime_settings(env)
    except SettingsError as exc:
        raise SettingsError(f"retrieval's model runtime (LLM_RUNTIME_*): {exc}") from None
    assert runtime is not None  # LLM_RUNTIME_URL is set
    return runtime


SETTINGS = Fields(
    RetrievalSettings,
    max_document_bytes=integer(
        "RETR_MAX_DOCUMENT_BYTES", DEFAULT_MAX_DOCUMENT_BYTES, 1024, 256 << 20
    ),
    mock_mode=flag("RETR_MOCK_MODE", False),
    synonyms_path=text("RETR_SYNONYMS_PATH", ""),
    production=flag("RETR_PRODUCTION", False),
)
MAX_DOCUMENT_BYTES = SETTINGS.vars["max_document_bytes"]
INDEX = Fields(
    IndexSettings,
    backend=text(
        "RETR_INDEX_BACKEND",
        "edge",
        choices=("edge", "qdrant"),
        default_doc="qdrant with QDRANT_URL, else edge",
    ),
    path=text("RETR_INDEX_PATH", "", default_doc="VISIOR_DATA_DIR/index"),
    qdrant_url=text("QDRANT_URL", "", also=("VECTOR_DB_URL",)),
    qdrant_api_key=text("QDRANT_API_KEY", ""),
    qdrant_collection=text("QDRANT_COLLECTION", "visior_chunks"),
    timeout_s=number("RETR_INDEX_TIMEOUT_S", 2.0, 0.01, MAX_TIMEOUT_SECONDS),
    hnsw_ef=integer("RETR_HNSW_EF", 128, 8, 4096),
    quantization=text("RETR_QUANTIZATION", "int8", choices=QUANTIZATIONS, lower=True),
    indexing_threshold_kb=integer("RETR_INDEXING_THRESHOLD_KB", 0, 0, 100_000_000),
    optimize_quiet_s=number("RETR_OPTIMIZE_QUIET_S", 10.0, 0.0, MAX_OPTIMIZE_QUIET_S),
)
CHUNKS = Fields(
    ChunkingConfig,
    chunk_tokens=integer("RETR_CHUNK_TOKENS", minimum=32, maximum=2048),
    overlap_tokens=integer("RETR_CHUNK_OVERLAP_TOKENS", minimum=0, maximum=1024),
)
SEARCH = Fields(
    SearchDefaults,
    max_results=integer("RETR_MAX_RESULTS", minimum=1, maximum=MAX_RESULTS_LIMIT),
    # A server default is held to the limit a request's own value is held to.
    max_docs=integer("DEFAULT_MAX_DOCS", minimum=1, maximum=PARAM_LIMITS["max_docs"]),
    max_sections=integer("DEFAULT_MAX_SECTIONS", minimum=1, maximum=PARAM_LIMITS["max_sections"]),
    max_chunks=integer("DEFAULT_MAX_CHUNKS", minimum=1, maximum=PARAM_LIMITS["max_chunks"]),
    context_token_limit=integer("DEFAULT_TOKEN_LIMIT", minimum=1, maximum=MAX_CONTEXT_TOKEN_LIMIT),
    topk_per_doc=integer("RETR_TOPK_PER_DOC", minimum=0, maximum=MAX_TOPK_PER_DOC),
    min_score=number("RETR_MIN_SCORE", minimum=0.0, maximum=1.0),
)
ENGINE = Fields(
    EngineSettings,
    enable_hybrid=flag("ENABLE_HYBRID"),
    enable_rerank=flag("ENABLE_RERANK"),
    fusion=text("RETR_FUSION", choices=FUSIONS),
    dense_weight=number("RETR_DENSE_WEIGHT", minimum=0.0),
    sparse_weight=number("RETR_SPARSE_WEIGHT", minimum=0.0),
    rerank_candidates=integer(
        "RERANK_MAX_CANDIDATES",
        minimum=1,
        maximum=200,
        default_doc="40 (the reranker's own cap: 50)",
    ),
    expand_query=flag("RETR_EXPAND_QUERY"),
    empty_on_backend_error=flag("RETR_EMPTY_ON_BACKEND_ERROR"),
    cross_language=flag(
        "RETR_CROSS_LANGUAGE", default_doc="true; false with RETR_EMBEDDING_PROFILE=fast"
    ),
)
RERANK_CANDIDATES = ENGINE.vars["rerank_candidates"]
EMBEDDING = Fields(
    EmbeddingSettings,
    profile=text("RETR_EMBEDDING_PROFILE", choices=PROFILES, lower=True),
    url=text("RETR_EMBEDDING_URL", ""),
    model=text("RETR_EMBEDDING_MODEL", ""),
    api_key=text("RETR_EMBEDDING_API_KEY", ""),
    dim=integer("RETR_EMBEDDING_DIM", minimum=1, maximum=65536),
    timeout_s=number("RETR_EMBEDDING_TIMEOUT_S", minimum=0.001, maximum=MAX_TIMEOUT_SECONDS),
    query_cache_size=integer("RETR_QUERY_CACHE_SIZE", minimum=0, maximum=10_000_000),
    query_prefix=text("RETR_EMBEDDING_QUERY_PREFIX"),
    passage_prefix=text("RETR_EMBEDDING_PASSAGE_PREFIX"),
    threads=text("RETR_EMBEDDING_THREADS", AUTO, range_doc="auto, or integer 1..the CPUs usable"),
)
RERANK = Fields(
    RerankSettings,
    url=text("RERANK_MODEL_URL"),
    api_style=text("RERANK_API_STYLE", lower=True),
    model=text("RERANK_MODEL"),
    api_key=text("RERANK_API_KEY"),
    timeout_s=number("RERANK_TIMEOUT_S", minimum=0.01, maximum=MAX_TIMEOUT_SECONDS),
    model_path=text("RERANK_MODEL_PATH"),
    model_file=text("RERANK_MODEL_FILE"),
    threads=integer("RERANK_THREADS", minimum=0, maximum=THREADS_LIMIT),
)
# The summaries' concurrency and budget, the variants' timeout and cache are
# LlmAssistSettings' defaults (llm_assist.py), not read from the environment.
ASSIST = Fields(
    LlmAssistSettings,
    summaries=flag(
        "RETR_LLM_SUMMARIES",
        doc="Model-written section summaries at ingest, by the LLM service's runtime "
        "(needs LLM_RUNTIME_URL and DEFAULT_MODEL_NAME).",
    ),
    query_variants=flag(
        "RETR_LLM_QUERY_VARIANTS",
        doc="Model-written query variants for expanded searches, by the LLM service's runtime "
        "(needs LLM_RUNTIME_URL and DEFAULT_MODEL_NAME).",
    ),
)
