from google.api import annotations_pb2 as _annotations_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from visior.common.v1 import common_pb2 as _common_pb2
from visior.retrieval.v1 import retrieval_pb2 as _retrieval_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RespondRequest(_message.Message):
    __slots__ = ("query", "user", "user_id", "tenant_id", "channel", "locale", "trace_id", "filters", "doc_ids", "section_ids", "max_results", "history")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    LOCALE_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    DOC_IDS_FIELD_NUMBER: _ClassVar[int]
    SECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESULTS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    query: str
    user: _common_pb2.UserContext
    user_id: str
    tenant_id: str
    channel: str
    locale: str
    trace_id: str
    filters: _retrieval_pb2.SearchFilters
    doc_ids: _containers.RepeatedScalarFieldContainer[str]
    section_ids: _containers.RepeatedScalarFieldContainer[str]
    max_results: int
    history: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    def __init__(self, query: _Optional[str] = ..., user: _Optional[_Union[_common_pb2.UserContext, _Mapping]] = ..., user_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., channel: _Optional[str] = ..., locale: _Optional[str] = ..., trace_id: _Optional[str] = ..., filters: _Optional[_Union[_retrieval_pb2.SearchFilters, _Mapping]] = ..., doc_ids: _Optional[_Iterable[str]] = ..., section_ids: _Optional[_Iterable[str]] = ..., max_results: _Optional[int] = ..., history: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("doc_id", "section_id", "page_start", "page_end", "score")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section_id: str
    page_start: int
    page_end: int
    score: float
    def __init__(self, doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class Safety(_message.Message):
    __slots__ = ("input", "output")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    input: str
    output: str
    def __init__(self, input: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("trace_id", "retrieval_latency_ms", "llm_latency_ms", "tool_steps", "scenario", "intent", "decided_by", "llm_runtime_ms", "model_calls", "prompt_tokens", "prompt_tokens_cached", "final_prompt_tokens", "withheld_for")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    LLM_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    LLM_RUNTIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_CACHED_FIELD_NUMBER: _ClassVar[int]
    FINAL_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FOR_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    retrieval_latency_ms: int
    llm_latency_ms: int
    tool_steps: int
    scenario: str
    intent: str
    decided_by: str
    llm_runtime_ms: int
    model_calls: int
    prompt_tokens: int
    prompt_tokens_cached: int
    final_prompt_tokens: int
    withheld_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, trace_id: _Optional[str] = ..., retrieval_latency_ms: _Optional[int] = ..., llm_latency_ms: _Optional[int] = ..., tool_steps: _Optional[int] = ..., scenario: _Optional[str] = ..., intent: _Optional[str] = ..., decided_by: _Optional[str] = ..., llm_runtime_ms: _Optional[int] = ..., model_calls: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., prompt_tokens_cached: _Optional[int] = ..., final_prompt_tokens: _Optional[int] = ..., withheld_for: _Optional[_Iterable[str]] = ...) -> None: ...

class RespondResponse(_message.Message):
    __slots__ = ("answer", "sources", "tools", "safety", "telemetry")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    answer: str
    sources: _containers.RepeatedCompositeFieldContainer[Source]
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    safety: Safety
    telemetry: Telemetry
    def __init__(self, answer: _Optional[str] = ..., sources: _Optional[_Iterable[_Union[Source, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., safety: _Optional[_Union[Safety, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetConfigResponse(_message.Message):
    __slots__ = ("default_model", "prompt_token_budget", "context_token_budget", "max_tool_steps", "window_radius", "mock_mode")
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RADIUS_FIELD_NUMBER: _ClassVar[int]
    MOCK_MODE_FIELD_NUMBER: _ClassVar[int]
    default_model: str
    prompt_token_budget: int
    context_token_budget: int
    max_tool_steps: int
    window_radius: int
    mock_mode: bool
    def __init__(self, default_model: _Optional[str] = ..., prompt_token_budget: _Optional[int] = ..., context_token_budget: _Optional[int] = ..., max_tool_steps: _Optional[int] = ..., window_radius: _Optional[int] = ..., mock_mode: _Optional[bool] = ...) -> None: ...

class UpdateConfigRequest(_message.Message):
    __slots__ = ("default_model", "prompt_token_budget", "context_token_budget", "max_tool_steps", "window_radius", "window_max", "mock_mode")
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RADIUS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MAX_FIELD_NUMBER: _ClassVar[int]
    MOCK_MODE_FIELD_NUMBER: _ClassVar[int]
    default_model: str
    prompt_token_budget: int
    context_token_budget: int
    max_tool_steps: int
    window_radius: int
    window_max: int
    mock_mode: bool
    def __init__(self, default_model: _Optional[str] = ..., prompt_token_budget: _Optional[int] = ..., context_token_budget: _Optional[int] = ..., max_tool_steps: _Optional[int] = ..., window_radius: _Optional[int] = ..., window_max: _Optional[int] = ..., mock_mode: _Optional[bool] = ...) -> None: ...

class UpdateConfigResponse(_message.Message):
    __slots__ = ("default_model", "prompt_token_budget", "context_token_budget", "max_tool_steps", "window_radius", "mock_mode")
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RADIUS_FIELD_NUMBER: _ClassVar[int]
    MOCK_MODE_FIELD_NUMBER: _ClassVar[int]
    default_model: str
    prompt_token_budget: int
    context_token_budget: int
    max_tool_steps: int
    window_radius: int
    mock_mode: bool
    def __init__(self, default_model: _Optional[str] = ..., prompt_token_budget: _Optional[int] = ..., context_token_budget: _Optional[int] = ..., max_tool_steps: _Optional[int] = ..., window_radius: _Optional[int] = ..., mock_mode: _Optional[bool] = ...) -> None: ...

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
