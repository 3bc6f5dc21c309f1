"""The delimited-block and anchor-line formats: one writer and one reader each, in agreement.

Blocks, their attributes and the `pages` attribute are services/common/untrusted.py's; the
anchor line is services/common/prompt_limits.py's. The LLM prompt, the extractive responder
and ToolsProxy write and read through them.
"""

from __future__ import annotations

import pytest

from services.common.prompt_limits import anchor_line, parse_anchor_line
from services.common.untrusted import (
    delimited_blocks,
    format_pages,
    is_wrapped,
    parse_attrs,
    parse_pages,
    strip_delimited,
    unwrap_untrusted,
    wrap_untrusted,
)
from services.llm.extractive import ExtractiveRuntime, _question
from services.llm.model import ContextChunk, GenerateInput, Turn, User
from services.llm.prompt import ANCHORS_HEADER, build_prompt, listed_anchors, render_chunk
from services.model_runtime.chat import ChatMessage
from services.toolsproxy.tools import shape_result

# --- blocks: one kind pattern for the writer and both readers ----------------------------------


def test_a_kind_with_an_underscore_is_one_block_to_every_reader():
    text = wrap_untrusted("data", "CALLER_DATA", {"doc_id": "d"})
    assert is_wrapped(text) and is_wrapped(text, "CALLER_DATA")
    assert unwrap_untrusted(text) == "data"
    [block] = delimited_blocks(text)
    assert (block.kind, block.attrs, block.text) == ("CALLER_DATA", {"doc_id": "d"}, "data")


@pytest.mark.parametrize("kind", ["document", "DOC-1", "_DOC", "", "DOC UMENT"])
def test_wrap_refuses_a_kind_the_readers_would_not_find(kind):
    with pytest.raises(ValueError):
        wrap_untrusted("x", kind)


def test_wrap_refuses_an_attribute_name_the_readers_would_not_find():
    with pytest.raises(ValueError):
        wrap_untrusted("x", "DOCUMENT", {"doc id": "d"})


@pytest.mark.parametrize(
    "text",
    [
        "<<<DOCUMENTX>>>\nx\n<<<END DOCUMENT>>>",
        "<<<DOCUMENT_X>>>\nx\n<<<END DOCUMENT>>>",
        '<<<DOCUMENTdoc_id="d">>>\nx\n<<<END DOCUMENT>>>',
    ],
)
def test_a_kind_ends_where_its_marker_says(text):
    assert not is_wrapped(text) and unwrap_untrusted(text) == text
    assert delimited_blocks(text) == [] and strip_delimited(text) == text


@pytest.mark.parametrize(
    "text",
    [
        wrap_untrusted("a\nb", "EXTERNAL"),
        wrap_untrusted("x", "CONTEXT", {"doc_id": 'd">>>', "pages": 3}),
        wrap_untrusted("", "QUERY"),
        "<<<DOCUMENT>>>\nx\n<<<END EXTERNAL>>>",
        "plain text",
    ],
)
def test_the_whole_text_reader_and_the_block_finder_agree(text):
    blocks = delimited_blocks(text)
    whole = len(blocks) == 1 and strip_delimited(text) == ""
    assert is_wrapped(text) == whole
    if whole:
        assert unwrap_untrusted(text) == blocks[0].text


def test_attributes_read_back_as_written_with_unsafe_characters_replaced():
    text = wrap_untrusted("x", "DOCUMENT", {"doc_id": 'a"b<c>', "n": 7, "url": "https://x/?q=1"})
    head = text.split("\n")[0].removeprefix("<<<DOCUMENT").removesuffix(">>>")
    assert parse_attrs(head) == {"doc_id": "a_b_c_", "n": "7", "url": "https://x/?q=1"}


# --- pages: one formatter, one parser; the prompt and ToolsProxy write the same ----------------


@pytest.mark.parametrize(
    ("first", "last", "attr", "read"),
    [
        (3, 3, "3", (3, 3)),
        (3, 5, "3-5", (3, 5)),
        (3, 0, "3", (3, 3)),
        (5, 3, "5", (5, 5)),
        (0, 0, None, (0, 0)),
        (0, 5, None, (0, 0)),
        ("4", "6", "4-6", (4, 6)),
        ("iv", None, None, (0, 0)),
        (True, None, None, (0, 0)),
    ],
)
def test_pages_are_written_and_read_back(first, last, attr, read):
    assert format_pages(first, last) == attr
    assert parse_pages(attr or "") == read


