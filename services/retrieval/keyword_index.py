"""An in-process BM25 keyword index over chunks, per tenant.

The foundation's stand-in for the Qdrant hybrid index (issue 3): same interface to the
search code, no embeddings yet. Every query is scoped to one tenant by construction: the
index keeps one posting table per tenant and never looks across.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from services.docstore.model import Chunk, Document, Section

_TOKEN = re.compile(r"\w+", re.UNICODE)
_K1 = 1.2
_B = 0.75


def terms(text: str) -> list[str]:
    """Lowercased word tokens cut to 6 characters: a crude stemmer for Russian and English."""
    return [t[:6] for t in _TOKEN.findall(text.lower()) if len(t) > 1 or t.isdigit()]


@dataclass(frozen=True)
class IndexedChunk:
    """A chunk with what search needs to filter and to report it."""

    doc: Document
    section: Section
    chunk: Chunk
    tf: Counter[str]
    length: int


@dataclass
class _TenantIndex:
    chunks: dict[str, list[IndexedChunk]] = field(default_factory=dict)  # doc_id -> chunks
    df: Counter[str] = field(default_factory=Counter)
    total_length: int = 0
    count: int = 0


@dataclass(frozen=True)
class ScoredChunk:
    """A chunk and its BM25 score."""

    item: IndexedChunk
    score: float


class KeywordIndex:
    """BM25 over chunk text plus the section title, one table per tenant."""

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantIndex] = defaultdict(_TenantIndex)

    def add(self, doc: Document) -> None:
        self.remove(doc.tenant_id, doc.doc_id)
        table = self._tenants[doc.tenant_id]
        by_ord = {s.section_id: s for s in doc.sections}
        items = []
        for chunk in doc.chunks:
            section = by_ord[chunk.section_id]
            words = terms(f"{section.title} {chunk.text}")
            item = IndexedChunk(doc, section, chunk, Counter(words), len(words))
            items.append(item)
            table.df.update(item.tf.keys())
            table.total_length += item.length
            table.count += 1
        table.chunks[doc.doc_id] = items

    def remove(self, tenant_id: str, doc_id: str) -> None:
        table = self._tenants.get(tenant_id)
        if table is None:
            return
        for item in table.chunks.pop(doc_id, []):
            table.df.subtract(item.tf.keys())
            table.total_length -= item.length
            table.count -= 1
        table.df = +table.df  # drop zero counts

    def chunk_count(self) -> int:
        return sum(t.count for t in self._tenants.values())

    def search(
        self,
        tenant_id: str,
        query: str,
        *,
        keep: object = None,
        limit: int = 50,
    ) -> list[ScoredChunk]:
        """Best chunks of one tenant for `query`; `keep(item) -> bool` filters by metadata."""
        table = self._tenants.get(tenant_id)
        if table is None or table.count == 0:
            return []
        q = set(terms(query))
        if not q:
            return []
        avg = table.total_length / table.count
        idf = {
            t: math.log(1 + (table.count - table.df[t] + 0.5) / (table.df[t] + 0.5))
            for t in q
            if table.df.get(t)
        }
        scored: list[ScoredChunk] = []
        for items in table.chunks.values():
            for item in items:
                if keep is not None and not keep(item):  # type: ignore[operator]
                    continue
                score = 0.0
                for t, w in idf.items():
                    f = item.tf.get(t)
                    if f:
                        score += w * f * (_K1 + 1) / (f + _K1 * (1 - _B + _B * item.length / avg))
                if score > 0:
                    scored.append(ScoredChunk(item, score))
        scored.sort(key=lambda s: (-s.score, s.item.doc.doc_id, s.item.chunk.ord))
        return scored[:limit]
