"""The model <-> tool loop of Generate (llm-service.md §6): call, check, execute, feed back.

One run: build the prompt within the token budget; run the caller's planned calls
(`ToolPolicy.planned_calls`: the scenario already knows them) in order, appended to the
conversation as one assistant tool-call turn and its results, exactly as if the model had
made them; call the model; for each tool call it makes, review it
(services/llm/toolcalls.py), execute it through ToolsProxy on the request's user, append the
result as delimited data cut to the budget; call the model again, until it answers without
tools. A first step that must read (`policy.require_tool_call`: the prompt holds only the
sections' summaries) answered with text, as a runtime ignoring tool_choice "required" does,
gets the policy's own read of its top anchor in its place (`CallGate.first_read`), appended
as the model's call and its result, the text discarded; it is a tool step, made once.
Planned calls count as tool steps; one the request may not make (not in
allowed_tools, not in the catalogue, bad arguments, more than the step limit) refuses the
request (INVALID_ARGUMENT, field tool_policy.planned_calls); one that fails is fed back as a
tool_error (it does not count towards the errors-in-a-row abort: the model did not make it).
How a run stops:

- final text from the model: the answer;
- `max_tool_steps` calls executed (the server's MAX_TOOL_STEPS, or fewer if the policy asks),
  or the same call repeated (runaway): the tools are withdrawn and the model is asked once
  more for the answer; if it still calls a tool, LLM_LIMIT_EXCEEDED ("Tool-call limit",
  limit_name max_tool_steps) after the step limit, LLM_RUNTIME_ERROR (502, limit_name
  repeated_call) after a repeated call: the model's failure, not the caller's;
- a tool call in a request that offers no tools: the call is refused and the model asked
  once for the answer without tools; if it still calls one, LLM_RUNTIME_ERROR (502,
  limit_name tools_offered);
- two tool errors in a row (a refused call or a tool that failed): a downstream failure, by
  the last error (`_Run._failed`): RATE_LIMIT_EXCEEDED or SERVER_BUSY (429), else
  LLM_RUNTIME_ERROR for calls the model got wrong (refused by the loop, or answered by
  ToolsProxy with NOT_FOUND or INVALID_ARGUMENT for arguments the model chose), else
  UPSTREAM_UNAVAILABLE for a tool that failed (502);
- no room left for a further tool result (the token budget, services/llm/budget.py, with
  the caller's context_token_budget) once a result was read: the model's call is refused
  (TOOL_LIMIT_REACHED, reported as a call past the step limit is), the tools are withdrawn
  and the model is asked for the answer from what it read, as at the step limit;
- the token budget spent with nothing read, or no room left for the answer's least share
  beside the loop's notes (MIN_ANSWER_TOKENS): LLM_LIMIT_EXCEEDED;
- the watchdog (the whole request, LoopSettings.watchdog_s): LLM_RUNTIME_ERROR ("Model
  timeout", llm-service.md §9.1), 502; the caller's time left, when that is shorter:
  DEADLINE_EXCEEDED;
- a runtime failure: its own error, as the runtime raised it (LLM_RUNTIME_ERROR; SERVER_BUSY
  when no connection to it came free; DEADLINE_EXCEEDED when the caller's deadline ended it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from services.common import errors
from services.common.context import before_caller
from services.common.generate_contract import last_question
from services.common.outcomes import outcome_of
from services.common.prompt_limits import DEFAULT_LLM_COMPLETION_TOKENS, DEFAULT_LLM_PROMPT_TOKENS
from services.common.tokenizer import LONGEST_TOKEN_BYTES, Tokenizer, default_tokenizer
from services.common.tool_contract import (
    EXTERNAL_TOOLS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    RATE_LIMIT_EXCEEDED,
    READ_TOOLS,
    UPSTREAM_UNAVAILABLE,
)
from services.llm import prompt as prompts
from services.llm.budget import (
    MESSAGE_OVERHEAD,
    TokenBudget,
    fit_prompt,
    limit_exceeded,
    message_tokens,
)
from services.llm.extractive import answer_without_model, held, ungrounded_terms
from services.llm.model import (
    EventSink,
    GenerateInput,
    GenerateOutput,
    PlannedCall,
    ToolCallRecord,
    ToolRequest,
    ToolResult,
    ToolRunner,
    User,
)
from services.llm.toolcalls import (
    REPEATED_CALL,
    TOOL_LIMIT_REACHED,
    UNKNOWN_TOOL,
    Approved,
    CallGate,
    error_message,
    refused_record,
    render_result,
    result_message,
    summarise,
)
from services.model_runtime.chat import (
    CONTENT_FILTER,
    LENGTH,
    LLM_RUNTIME_ERROR,
    ChatMessage,
    ChatRequest,
    ChatRuntime,
    Completion,
    GenerationParams,
    StreamDelta,
    ToolCall,
    ToolSpec,
)

log = logging.getLogger("visior.llm.loop")
PLANNED_FIELD = "tool_policy.planned_calls"
PLANNED_CALL_ID = "planned-{}"
"""Ids of the planned calls in the conversation (1-based, in order)."""
STAND_IN_CALL_ID = "policy-read-1"
"""Id of the policy's read in place of a text answer to a step that had to read."""
MIN_TOOL_RESULT_TOKENS = 64
"""With less room than this for a tool result's text, the budget is spent: the tools are
withdrawn once something was read, else LLM_LIMIT_EXCEEDED."""
TOOL_RESULT_MESSAGE_TOKENS = 64
"""Room kept for what a tool result's message adds around its text (role, tool name, call
id): 12-34 tokens measured for the tools with call ids of up to 24 random characters (the
runtime client's own and OpenAI-style ones)."""
MIN_ANSWER_TOKENS = 128
"""The least of its share the loop's notes (the answer language, the request for the final
answer) leave an answer, or half the share when that is less: the notes come out of the
answer's share down to it, then out of a tool result's room; a call that cannot keep it is
refused (LLM_LIMIT_EXCEEDED) rather than sent for a few tokens of answer."""
MIN_TOOL_RESULT_ROOM = MIN_TOOL_RESULT_TOKENS + TOOL_RESULT_MESSAGE_TOKENS
"""What LLM_SERVICE_MAX_TOTAL_TOKENS must leave past MAX_PROMPT_TOKENS + MAX_COMPLETION_TOKENS
so that one minimal tool result fits (services/llm/config.py refuses to start otherwise)."""
MODEL_MISTAKE_CODES = frozenset({NOT_FOUND, INVALID_ARGUMENT})
"""ToolsProxy's error codes that say a call's arguments were wrong (`_Run._models_mistake`):
when the model chose them, two in a row are the model's failure (LLM_RUNTIME_ERROR), not
the tools' (UPSTREAM_UNAVAILABLE)."""
NO_TOOLS = "tools_offered"
"""The `limit_name` (limit 0) of the abort of a model that asks for tools in a request that
offers none, even after the request for its final answer (LLM_RUNTIME_ERROR)."""
SPENT = "token_budget"
"""`_Run.closed_by` when the spent token budget withdrew the tools (the abort then names the
budget's own limit, `TokenBudget.limit_name`)."""
STEP_LIMIT = "max_tool_steps"
"""The `limit_name` of the step limit (LoopSettings.max_tool_steps, or the policy's fewer)."""
REPEATED_CALL_GUARD = "repeated_call"
"""The `limit_name` (limit 1: each distinct call runs once) of the abort of a model that
repeated a call, and asked for tools again after the request for its final answer."""
TOOLS_DOWNSTREAM = "toolsproxy"
"""The `downstream` an abort for failed tool calls names (services/llm/tools_client.py's)."""


