"""The vector index: one interface (VectorIndex), Qdrant Edge and Qdrant server backends."""

from services.retrieval.index.base import (
    KINDS,
    IndexFilter,
    IndexHit,
    IndexLockedError,
    IndexPoint,
    IndexUnavailableError,
    InvalidFilterError,
)
from services.retrieval.index.edge import EdgeIndex
from services.retrieval.index.qdrant_common import VectorIndex
from services.retrieval.index.server import QdrantServerIndex
from services.retrieval.index.sparse import Bm25Encoder, SparseVector

__all__ = [
    "KINDS",
    "Bm25Encoder",
    "EdgeIndex",
    "IndexFilter",
    "IndexHit",
    "IndexLockedError",
    "IndexPoint",
    "IndexUnavailableError",
    "InvalidFilterError",
    "QdrantServerIndex",
    "SparseVector",
    "VectorIndex",
]
