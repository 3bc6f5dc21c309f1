"""Synthetic chunk points for index tests: one tenant, one point per vector, ids 1..n."""

from __future__ import annotations

import numpy as np

from services.retrieval.index.base import IndexPoint


def chunk_points(vectors: np.ndarray, tenant: str = "a") -> list[IndexPoint]:
    """Point i (id i + 1, chunk c<i>, document d<i // 10>) carries vectors[i]."""
    return [
        IndexPoint(
            point_id=i + 1,
            tenant_id=tenant,
            doc_id=f"d{i // 10}",
            section_id="s",
            chunk_id=f"c{i}",
            kind="chunk",
            ord=i % 10,
            page_start=1,
            page_end=1,
            tokens=10,
            source="user",
            product="",
            version="",
            tags=(),
            generation="g",
            dense=vectors[i],
            sparse_text=f"word{i % 50}",
        )
        for i in range(len(vectors))
    ]
