from google.api import annotations_pb2 as _annotations_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchFilters(_message.Message):
    __slots__ = ("product", "version", "tags", "doc_ids", "section_ids", "source")
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    SECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    product: str
    version: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    section_ids: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, product: _Optional[str] = ..., version: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., doc_ids: _Optional[_Iterable[str]] = ..., section_ids: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class SearchParams(_message.Message):
    __slots__ = ("max_docs", "max_sections", "max_chunks", "context_token_limit", "retrieval_mode", "enable_hybrid", "enable_rerank", "ranking", "fusion", "topk_per_doc", "min_score", "expand_query", "hard_trim")
    MAX_DOCS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_MODE_FIELD_NUMBER: _ClassVar[int]
    ENABLE_HYBRID_FIELD_NUMBER: _ClassVar[int]
    ENABLE_RERANK_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    TOPK_PER_DOC_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    EXPAND_QUERY_FIELD_NUMBER: _ClassVar[int]
    HARD_TRIM_FIELD_NUMBER: _ClassVar[int]
    max_docs: int
    max_sections: int
    max_chunks: int
    context_token_limit: int
    retrieval_mode: str
    enable_hybrid: bool
    enable_rerank: bool
    ranking: str
    fusion: str
    topk_per_doc: int
    min_score: float
    expand_query: bool
    hard_trim: bool
    def __init__(self, max_docs: _Optional[int] = ..., max_sections: _Optional[int] = ..., max_chunks: _Optional[int] = ..., context_token_limit: _Optional[int] = ..., retrieval_mode: _Optional[str] = ..., enable_hybrid: _Optional[bool] = ..., enable_rerank: _Optional[bool] = ..., ranking: _Optional[str] = ..., fusion: _Optional[str] = ..., topk_per_doc: _Optional[int] = ..., min_score: _Optional[float] = ..., expand_query: _Optional[bool] = ..., hard_trim: _Optional[bool] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("query", "tenant_id", "max_results", "filters", "language", "params", "trace_id")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    query: str
    tenant_id: str
    max_results: int
    filters: SearchFilters
    language: str
    params: SearchParams
    trace_id: str
    def __init__(self, query: _Optional[str] = ..., tenant_id: _Optional[str] = ..., max_results: _Optional[int] = ..., filters: _Optional[_Union[SearchFilters, _Mapping]] = ..., language: _Optional[str] = ..., params: _Optional[_Union[SearchParams, _Mapping]] = ..., trace_id: _Optional[str] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("doc_id", "section_id", "chunk_id", "text", "score", "page_start", "page_end")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section_id: str
    chunk_id: str
    text: str
    score: float
    page_start: int
    page_end: int
    def __init__(self, doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ...) -> None: ...

class McpLink(_message.Message):
    __slots__ = ("doc_id", "page_start", "page_end")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    page_start: int
    page_end: int
    def __init__(self, doc_id: _Optional[str] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("chunk_id", "doc_id", "section_id", "text", "tokens", "page_start", "page_end", "score", "mcp_link", "chunk_ids", "truncated")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    MCP_LINK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    doc_id: str
    section_id: str
    text: str
    tokens: int
    page_start: int
    page_end: int
    score: float
    mcp_link: McpLink
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    truncated: bool
    def __init__(self, chunk_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., text: _Optional[str] = ..., tokens: _Optional[int] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ..., score: _Optional[float] = ..., mcp_link: _Optional[_Union[McpLink, _Mapping]] = ..., chunk_ids: _Optional[_Iterable[str]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class UsedDoc(_message.Message):
    __slots__ = ("doc_id", "score", "title")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    score: float
    title: str
    def __init__(self, doc_id: _Optional[str] = ..., score: _Optional[float] = ..., title: _Optional[str] = ...) -> None: ...

class UsedSection(_message.Message):
    __slots__ = ("section_id", "score", "doc_id", "title", "summary", "page_start", "page_end", "anchor_chunk_id")
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    section_id: str
    score: float
    doc_id: str
    title: str
    summary: str
    page_start: int
    page_end: int
    anchor_chunk_id: str
    def __init__(self, section_id: _Optional[str] = ..., score: _Optional[float] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., summary: _Optional[str] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ..., anchor_chunk_id: _Optional[str] = ...) -> None: ...

class SearchMeta(_message.Message):
    __slots__ = ("retrieval_time_ms", "mode", "hybrid_used", "rerank_used", "trace_id", "backend", "language", "query_variants", "query_embedding_ms", "engine_ms", "rerank_ms", "query_variants_source")
    RETRIEVAL_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HYBRID_USED_FIELD_NUMBER: _ClassVar[int]
    RERANK_USED_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    QUERY_VARIANTS_FIELD_NUMBER: _ClassVar[int]
    QUERY_EMBEDDING_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MS_FIELD_NUMBER: _ClassVar[int]
    RERANK_MS_FIELD_NUMBER: _ClassVar[int]
    QUERY_VARIANTS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    retrieval_time_ms: int
    mode: str
    hybrid_used: bool
    rerank_used: bool
    trace_id: str
    backend: str
    language: str
    query_variants: _containers.RepeatedScalarFieldContainer[str]
    query_embedding_ms: float
    engine_ms: float
    rerank_ms: float
    query_variants_source: str
    def __init__(self, retrieval_time_ms: _Optional[int] = ..., mode: _Optional[str] = ..., hybrid_used: _Optional[bool] = ..., rerank_used: _Optional[bool] = ..., trace_id: _Optional[str] = ..., backend: _Optional[str] = ..., language: _Optional[str] = ..., query_variants: _Optional[_Iterable[str]] = ..., query_embedding_ms: _Optional[float] = ..., engine_ms: _Optional[float] = ..., rerank_ms: _Optional[float] = ..., query_variants_source: _Optional[str] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "chunks", "used_docs", "used_sections", "meta")
    HITS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    USED_DOCS_FIELD_NUMBER: _ClassVar[int]
    USED_SECTIONS_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    used_docs: _containers.RepeatedCompositeFieldContainer[UsedDoc]
    used_sections: _containers.RepeatedCompositeFieldContainer[UsedSection]
    meta: SearchMeta
    def __init__(self, hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., used_docs: _Optional[_Iterable[_Union[UsedDoc, _Mapping]]] = ..., used_sections: _Optional[_Iterable[_Union[UsedSection, _Mapping]]] = ..., meta: _Optional[_Union[SearchMeta, _Mapping]] = ...) -> None: ...

class GetHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetHealthResponse(_message.Message):
    __slots__ = ("status", "service", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    status: str
    service: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[str] = ..., service: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IngestDocumentRequest(_message.Message):
    __slots__ = ("tenant_id", "doc_id", "file_name", "content_type", "content", "title", "product", "version", "tags", "trace_id", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    doc_id: str
    file_name: str
    content_type: str
    content: bytes
    title: str
    product: str
    version: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    trace_id: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, tenant_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., file_name: _Optional[str] = ..., content_type: _Optional[str] = ..., content: _Optional[bytes] = ..., title: _Optional[str] = ..., product: _Optional[str] = ..., version: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., trace_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IngestDocumentResponse(_message.Message):
    __slots__ = ("doc_id", "sections", "chunks", "pages", "replaced", "unchanged", "doc_ids", "generation", "removed_doc_ids")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    sections: int
    chunks: int
    pages: int
    replaced: bool
    unchanged: bool
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    generation: str
    removed_doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, doc_id: _Optional[str] = ..., sections: _Optional[int] = ..., chunks: _Optional[int] = ..., pages: _Optional[int] = ..., replaced: _Optional[bool] = ..., unchanged: _Optional[bool] = ..., doc_ids: _Optional[_Iterable[str]] = ..., generation: _Optional[str] = ..., removed_doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteDocumentRequest(_message.Message):
    __slots__ = ("tenant_id", "doc_id", "trace_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    doc_id: str
    trace_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., doc_id: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class DeleteDocumentResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListDocumentsRequest(_message.Message):
    __slots__ = ("tenant_id", "trace_id", "page_size", "page_token", "doc_ids")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    trace_id: str
    page_size: int
    page_token: str
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., doc_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DocumentInfo(_message.Message):
    __slots__ = ("doc_id", "title", "pages", "sections", "chunks", "chars", "source", "generation", "metadata", "tokens")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    SECTIONS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHARS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    title: str
    pages: int
    sections: int
    chunks: int
    chars: int
    source: str
    generation: str
    metadata: _containers.ScalarMap[str, str]
    tokens: int
    def __init__(self, doc_id: _Optional[str] = ..., title: _Optional[str] = ..., pages: _Optional[int] = ..., sections: _Optional[int] = ..., chunks: _Optional[int] = ..., chars: _Optional[int] = ..., source: _Optional[str] = ..., generation: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., tokens: _Optional[int] = ...) -> None: ...

class ListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "next_page_token")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[DocumentInfo]
    next_page_token: str
    def __init__(self, documents: _Optional[_Iterable[_Union[DocumentInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
