"""How long a document's id and filterable fields may be: what ingestion accepts
(services/retrieval/ingestion.py, services/docstore/fields.py) and, so, the longest value a
search filter can usefully hold (`search_contract.validate_filters`, which the Orchestrator
and Retrieval both run)."""

from __future__ import annotations

MAX_DOC_ID_CHARS = 128
"""A doc_id's longest spelling, in characters of any script."""
MAX_TAG_CHARS = 128
MAX_PRODUCT_CHARS = 256
"""Also the limit of `version`."""

FILTER_VALUE_CHARS = {
    "product": MAX_PRODUCT_CHARS,
    "version": MAX_PRODUCT_CHARS,
    "tags": MAX_TAG_CHARS,
    "doc_ids": MAX_DOC_ID_CHARS,
}
"""The longest value of each search filter: the longest a document can be stored with. A
section id has no bound of its own (its document's id and a slug of its heading)."""
