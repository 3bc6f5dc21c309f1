"""The bounds of a document's own fields, whichever way it comes in: an IngestDocument request
(services/retrieval/ingestion.py) or a row of a knowledge-base CSV (kb_csv.py).

Tags, product and version are payload of every index point of the document and filter values;
the title is in every doc point's BM25 text and every answer; metadata is stored with the
document. Each is normalised by one rule on both ways in (`normalized_tags`, `one_line` for
the title, product and version), and their bounds hold the fields so normalised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.common import errors
from services.common.document_limits import MAX_PRODUCT_CHARS, MAX_TAG_CHARS

MAX_TAGS = 32
MAX_TITLE_CHARS = 1024
MAX_METADATA = 32
"""Entries of the document's own metadata (the caller's, or a knowledge-base row's); the
SERVICE_METADATA entries come on top of them."""
MAX_METADATA_KEY_CHARS = 128
MAX_METADATA_VALUE = 1024
"""Characters of a metadata value, also of the `file_name` stored as one."""
SERVICE_METADATA = ("file_name", "format", "kb_file")
"""Metadata the service writes: on every document the file's name (at most MAX_METADATA_VALUE
characters) and its parsed format, on a knowledge-base article the CSV that wrote it (what its
re-ingest prunes by). A document's own metadata may not use these keys."""


def one_line(text: str) -> str:
    """A title, product or version as it is stored and filtered on: one line, each run of
    white space (newlines too) one space, none around it. " Orion X " stored as sent was
    never found by "Orion X"."""
    return " ".join(text.split())


def filter_text(value: str) -> str:
    """A search filter's product or version held to the stored rule (`one_line`). A blank one
    stays as sent and matches nothing, as no document keeps a blank one: a filter is never
    widened by what it loses."""
    return one_line(value) or value


def normalized_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """A document's tags as they are stored and filtered on: each stripped of surrounding
    white space, empty ones dropped, a repeat dropped (the first kept, in order; tags are
    compared as written, case included). A filter value is matched exactly: " finance "
    stored as sent was never found by "finance"."""
    return tuple(dict.fromkeys(tag for tag in (t.strip() for t in tags) if tag))


def filter_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """A search filter's tags held to the stored tags' rule (`normalized_tags`): each stripped
    of surrounding white space, so " finance " finds what was stored as "finance". A blank
    one stays blank and matches nothing, as no document keeps a blank tag: a filter is never
    widened by what it loses."""
    return tuple(dict.fromkeys(t.strip() for t in tags))


def check_fields(
    *,
    title: str = "",
    product: str = "",
    version: str = "",
    tags: Sequence[str] = (),
    metadata: Mapping[str, str] | None = None,
    file_name: str = "",
) -> None:
    """Refuse a document whose fields are past the bounds above, naming the field.

    `LimitExceededError` (LIMIT_EXCEEDED, metadata `field` and `limit`) for a field past its
    bound: at most MAX_TAGS tags of MAX_TAG_CHARS characters, a title of MAX_TITLE_CHARS,
    product and version of MAX_PRODUCT_CHARS, MAX_METADATA metadata entries with keys of
    MAX_METADATA_KEY_CHARS and values of MAX_METADATA_VALUE, a `file_name` of
    MAX_METADATA_VALUE. The fields are held as given: both callers normalise them first
    (`normalized_tags`, `one_line`), so the bounds hold what the document keeps.
    `InvalidArgumentError` (field `metadata`) for a metadata key of
    SERVICE_METADATA, which the service sets.
    """
    if len(tags) > MAX_TAGS:
        raise errors.over_limit(f"{len(tags)} tags; at most {MAX_TAGS}", MAX_TAGS, field="tags")
    # In key order: a map's wire order is not the caller's, and the same request must get
    # the same refusal however its map was encoded.
    metadata = dict(sorted((metadata or {}).items()))
    if len(metadata) > MAX_METADATA:
        raise errors.over_limit(
            f"{len(metadata)} metadata entries; at most {MAX_METADATA}", MAX_METADATA,
            field="metadata",
        )  # fmt: skip
    reserved = [key for key in metadata if key in SERVICE_METADATA]
    if reserved:
        raise errors.invalid(
            "metadata", f"metadata key {reserved[0]!r} is reserved: the service sets it"
        )
    texts = [
        *((f"tag {_start(tag)}", tag, MAX_TAG_CHARS, "tags") for tag in tags),
        ("title", title, MAX_TITLE_CHARS, "title"),
        ("product", product, MAX_PRODUCT_CHARS, "product"),
        ("version", version, MAX_PRODUCT_CHARS, "version"),
        *((f"metadata key {_start(key)}", key, MAX_METADATA_KEY_CHARS, "metadata")
          for key in metadata),
        *((f"metadata {key!r}", value, MAX_METADATA_VALUE, "metadata")
          for key, value in metadata.items()),
        ("file_name", file_name, MAX_METADATA_VALUE, "file_name"),
    ]  # fmt: skip
    for what, text, most, field in texts:
        if len(text) > most:
            raise errors.over_limit(
                f"{what} is {len(text)} characters; at most {most}", most, field=field
            )


def _start(text: str, shown: int = 40) -> str:
    """`text` quoted, cut to its first `shown` characters."""
    return repr(text if len(text) <= shown else text[:shown] + "…")
