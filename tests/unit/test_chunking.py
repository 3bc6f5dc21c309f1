"""chunking: consecutive chunks read as one text (join_chunks); words longer than a chunk
and paragraphs of any length cut without losing a character."""

from __future__ import annotations

import random

import pytest

from services.common.tokenizer import count_tokens, default_tokenizer
from services.docstore import chunking
from services.docstore.chunking import (
    ChunkingConfig,
    Paragraph,
    chunk_paragraphs,
    iter_split,
    join_chunks,
)


@pytest.mark.parametrize(
    ("texts", "joined"),
    [
        ((), ""),
        (("Only one.",), "Only one."),
        # The chunker repeats whole trailing sentences: the text goes on after them.
        (("Backups run nightly. They take an hour.", "They take an hour. Restore with tar."),
         "Backups run nightly. They take an hour. Restore with tar."),
        # A token-count cut inside a sentence (at least 12 characters shared) is overlap too.
        (("Run it to update the chroot and build the packages:",
          "update the chroot and build the packages:\n\n$ sudo pbuilder --update"),
         "Run it to update the chroot and build the packages:\n\n$ sudo pbuilder --update"),
        # No overlap (another section, or a word both happen to share): the joiner goes between.
        (("Read more in the manual", "manual pages for details."),
         "Read more in the manual\n\nmanual pages for details."),
        (("First section.", "Second section."), "First section.\n\nSecond section."),
    ],
)  # fmt: skip
def test_join_chunks(texts: tuple[str, ...], joined: str) -> None:
    assert join_chunks(texts) == joined


def test_a_chunk_wholly_inside_the_overlap_adds_nothing_and_the_joiner_is_the_callers() -> None:
    assert (
        join_chunks(["A long sentence here.", "A long sentence here."]) == "A long sentence here."
    )
    assert join_chunks(["One.", "Two."], joiner=" | ") == "One. | Two."


# --- words longer than a chunk, and long paragraphs read a slice at a time -----------------------

GIANT_WORDS = [
    "Резервное_копирование_выполняется_ежедневно" * 30,  # 2-byte characters
    "🙂🚀🔥" * 120,  # 4-byte characters, several tokens each
    "数据库备份每天凌晨两点运行并保留三十天以便恢复" * 40,
    "ab" * 5_000,  # longer than the window a word is encoded in (2 x 8 x 128 characters)
    "жé🙂x" * 3_000,
    "broken\ufffdbytes\ufffd" * 200,  # U+FFFD of its own
]


@pytest.mark.parametrize("size", [8, 13, 200])
@pytest.mark.parametrize("word", GIANT_WORDS, ids=lambda w: w[:8])
def test_a_word_longer_than_a_chunk_is_cut_between_characters(word: str, size: int) -> None:
    config = ChunkingConfig(chunk_tokens=size, overlap_tokens=0)
    chunks = chunk_paragraphs([Paragraph(word, 1)], config)
    assert "".join(c.text for c in chunks) == word  # no character lost at a cut
    assert all(0 < c.tokens <= size and c.tokens == count_tokens(c.text) for c in chunks)


def test_a_word_within_one_window_is_cut_where_its_tokens_are() -> None:
    word = "x9" * 900  # ASCII: every token boundary is a character boundary
    config = ChunkingConfig(chunk_tokens=200, overlap_tokens=0)
    tokenizer = default_tokenizer()
    ids = tokenizer.encode(word)
    expected = [tokenizer.decode(ids[i : i + 200]) for i in range(0, len(ids), 200)]
    assert [c.text for c in chunk_paragraphs([Paragraph(word, 1)], config)] == expected


@pytest.mark.parametrize("seed", range(3))
def test_long_paragraphs_chunk_alike_read_in_slices(monkeypatch, seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["Backups run.", "Да!", "v1.2", "e.g. this", "«Цитата».", "(See it.)", "word", "?"]
    spaces = [" ", "  ", "\t", "\n", " \n "]
    paragraphs = [
        Paragraph("".join(rng.choice(pieces) + rng.choice(spaces) for _ in range(300)), n)
        for n in (1, 2)
    ]
    config = ChunkingConfig(chunk_tokens=40, overlap_tokens=8)
    whole = chunk_paragraphs(paragraphs, config)
    monkeypatch.setattr(chunking, "_SPLIT_SLICE", 7)
    assert chunk_paragraphs(paragraphs, config) == whole


@pytest.mark.parametrize("text", ["", "\n", "a\nb", "a\n\nb\n", "x" * 50, "a\nb" * 40 + "\n"])
def test_iter_split_is_split(monkeypatch, text: str) -> None:
    monkeypatch.setattr(chunking, "_SPLIT_SLICE", 3)
    assert list(iter_split(text, "\n")) == text.split("\n")
    assert list(iter_split(text, "\n\n")) == text.split("\n\n")


def test_a_word_an_encoding_does_not_decode_back_is_cut_by_characters():
    """qwen3 normalises to NFC: no piece of "cafe" + a combining acute decodes back as written.
    The word is still cut, into pieces that join back to it, within the limit; it was an
    endless loop."""
    tok = default_tokenizer("qwen3")
    word = "cafe\u0301" * 20
    pieces = list(chunking._cut_word(word, 8, tok))
    assert "".join(pieces) == word
    assert all(p and tok.count(p) <= 8 for p in pieces)
