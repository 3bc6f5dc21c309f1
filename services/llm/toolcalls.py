"""Tool calls of the model: validate, apply the caller's policy, render results as messages.

A model's tool call goes through `CallGate.review`:

1. the tool must be offered (in the catalogue and in `policy.allowed_tools`);
2. its arguments must be a JSON object matching the tool's JSON schema, but for the window
   of a read (`POLICY_WINDOW_FIELDS`), which is the policy's to set: what the model wrote
   there is replaced, not checked (a radius past the schema's maximum reads the scheduled
   window, it is no tool_error);
3. the policy decides what is executed (docs/architecture.md §7, orchestrator.md §3.4–3.5): a read of a
   section (`read_chunk_window` or `read_doc_section`) goes to the policy's anchor for that
   section, as `read_chunk_window` when the anchor chunk is known and allowed, else as
   `read_doc_section`; the window radius follows `policy.radius_schedule` (1 → 2 → … → R,
   the last entry repeating) per anchor, never past the tool schema's `maximum`.

`CallGate.first_read` is the read the policy makes of its own for a model that answered a
step that had to read (orchestrator.md §3.3).

A rejected call is not an exception: it becomes a `tool_error` message fed back to the model.
Results are rendered as a JSON header line followed by their texts as delimited data.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.generate_contract import ToolCallRecord, failed_call_summary
from services.common.tokenizer import Tokenizer
from services.common.tool_args import ArgumentError, check_arguments
from services.common.tool_contract import (
    FETCH_CBR_DATA,
    INVALID_ARGUMENT,
    READ_CHUNK_WINDOW,
    READ_DOC_SECTION,
    READ_DOC_SECTION_ARGUMENTS,
    READ_DOC_SECTION_DESCRIPTION,
    READ_TOOLS,
    TEXT_FIELDS,
    read_chunk_window_arguments,
)
from services.common.untrusted import (
    MARKER_CHARS,
    is_wrapped,
    neutralise_markers,
    unwrap_untrusted,
    wrap_untrusted,
)
from services.llm.budget import count_tokens
from services.llm.model import Anchor, ToolPolicy, ToolResult
from services.llm.prompt import DelimitedText, delimited_blocks
from services.model_runtime.chat import ChatMessage, ToolCall, ToolSpec, valid_text

# Codes of the tool_error messages the loop feeds back to the model.
UNKNOWN_TOOL = "UNKNOWN_TOOL"
TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
INVALID_JSON = "INVALID_JSON"
SECTION_NOT_ALLOWED = "SECTION_NOT_ALLOWED"
REPEATED_CALL = "REPEATED_CALL"
TOOL_LIMIT_REACHED = "TOOL_LIMIT_REACHED"

MAX_ARGUMENTS_CHARS = 8192
"""Longer argument text is refused before parsing (a runaway generation, not a call)."""
MAX_REFUSED_NAME_CHARS = 64
"""A refused call's tool name is reported cut to this (the longest function name the OpenAI
API accepts): a model may write any text there."""
MIN_CUT_TEXT_TOKENS = 8
"""A tool result's text is cut to the room left only when at least this many of its tokens
remain; with less it is left out whole (a marker pair with a word or two in it tells the
model nothing)."""
POLICY_WINDOW_FIELDS = ("radius", "window_before", "window_after")
"""The arguments of a read that the policy sets (its radius schedule): the model's are
dropped before its call is checked against the tool's schema."""
MAX_ARGUMENTS_DEPTH = 20
"""Deeper nesting is refused: tool arguments are flat, and ToolsProxy's request (a Struct,
three protobuf levels per JSON level) must stay within protobuf's 100-level limit."""

READ_TOOL_SPECS = (
    ToolSpec(
        READ_CHUNK_WINDOW,
        "Read the chunks around an anchor chunk of a document: `radius` chunks on each side.",
        read_chunk_window_arguments({"type": "integer", "minimum": 0}),
    ),
    ToolSpec(READ_DOC_SECTION, READ_DOC_SECTION_DESCRIPTION, READ_DOC_SECTION_ARGUMENTS),
)
"""The two read tools, for when ToolsProxy's own catalogue (ListTools) is not at hand."""


# --- arguments as the model wrote them ----------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"arguments hold {name}, which is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"arguments hold {text}, too large for a number")
    return value


_MAX_DOUBLE = 1.7976931348623157e308