@dataclass(frozen=True)
class LoopSettings:
    """The service's limits for one Generate (llm-service.md §7); a request may only lower them."""

    max_tool_steps: int = 3
    """Tool calls executed per request (MAX_TOOL_STEPS); the policy may ask for fewer."""
    max_prompt_tokens: int = DEFAULT_LLM_PROMPT_TOKENS
    """The first prompt, context included (MAX_PROMPT_TOKENS)."""
    max_completion_tokens: int = DEFAULT_LLM_COMPLETION_TOKENS
    """Each model answer (MAX_COMPLETION_TOKENS); reserved for the final answer."""
    max_total_tokens: int = 5120
    """The conversation at any step, tool results and the answer reserve included
    (LLM_SERVICE_MAX_TOTAL_TOKENS); at least MAX_PROMPT_TOKENS + MAX_COMPLETION_TOKENS + 128,
    the room of one minimal tool result. The Orchestrator reads it too: it reads selected
    documents whole (S3) only when one tool result holds their counted tokens uncut."""
    max_tool_result_tokens: int = 2048
    """One tool result as the model sees it; longer texts are cut. The service computes it:
    what the first prompt and the answer leave of max_total_tokens
    (services/common/shared_config.py tool_result_room)."""
    min_tool_result_tokens: int = MIN_TOOL_RESULT_TOKENS
    """With less room than this for a result, the budget is spent: the tools are withdrawn
    once something was read, else LLM_LIMIT_EXCEEDED."""
    max_consecutive_tool_errors: int = 2
    """Tool errors in a row that abort the request (llm-service.md §9.2)."""
    watchdog_s: float = 60.0
    """The whole request, every model and tool call included (LLM_SERVICE_WATCHDOG_SECONDS)."""
    tool_timeout_s: float = 5.0
    """Deadline of one call of a document or search tool (LLM_SERVICE_MCP_TIMEOUT_SECONDS)."""
    external_tool_timeout_s: float = 10.0
    """Deadline of one call of a tool over an outside service, fetch_cbr_data or
    fetch_finance_news (LLM_SERVICE_EXTERNAL_TOOL_TIMEOUT_S); the other tools' is
    tool_timeout_s (LLM_SERVICE_MCP_TIMEOUT_SECONDS)."""
    default_model: str = ""
    """Reported as model_name when the runtime names none (the runtime's DEFAULT_MODEL_NAME,
    or "extractive")."""


class LoopObserver(Protocol):
    """Told of every model call the loop made and every tool call (the LLM metrics count
    what each request used, whatever its outcome)."""

    def model_call(self, messages: tuple[ChatMessage, ...], completion: Completion) -> None:
        """`messages`: what was sent, the closing language note included. `completion`: the
        answer; for a call that failed or was cancelled once made, the text streamed so far
        with no counts (`_Run._call`)."""

    def tool_call(self, name: str, code: str) -> None:
        """`code`: "" when the tool answered ok, else its error code (the exception's reason
        when the call raised; DEADLINE_EXCEEDED when it timed out)."""


def _made(failure: BaseException) -> bool:
    """Whether a model call that ended with `failure` was made: the runtime client refuses
    some without calling (its breaker open, no time left, no free connection), saying so
    with `attempts` 0."""
    return not (
        isinstance(failure, errors.ServiceError) and failure.metadata.get("attempts") == "0"
    )


def answer_chars(max_tokens: int | None) -> int | None:
    """The most characters an answer of `max_tokens` tokens can hold (LONGEST_TOKEN_BYTES a
    token, the bundled encodings' longest token: a model's own tokens are no longer in
    practice), past which a runtime ignored max_tokens; None: no cap."""
    return None if max_tokens is None else max_tokens * LONGEST_TOKEN_BYTES


def capped(completion: Completion, room: int | None) -> Completion:
    """`completion` with its text cut to `room` characters (`answer_chars`), finish_reason
    "length", when a runtime sent more: a runaway answer never reaches the caller whole."""
    if room is None or len(completion.content) <= room:
        return completion
    return replace(completion, content=completion.content[:room], finish_reason=LENGTH)


FINISH_REASONS = frozenset({"stop", LENGTH, CONTENT_FILTER})


def finish_reason(completion: Completion) -> str:
    """How an answer ended (GenerateMeta.finish_reason): the runtime's "length" or
    "content_filter", else "stop" (any other reason a runtime gives, or none)."""
    return completion.finish_reason if completion.finish_reason in FINISH_REASONS else "stop"


class _NoObserver:
    def model_call(self, messages: tuple[ChatMessage, ...], completion: Completion) -> None:
        pass

    def tool_call(self, name: str, code: str) -> None:
        pass


