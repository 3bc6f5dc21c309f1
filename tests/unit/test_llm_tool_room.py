"""One home for the room a tool result needs: the LLM service refuses a total that leaves less
than MIN_TOOL_RESULT_ROOM past the first prompt and one answer, and the mesh's local-model
env leaves that room (services/llm/loop.py, services/llm/config.py, services/devtools/mesh.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from services.common.settings import Env, SettingsError
from services.common.shared_config import MIN_FIRST_PROMPT_TOKENS
from services.common.tokenizer import default_tokenizer
from services.devtools.mesh import local_model_env
from services.llm.config import LlmSettings
from services.llm.loop import (
    MIN_TOOL_RESULT_ROOM,
    MIN_TOOL_RESULT_TOKENS,
    LoopSettings,
    ToolLoop,
)
from services.llm.model import Anchor, GenerateInput, ToolPolicy, ToolResult, Turn, User
from services.llm.toolcalls import READ_DOC_SECTION, READ_TOOL_SPECS
from services.model_runtime.chat import Completion, ToolCall

TOK = default_tokenizer()
URL = "http://127.0.0.1:1"


def _settings(total: int, prompt: int = 2500, completion: int = 500) -> LlmSettings:
    return LlmSettings.from_env(
        Env(
            {
                "LLM_SERVICE_MAX_TOTAL_TOKENS": str(total),
                "MAX_PROMPT_TOKENS": str(prompt),
                "MAX_COMPLETION_TOKENS": str(completion),
            }
        )
    )


def test_the_loop_minimum_is_the_one_constant() -> None:
    assert LoopSettings().min_tool_result_tokens == MIN_TOOL_RESULT_TOKENS
    assert MIN_TOOL_RESULT_ROOM > MIN_TOOL_RESULT_TOKENS  # the result's message fits too


@pytest.mark.parametrize("short", [MIN_TOOL_RESULT_ROOM, 1])
def test_a_total_leaving_no_room_for_a_tool_result_is_refused(short: int) -> None:
    with pytest.raises(SettingsError) as info:
        _settings(2500 + 500 + MIN_TOOL_RESULT_ROOM - short)
    message = str(info.value)
    assert "LLM_SERVICE_MAX_TOTAL_TOKENS" in message and "tool result" in message
    assert f"at least {MIN_TOOL_RESULT_ROOM}" in message


def test_the_least_total_accepted_leaves_the_room() -> None:
    loop = _settings(2500 + 500 + MIN_TOOL_RESULT_ROOM).loop
    assert loop.max_tool_result_tokens == MIN_TOOL_RESULT_ROOM


# The local model's env, before the fix: (total, prompt) = (7168, 4096), (4608, 4096),
# (3072, 2560), (1024, 512) -- the last three left no tool result any room.
@pytest.mark.parametrize(
    ("n_ctx", "total", "prompt"),
    [
        (8192, 7168, 4096),  # the default n_ctx: unchanged, 2,560 left for a tool result
        (5632, 4608, 4096 - MIN_TOOL_RESULT_ROOM),
        (4096, 3072, 2560 - MIN_TOOL_RESULT_ROOM),
        (3712, 2688, 2176 - MIN_TOOL_RESULT_ROOM),  # the least n_ctx: MIN_FIRST_PROMPT_TOKENS
    ],
)
def test_the_local_model_env_leaves_room_for_a_tool_result(
    n_ctx: int, total: int, prompt: int
) -> None:
    env = local_model_env(URL, "m", n_ctx, env={})
    assert (env["LLM_SERVICE_MAX_TOTAL_TOKENS"], env["MAX_PROMPT_TOKENS"]) == (
        str(total),
        str(prompt),
    )
    loop = LlmSettings.from_env(Env(env)).loop  # the LLM service starts
    assert loop.max_tool_result_tokens >= MIN_TOOL_RESULT_ROOM


def test_a_context_too_small_for_a_prompt_and_a_tool_result_is_refused() -> None:
    # n_ctx 4096: a total of 3,072; an answer one token longer than the total less the tool
    # result's room and the least first prompt leaves the prompt one token short of it.
    completion = 3072 - MIN_TOOL_RESULT_ROOM - MIN_FIRST_PROMPT_TOKENS + 1
    with pytest.raises(SettingsError) as info:
        local_model_env(URL, "m", 4096, env={"MAX_COMPLETION_TOKENS": str(completion)})
    message = str(info.value)
    assert f"MAX_COMPLETION_TOKENS={completion}" in message
    assert "tool result" in message and "n_ctx 4096" in message
    assert f"at least {MIN_FIRST_PROMPT_TOKENS}" in message
    one_less = {"MAX_COMPLETION_TOKENS": str(completion - 1)}
    env = local_model_env(URL, "m", 4096, env=one_less)
    assert env["MAX_PROMPT_TOKENS"] == str(MIN_FIRST_PROMPT_TOKENS)


class _Runtime:
    """Asks for one tool call, then answers."""

    name = "scripted"

    def __init__(self, call: ToolCall) -> None:
        self.script = [
            Completion("", (call,), finish_reason="tool_calls", model="m"),
            Completion("LDAP is set up in Settings.", model="m"),
        ]
        self.sent: list[list] = []

    async def complete(self, request, *, timeout_s):
        self.sent.append(list(request.messages))
        return self.script.pop(0)

    async def stream(self, request, *, timeout_s):
        yield await self.complete(request, timeout_s=timeout_s)


class _Tools:
    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, request, *, timeout_s=None):
        self.calls += 1
        text = "LDAP is set up in Settings. " * 200
        return ToolResult(
            "ok",
            {"doc_id": "guide", "title": "Guide", "page_start": 2, "page_end": 3,
             "text": f'<<<DOCUMENT doc_id="guide">>>\n{text}\n<<<END DOCUMENT>>>'},
        )  # fmt: skip


@pytest.mark.parametrize("call_id", ["c1", "call_9fQ2xZ7kLmP4vR8tY1wB6nJ3"])
async def test_a_tool_call_goes_through_with_the_local_model_at_4096(call_id: str) -> None:
    """`visior run --model local --model-ctx 4096`: a read got 0 tokens of room."""
    settings = LlmSettings.from_env(Env(local_model_env(URL, "m", 4096, env={}))).loop
    args = '{"doc_id": "guide", "section_id": "s2"}'
    runtime, tools = _Runtime(ToolCall(call_id, READ_DOC_SECTION, args)), _Tools()
    loop = ToolLoop(runtime, tools, READ_TOOL_SPECS, settings, tokenizer=TOK)
    policy = ToolPolicy(allowed_tools=(READ_DOC_SECTION,), anchors=(Anchor("guide", "s2", ""),))
    out = await loop.run(
        GenerateInput(
            messages=(Turn("user", "How do I set up LDAP?"),),
            user=User("t1", "u1"),
            policy=policy,
            trace_id="tr",
        )
    )
    assert tools.calls == 1
    assert out.tools_called[0].result_summary.endswith("truncated to the token budget")
    fed = runtime.sent[1][-1]
    assert fed.role == "tool" and TOK.count(fed.content) >= MIN_TOOL_RESULT_TOKENS


def _config_docs():
    """tools/config_docs.py, the generator of docs/configuration.md."""
    path = Path(__file__).resolve().parents[2] / "tools" / "config_docs.py"
    spec = importlib.util.spec_from_file_location("config_docs_tool_room", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_total_s_documentation_states_the_room() -> None:
    doc = _config_docs().field_docs(LoopSettings)["max_total_tokens"]
    assert f"MAX_COMPLETION_TOKENS + {MIN_TOOL_RESULT_ROOM}" in doc
