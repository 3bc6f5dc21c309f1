"""The offline BPE tokenizer: exact counts, safe truncation."""

import pytest
import quicktok

from services.common.tokenizer import (
    LONGEST_TOKEN_BYTES,
    BpeTokenizer,
    count_tokens,
    default_tokenizer,
)


def test_counts_match_the_cl100k_reference():
    # cl100k_base ids for "hello world" are [15339, 1917] (tiktoken's own test vector).
    tok = BpeTokenizer()
    assert tok.encode("hello world") == [15339, 1917]
    assert count_tokens("hello world") == 2
    assert count_tokens("") == 0


def test_russian_text_costs_more_tokens_than_words():
    text = "Как настроить интеграцию с каталогом пользователей"
    assert count_tokens(text) > len(text.split())


def test_truncate_keeps_a_prefix_within_the_limit_and_never_a_broken_character():
    tok = default_tokenizer()
    text = "Привет, мир! " * 20
    for limit in range(0, 30):
        cut = tok.truncate(text, limit)
        assert text.startswith(cut)
        assert tok.count(cut) <= limit
        assert "\ufffd" not in cut
    assert tok.truncate("short", 100) == "short"


def test_count_is_the_length_of_the_encoding_special_tokens_as_text():
    """count() asks quicktok for the count without the token list: the same number as
    len(encode()), special tokens counted as the plain text they are in a document."""
    tok = BpeTokenizer()
    texts = [
        "hello world",
        "Как настроить LDAP? 😀 " * 50,
        "a <|endoftext|> b <|fim_prefix|>",
        "\n\t  ",
        "x" * 10_000,
    ]
    for text in texts:
        assert tok.count(text) == len(tok.encode(text))


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_no_token_of_a_bundled_encoding_is_longer_than_longest_token_bytes(encoding: str):
    """LONGEST_TOKEN_BYTES bounds answers cut as runaways and the least message size
    (settings.MIN_MESSAGE_BYTES): no token is longer in bytes, and one is that long."""
    enc = quicktok.get_encoding(encoding)
    longest = 0
    for token in range(enc.n_vocab):
        try:
            longest = max(longest, len(enc.decode_single_token_bytes(token)))
        except Exception:  # an id in the gap before the special tokens
            continue
    assert longest == LONGEST_TOKEN_BYTES