class _Sink:
    """Forwards to the caller's EventSink, if any."""

    def __init__(self, sink: EventSink | None) -> None:
        self.sink = sink

    async def delta(self, text: str) -> None:
        if self.sink is not None and text:
            await self.sink.delta(text)

    async def tool_call(self, record: ToolCallRecord) -> None:
        if self.sink is not None:
            await self.sink.tool_call(record)


class ToolLoop:
    """Runs Generate requests over one chat runtime and the tools. Safe to share: each run
    keeps its state to itself."""

    def __init__(
        self,
        runtime: ChatRuntime,
        tools: ToolRunner,
        catalogue: Sequence[ToolSpec],
        settings: LoopSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        tokenizer: Tokenizer | None = None,
        observer: LoopObserver | None = None,
    ) -> None:
        self.runtime = runtime
        self.tools = tools
        self.observer: LoopObserver = observer or _NoObserver()
        self.catalogue = tuple(catalogue)
        self.settings = settings
        self.clock = clock
        self.tokenizer: Tokenizer = tokenizer or default_tokenizer()

    async def run(
        self, req: GenerateInput, sink: EventSink | None = None, *, timeout_s: float | None = None
    ) -> GenerateOutput:
        """Generate the answer to `req` (already validated). `sink` gets each step's text
        as it is streamed and a tool_call event for each tool call, executed or refused, which
        ends its step: the answer is the text after the last one. `timeout_s` is the caller's
        time left, which shortens the watchdog."""
        return await _Run(self, req, _Sink(sink), timeout_s).go()


