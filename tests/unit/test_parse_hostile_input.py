"""Parsing stays linear on hostile input: a heading line, a long section, a CSV header.

Each input here took seconds to hours with the quadratic or worse code these fixes
replaced; the tests check what comes out (the time is the benchmarks' business)."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

import pytest

from services.common import lexical
from services.docstore.errors import KnowledgeBaseError
from services.docstore.kb_csv import SNIFF_CHARS, read_knowledge_base_csv
from services.docstore.parsing import _md_heading, parse_document
from services.docstore.summaries import _WORD, ExtractiveSummarizer

_OLD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _old_heading(line: str) -> tuple[int, str] | None:
    m = _OLD_HEADING.match(line)
    return (len(m.group(1)), m.group(2).strip()) if m else None


def test_headings_read_as_the_backtracking_pattern_read_them():
    # Every stripped line of up to 7 of these characters whose text is not all closing #s.
    for n in range(1, 8):
        for chars in itertools.product("# a\tb", repeat=n):
            line = "".join(chars).strip()
            old = _old_heading(line)
            if old is not None and not old[1].strip("# \t"):
                continue  # "# ##": a heading of closing marks only, kept whole now
            assert _md_heading(line) == old, repr(line)


def test_a_heading_with_a_long_run_of_inner_spaces_is_one_heading():
    line = "# a" + " " * 20_000 + "b ##"
    assert _md_heading(line) == (1, "a" + " " * 20_000 + "b")
    doc = parse_document(
        tenant_id="t", doc_id="d", content=f"{line}\n\nText under it.\n".encode(), fmt="markdown"
    )
    assert doc.title.startswith("a")  # the heading titles the document (cut to its bound)
    assert any("Text under it." in c.text for c in doc.chunks)


def _old_ranking(text: str) -> list[int]:
    sentences = lexical.sentences(text)
    whole = Counter(w.lower() for w in _WORD.findall(text))

    def cosine(sentence: str) -> float:
        words = Counter(w.lower() for w in _WORD.findall(sentence))
        if not words:
            return 0.0
        dot = sum(n * whole[w] for w, n in words.items())
        norm = math.sqrt(sum(n * n for n in words.values())) * math.sqrt(
            sum(n * n for n in whole.values())
        )
        return dot / norm if norm else 0.0

    return sorted(range(1, len(sentences)), key=lambda i: (-cosine(sentences[i]), i))


@pytest.mark.parametrize("sentences", [3, 40, 400])
def test_summaries_pick_the_sentences_they_picked_before(sentences):
    words = ["кластер", "узел", "сервер", "backup", "restore", "диск", "сеть", "policy"]
    text = " ".join(
        f"{words[i % 8].capitalize()} {words[(i * 3) % 8]} {words[(i * 5 + 1) % 8]} {i}."
        for i in range(sentences)
    )
    summarizer = ExtractiveSummarizer(max_sentences=3)
    picked = summarizer.summarize("T", text, 10_000)
    split = lexical.sentences(text)
    expected = sorted([0, *_old_ranking(text)[:2]])
    assert picked == " ".join(split[i] for i in expected)


def test_a_section_of_many_distinct_sentences_is_summarised():
    # 20,000 sentences of distinct words: ~8 hours with the norm counted a sentence.
    text = " ".join(f"Xy {100_000 + i}." for i in range(20_000))
    summary = ExtractiveSummarizer(max_sentences=2).summarize("T", text, 200)
    assert summary.startswith("Xy 100000.")


def test_a_knowledge_base_header_is_sniffed_from_its_first_characters_only():
    # A 1 MB first line: the sniffer reads SNIFF_CHARS of it, then the header is judged whole.
    header = ',"' * 500_000
    with pytest.raises(KnowledgeBaseError) as info:
        read_knowledge_base_csv(f"{header}\nx\n".encode(), tenant_id="__knowledge_base__")
    assert "title" in str(info.value)  # the missing required columns are named
    # A semicolon header longer than the sample is still split on semicolons.
    names = ["title", "content", "topic", "jurisdiction", "updated_at"]
    padded = ";".join([*names, "x" * SNIFF_CHARS])
    row = ";".join(["T", "Body text.", "vat", "RU", "2025-01-01", "pad"])
    docs = read_knowledge_base_csv(f"{padded}\n{row}\n".encode(), tenant_id="__knowledge_base__")
    assert [d.title for d in docs.strict()] == ["T"]