def _double_int(text: str) -> int:
    value = int(text)
    if abs(value) > _MAX_DOUBLE:
        raise ValueError("arguments hold an integer too large for a number")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, `{}` is 1)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            stack.extend(
                (v, level + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def parse_arguments(text: str) -> dict[str, Any]:
    """The arguments a model wrote, as a JSON object (empty text is `{}`); raises ValueError.

    Only what ToolsProxy's request (a protobuf Struct) can carry passes: no NaN or
    Infinity, no number beyond a double, no unpaired surrogate escape ("\\ud800"), no
    nesting deeper than MAX_ARGUMENTS_DEPTH.
    """
    if len(text) > MAX_ARGUMENTS_CHARS:
        raise ValueError(f"arguments are {len(text)} characters; at most {MAX_ARGUMENTS_CHARS}")
    if not text.strip():
        return {}
    try:
        value = json.loads(
            text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_double_int
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise ValueError("arguments are nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    if _depth(value) > MAX_ARGUMENTS_DEPTH:
        raise ValueError(f"arguments are nested more than {MAX_ARGUMENTS_DEPTH} levels deep")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("arguments hold an unpaired surrogate (not valid Unicode)") from None
    return value


# --- the policy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Approved:
    """A call to execute: what the model asked for and what the policy decided to run."""

    call_id: str
    requested: str
    name: str
    arguments: dict[str, Any]

    @property
    def key(self) -> str:
        """Identity of the executed call (name and canonical arguments)."""
        return self.name + json.dumps(self.arguments, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Rejected:
    """A call not executed, with the tool_error code and message the model gets back."""

    call_id: str
    name: str
    code: str
    message: str


@dataclass
class CallGate:
    """Reviews the tool calls of one request against the offered tools and the policy."""

    offered: Sequence[ToolSpec]
    policy: ToolPolicy
    _specs: dict[str, ToolSpec] = field(init=False)
    _reads: dict[tuple[str, str], int] = field(init=False, default_factory=dict)
    _done: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._specs = {s.name: s for s in self.offered}

    @property
    def names(self) -> list[str]:
        """The names of the offered tools."""
        return list(self._specs)

    def review(self, call: ToolCall) -> Approved | Rejected:
        """Approve `call` as the policy rewrites it, or reject it with a tool_error."""
        spec = self._specs.get(call.name)
        if spec is None:
            offered = ", ".join(self._specs) or "none"
            return Rejected(
                call.id, call.name, UNKNOWN_TOOL,
                f"there is no tool {call.name!r} in this request; the tools are: {offered}",
            )  # fmt: skip
        read = call.name in READ_TOOLS
        try:
            args = parse_arguments(call.arguments)
            if read:
                # The window is the policy's (orchestrator.md §3.5): the model's is replaced.
                args = {k: v for k, v in args.items() if k not in POLICY_WINDOW_FIELDS}
            args = check_arguments(spec.parameters, args)
        except ArgumentError as exc:
            return Rejected(call.id, call.name, INVALID_ARGUMENT, str(exc))
        except ValueError as exc:
            return Rejected(call.id, call.name, INVALID_JSON, str(exc))
        if read:
            return self._read(call, args)
        return Approved(call.id, call.name, call.name, args)

    def first_read(self, call_id: str) -> Approved | None:
        """The read the policy schedules for its top anchor (anchors come best first), as if
        the model had asked for it: for a model that answered a step that had to read
        (orchestrator.md §3.3). None when the policy lists no anchor or may not read it."""
        if not self.policy.anchors:
            return None
        anchor = self.policy.anchors[0]
        asked = READ_CHUNK_WINDOW if anchor.anchor_chunk_id else READ_DOC_SECTION
        verdict = self._at(anchor, call_id, asked)
        return verdict if isinstance(verdict, Approved) else None

    def _anchor_for(self, args: Mapping[str, Any]) -> Anchor | None:
        doc_id = args.get("doc_id")
        same_doc = [a for a in self.policy.anchors if a.doc_id == doc_id]
        chunk_id, section_id = args.get("anchor_chunk_id"), args.get("section_id")
        for a in same_doc:
            if chunk_id and a.anchor_chunk_id == chunk_id:
                return a
        for a in same_doc:
            if section_id and a.section_id == section_id:
                return a
        # A chunk or section of an allowed document the policy has no anchor for: the
        # policy reads the document's best section instead (anchors come best first).
        return same_doc[0] if same_doc else None

    def _read(self, call: ToolCall, args: dict[str, Any]) -> Approved | Rejected:
        if self.policy.anchors:
            anchor = self._anchor_for(args)
            if anchor is None:
                listed = ", ".join(sorted({a.doc_id for a in self.policy.anchors}))
                return Rejected(
                    call.id, call.name, SECTION_NOT_ALLOWED,
                    f"document {args.get('doc_id')!r} is not among the sections this request "
                    f"may read (documents: {listed})",
                )  # fmt: skip
        else:
            anchor = Anchor(
                str(args["doc_id"]),
                str(args.get("section_id", "")),
                str(args.get("anchor_chunk_id", "")),
            )
        return self._at(anchor, call.id, call.name)

    def _at(self, anchor: Anchor, call_id: str, asked: str) -> Approved | Rejected:
        """The read of `anchor` the policy executes for a call of tool `asked`."""
        allowed = set(self.policy.allowed_tools) & set(self._specs)
        if anchor.anchor_chunk_id and READ_CHUNK_WINDOW in allowed:
            radius = self._radius(anchor)
            return Approved(
                call_id, asked, READ_CHUNK_WINDOW,
                {"doc_id": anchor.doc_id, "anchor_chunk_id": anchor.anchor_chunk_id,
                 "radius": radius},
            )  # fmt: skip
        if anchor.section_id and READ_DOC_SECTION in allowed:
            return Approved(
                call_id, asked, READ_DOC_SECTION,
                {"doc_id": anchor.doc_id, "section_id": anchor.section_id},
            )  # fmt: skip
        return Rejected(
            call_id, asked, TOOL_NOT_ALLOWED,
            f"{anchor.doc_id!r} has no anchor chunk and no section this request may read "
            f"with {', '.join(sorted(allowed))}",
        )  # fmt: skip

    def _radius(self, anchor: Anchor) -> int:
        schedule = self.policy.radius_schedule or (1,)
        reads = self._reads.get((anchor.doc_id, anchor.anchor_chunk_id), 0)
        radius = schedule[min(reads, len(schedule) - 1)]
        # Never ask more than the proxy allows (docs/architecture.md §8): its schema states the maximum.
        props = self._specs[READ_CHUNK_WINDOW].parameters.get("properties", {})
        cap = props.get("radius", {}).get("maximum")
        return min(radius, int(cap)) if isinstance(cap, int | float) else radius

    def is_repeat(self, call: Approved) -> bool:
        """Whether the same call with the same arguments already ran in this request."""
        return call.key in self._done

    def record(self, call: Approved) -> None:
        """Note an executed call: the next read of its anchor takes the next radius."""
        self._done.add(call.key)
        if call.name == READ_CHUNK_WINDOW:
            key = (str(call.arguments["doc_id"]), str(call.arguments["anchor_chunk_id"]))
            self._reads[key] = self._reads.get(key, 0) + 1


# --- results as messages ------------------------------------------------------------------------


def error_content(name: str, code: str, message: str) -> str:
    """The `tool_error` a failed or refused call answers the model with (llm-service.md §9.2)."""
    body = {"tool_name": name, "status": "error", "tool_error": {"code": code, "message": message}}
    return json.dumps(body, ensure_ascii=False)


def error_message(call_id: str, name: str, code: str, message: str) -> ChatMessage:
    """A tool message carrying a tool_error."""
    return ChatMessage("tool", error_content(name, code, message), tool_call_id=call_id, name=name)


def _wire_text(text: str, max_chars: int | None = None) -> str:
    """`text` as a proto string carries it: valid UTF-8 (`valid_text`), at most `max_chars`
    characters."""
    text = valid_text(text)
    if max_chars is not None and len(text) > max_chars:
        return text[: max_chars - 1] + "…"
    return text


def refused_record(call: ToolCall, code: str, message: str) -> ToolCallRecord:
    """The stream's tool_call event of a call the loop refused: the tool as the model named it
    (MAX_REFUSED_NAME_CHARS at most), its arguments when they are a JSON object ToolsProxy's
    request could carry (else none), and the tool_error the model gets back."""
    try:
        arguments = parse_arguments(call.arguments)
    except ValueError:
        arguments = {}
    return ToolCallRecord(
        _wire_text(call.name, MAX_REFUSED_NAME_CHARS),
        arguments,
        _wire_text(failed_call_summary(code, message)),
    )


@dataclass(frozen=True)
class RenderedResult:
    """A tool result as message content, and whether its texts were cut to the budget."""

    content: str
    truncated: bool
    texts: tuple[str, ...] = field(default=(), compare=False)
    """The result's texts as delimited for the content (before any cut), for `summarise`."""


_PLACEHOLDER = "[text {} below]"
_PLACEHOLDER_RE = re.compile(re.escape(_PLACEHOLDER).replace(re.escape("{}"), r"(\d+)"))


def _neutralised(value: str) -> str:
    """`neutralise_markers(value)`, skipping the regex for the many strings with no `<`."""
    for c in MARKER_CHARS:
        if c in value:
            return neutralise_markers(value)
    return value


def _split_texts(value: Any, texts: list[str], key: str = "") -> Any:
    """A copy of `value` with its text fields replaced by placeholders, texts collected.

    A text field (TEXT_FIELDS) is always delimited data; so is any string ToolsProxy
    delimited, whatever its key (an external result's headline, EXTERNAL_LABEL_FIELDS): it
    reaches the model only inside the delimiters, never in the JSON header.
    """
    if isinstance(value, Mapping):
        return {k: _split_texts(v, texts, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_split_texts(v, texts) for v in value]
    if isinstance(value, str):
        if key in TEXT_FIELDS or is_wrapped(value):
            # ToolsProxy wraps texts; anything that arrives bare is delimited here.
            wrapped = (
                value if is_wrapped(value) else wrap_untrusted(_neutralised(value), "DOCUMENT")
            )
            texts.append(wrapped)
            return _PLACEHOLDER.format(len(texts))
        return _neutralised(value)
    return value


def _map_placeholders(value: Any, replace: Callable[[int, str], Any]) -> Any:
    """`value` (a result header, parsed JSON) with each `[text N below]` placeholder string
    replaced by `replace(N, the placeholder)`."""
    if isinstance(value, dict):
        return {k: _map_placeholders(v, replace) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_placeholders(v, replace) for v in value]
    if isinstance(value, str) and (m := _PLACEHOLDER_RE.fullmatch(value)):
        return replace(int(m.group(1)), value)
    return value


def fill_placeholders(value: Any, texts: Sequence[DelimitedText]) -> Any:
    """A result header (`render_result`) with each `[text N below]` placeholder replaced by
    its text, unwrapped: the inverse of `_split_texts`."""
    return _map_placeholders(
        value,
        lambda n, held: unwrap_untrusted(texts[n - 1].text) if 0 < n <= len(texts) else held,
    )


def _cut_block(block: str, max_tokens: int, tokenizer: Tokenizer) -> str | None:
    """`block` cut to `max_tokens` with its markers kept; None when fewer than
    MIN_CUT_TEXT_TOKENS of its text would remain."""
    head, _, rest = block.partition("\n")
    inner, _, tail = rest.rpartition("\n")
    frame = tokenizer.count(head) + tokenizer.count(tail) + 2
    if max_tokens - frame < MIN_CUT_TEXT_TOKENS:
        return None
    kept = tokenizer.truncate(inner, max_tokens - frame).rstrip()
    return f"{head}\n{kept}…\n{tail}"


def _fit_blocks(blocks: Sequence[str], budget: int, tokenizer: Tokenizer) -> dict[int, str]:
    """The blocks kept within `budget` tokens, by index: each whole while it fits; the first
    that does not is cut to the room left when enough of its text fits, and spends it;
    a block that neither fits nor can be cut is left out, and a later, shorter one may fit."""
    kept: dict[int, str] = {}
    for i, block in enumerate(blocks):
        cost = count_tokens(tokenizer, block) + 1
        if cost <= budget:
            kept[i] = block
            budget -= cost
            continue
        cut = _cut_block(block, budget, tokenizer)
        if cut is not None:
            kept[i] = cut
            return kept
    return kept


def _renumbered(value: Any, numbers: Mapping[int, int]) -> Any:
    """A result header with each `[text N below]` placeholder renumbered to `numbers[N]`,
    or emptied when text N was left out."""
    return _map_placeholders(
        value, lambda n, _: _PLACEHOLDER.format(numbers[n]) if numbers.get(n) else ""
    )


def _cut_content(
    header: dict[str, Any], texts: Sequence[str], kept: Mapping[int, str], compact: bool
) -> str:
    """The content of a result cut to `kept` texts: the header (its placeholders renumbered,
    the texts left out counted) and the kept texts in order."""
    order = sorted(kept)
    numbers = {i + 1: rank + 1 for rank, i in enumerate(order)}
    line: dict[str, Any] = {"tool_name": header["tool_name"], "status": "ok"}
    if not compact:
        line["result"] = _renumbered(header["result"], numbers)
    line["truncated"] = True
    if omitted := len(texts) - len(kept):
        line["omitted"] = omitted
    return "\n".join([json.dumps(line, ensure_ascii=False), *(kept[i] for i in order)])


MIN_THINNED_ITEMS = 2
"""A thinned series keeps at least its first and last values; when not even those fit, the
result is cut as any other (`render_result`)."""


def _series_items(name: str, result: Any) -> list[Mapping[str, Any]] | None:
    """The dated values of a fetch_cbr_data series result (rate dynamics, the key rate over a
    range), oldest first as ToolsProxy sorts them; None for any other result."""
    if name != FETCH_CBR_DATA or not isinstance(result, Mapping):
        return None
    items = result.get("items")
    if not isinstance(items, list) or len(items) <= MIN_THINNED_ITEMS:
        return None
    if not all(isinstance(i, Mapping) and "date" in i and "value" in i for i in items):
        return None
    return items


def series_value(item: Mapping[str, Any]) -> float | None:
    """A rate series item's `value` when it is a finite number (the tool's contract), else
    None: the one reading of it for thinning a series and for answering from one."""
    value = item.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _spread(indices: Sequence[int]) -> list[int]:
    """`indices` ordered so that every prefix spreads evenly over them: both ends, then the
    middle, then the quarters, and so on."""
    if not indices:
        return []
    order = [indices[0], indices[-1]]
    halves = deque([(0, len(indices) - 1)])
    while halves:
        lo, hi = halves.popleft()
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        order.append(indices[mid])
        halves.extend(((lo, mid), (mid, hi)))
    return order


def _thinning_order(items: Sequence[Mapping[str, Any]]) -> list[int]:
    """The indices of a series' items, the most telling first: the first and the last, the
    lowest and the highest value, each change of value (spread over the period), then the
    rest spread evenly. The first k of them are the k items a thinned series keeps."""
    values = [series_value(i) for i in items]
    numbered = {i: v for i, v in enumerate(values) if v is not None}
    ends = [0, len(items) - 1]
    if numbered:
        ends += [min(numbered, key=numbered.__getitem__), max(numbered, key=numbered.__getitem__)]
    changes = [i for i in range(1, len(items)) if values[i] != values[i - 1]]
    return list(dict.fromkeys([*ends, *_spread(changes), *_spread(range(len(items)))]))


def _thinned_series(
    name: str, header: Mapping[str, Any], texts: Sequence[str], tokenizer: Tokenizer,
    max_tokens: int,
) -> RenderedResult | None:  # fmt: skip
    """A series result of fetch_cbr_data that does not fit, within `max_tokens` with its
    header and texts whole and as many of its items as fit (`_thinning_order`, kept in date
    order), the number left out in `items_omitted`; None when it is no such series or not
    even MIN_THINNED_ITEMS of its items fit."""
    result = header["result"]
    items = _series_items(name, result)
    if items is None:
        return None
    order = _thinning_order(items)

    def content(k: int) -> str:
        kept = [items[i] for i in sorted(order[:k])]
        thinned = {**result, "items": kept, "items_omitted": len(items) - k}
        line = {"tool_name": name, "status": "ok", "result": thinned, "truncated": True}
        return "\n".join([json.dumps(line, ensure_ascii=False), *texts])

    lo, hi = MIN_THINNED_ITEMS, len(items) - 1
    if tokenizer.count(content(lo)) > max_tokens:
        return None
    while lo < hi:  # the most items that fit: each one kept adds tokens
        mid = (lo + hi + 1) // 2
        if tokenizer.count(content(mid)) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return RenderedResult(content(lo), True, tuple(texts))


def render_result(
    name: str, result: Mapping[str, Any], tokenizer: Tokenizer, max_tokens: int
) -> RenderedResult:
    """Result content within `max_tokens`: a JSON header line, then its texts as data.

    The header holds the result with each text replaced by `[text N below]`; the texts
    follow in order, delimited. When the whole does not fit, the texts are kept whole in
    order while they fit, the first that does not is cut (its markers stay), and the texts
    with no room left are left out whole: the header says `"truncated": true`, counts them
    in `"omitted"`, and their placeholders are empty. A header whose metadata would crowd out
    the text keeps only the tool's name, the status and those two fields.

    A series of dated values of fetch_cbr_data (rate dynamics, the key rate over a range) is
    thinned instead: its header and texts stay whole, its items keep the first and last
    values, the lowest and highest, the changes and an even spread of the rest, as many as
    fit, and `"items_omitted"` in the result counts the others (`_thinned_series`).
    """
    texts: list[str] = []
    header: dict[str, Any] = {
        "tool_name": name,
        "status": "ok",
        "result": _split_texts(result, texts),
    }
    whole = "\n".join([json.dumps(header, ensure_ascii=False), *texts])
    # Counted through the shared cache: the result message is counted again when added.
    if count_tokens(tokenizer, whole) <= max_tokens:
        return RenderedResult(whole, False, tuple(texts))
    if thinned := _thinned_series(name, header, texts, tokenizer, max_tokens):
        return thinned
    # The header line is priced as it reads with every text kept; leaving texts out changes
    # it by a few tokens, which the loop below settles.
    line = json.dumps({**header, "truncated": True}, ensure_ascii=False)
    compact = tokenizer.count(line) > max_tokens // 2  # metadata would crowd out the text
    if compact:
        line = _cut_content(header, (), {}, compact)
    budget = max_tokens - tokenizer.count(line) - 1
    kept = _fit_blocks(texts, budget, tokenizer)
    while True:
        content = _cut_content(header, texts, kept, compact)
        over = tokenizer.count(content) - max_tokens
        if over <= 0 or not kept:
            break
        # Token counts of joined text differ by a token or two from the parts' sum.
        budget -= over
        kept = _fit_blocks(texts, budget, tokenizer)
    if over > 0:  # not even the header line fits
        content = tokenizer.truncate(content, max_tokens)
    return RenderedResult(content, True, tuple(texts))


def result_message(call_id: str, name: str, content: str) -> ChatMessage:
    """A tool message answering call `call_id`."""
    return ChatMessage("tool", content, tool_call_id=call_id, name=name)


@dataclass(frozen=True)
class ToolContent:
    """A tool message read back: status, error or result header, and its delimited texts."""

    name: str
    ok: bool
    result: dict[str, Any]
    texts: list[DelimitedText]
    error_code: str = ""
    error_message: str = ""


def parse_tool_content(content: str) -> ToolContent | None:
    """A tool message's content as `render_result` / `error_content` wrote it (else None)."""
    first, _, rest = content.partition("\n")
    try:
        header = json.loads(first)
    except json.JSONDecodeError:
        return None
    if not isinstance(header, dict):
        return None
    name = str(header.get("tool_name", ""))
    if header.get("status") == "error":
        err = header.get("tool_error")
        err = err if isinstance(err, dict) else {}
        return ToolContent(
            name, False, {}, [], str(err.get("code", "")), str(err.get("message", ""))
        )
    result = header.get("result")
    return ToolContent(
        name, True, result if isinstance(result, dict) else {}, delimited_blocks(rest)
    )


def summarise(
    result: ToolResult, truncated: bool = False, texts: Sequence[str] | None = None
) -> str:
    """The `result_summary` of a tools_called entry; `texts`: the result's delimited texts
    when already split (`RenderedResult.texts`), else they are split here."""
    if result.status != "ok":
        return failed_call_summary(result.error_code, result.error_message)
    r = result.result or {}
    if texts is None:
        found: list[str] = []
        _split_texts(r, found)
        texts = found
    size = sum(len(unwrap_untrusted(t)) for t in texts)
    where = str(r.get("doc_id") or r.get("document_id") or "")
    pages = ""
    if r.get("page_start") is not None and r.get("page_end") is not None:
        pages = f" (pp. {r.get('page_start')}–{r.get('page_end')})"
    cut = ", truncated to the token budget" if truncated else ""
    if texts:
        return f"read {size} characters of {where or 'the result'}{pages}{cut}"
    return f"ok: {', '.join(sorted(r))[:200]}{cut}"
