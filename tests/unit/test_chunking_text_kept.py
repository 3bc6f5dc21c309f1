"""chunking: a sentence longer than a chunk (a long Russian sentence, a Markdown table's rows
read as one period-less sentence) is cut into chunks that hold every word of it, each within
the token limit. Words are counted one by one to fill a piece, and the first word of a piece,
with no space before it, can cost more than with one ("данные" is three tokens of
cl100k_base, " данные" one): the piece's own text is what is counted."""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from services.common.tokenizer import BpeTokenizer, count_tokens
from services.docstore.chunking import ChunkingConfig, Paragraph, chunk_paragraphs
from services.docstore.parsing import parse_document

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "docs" / "orion-x-admin-guide.md"

LONG_RUSSIAN_SENTENCE = " ".join(
    """
Создайте для через настройка администраторы кластерах компании все миграции виртуализации
группы новые консоль конфигурации сервера тему кластера восстановления копирование
рассчитано быть установку снимкам узлы возвращается через нажмите каждые платформа консоль
руководство используется возможности ежедневно резервную копию снимкам конфигурации машины
узлы миграции памяти без конфигурации памяти тему миграция единый хранилище обслуживания
обновление для для запустить машин машины загрузите более узел кластерами единый требования
изменить соседние соединение руководство можно быть синхронизация узел политики ошибки
конфигурации укажите выберите руководство после компании нажмите резервное оперативной
поддержка руководство одной виртуальных машин узла машины пользователей учётную настройку
обновления расписание узлы снимкам резервное узла ограничения консоль резервную
рекомендуется адрес для если пустом обновлением это обоих восстановить для прерывалась живой
резервное сертификат узел узла.
""".split()
)
"""113 words, one sentence: at the default 200 tokens its first piece ended in "маш"."""

TABLE_ROWS = " ".join(
    """
🙂 | [ссылка](http://x.ru/a?b=1) | нет | Включено | Включено | | ОК | 12:30–14:00 |
/var/lib/orion/data | — | нет | | N/A | нет | x86_64 | 3 | 🙂 | | нет |
[ссылка](http://x.ru/a?b=1) | 10.0.0.1 | 3 | 10.0.0.1 | | 192.168.100.254:8080 | **важно** |
auth.ldap.enabled=true | [ссылка](http://x.ru/a?b=1) | да | | `--force` | 3 | нет | 17 |
Включено | | N/A | 3 | **важно** | N/A | /var/lib/orion/data | | 3 | 17 | да | 2024-01-15 |
— | | 17 | ОК | [ссылка](http://x.ru/a?b=1) | e.g. | x86_64 | | — | e.g. | Включено |
С.-Петербург | N/A | | auth.ldap.enabled=true | auth.ldap.enabled=true |
[ссылка](http://x.ru/a?b=1) | 1 024 МБ | 3 | | ru-RU | **важно** | x86_64 | &nbsp; |
**важно** | | e.g. | ru-RU | нет | N/A | 99,95 % | | 99,95 % | 10.0.0.1 | 99,95 % | 17 |
auth.ldap.enabled=true | | Сервер | 🙂 | ОК | N/A | x86_64 |
""".split()
)
"""Table rows joined into one paragraph with no sentence stop: one "sentence" of ~400 tokens."""


def holds_in_order(words: Iterable[str], texts: Iterable[str]) -> bool:
    """Whether `words` appear in order among the words of `texts` (overlap repeats some)."""
    remaining = iter(" ".join(texts).split())
    return all(word in remaining for word in words)


def within_limit(texts_and_counts: Iterable[tuple[str, int]], limit: int) -> bool:
    return all(0 < n <= limit and n == count_tokens(text) for text, n in texts_and_counts)


@pytest.mark.parametrize("body", [LONG_RUSSIAN_SENTENCE, TABLE_ROWS], ids=["russian", "table"])
def test_a_markdown_sentence_longer_than_a_chunk_keeps_every_word(body: str) -> None:
    doc = parse_document(
        tenant_id="t", doc_id="d", content=f"## Раздел\n\n{body}\n".encode(), fmt="markdown"
    )
    assert len(doc.chunks) > 1
    assert within_limit(((c.text, c.tokens) for c in doc.chunks), 200)
    assert holds_in_order(body.split(), (c.text for c in doc.chunks))


def test_words_dearer_at_a_piece_start_are_all_kept_without_overlap() -> None:
    words = ["данные"] * 450
    config = ChunkingConfig(chunk_tokens=200, overlap_tokens=0)
    chunks = chunk_paragraphs([Paragraph(" ".join(words) + ".", 1)], config)
    assert within_limit(((c.text, c.tokens) for c in chunks), 200)
    assert " ".join(c.text for c in chunks) == " ".join(words) + "."


class _DearJoins(BpeTokenizer):
    """cl100k_base with a token more for every 40 characters of a text: a text counts more
    than its parts do one by one, so the chunker's estimate of a chunk always falls short of
    its count, however it is joined."""

    def count(self, text: str) -> int:
        return super().count(text) + len(text) // 40


def test_a_chunk_whose_estimate_falls_short_hands_its_last_units_on() -> None:
    rng = random.Random(5)
    vocab = _sample_words()
    sentences = [
        " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 60))) + "." for _ in range(80)
    ]
    tok = _DearJoins()
    for overlap in (0, 8):
        config = ChunkingConfig(chunk_tokens=48, overlap_tokens=overlap)
        chunks = chunk_paragraphs([Paragraph(" ".join(sentences), 1)], config, tok)
        assert all(0 < c.tokens <= 48 and c.tokens == tok.count(c.text) for c in chunks)
        if overlap == 0:
            assert " ".join(c.text for c in chunks) == " ".join(sentences)
        assert holds_in_order(" ".join(sentences).split(), (c.text for c in chunks))


@functools.cache
def _sample_words() -> list[str]:
    """The sample admin guide's words (Russian prose, commands, paths) and table cells, each
    within 16 tokens: no word is longer than a chunk, which would be cut inside."""
    text = SAMPLE.read_text(encoding="utf-8")
    words = {*re.findall(r"\S+", text), *TABLE_ROWS.split(" | ")}
    return sorted(w for w in words if w.strip() and count_tokens(f" {w}") <= 16)


@pytest.mark.parametrize("seed", range(50))
def test_random_long_sentences_keep_every_word_within_the_limit(seed: int) -> None:
    """Documents of one to four sentences of 60-250 sample words, cut at several limits:
    without overlap the chunks read back as the text word for word; with it every word is
    there in order."""
    rng = random.Random(seed)
    vocab = _sample_words()
    paragraphs = [
        Paragraph(
            " ".join(
                " ".join(rng.choice(vocab) for _ in range(rng.randint(60, 250))).capitalize()
                + rng.choice([".", "", " |"])
                for _ in range(rng.randint(1, 4))
            ),
            page,
        )
        for page in range(1, rng.randint(2, 3))
    ]
    words = [w for p in paragraphs for w in p.text.split()]
    limit = rng.choice([32, 64, 200])
    for overlap in (0, limit // 4):
        config = ChunkingConfig(chunk_tokens=limit, overlap_tokens=overlap)
        chunks = chunk_paragraphs(paragraphs, config)
        assert within_limit(((c.text, c.tokens) for c in chunks), limit)
        if overlap == 0:
            assert " ".join(c.text for c in chunks).split() == words
        else:
            assert holds_in_order(words, (c.text for c in chunks))
