from google.api import annotations_pb2 as _annotations_pb2
from google.api import field_behavior_pb2 as _field_behavior_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.rpc import status_pb2 as _status_pb2
from visior.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContextChunk(_message.Message):
    __slots__ = ("doc_id", "section_id", "text", "page_start", "page_end", "chunk_id", "score")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section_id: str
    text: str
    page_start: int
    page_end: int
    chunk_id: str
    score: float
    def __init__(self, doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., text: _Optional[str] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ..., chunk_id: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class GenerationParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "response_schema")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    response_schema: _struct_pb2.Struct
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., response_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class AnchorChunk(_message.Message):
    __slots__ = ("doc_id", "section_id", "anchor_chunk_id")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    SECTION_ID_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    section_id: str
    anchor_chunk_id: str
    def __init__(self, doc_id: _Optional[str] = ..., section_id: _Optional[str] = ..., anchor_chunk_id: _Optional[str] = ...) -> None: ...

class ToolPolicy(_message.Message):
    __slots__ = ("allowed_tools", "anchors", "window_radius_schedule", "max_tool_steps", "context_token_budget", "planned_calls", "require_tool_call")
    ALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RADIUS_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    PLANNED_CALLS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    allowed_tools: _containers.RepeatedScalarFieldContainer[str]
    anchors: _containers.RepeatedCompositeFieldContainer[AnchorChunk]
    window_radius_schedule: _containers.RepeatedScalarFieldContainer[int]
    max_tool_steps: int
    context_token_budget: int
    planned_calls: _containers.RepeatedCompositeFieldContainer[PlannedCall]
    require_tool_call: bool
    def __init__(self, allowed_tools: _Optional[_Iterable[str]] = ..., anchors: _Optional[_Iterable[_Union[AnchorChunk, _Mapping]]] = ..., window_radius_schedule: _Optional[_Iterable[int]] = ..., max_tool_steps: _Optional[int] = ..., context_token_budget: _Optional[int] = ..., planned_calls: _Optional[_Iterable[_Union[PlannedCall, _Mapping]]] = ..., require_tool_call: _Optional[bool] = ...) -> None: ...

class PlannedCall(_message.Message):
    __slots__ = ("tool_name", "arguments")
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    tool_name: str
    arguments: _struct_pb2.Struct
    def __init__(self, tool_name: _Optional[str] = ..., arguments: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("mode", "system_prompt", "messages", "context_chunks", "generation_params", "trace_id", "user", "tool_policy", "model", "answer_language")
    MODE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_PARAMS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TOOL_POLICY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ANSWER_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    mode: str
    system_prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    context_chunks: _containers.RepeatedCompositeFieldContainer[ContextChunk]
    generation_params: GenerationParams
    trace_id: str
    user: _common_pb2.UserContext
    tool_policy: ToolPolicy
    model: str
    answer_language: str
    def __init__(self, mode: _Optional[str] = ..., system_prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., context_chunks: _Optional[_Iterable[_Union[ContextChunk, _Mapping]]] = ..., generation_params: _Optional[_Union[GenerationParams, _Mapping]] = ..., trace_id: _Optional[str] = ..., user: _Optional[_Union[_common_pb2.UserContext, _Mapping]] = ..., tool_policy: _Optional[_Union[ToolPolicy, _Mapping]] = ..., model: _Optional[str] = ..., answer_language: _Optional[str] = ...) -> None: ...

class UsedTokens(_message.Message):
    __slots__ = ("prompt", "completion", "prompt_cached", "final_prompt")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CACHED_FIELD_NUMBER: _ClassVar[int]
    FINAL_PROMPT_FIELD_NUMBER: _ClassVar[int]
    prompt: int
    completion: int
    prompt_cached: int
    final_prompt: int
    def __init__(self, prompt: _Optional[int] = ..., completion: _Optional[int] = ..., prompt_cached: _Optional[int] = ..., final_prompt: _Optional[int] = ...) -> None: ...

class GenerateMeta(_message.Message):
    __slots__ = ("model_name", "latency_ms", "tool_steps", "trace_id", "extractive", "runtime_ms", "model_calls", "withheld_for", "finish_reason")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TOOL_STEPS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRACTIVE_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FOR_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    latency_ms: int
    tool_steps: int
    trace_id: str
    extractive: bool
    runtime_ms: int
    model_calls: int
    withheld_for: _containers.RepeatedScalarFieldContainer[str]
    finish_reason: str
    def __init__(self, model_name: _Optional[str] = ..., latency_ms: _Optional[int] = ..., tool_steps: _Optional[int] = ..., trace_id: _Optional[str] = ..., extractive: _Optional[bool] = ..., runtime_ms: _Optional[int] = ..., model_calls: _Optional[int] = ..., withheld_for: _Optional[_Iterable[str]] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("answer", "used_tokens", "tools_called", "meta")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    USED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_CALLED_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    answer: str
    used_tokens: UsedTokens
    tools_called: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    meta: GenerateMeta
    def __init__(self, answer: _Optional[str] = ..., used_tokens: _Optional[_Union[UsedTokens, _Mapping]] = ..., tools_called: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., meta: _Optional[_Union[GenerateMeta, _Mapping]] = ...) -> None: ...

class GenerateStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("delta", "tool_call", "final", "error")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    delta: str
    tool_call: _common_pb2.ToolCall
    final: GenerateResponse
    error: _status_pb2.Status
    def __init__(self, delta: _Optional[str] = ..., tool_call: _Optional[_Union[_common_pb2.ToolCall, _Mapping]] = ..., final: _Optional[_Union[GenerateResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

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