@pytest.mark.parametrize("attr", ["", "0", "0-5", "x", "3-", "-3", "3-5-7"])
def test_pages_no_writer_writes_name_no_page(attr):
    assert parse_pages(attr) == (0, 0)


def _tools_pages(result: dict) -> str | None:
    [text] = _texts(shape_result(result, 10_000, "document").result)
    return delimited_blocks(text)[0].attrs.get("pages")


def _texts(value):
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "text":
                yield v
            else:
                yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)


@pytest.mark.parametrize(("first", "last"), [(0, 0), (3, 3), (3, 5), (0, 5), (5, 0), (5, 3)])
def test_the_prompt_and_toolsproxy_write_the_same_pages(first, last):
    chunk = render_chunk(ContextChunk("d", "s", "x", first, last))
    prompt_pages = delimited_blocks(chunk)[0].attrs.get("pages")
    tools = _tools_pages({"doc_id": "d", "page_start": first, "page_end": last, "text": "x"})
    assert prompt_pages == tools == format_pages(first, last)


def test_an_object_with_no_known_page_does_not_take_its_parents_pages():
    result = {"doc_id": "d", "page_start": 3, "page_end": 5,
              "items": [{"page": 0, "text": "a"}, {"page": 4, "text": "b"}, {"text": "c"}]}  # fmt: skip
    texts = list(_texts(shape_result(result, 10_000, "document").result))
    pages = [delimited_blocks(t)[0].attrs.get("pages") for t in texts]
    assert pages == [None, "4", "3-5"]


@pytest.mark.parametrize(("first", "last", "cited"), [(3, 5, "pp. 3–5"), (6, 6, "p. 6")])
def test_the_extractive_responder_cites_the_pages_the_prompt_wrote(first, last, cited):
    req = GenerateInput(
        messages=(Turn("user", "How do I set up LDAP?"),),
        user=User("t1", "u1"),
        system_prompt="You are Visior. Answer in English.",
        context_chunks=(ContextChunk("guide", "s1", "To set up LDAP open Settings.", first, last),),
    )
    answer = ExtractiveRuntime().respond(build_prompt(req), ()).content
    assert cited in answer


def test_a_caller_tool_turn_is_not_the_question_but_a_look_alike_user_turn_is():
    req = GenerateInput(
        messages=(Turn("user", "How do I set up LDAP?"), Turn("tool", "LDAP data")),
        user=User("t1", "u1"),
    )
    assert _question(build_prompt(req)) == "How do I set up LDAP?"
    typed = ChatMessage("user", "<<<EXTERNAL markers: what are they?")
    assert _question([*build_prompt(req), typed]) == typed.content


# --- the anchor line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        ("guide", "s1", "guide:c3"),
        ('d"x', "s\\2", ""),
        ("док\u2028умент", "line\nbreak", "tab\there"),
    ],
)
def test_an_anchor_line_reads_back_as_written(values):
    line = anchor_line(*values)
    assert "\n" not in line and parse_anchor_line(line) == values


@pytest.mark.parametrize(
    "line",
    [
        '- doc_id="\\q" section_id="" anchor_chunk_id=""',
        '- doc_id="a" section_id="b"',
        ' - doc_id="a" section_id="b" anchor_chunk_id="c"',
        'doc_id="a" section_id="b" anchor_chunk_id="c"',
    ],
)
def test_other_lines_are_not_anchor_lines(line):
    assert parse_anchor_line(line) is None


def test_a_malformed_anchor_line_ends_the_list_instead_of_failing():
    system = "\n".join(
        [
            ANCHORS_HEADER,
            anchor_line("a", "s", "c"),
            '- doc_id="\\q" section_id="" anchor_chunk_id=""',
        ]
    )
    assert [(a.doc_id, a.section_id, a.anchor_chunk_id) for a in listed_anchors(system)] == [
        ("a", "s", "c")
    ]