class _Run:
    """The state of one request in the loop."""

    def __init__(
        self, loop: ToolLoop, req: GenerateInput, sink: _Sink, timeout_s: float | None
    ) -> None:
        s = loop.settings
        self.loop, self.req, self.sink, self.s = loop, req, sink, s
        self.started = loop.clock()
        # The caller's time less the hop's margin: this service's own answer (a timeout
        # named as the caller's deadline or the model's) reaches the caller before it gives up.
        watchdog = (
            s.watchdog_s if timeout_s is None else min(s.watchdog_s, before_caller(timeout_s))
        )
        self.watchdog = watchdog
        self.callers = watchdog < s.watchdog_s
        """Whether the watchdog is the caller's deadline, not the service's own."""
        self.deadline = self.started + watchdog
        steps = s.max_tool_steps
        if req.policy.max_tool_steps is not None:
            steps = max(0, min(steps, req.policy.max_tool_steps))
        allowed = set(req.policy.allowed_tools)
        self.offered: tuple[ToolSpec, ...] = ()
        if steps > 0 and req.user is not None:
            self.offered = tuple(t for t in loop.catalogue if t.name in allowed)
        self.max_steps = steps if self.offered else 0
        self.step_limit = steps
        completion = s.max_completion_tokens
        if req.params.max_tokens is not None:
            completion = max(1, min(completion, req.params.max_tokens))
        self.budget = TokenBudget(
            loop.tokenizer,
            max_prompt_tokens=s.max_prompt_tokens,
            max_completion_tokens=completion,
            max_total_tokens=s.max_total_tokens,
            context_token_budget=req.policy.context_token_budget,
        )
        self.gate = CallGate(self.offered, req.policy)
        self.records: list[ToolCallRecord] = []
        self.steps = 0
        self.errors_in_a_row = 0
        self.closed = not self.offered
        self.closed_by = NO_TOOLS if self.closed else ""
        """The guard that withdrew the tools (`_close`): NO_TOOLS when none were offered."""
        self.final_asked = False
        """Whether a call was sent with the final-answer note (`_close_tools`)."""
        self.read = False
        """Whether a tool result was fed to the model (status ok)."""
        self.spent = False
        """Whether the token budget left no room for a further tool result once something was
        read (`_no_room`): the tools are withdrawn, the model answers from what it read."""
        self.model_name = ""
        self.step_ms: list[int] = []
        """Each model call's latency (ms), for the request's summary log line."""
        self.tool_ms: list[int] = []
        """Each tool call's latency (ms), likewise."""
        self.prompt_cached = 0
        """Prompt tokens the runtime took from its cache, over all calls."""
        self.extractive = bool(getattr(loop.runtime, "extractive", False))
        """Whether the runtime is the built-in extractive responder, which keeps the loop's
        rules itself (services/llm/extractive.py)."""
        self.language_note = prompts.language_note(req.answer_language, last_question(req.messages))
        """Closes every call (`_sent`), never kept in the conversation."""
        self.final_note: ChatMessage | None = prompts.final_answer_note() if self.offered else None
        """The final-answer note until the tools are withdrawn and it closes the conversation."""
        self.note_overflow = 0
        """What of the final-answer note the conversation had no room for: it rides on the
        conversation with the language note (`_answer_tokens`)."""
        self.min_answer = min(MIN_ANSWER_TOKENS, max(1, completion // 2))
        """The least of its share the notes leave the answer."""
        self.riding = 0
        """Tokens of the notes riding on the conversation in the latest call."""
        self.final_prompt = 0
        """The last call's prompt tokens, as the runtime reported them, else as the service
        estimated them for `prompt_tokens` (`TokenBudget.record_call`)."""

    # --- the loop -------------------------------------------------------------------------

    async def go(self) -> GenerateOutput:
        """The run, then one INFO line summing it up (the per-step records are DEBUG)."""
        failure: BaseException | None = None
        try:
            return await self._go()
        except BaseException as exc:
            failure = exc
            raise
        finally:
            log.info(
                "generate",
                extra={
                    "model": self._model_name(),
                    "outcome": outcome_of(failure),
                    "tool_steps": self.steps,
                    "model_calls": self.budget.calls,
                    "prompt_tokens": self.budget.prompt_used,
                    "prompt_cached": self.prompt_cached,
                    "step_ms": self.step_ms,
                    "tool_ms": self.tool_ms,
                    "latency_ms": round((self.loop.clock() - self.started) * 1000),
                    "trace_id": self.req.trace_id,
                },
            )

    async def _go(self) -> GenerateOutput:
        messages = self._prompt()
        self.budget.start(messages, self.offered)
        self._fit_language_note(messages)
        await self._planned(messages)
        while True:
            if self.closed and self.final_note is not None:
                messages[:] = self._close_tools(messages, self.final_note)
            # Withdrawn tools stay in the prompt (tool_choice "none"): each step then extends
            # the previous prompt, and the runtime's prompt cache covers all but the new turns.
            max_tokens = self._answer_tokens(messages)
            params = replace(
                self.req.params,
                # The extractive responder quotes whole sentences: held to the caller's own
                # max_tokens only (its answers pass the service's default share).
                max_tokens=self.req.params.max_tokens if self.extractive else max_tokens,
                tool_choice=self._tool_choice(),
            )
            # A step that must read, answered with text, gets the policy's read in its place.
            stand_in = (
                self.gate.first_read(STAND_IN_CALL_ID) if params.tool_choice == "required" else None
            )
            # An answer to a question naming what nothing read mentions is withheld: while
            # that holds, no text of the step is streamed; nor is a text a read would replace.
            withheld = self._ungrounded(messages)
            hold = bool(withheld) or stand_in is not None
            completion = await self._step(messages, params, hold=hold)
            if not completion.tool_calls:
                if stand_in is not None:
                    await self._read_in_its_place(messages, stand_in)
                    continue
                if withheld:
                    return await self._withhold(messages, withheld)
                ended = finish_reason(completion)
                if not completion.content.strip() and not self.req.params.stop and ended == "stop":
                    # No answer at all. Not an outage where the caller's stop sequence ended it
                    # before it started, max_tokens cut it, or the runtime's filter withheld it.
                    raise errors.UnavailableError(
                        f"the model answered with no text (finish_reason {ended})",
                        reason=LLM_RUNTIME_ERROR,
                    )
                return self._output(completion.content, ended)
            if self.closed:
                if not self.final_asked:
                    # No tools were offered, yet the model asked for some: asked once for
                    # the answer without them, as when the tools are withdrawn.
                    await self._ask_for_the_answer(completion)
                    continue
                raise self._tools_after_closing(completion)
            await self._tool_turn(messages, completion)

    async def _ask_for_the_answer(self, completion: Completion) -> None:
        """The model asked for tools in a request that offers none: each call is refused
        (a tool_call event ends the step, its text is not the answer), none is added to the
        conversation, and the next call closes it with the final-answer note."""
        for call in completion.tool_calls:
            await self._refuse(
                call, UNKNOWN_TOOL, "no tools are offered in this request", counts=False
            )
        self.final_note = prompts.final_answer_note()

    def _close(self, guard: str) -> None:
        """Withdraw the tools; `guard` names the limit that did it (the first one counts)."""
        if not self.closed:
            self.closed_by = guard
        self.closed = True

    def _tools_after_closing(self, completion: Completion) -> errors.ServiceError:
        """The model asked for tools after they were withdrawn and it was asked for its final
        answer. The caller's limits withdrew them (the token budget when it was spent, else
        the step limit): LLM_LIMIT_EXCEEDED (llm-service.md §9.3, "Tool-call limit"), naming
        that limit. The model did it (no tools offered, or a call it repeated): the model
        failing at its task, LLM_RUNTIME_ERROR (502, as §9.1's), naming that guard."""
        names = ", ".join(dict.fromkeys(c.name for c in completion.tool_calls))
        if self.closed_by in (NO_TOOLS, REPEATED_CALL_GUARD):
            if self.closed_by == NO_TOOLS:
                what = "no tools are offered in this request"
                metadata = errors.limit_metadata(0, name=NO_TOOLS)
            else:
                what = "it repeated a tool call, so the tools were withdrawn"
                metadata = errors.limit_metadata(1, name=REPEATED_CALL_GUARD)
            return errors.UnavailableError(
                f"the model asked for tools ({names}) again after the request for its final "
                f"answer: {what} ({self.steps} tool call(s) made)",
                reason=LLM_RUNTIME_ERROR,
                metadata={**metadata, "tool": completion.tool_calls[0].name},
            )
        message = (
            f"Tool-call limit reached: the model asked for tools after {self.steps} tool "
            "call(s) and the request for its final answer"
        )
        if self.spent:
            return limit_exceeded(
                f"{message} (the token budget was spent)",
                self.budget.limit_name(),
                self.budget.conversation_limit,
            )
        return limit_exceeded(message, STEP_LIMIT, self.max_steps)

    async def _step(
        self, messages: list[ChatMessage], params: GenerationParams, *, hold: bool
    ) -> Completion:
        """One model call (`_call`), timed and counted into the budget."""
        step_started = self.loop.clock()
        completion = await self._call(messages, self.offered, params, hold=hold)
        step_ms = round((self.loop.clock() - step_started) * 1000)
        self.step_ms.append(step_ms)
        # Our own count of the answer is needed only when the runtime reports none. It errs
        # high by the message's template tokens, which never take it past the call's cap (a
        # runtime that ignores the cap is counted for all it sent).
        answered = completion.completion_tokens
        if answered is None:
            answered = message_tokens(
                self.loop.tokenizer,
                ChatMessage("assistant", completion.content, completion.tool_calls),
            )
            if params.max_tokens is not None and answered > params.max_tokens:
                answered = max(params.max_tokens, answered - MESSAGE_OVERHEAD)
        prompt = self.budget.record_call(
            reported_prompt=completion.prompt_tokens, completion=answered, notes=self.riding
        )
        # The last call's prompt as the totals count it (the runtime's count, else the same
        # estimate); of it, no more than all can have come from the runtime's cache.
        self.final_prompt = prompt
        self.prompt_cached += min(max(0, completion.cached_prompt_tokens), prompt)
        self.model_name = completion.model or self.model_name
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "model step",
                extra={
                    "model": self._model_name(),
                    "step": self.budget.calls,
                    "tool_calls": len(completion.tool_calls),
                    "step_ms": step_ms,
                    "trace_id": self.req.trace_id,
                },
            )
        return completion

    async def _tool_turn(self, messages: list[ChatMessage], completion: Completion) -> None:
        """The model's tool calls, executed or refused, appended with its turn.

        With no room left for even a minimal result once something was read, the budget is
        spent (orchestrator.md §3.5: the loop cuts at context_token_budget): the tools are
        withdrawn as at the step limit and the model answers from what it read. The turn is
        then left out, the conversation it would overfill as it was before it; a call of the
        turn that finds no room after the turn's first ones were executed is answered with
        the refusal, which rides on the conversation as the loop's notes do."""
        turn = ChatMessage("assistant", completion.content, completion.tool_calls)
        pending = message_tokens(self.loop.tokenizer, turn)
        if self._no_room(completion.tool_calls[0], pending=pending):
            for call in completion.tool_calls:
                await self._refuse(call, TOOL_LIMIT_REACHED, self._spent(), counts=False)
            self._close(SPENT)
            return
        messages.append(turn)
        self.budget.add(turn)
        for call in completion.tool_calls:
            messages.append(await self._tool(call))
            if self.spent:
                self.note_overflow += self.budget.add_note(messages[-1])
            else:
                self.budget.add(messages[-1])
        if self.steps >= self.max_steps:
            self._close(STEP_LIMIT)

    async def _read_in_its_place(self, messages: list[ChatMessage], read: Approved) -> None:
        """The policy's `read` (`CallGate.first_read`) in place of a text answer to a step
        that had to read (orchestrator.md §3.3: the first prompt holds only summaries, and a
        runtime may ignore tool_choice "required"): appended as the model's call and its
        result, the text discarded. It is a tool step; as a planned call, a failure of it
        does not count towards the errors-in-a-row abort (the model did not make it)."""
        log.info(
            "no tool call where one was required: the policy's read in its place",
            extra={"model": self._model_name(), "tool": read.name, "trace_id": self.req.trace_id},
        )
        arguments = json.dumps(read.arguments, ensure_ascii=False)
        await self._ours(messages, [(ToolCall(read.call_id, read.name, arguments), read)])

    # --- the loop's notes ------------------------------------------------------------------
    # The language note and the part of the final-answer note the conversation has no room
    # for ride on the conversation: they take what the total budget leaves past it and the
    # answer's share, then that share down to `min_answer`; a tool result's room leaves them
    # the rest. So every call fits LLM_SERVICE_MAX_TOTAL_TOKENS with an answer of at least
    # `min_answer` tokens, however much the tool results took.

    def _sent(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """`messages` as a call sends them: closed by the language note, a turn of its own.
        (Joined to a user turn before it, it changed what the bundled 1.5B model answers:
        "28" where a sentence in the question's language was asked for.)"""
        return messages if self.language_note is None else [*messages, self.language_note]

    def _language_tokens(self) -> int:
        """Tokens the language note adds to a call."""
        note = self.language_note
        return 0 if note is None else message_tokens(self.loop.tokenizer, note)

    def _spare(self) -> int:
        """Tokens the notes may ride on besides the conversation's room: the total budget's
        past the caller's context budget, and the answer's share down to `min_answer`."""
        b = self.budget
        return b.notes_room() - b.room() + b.max_completion_tokens - self.min_answer

    def _fit_language_note(self, messages: list[ChatMessage]) -> None:
        """Keep the language note that repeats the question only when it fits beside the
        first prompt; else it names the language alone."""
        if self.language_note is None:
            return
        if self._language_tokens() > self.budget.room() + self._spare():
            self.language_note = prompts.language_note(self.req.answer_language)

    def _notes_reserve(self) -> int:
        """Room a tool result leaves for the notes riding on the next call's conversation,
        past what `_spare` holds of them: the language note (as a turn of its own: a tool
        turn precedes it), and the final-answer note when this call takes the last step."""
        tok = self.loop.tokenizer
        riding = self.note_overflow
        if self.language_note is not None:
            riding += message_tokens(tok, self.language_note)
        if self.final_note is not None and self.steps + 1 >= self.max_steps:
            riding += message_tokens(tok, self.final_note)
        return max(0, riding - self._spare())

    def _close_tools(self, messages: list[ChatMessage], note: ChatMessage) -> list[ChatMessage]:
        """`messages` closed by the final-answer note, counted into the conversation as far
        as its room goes; the rest rides on it (`note_overflow`)."""
        self.final_note = None
        self.final_asked = True
        self.note_overflow += self.budget.add_note(note)
        return [*messages, note]

    def _answer_tokens(self, messages: list[ChatMessage]) -> int:
        """The next call's max_tokens: the answer's share less what of the notes the total
        budget has no room for; LLM_LIMIT_EXCEEDED when that leaves less than `min_answer`."""
        share = self.budget.before_call()
        riding = self.riding = self.note_overflow + self._language_tokens()
        max_tokens = share - max(0, riding - self.budget.notes_room())
        if max_tokens < self.min_answer:
            raise limit_exceeded(
                f"token budget spent: the conversation is {self.budget.conversation} tokens "
                f"and the service's notes {riding}, which leaves {max(0, max_tokens)} tokens "
                f"for the answer; at least {self.min_answer} are kept for it",
                "max_total_tokens",
                self.s.max_total_tokens,
            )
        return max_tokens

    def _tool_choice(self) -> str:
        if self.closed:
            return "none"
        # Only the first step, and only when the model has read nothing yet.
        first = self.budget.calls == 0 and not self.req.policy.planned_calls
        return "required" if first and self.req.policy.require_tool_call else "auto"

    def _prompt(self) -> list[ChatMessage]:
        anchors = self.req.policy.anchors if self.offered else ()

        def build(chunks: Sequence[Any]) -> list[ChatMessage]:
            return prompts.build_prompt(
                self.req,
                chunks,
                tools=self.offered,
                anchors=anchors,
                max_tool_calls=max(0, self.max_steps - len(self.req.policy.planned_calls)),
            )

        chunks = self.req.context_chunks if self.req.mode == prompts.RAG else ()
        messages, _kept = fit_prompt(
            build,
            chunks,
            tools=self.offered,
            limit=self.budget.prompt_limit,
            tokenizer=self.loop.tokenizer,
            render_chunk=prompts.render_chunk,
            limit_name=self.budget.prompt_limit_name(),
        )
        return messages

    # --- one model call -------------------------------------------------------------------

    def _left(self) -> float:
        left = self.deadline - self.loop.clock()
        if left <= 0:
            raise self._timeout()
        return left

    def _timeout(self) -> errors.ServiceError:
        if self.callers:
            return errors.DeadlineExceededError(
                f"the caller's deadline passed: {self.watchdog:g} s were left for the request "
                f"({self.steps} tool call(s) made)"
            )
        return errors.UnavailableError(
            f"Model timeout: the request took longer than {self.watchdog:g} s "
            f"({self.steps} tool call(s) made)",
            reason=LLM_RUNTIME_ERROR,
            metadata=errors.limit_metadata(self.watchdog, name="watchdog_s"),
        )

    async def _call(
        self,
        messages: list[ChatMessage],
        tools: Sequence[ToolSpec],
        params: Any,
        *,
        hold: bool = False,
    ) -> Completion:
        """One runtime call; streamed to the sink when there is one. `hold`: the step's text
        never reaches the sink (an answer then is withheld, and text beside a tool call may
        claim what the text read does not hold)."""
        left = self._left()
        runtime = self.loop.runtime
        messages = self._sent(messages)
        request = ChatRequest(messages, tools, params, self.req.model)
        final: Completion | None = None
        streamed: list[str] = []
        room = answer_chars(params.max_tokens)
        try:
            # This timer and the runtime client's own end at the same instant; the client
            # judges a call cut at its deadline the same, whichever fires first.
            async with asyncio.timeout(left):
                if self.sink.sink is None:
                    final = capped(await runtime.complete(request, timeout_s=left), room)
                    self.loop.observer.model_call(tuple(messages), final)
                    return final
                events = runtime.stream(request, timeout_s=left)
                left_chars = room
                try:
                    async for event in events:
                        if not isinstance(event, StreamDelta):
                            final = capped(event, room)
                            self.loop.observer.model_call(tuple(messages), final)
                            continue
                        text = event.text
                        if left_chars is not None:
                            text = text[:left_chars]
                            left_chars -= len(text)
                        streamed.append(text)
                        if text and not hold:
                            await self.sink.delta(text)
                        if text != event.text:
                            # A runtime that ignores max_tokens: the answer ends here.
                            final = Completion("".join(streamed), finish_reason=LENGTH)
                            self.loop.observer.model_call(tuple(messages), final)
                            break
                finally:
                    aclose = getattr(events, "aclose", None)
                    if aclose is not None:
                        await aclose()  # the runtime's stream ends now, not when collected
        except BaseException as exc:
            if final is None and _made(exc):
                # What a failed or cancelled call used counts too: the prompt sent, and the
                # text so far (both estimated, as no counts came).
                self.loop.observer.model_call(tuple(messages), Completion("".join(streamed)))
            if isinstance(exc, TimeoutError):
                raise self._timeout() from None
            raise
        if final is None:
            raise errors.UnavailableError(
                "the model's stream ended without a completion", reason=LLM_RUNTIME_ERROR
            )
        return final

    # --- one tool call --------------------------------------------------------------------

    async def _refuse(
        self, call: ToolCall, code: str, message: str, *, counts: bool
    ) -> ChatMessage:
        """The tool_error a refused call is answered with. The stream gets a tool_call event
        for it, as for an executed call: the event ends the step whose text was streamed."""
        log.info(
            "tool call refused",
            extra={"tool": call.name, "code": code, "trace_id": self.req.trace_id},
        )
        record = refused_record(call, code, message)
        await self.sink.tool_call(record)
        if counts:
            self._failed(record.name, code, models=True)  # the name as a status can carry it
        return error_message(call.id, call.name, code, message)

    def _failed(self, name: str, code: str, *, models: bool) -> None:
        """Count a tool error; the one that makes `max_consecutive_tool_errors` in a row
        aborts the request (llm-service.md §9.2) with the status of the last error.

        The request was within its limits (§9.3's LLM_LIMIT_EXCEEDED is not this): a rate
        limit, or ToolsProxy at its concurrency cap, is a 429 the caller can wait out
        (RESOURCE_EXHAUSTED, RATE_LIMIT_EXCEEDED or SERVER_BUSY); an error that is the
        model's (`models`: a call the loop refused, or one ToolsProxy answered with an error
        saying the model's own arguments were wrong, `_models_mistake`) is the model failing
        at its task (LLM_RUNTIME_ERROR, as §9.1's model errors); any other failed call is the
        tools failing it (UPSTREAM_UNAVAILABLE, ToolsProxy its `downstream`). Both are 502s.
        A tool's NOT_FOUND or ACCESS_DENIED is not passed on as the caller's 404 or 403: the
        missing document may be one the model named, the caller's request names nothing
        missing, and the Orchestrator would pass a 404 on as its own. The tool's code is in
        the metadata (`tool_error`), with the limit.

        The extractive responder's errors are not counted: it is no model that may keep
        failing, it tries at most MAX_SECTIONS_TRIED sections and then answers from what it
        has, saying what could not be read."""
        if self.extractive:
            return
        self.errors_in_a_row += 1
        if self.errors_in_a_row < self.s.max_consecutive_tool_errors:
            return
        message = f"{self.errors_in_a_row} tool errors in a row; the last: {name} {code}"
        metadata = {
            **errors.limit_metadata(
                self.s.max_consecutive_tool_errors, name="max_consecutive_tool_errors"
            ),
            "tool": name,
            "tool_error": code,
        }
        if code in (RATE_LIMIT_EXCEEDED, errors.SERVER_BUSY):
            metadata["downstream"] = TOOLS_DOWNSTREAM
            raise errors.ResourceExhaustedError(message, reason=code, metadata=metadata)
        if models:
            message += ", a call the model got wrong"
            raise errors.UnavailableError(message, reason=LLM_RUNTIME_ERROR, metadata=metadata)
        metadata["downstream"] = TOOLS_DOWNSTREAM
        raise errors.UnavailableError(message, reason=UPSTREAM_UNAVAILABLE, metadata=metadata)

    def _models_mistake(self, call: Approved, code: str) -> bool:
        """Whether ToolsProxy's error `code` for an executed `call` says the model's call was
        wrong: the document, section or page it named does not exist (NOT_FOUND), or its
        arguments are not what the tool takes (INVALID_ARGUMENT). Not when the policy chose
        what the call reads (a read, rewritten to one of the caller's anchors,
        `CallGate._read`): the caller found that section, so its NOT_FOUND is the store
        changed since, a failure of the tools. Any other code (UPSTREAM_UNAVAILABLE, a
        timeout, INTERNAL, ACCESS_DENIED: the request's identity, never the model's
        arguments; WINDOW_TOO_LARGE: the window is the policy's) is the tools' failure."""
        if code not in MODEL_MISTAKE_CODES:
            return False
        return not (call.name in READ_TOOLS and self.req.policy.anchors)

    async def _tool(self, call: ToolCall) -> ChatMessage:
        if self.closed or self.steps >= self.max_steps:
            self._close(STEP_LIMIT)
            message = (
                self._spent()
                if self.spent
                else f"no more tool calls in this request (at most {self.max_steps})"
            )
            return await self._refuse(call, TOOL_LIMIT_REACHED, message, counts=False)
        verdict = self.gate.review(call)
        if not isinstance(verdict, Approved):
            return await self._refuse(call, verdict.code, verdict.message, counts=True)
        if self.gate.is_repeat(verdict):
            # A runaway loop: the answer to this exact call is already in the conversation.
            self._close(REPEATED_CALL_GUARD)
            return await self._refuse(
                call, REPEATED_CALL,
                f"{verdict.name} was already called with these arguments; its result is above",
                counts=False,
            )  # fmt: skip
        return await self._run_approved(call, verdict, planned=False)

    async def _run_approved(
        self, call: ToolCall, verdict: Approved, *, planned: bool, share: int = 1
    ) -> ChatMessage:
        """Execute an approved call within the budget; its result (or tool_error) message.
        `share`: the calls (this one included) still to be fed from the room left, so a
        first planned result cannot crowd out the next. With no room for the result once
        something was read, a model's call is refused and the tools withdrawn (`_no_room`)."""
        if not planned and self._no_room(call):
            self._close(SPENT)
            return await self._refuse(call, TOOL_LIMIT_REACHED, self._spent(), counts=False)
        room = self._result_room(call, share=share)
        if room < self.s.min_tool_result_tokens:
            raise limit_exceeded(
                f"token budget spent: {max(room, 0)} tokens left for a tool result, the "
                f"conversation is {self.budget.conversation} tokens",
                self.budget.limit_name(),
                self.budget.conversation_limit,
            )
        result = await self._execute(verdict, planned=planned)
        self.steps += 1
        self.gate.record(verdict)
        if result.status == "ok":
            rendered = render_result(verdict.name, result.result or {}, self.loop.tokenizer, room)
            message = result_message(call.id, call.name, rendered.content)
            record = ToolCallRecord(
                verdict.name,
                verdict.arguments,
                summarise(result, rendered.truncated, rendered.texts),
            )
        else:
            message = error_message(call.id, call.name, result.error_code, result.error_message)
            record = ToolCallRecord(verdict.name, verdict.arguments, summarise(result))
        self.records.append(record)
        await self.sink.tool_call(record)
        if result.status == "ok":
            self.errors_in_a_row = 0
            self.read = True
        elif not planned:
            code = result.error_code
            self._failed(verdict.name, code, models=self._models_mistake(verdict, code))
        return message

    def _result_room(self, call: ToolCall, *, share: int = 1, pending: int = 0) -> int:
        """Tokens a result of `call` may take: its `share` of the room the conversation has
        left past `pending` tokens not yet counted into it and the notes' reserve, within
        max_tool_result_tokens, less what the result's message adds around its text."""
        room = (self.budget.room() - pending - self._notes_reserve()) // share
        frame = message_tokens(self.loop.tokenizer, result_message(call.id, call.name, ""))
        return min(room, self.s.max_tool_result_tokens) - frame

    def _no_room(self, call: ToolCall, *, pending: int = 0) -> bool:
        """Whether the budget is spent for a model's `call` (`_tool_turn`): something was
        read, and no minimal result of it fits beside `pending` tokens (its turn, when not yet
        counted). Once spent, it stays so: the refusals then ride on the conversation."""
        if not self.spent and self.read:
            room = self._result_room(call, pending=pending)
            self.spent = room < self.s.min_tool_result_tokens
        return self.spent

    def _spent(self) -> str:
        """The tool_error message of a call refused for the spent budget."""
        return (
            f"the token budget is spent ({self.budget.limit_name()} "
            f"{self.budget.conversation_limit}): no room for another tool result in this "
            "request; answer from the text already read"
        )

    # --- the caller's planned calls -------------------------------------------------------

    def _bad_plan(self, index: int, name: str, message: str) -> errors.InvalidArgumentError:
        return errors.InvalidArgumentError(
            f"tool_policy.planned_calls[{index}] ({name}): {message}",
            metadata={"field": PLANNED_FIELD, "index": str(index), "tool": name},
        )

    def _review_planned(self, planned: Sequence[PlannedCall]) -> list[tuple[ToolCall, Approved]]:
        """The planned calls as the gate approves them; a call the request may not make
        refuses the whole request (the caller's mistake, not the model's)."""
        allowed = set(self.req.policy.allowed_tools)
        for i, p in enumerate(planned):
            if p.tool_name not in allowed:
                raise self._bad_plan(i, p.tool_name, "the tool is not in tool_policy.allowed_tools")
        if self.req.user is None:
            raise errors.InvalidArgumentError(
                "planned tool calls need the user", metadata={"field": "user"}
            )
        if len(planned) > self.step_limit:
            raise limit_exceeded(
                f"{len(planned)} planned tool call(s), but at most {self.step_limit} tool "
                "call(s) in this request",
                STEP_LIMIT,
                self.step_limit,
                field=PLANNED_FIELD,
            )
        out: list[tuple[ToolCall, Approved]] = []
        seen: set[str] = set()
        for i, p in enumerate(planned):
            arguments = json.dumps(p.arguments, ensure_ascii=False)
            call = ToolCall(PLANNED_CALL_ID.format(i + 1), p.tool_name, arguments)
            verdict = self.gate.review(call)
            if not isinstance(verdict, Approved):
                message = (
                    "ToolsProxy offers no such tool"
                    if verdict.code == UNKNOWN_TOOL
                    else f"{verdict.code}: {verdict.message}"
                )
                raise self._bad_plan(i, p.tool_name, message)
            if verdict.key in seen:
                raise self._bad_plan(i, p.tool_name, "the same call is planned twice")
            seen.add(verdict.key)
            out.append((call, verdict))
        return out

    async def _planned(self, messages: list[ChatMessage]) -> None:
        """Run the planned calls in order; append them as one tool-call turn and results."""
        planned = self.req.policy.planned_calls
        if not planned:
            return
        await self._ours(messages, self._review_planned(planned))

    async def _ours(
        self, messages: list[ChatMessage], approved: list[tuple[ToolCall, Approved]]
    ) -> None:
        """Calls the loop makes itself (the caller's planned ones, the policy's read in place
        of an answer), run in order and appended as one tool-call turn and their results,
        exactly as if the model had made them: each a tool step, none counting towards the
        errors-in-a-row abort; each result may take its share of the room left."""
        turn = ChatMessage("assistant", "", tuple(call for call, _ in approved))
        messages.append(turn)
        self.budget.add(turn)
        for i, (call, verdict) in enumerate(approved):
            share = len(approved) - i
            messages.append(await self._run_approved(call, verdict, planned=True, share=share))
            self.budget.add(messages[-1])
        if self.steps >= self.max_steps:
            self._close(STEP_LIMIT)

    def tool_timeout(self, name: str, left: float) -> float:
        """The deadline of one call of tool `name`: the external tools' own (the bank,
        Tavily: 8-10 s, agent.md §7.2) or the other tools', never past the request's time
        `left`. ToolsProxy ends its outside calls a little before it (services.common.context)."""
        s = self.s
        own = s.external_tool_timeout_s if name in EXTERNAL_TOOLS else s.tool_timeout_s
        return min(own, left)

    async def _execute(self, call: Approved, *, planned: bool = False) -> ToolResult:
        user = self.req.user
        assert user is not None  # tools are offered only with a user
        left = self._left()
        timeout = self.tool_timeout(call.name, left)
        started = self.loop.clock()
        try:
            async with asyncio.timeout(left):
                result = await self._observed(call, user, timeout)
        except TimeoutError:
            raise self._timeout() from None
        except (errors.UnavailableError, errors.DeadlineExceededError):
            # ToolsProxy itself is down (the channel already retried): a downstream failure
            # the caller must see (502), not an answer composed without the documents.
            raise
        except errors.ServiceError as exc:
            # ToolsProxy refused the call: the model hears it as a tool error.
            result = ToolResult("error", error_code=exc.reason, error_message=exc.message)
        tool_ms = round((self.loop.clock() - started) * 1000)
        self.tool_ms.append(tool_ms)
        # A failed call stays at INFO; the ok ones are summed up by the request's INFO line.
        level = logging.DEBUG if result.status == "ok" else logging.INFO
        if log.isEnabledFor(level):
            log.log(
                level,
                "tool call",
                extra={
                    "tool": call.name,
                    "requested": call.requested,
                    "planned": planned,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                    "status": result.status,
                    "error_code": result.error_code,
                    "tool_ms": tool_ms,
                    "trace_id": self.req.trace_id,
                },
            )
        return result

    async def _observed(self, call: Approved, user: User, timeout_s: float) -> ToolResult:
        """ToolsProxy's answer to `call`, told to the loop's observer with its error code."""
        observer = self.loop.observer
        try:
            request = ToolRequest(call.name, call.arguments, user, self.req.trace_id)
            result = await self.loop.tools.execute(request, timeout_s=timeout_s)
        except errors.ServiceError as exc:
            observer.tool_call(call.name, exc.reason or "error")
            raise
        except TimeoutError:  # the runner's own deadline, not the request's (that cancels)
            observer.tool_call(call.name, "DEADLINE_EXCEEDED")
            raise
        observer.tool_call(call.name, "" if result.status == "ok" else result.error_code or "error")
        return result

    # --- the answer -----------------------------------------------------------------------

    def _model_name(self) -> str:
        return (
            self.model_name
            or self.req.model
            or self.s.default_model
            or getattr(self.loop.runtime, "name", "")
        )

    def _ungrounded(self, messages: list[ChatMessage]) -> list[str]:
        """The question's names that nothing read so far mentions, when an answer now would
        be withheld: a model's (the extractive responder applies the rule itself), in either
        mode (the Orchestrator's knowledge-base answers are "chat"), never a JSON answer to a
        `response_schema`."""
        if self.req.params.response_schema is not None:
            return []
        if self.extractive:
            return []
        return ungrounded_terms(self._sent(messages))

    async def _withhold(self, messages: list[ChatMessage], terms: list[str]) -> GenerateOutput:
        """The extractive answer in place of the model's, which named none of `terms` from
        the text read: it says the documents do not answer and quotes what was read, held to
        the caller's stop sequences and max_tokens as any extractive answer (`held`)."""
        p = self.req.params
        quoted = held(Completion(answer_without_model(self._sent(messages))), p.stop, p.max_tokens)
        answer = quoted.content
        log.info(
            "answer withheld",
            extra={"model": self._model_name(), "terms": terms, "trace_id": self.req.trace_id},
        )
        await self.sink.delta(answer)
        return replace(self._output(answer, quoted.finish_reason), withheld_for=tuple(terms))

    def _output(self, answer: str, ended: str = "stop") -> GenerateOutput:
        return GenerateOutput(
            answer=answer,
            finish_reason=ended,
            prompt_tokens=self.budget.prompt_used,
            completion_tokens=self.budget.completion_used,
            tools_called=tuple(self.records),
            model_name=self._model_name(),
            latency_ms=round((self.loop.clock() - self.started) * 1000),
            extractive=self.extractive,
            trace_id=self.req.trace_id,
            prompt_cached=self.prompt_cached,
            final_prompt_tokens=self.final_prompt,
            runtime_ms=0 if self.extractive else sum(self.step_ms),  # no model to wait for
            model_calls=self.budget.calls,
        )
