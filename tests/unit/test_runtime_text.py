"""What the runtime client takes from an answer is valid Unicode: JSON may escape an unpaired
surrogate ("\\ud800"), which json.loads keeps, and the tokenizer, protobuf and the document
stores refuse (services/model_runtime/chat.valid_text)."""

from __future__ import annotations

import json

import pytest

from services.common.tokenizer import count_tokens
from services.model_runtime.chat import valid_text
from services.model_runtime.client import StreamAssembler, parse_completion

LONE = json.loads('"a\\ud800b\\udfffc"')
"""As json.loads gives it: two unpaired surrogates."""


def test_unpaired_surrogates_become_the_replacement_character() -> None:
    assert valid_text(LONE) == "a\ufffdb\ufffdc"
    pair = json.loads('"\\ud83d\\ude00"')  # an escaped pair is joined: an emoji, kept
    assert valid_text(pair) == "\U0001f600"
    assert valid_text("ascii only") == "ascii only"
    assert valid_text("кириллица") == "кириллица"
    with pytest.raises((TypeError, UnicodeEncodeError, ValueError)):
        count_tokens(LONE)  # what the client keeps from the rest of the service


def test_a_whole_answer_s_text_and_tool_call_names_are_valid() -> None:
    payload = {
        "choices": [
            {
                "message": {
                    "content": LONE,
                    "tool_calls": [{"id": LONE, "function": {"name": LONE, "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    out = parse_completion(payload, model="m", json_mode=False)
    assert out.content == "a\ufffdb\ufffdc"
    assert (out.tool_calls[0].name, out.tool_calls[0].id) == ("a\ufffdb\ufffdc",) * 2
    count_tokens(out.content + out.tool_calls[0].name)


def test_a_json_mode_answer_s_text_is_valid() -> None:
    text = json.dumps({"answer": "x\\ud800y"}).replace("\\\\", "\\")  # {"answer": "x\ud800y"}
    payload = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
    out = parse_completion(payload, model="m", json_mode=True)
    assert out.content == "x\ufffdy"


def test_streamed_pieces_and_the_assembled_answer_are_valid() -> None:
    assembler = StreamAssembler(model="m")
    pieces = [
        assembler.feed({"choices": [{"index": 0, "delta": {"content": LONE}}]}),
        assembler.feed(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": 0, "id": "c1", "function": {"name": LONE}}]
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        ),
    ]
    assert pieces == ["a\ufffdb\ufffdc", ""]
    out = assembler.completion()
    assert out.content == "a\ufffdb\ufffdc" and out.tool_calls[0].name == "a\ufffdb\ufffdc"
