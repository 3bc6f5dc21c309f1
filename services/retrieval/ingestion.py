"""Ingestion: parse, embed, write index points, commit the document store, drop the old version.

Order matters for crash safety (issue 3: "a crash in the middle of a document leaves nothing
of it visible; running again completes it"):

1. journal entry (tenant, doc, new generation), fsynced;
2. index points of the new generation (deterministic ids: a rerun overwrites, never duplicates);
3. the document store commits the new version in one transaction, with the list of its
   points (`StoredPoint`): from here search sees it. Search reads every candidate's fields
   from that list (services/retrieval/engine.py), so a point the store does not list, of
   an uncommitted or a replaced generation, is never shown;
4. the old generation's points are deleted, the journal entry is marked done.

A crash before 3 leaves only invisible points, which `recover()` deletes at the next start;
a crash after 3 leaves old points that are invisible and deleted the same way.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np

from services.common import errors
from services.common.context import detached_context
from services.common.document_limits import DOC_ID_RULE, is_doc_id
from services.common.search_contract import KB_SOURCE, KB_TENANT, USER_SOURCE, check_tenant_id
from services.docstore.chunking import whole_text_tokens
from services.docstore.errors import DocumentLimitError, StoreUnavailableError
from services.docstore.fields import check_fields, normalized_tags, one_line
from services.docstore.kb_csv import kb_file_key, read_knowledge_base_csv
from services.docstore.model import Document, DocumentSummary, StoredPoint
from services.docstore.parsing import (
    FORMATS,
    ChunkingConfig,
    derived_doc_id,
    guess_format,
    parse_document,
    unsupported_format,
)
from services.docstore.pdf import PdfText, read_pdf
from services.docstore.store import DocumentStore
from services.docstore.summaries import mix_generation, section_texts
from services.retrieval.embeddings import Embedder
from services.retrieval.index.base import IndexPoint, IndexUnavailableError
from services.retrieval.index.qdrant_common import VectorIndex
from services.retrieval.journal import IngestJournal, JournalEntry
from services.retrieval.listing import ListPage, list_page, page_token, read_page
from services.retrieval.sections import SectionCatalog

log = logging.getLogger("visior.retrieval.ingestion")

_PROGRESS_LOG_S = 5.0
EMBED_SLICE = 32
"""Passages embedded per worker-thread call at ingest (a multiple of every profile's batch):
between slices a cancelled caller stops the work (one slice is ~5 s of e5 on 2 cores, 0.2 s
of fast), the pace is checked against the call's deadline, and progress is logged."""
_POINT_NS = uuid.UUID("6f1d5c3e-8a4b-4f8e-9d7a-2c1b0e9f4a31")
_T = TypeVar("_T")


class SectionSummarizer(Protocol):
    """Rewrites a parsed document's section summaries (services/retrieval/llm_assist.py)."""

    name: str
    concurrency: int
    """Model calls in flight at once; also how many documents of one file are summarised
    at a time."""

    def generation(self, doc: Document) -> str:
        """`doc`'s generation once its summaries are this summarizer's."""
        ...

    async def summarize_sections(self, doc: Document, max_chars: int) -> Document:
        """`doc` with its section summaries rewritten (a failed one keeps the parser's)."""
        ...


@dataclass(frozen=True)
class IngestInput:
    """One file to ingest, as the domain sees it."""

    tenant_id: str
    content: bytes
    doc_id: str = ""
    file_name: str = ""
    content_type: str = ""
    title: str = ""
    product: str = ""
    version: str = ""
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestOutcome:
    doc_id: str
    sections: int
    chunks: int
    pages: int
    replaced: bool
    unchanged: bool = False
    doc_ids: tuple[str, ...] = ()
    generation: str = ""
    removed_doc_ids: tuple[str, ...] = ()
    """Knowledge-base articles an earlier version of the same CSV held and this one does
    not: deleted."""


def check_doc_id(doc_id: str) -> None:
    """INVALID_ARGUMENT naming `doc_id` when it is not one a document could be stored under:
    a request naming such an id is refused, never answered as a document not found."""
    if not is_doc_id(doc_id):
        raise errors.invalid("doc_id", DOC_ID_RULE)


_CSV_RULE = {"csv": f"only into the knowledge-base tenant {KB_TENANT!r}"}
"""What `_validate` holds a CSV to, as an UNSUPPORTED_FORMAT message says it."""


def _unsupported(item: IngestInput) -> errors.InvalidArgumentError:
    """UNSUPPORTED_FORMAT for a file no parser takes, naming the request field at fault, what
    was given and every suffix and content type taken (`parsing.unsupported_format`)."""
    field, message = unsupported_format(item.file_name, item.content_type, _CSV_RULE)
    return errors.InvalidArgumentError(
        message, reason="UNSUPPORTED_FORMAT", metadata={"field": field}
    )


def embedding_identity(embedder: Embedder) -> str:
    """What of `embedder` makes a passage's vector, mixed into every document's generation
    (`mix_generation`): its model's name and the text it puts before each passage. A new
    model or prefix gives every document a new generation, so ingesting it again embeds it
    again instead of answering unchanged with the old model's vectors.

    Query stages in front of the model (the query cache, query batching: `QueryStage`) carry
    its name and pass passages through to `inner`; the prefix is read from the first layer
    that has one (`RemoteEmbedder.passage_prefix`; the local models add theirs themselves).
    """
    prefix, seen = "", set()
    layer: object = embedder
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        found = getattr(layer, "passage_prefix", None)
        if isinstance(found, str):
            prefix = found
            break
        layer = getattr(layer, "inner", None)
    return f"embedder={embedder.name}\0passage_prefix={prefix}"


WRITE_BATCH = 64
"""Knowledge-base articles written under one hold of the ingest lock."""
POINTS_VERSION = 2
"""Bumped whenever `document_points` changes what a point holds for the same document (2: a
document's BM25 text is all of it), mixed into every generation (`_ingest`): ingesting an
unchanged document again then writes its points anew instead of answering unchanged."""


def _listed_points(doc: Document) -> list[StoredPoint]:
    """The point list of a stored document (no vectors needed: ids and fields only)."""
    return stored_points(document_points(doc, None))


def point_id(tenant_id: str, doc_id: str, kind: str, item_id: str, generation: str) -> int:
    """Deterministic point id: the same chunk of the same generation is always the same point.

    The top 64 bits of a UUIDv5 of the five parts (an unsigned 64-bit id, which both
    backends take natively): two points of a million share an id with odds of about
    3e-8. Integer ids come back from Edge as ints; UUID ids came back as uuid.UUID
    objects, ~600 of them per search (0.5 ms at 100k points).
    """
    key = f"{tenant_id}\x1f{doc_id}\x1f{kind}\x1f{item_id}\x1f{generation}"
    return uuid.uuid5(_POINT_NS, key).int >> 64


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return (v / n).astype(np.float32) if n > 0 else v.astype(np.float32)


def chunk_texts(doc: Document) -> list[str]:
    """What each chunk's vectors are made from: its section title, then its text."""
    titles = {s.section_id: s.title for s in doc.sections}
    return [f"{titles.get(c.section_id, '')}\n{c.text}".strip() for c in doc.chunks]


def document_points(
    doc: Document, vectors: np.ndarray | None, texts: Sequence[str] | None = None
) -> list[IndexPoint]:
    """Chunk points, section points (centroid vector; for BM25 the section's text, each
    chunk's overlap with the one before counted once: `summaries.section_texts`), a doc point
    (mean vector; for BM25 the title and every section's title and text).

    `vectors` are the chunks' passage embeddings, in order; None leaves every dense
    vector out (the points' fields and ids are the same either way). `texts` are
    `chunk_texts(doc)` when the caller has them already.
    """
    texts = chunk_texts(doc) if texts is None else texts
    section_text = section_texts(doc)
    gen, tenant = doc.generation, doc.tenant_id

    def point(kind: str, item_id: str, dense: np.ndarray | None, **kw: object) -> IndexPoint:
        return IndexPoint(
            point_id=point_id(tenant, doc.doc_id, kind, item_id, gen),
            tenant_id=tenant,
            doc_id=doc.doc_id,
            kind=kind,
            source=doc.source,
            product=doc.product,
            version=doc.version,
            tags=tuple(doc.tags),
            generation=gen,
            dense=dense,
            **kw,  # type: ignore[arg-type]
        )

    points = [
        point("chunk", c.chunk_id, None if vectors is None else vectors[i],
              section_id=c.section_id, chunk_id=c.chunk_id, ord=c.ord,
              page_start=c.page_start, page_end=c.page_end, tokens=c.tokens,
              sparse_text=texts[i])
        for i, c in enumerate(doc.chunks)
    ]  # fmt: skip
    by_section: dict[str, list[int]] = {}
    for i, c in enumerate(doc.chunks):
        by_section.setdefault(c.section_id, []).append(i)
    for s in doc.sections:
        idx = by_section.get(s.section_id, [])
        if not idx:
            continue
        points.append(
            point("section", s.section_id,
                  None if vectors is None else _unit(vectors[idx].mean(axis=0)),
                  section_id=s.section_id, chunk_id="", ord=s.ord, page_start=s.page_start,
                  page_end=s.page_end, tokens=sum(doc.chunks[i].tokens for i in idx),
                  sparse_text=f"{s.title}\n{section_text[s.section_id]}")
        )  # fmt: skip
    # The document's BM25 text is all of it: its title and every section's title and text.
    # doc_first ranks documents before sections, and a word only in a section's body must
    # still find its document when ranking is sparse.
    body = "\n".join(
        f"{s.title}\n{section_text[s.section_id]}"
        for s in doc.sections
        if s.section_id in by_section
    )
    points.append(
        point("doc", "doc", None if vectors is None else _unit(vectors.mean(axis=0)),
              section_id="", chunk_id="", ord=0, page_start=1, page_end=doc.pages, tokens=0,
              sparse_text=f"{doc.title}\n{body}")
    )  # fmt: skip
    return points


def stored_points(points: Sequence[IndexPoint]) -> list[StoredPoint]:
    """What the document store lists of each point (search reads candidates from it)."""
    return [
        StoredPoint(p.point_id, p.doc_id, p.section_id, p.chunk_id, p.kind, p.ord,
                    p.page_start, p.page_end, p.tokens, p.generation)
        for p in points
    ]  # fmt: skip


def _store_unavailable(exc: StoreUnavailableError) -> errors.UnavailableError:
    return errors.BackendUnavailableError(
        f"the document store is unavailable: {exc}", metadata={"backend": "docstore"}
    )


PACE_SLICES = 3
"""Slices timed (after the first, which pays the warm-up) before the pace may refuse."""


class _Pace:
    """The progress of embedding one file's passages, EMBED_SLICE at a time: logged every
    _PROGRESS_LOG_S, and checked against the caller's deadline once PACE_SLICES slices after
    the first are timed, at the median of their times (one slice slowed by a search or a
    collection does not make the rate)."""

    def __init__(self, total: int, now: float, deadline: float | None) -> None:
        self.total = total
        self.deadline = deadline
        self._started = self._logged = self._last = now
        self._slices: list[float] = []  # seconds of each slice, the first left out

    def done(self, passages: int, now: float) -> None:
        took, self._last = now - self._last, now
        if passages >= self.total:
            return
        if passages > EMBED_SLICE:  # the first slice pays the warm-up
            self._slices.append(took)
        if len(self._slices) < PACE_SLICES:
            return
        rate = EMBED_SLICE / max(statistics.median(self._slices), 1e-9)
        finish = now + (self.total - passages) / rate
        if now - self._logged >= _PROGRESS_LOG_S:
            self._logged = now
            log.info("embedding", extra={"passages": passages, "of": self.total,
                                         "per_second": round(rate, 1)})  # fmt: skip
        if self.deadline is not None and finish > self.deadline:
            raise errors.DeadlineExceededError(
                f"embedding the file's {self.total} passages at {rate:.1f} a second "
                f"(the pace of the first {passages}) takes about "
                f"{finish - self._started:.0f} s, past "
                f"this call's deadline ({self.deadline - self._started:.0f} s): ingest it in "
                "smaller files, or call over gRPC with a longer deadline",
                metadata={"passages": str(self.total), "passages_per_second": f"{rate:.1f}"},
            )


class Ingestor:
    """Documents in and out of the index and the document store; the store is the truth."""

    def __init__(
        self,
        *,
        store: DocumentStore,
        index: VectorIndex,
        embedder: Embedder,
        sections: SectionCatalog,
        journal: IngestJournal,
        max_document_bytes: int,
        chunking: ChunkingConfig | None = None,
        summarizer: SectionSummarizer | None = None,
        pdf_reader: Callable[[bytes], PdfText] = read_pdf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        self._pdf_reader = pdf_reader
        # None: the parser's extractive summaries are the summaries.
        self._summarizer = summarizer
        self._index = index
        self._embedder = embedder
        self._sections = sections
        self._journal = journal
        self._max_bytes = max_document_bytes
        self._chunking = chunking or ChunkingConfig()
        # One document at a time per process: the Edge shard is single-writer anyway, and
        # two ingests of the same doc_id must not interleave their steps.
        self._lock = asyncio.Lock()
        # One knowledge-base CSV at a time: its articles are written WRITE_BATCH at a time,
        # the lock let go between, and pruning must see only its own file's writes.
        self._csv_lock = asyncio.Lock()
        self._ingesting = 0
        # Locked work whose caller was cancelled, still running (asyncio keeps weak refs).
        self._abandoned: set[asyncio.Task[Any]] = set()

    # -- recovery ---------------------------------------------------------------------------

    def recover(self) -> int:
        """Delete index points left by interrupted ingests/deletes; returns entries handled."""
        pending = self._journal.pending()
        try:
            for entry in pending:
                live = self._store.document_generation(entry.tenant_id, entry.doc_id)
                if entry.replaces is not None:
                    # Only the generations this entry wrote or was replacing: the others may
                    # be another process's ingest in flight (replicas on one Qdrant server).
                    for gen in {entry.generation, entry.replaces} - {live, ""}:
                        self._index.delete_document(entry.tenant_id, entry.doc_id, generation=gen)
                elif live is None:  # an entry from before `replaces` was journaled
                    self._index.delete_document(entry.tenant_id, entry.doc_id)
                else:
                    self._index.delete_document(
                        entry.tenant_id, entry.doc_id, except_generation=live
                    )
                self._journal.finish(entry)
                log.info(
                    "recovered an interrupted ingest",
                    extra={"tenant_id": entry.tenant_id, "doc_id": entry.doc_id, "live": live},
                )
        finally:
            # Also when the index is down at start (the service serves anyway): compaction
            # keeps every unfinished entry, and the journal does not grow run after run.
            self._journal.compact()
        return len(pending)

    def complete_stored_documents(self) -> int:
        """Write what a store of an older version left out of its documents: their point
        lists and token counts; returns the documents completed. Idempotent; run at start,
        before serving (2,500 documents of 115k points: 5.2 s), with a progress line every
        5 s."""
        todo = self._store.incomplete_documents()
        done = 0
        started = last_log = time.monotonic()
        for n, (tenant_id, doc_id, generation) in enumerate(todo, start=1):
            doc = self._store.get_document(tenant_id, doc_id)
            if doc is not None and doc.generation == generation:
                texts = (c.text for c in doc.chunks)
                tokens = whole_text_tokens(doc.page_texts, texts, self._chunking.encoding)
                done += self._store.complete_document(
                    tenant_id, doc_id, generation, partial(_listed_points, doc), tokens
                )
            if time.monotonic() - last_log >= _PROGRESS_LOG_S and n < len(todo):
                last_log = time.monotonic()
                log.info("completing stored documents",
                         extra={"documents": n, "of": len(todo)})  # fmt: skip
        if todo:
            log.info(
                "completed stored documents (point lists, token counts)",
                extra={"documents": done, "seconds": round(time.monotonic() - started, 1)},
            )
        return done

    # -- ingest -----------------------------------------------------------------------------

    def _validate(self, item: IngestInput) -> tuple[str, str]:
        """The doc_id ("" for a knowledge-base CSV) and format of a request within its bounds.

        The fields are held to `check_fields`, as a knowledge-base CSV's rows are: the caller's
        metadata has at most MAX_METADATA entries and may not name a key of
        `SERVICE_METADATA`, which the service stores: on every document the request's
        `file_name` (at most MAX_METADATA_VALUE characters) and the parsed format. A request
        passing every other check whose file is of no format taken is UNSUPPORTED_FORMAT
        (`_unsupported`). The fields are held as given: `_ingest` normalises them first
        (`normalized_tags`, `one_line`).
        """
        check_tenant_id(item.tenant_id)
        if not item.content:
            raise errors.invalid("content", "content is empty")
        if len(item.content) > self._max_bytes:
            raise errors.over_limit(
                f"document is {len(item.content)} bytes; the limit is {self._max_bytes}",
                self._max_bytes,
                field="content",
            )
        # The same bounds as a knowledge-base CSV's rows (services/docstore/fields.py).
        check_fields(
            title=item.title,
            product=item.product,
            version=item.version,
            tags=item.tags,
            metadata=item.metadata,
            file_name=item.file_name,
        )
        fmt = guess_format(item.file_name, item.content_type)
        if fmt == "csv":
            if item.tenant_id != KB_TENANT:
                raise errors.invalid(
                    "tenant_id",
                    f"a knowledge-base CSV goes to the reserved tenant {KB_TENANT!r} "
                    "(visior ingest --knowledge-base)",
                )
            # Its rows name each article and its fields: a field of one document has no home.
            for name in ("doc_id", "title", "product", "version", "tags", "metadata"):
                value = getattr(item, name)
                if value.strip() if isinstance(value, str) else value:  # a blank title is none
                    raise errors.invalid(
                        name,
                        f"a knowledge-base CSV's articles take their ids and fields from its "
                        f"rows; {name} names one document's: leave it out",
                    )
            return "", fmt
        if item.doc_id:
            check_doc_id(item.doc_id)
            doc_id = item.doc_id
        else:
            doc_id = derived_doc_id(item.file_name)
            if not is_doc_id(doc_id):
                raise errors.invalid(
                    "file_name", "no doc_id could be made from file_name; give doc_id"
                )
        # After every other check: a request with another fault too is told that one.
        if fmt not in FORMATS:
            raise _unsupported(item)
        return doc_id, fmt

    def _parse(self, item: IngestInput, doc_id: str, fmt: str) -> list[Document]:
        source = KB_SOURCE if item.tenant_id == KB_TENANT else USER_SOURCE
        try:
            if fmt == "csv":
                return read_knowledge_base_csv(
                    item.content, tenant_id=item.tenant_id, config=self._chunking,
                    file_name=kb_file_key(item.file_name),
                ).strict()  # fmt: skip
            return [
                parse_document(
                    tenant_id=item.tenant_id,
                    doc_id=doc_id,
                    content=item.content,
                    fmt=fmt,
                    title=item.title,
                    product=item.product,
                    version=item.version,
                    tags=item.tags,
                    source=source,
                    metadata={
                        **item.metadata,
                        **({"file_name": item.file_name} if item.file_name else {}),
                    },
                    config=self._chunking,
                    pdf_reader=self._pdf_reader,
                )
            ]
        except DocumentLimitError as exc:
            raise errors.over_limit(
                str(exc), exc.limit, field="content", name=exc.limit_name
            ) from None
        except ValueError as exc:  # ParseError and CSV validation errors subclass ValueError
            raise errors.InvalidArgumentError(
                str(exc), reason="PARSE_ERROR", metadata={"field": "content"}
            ) from None

    @property
    def ingesting(self) -> int:
        """IngestDocument calls in progress (parsing, embedding or writing)."""
        return self._ingesting

    async def ingest(self, item: IngestInput, *, time_left_s: float | None = None) -> IngestOutcome:
        """Ingest one file. `time_left_s`: the caller's deadline, when it has one; a document
        whose embedding would run past it is refused as soon as its pace shows it (`_embed`)."""
        deadline = None if time_left_s is None else self._clock() + time_left_s
        self._ingesting += 1
        try:
            return await self._ingest(item, deadline)
        finally:
            self._ingesting -= 1

    async def _ingest(self, item: IngestInput, deadline: float | None) -> IngestOutcome:
        # One rule for a request's fields and a knowledge-base CSV's (kb_csv), before the
        # limits hold them: " finance " is stored, and found, as "finance".
        item = replace(
            item,
            title=one_line(item.title),
            product=one_line(item.product),
            version=one_line(item.version),
            tags=normalized_tags(item.tags),
        )
        doc_id, fmt = self._validate(item)
        parsed = await asyncio.to_thread(self._parse, item, doc_id, fmt)
        # The embedder and the points' layout are part of the generation as the summarizer is
        # (`_summarized`).
        made_by = f"{embedding_identity(self._embedder)}\0points={POINTS_VERSION}"
        docs = [replace(d, generation=mix_generation(d.generation, made_by)) for d in parsed]
        if not docs:  # a knowledge-base CSV with a header and no rows
            raise errors.invalid("content", "the knowledge-base CSV has no rows")
        for doc in docs:
            if not doc.chunks:
                raise errors.invalid("content", f"document {doc.doc_id!r} has no text")
        # Each document with whether its summaries are final (see _summarized).
        todo = [(doc, True) for doc in docs]
        if self._summarizer is not None:
            # Before the lock: model calls can take a while, and other ingests need not wait.
            todo = await self._summarized_all(docs, self._summarizer)

        # Embedded before the lock too: it is the slow part (e5: ~7 passages/s on 2 cores), and
        # neither other ingests nor deletes need wait for it. A caller who gives up stops it.
        ready = await self._prepared(todo, deadline)

        if fmt == "csv":
            async with self._csv_lock:
                outcomes, removed = await self._write_articles(todo, ready, deadline)
        else:
            ((doc, final),) = todo
            outcomes = [
                await self._locked(
                    lambda: self._ingest_one(doc, final, ready.get(doc.doc_id), deadline)
                )
            ]
            removed = ()
        first = outcomes[0]
        return IngestOutcome(
            doc_id=first.doc_id if len(outcomes) == 1 else "",
            sections=sum(o.sections for o in outcomes),
            chunks=sum(o.chunks for o in outcomes),
            pages=sum(o.pages for o in outcomes),
            replaced=any(o.replaced for o in outcomes),
            unchanged=all(o.unchanged for o in outcomes) and not removed,
            doc_ids=tuple(o.doc_id for o in outcomes),
            generation=first.generation if len(outcomes) == 1 else "",
            removed_doc_ids=removed,
        )

    async def _write_articles(
        self,
        todo: Sequence[tuple[Document, bool]],
        ready: Mapping[str, tuple[Document, list[IndexPoint]]],
        deadline: float | None,
    ) -> tuple[list[IngestOutcome], tuple[str, ...]]:
        """Write a knowledge-base CSV's articles, WRITE_BATCH under the lock at a time, so
        a file of many articles keeps no other ingest or delete waiting for all of them;
        then delete the articles of the file's earlier version it no longer holds. A
        failure or a cancel leaves the old articles where they were; running the file
        again completes it."""
        written: list[IngestOutcome] = []
        for at in range(0, len(todo), WRITE_BATCH):
            batch = todo[at : at + WRITE_BATCH]

            async def write(batch: Sequence[tuple[Document, bool]] = batch) -> None:
                for doc, final in batch:
                    written.append(
                        await self._ingest_one(doc, final, ready.get(doc.doc_id), deadline)
                    )

            await self._locked(write)
        removed = await self._locked(lambda: self._prune_articles([d for d, _ in todo]))
        return written, removed

    async def _prune_articles(self, articles: Sequence[Document]) -> tuple[str, ...]:
        """Delete the knowledge-base articles that an earlier ingest of the CSV these
        `articles` come from (the same file name) wrote and it no longer holds; their ids.
        Articles another CSV wrote, or that moved to another CSV since, stay; so do articles
        written before pruning existed (no `kb_file`), until their CSV is ingested again."""
        file_key = articles[0].metadata.get("kb_file", "")
        keep = {a.doc_id for a in articles}
        try:
            stored = await asyncio.to_thread(self._store.list_documents, KB_TENANT)
        except StoreUnavailableError as exc:
            raise _store_unavailable(exc) from None
        gone = [d.doc_id for d in stored
                if d.metadata.get("kb_file") == file_key and d.doc_id not in keep]  # fmt: skip
        for doc_id in gone:
            await self._delete(KB_TENANT, doc_id)
        if gone:
            log.info("articles no longer in the CSV deleted",
                     extra={"file_name": file_key, "removed": len(gone)})  # fmt: skip
        return tuple(gone)

    async def _summarized_all(
        self, docs: Sequence[Document], summarizer: SectionSummarizer
    ) -> list[tuple[Document, bool]]:
        """`_summarized` for every document of one file (a knowledge-base CSV has one per
        article), `summarizer.concurrency` documents at a time: each document's time budget
        starts when its turn comes, not while it waits behind the others."""
        if len(docs) == 1:
            return [await self._summarized(docs[0], summarizer)]
        turns = asyncio.Semaphore(max(1, summarizer.concurrency))

        async def one(doc: Document) -> tuple[Document, bool]:
            async with turns:
                return await self._summarized(doc, summarizer)

        return list(await asyncio.gather(*(one(doc) for doc in docs)))

    async def _summarized(
        self, doc: Document, summarizer: SectionSummarizer
    ) -> tuple[Document, bool]:
        """`doc` under the summarizer's generation, its summaries rewritten unless the store
        already holds that generation (then `_ingest_one` reports it unchanged, no model call),
        and whether they were rewritten."""
        doc = replace(doc, generation=summarizer.generation(doc))
        if await self._live_generation(doc) == doc.generation:
            return doc, False
        return await summarizer.summarize_sections(doc, self._chunking.summary_chars), True

    async def _final_summaries(self, doc: Document, live: str | None) -> Document:
        """`doc` (its summaries skipped by `_summarized`) with its summaries made final, now
        that it is to be written after all: written under the summarizer's generation, the
        parser's summaries would stay for good (the next ingest answers unchanged)."""
        if live == doc.generation:  # its points are missing: the store has the summaries
            stored = await asyncio.to_thread(self._store.get_document, doc.tenant_id, doc.doc_id)
            if stored is not None and stored.generation == doc.generation:
                return stored
        if self._summarizer is None:  # only a summarizer's run leaves summaries to do
            return doc
        # The store moved on since `_summarized` looked (another ingest of this id).
        return await self._summarizer.summarize_sections(doc, self._chunking.summary_chars)

    async def _live_generation(self, doc: Document) -> str | None:
        """The generation the store holds for `doc`'s id, read off the event loop (a
        PostgreSQL store answers over the network)."""
        return await asyncio.to_thread(self._store.document_generation, doc.tenant_id, doc.doc_id)

    async def _prepared(
        self, todo: Sequence[tuple[Document, bool]], deadline: float | None
    ) -> dict[str, tuple[Document, list[IndexPoint]]]:
        """Before the lock, each document of a file that the store and the index do not hold
        already (an unchanged re-ingest embeds nothing), as it is to be written: its summaries
        final (`_final_summaries`, for one whose summaries `_summarized` skipped) and its
        points with their vectors. The file's passages are embedded together, in slices, at
        one pace checked against `deadline` (a knowledge-base CSV's articles are small)."""
        docs = []
        for doc, final in todo:
            live = await self._live_generation(doc)
            if live == doc.generation and await self._indexed(doc):
                continue
            docs.append(doc if final else await self._final_summaries(doc, live))
        texts = [chunk_texts(doc) for doc in docs]
        vectors = await self._embed([t for some in texts for t in some], deadline)
        ready, at = {}, 0
        for doc, some in zip(docs, texts, strict=True):
            points = document_points(doc, vectors[at : at + len(some)], some)
            ready[doc.doc_id] = (doc, points)
            at += len(some)
        return ready

    async def _ingest_one(
        self,
        doc: Document,
        summarized: bool = True,
        ready: tuple[Document, list[IndexPoint]] | None = None,
        deadline: float | None = None,
    ) -> IngestOutcome:
        """Write `doc` (under the lock): as `_prepared` made it ready, or, when the store
        changed since (another ingest of the same id), made ready here."""
        live = await self._live_generation(doc)
        counts = (len(doc.sections), len(doc.chunks), doc.pages)
        if live == doc.generation and await self._indexed(doc):
            return IngestOutcome(doc.doc_id, *counts, replaced=False, unchanged=True,
                                 doc_ids=(doc.doc_id,), generation=doc.generation)  # fmt: skip
        if ready is not None:
            doc, points = ready
        else:
            if not summarized:
                doc = await self._final_summaries(doc, live)
            points = await self._points(doc, deadline)
        entry = await asyncio.to_thread(
            self._journal.begin, doc.tenant_id, doc.doc_id, doc.generation, live or ""
        )
        try:
            await asyncio.to_thread(self._index.upsert, points)
            previous = await asyncio.to_thread(self._store.replace, doc, stored_points(points))
        except IndexUnavailableError as exc:
            raise errors.BackendUnavailableError(
                f"the vector store is unavailable: {exc}"
            ) from None
        except StoreUnavailableError as exc:
            # The new points stay invisible (the store holds the old generation); the journal
            # entry stays open, so recovery deletes them at the next start.
            raise _store_unavailable(exc) from None
        # Committed: visible from here on. The rest is cleanup that recovery would redo.
        self._sections.forget(doc.tenant_id, doc.doc_id)
        # A commit replayed after its acknowledgement was lost reports its own generation as
        # the one it replaced (`_drop_replaced`): a document new then was not replaced.
        replaced = previous is not None and (previous != doc.generation or live is not None)
        await self._drop_replaced(doc, live, previous, entry)
        log.info(
            "ingested",
            extra={"tenant_id": doc.tenant_id, "doc_id": doc.doc_id, "chunks": len(doc.chunks),
                   "generation": doc.generation, "replaced": replaced},
        )  # fmt: skip
        return IngestOutcome(doc.doc_id, *counts, replaced=replaced,
                             doc_ids=(doc.doc_id,), generation=doc.generation)  # fmt: skip

    async def _drop_replaced(
        self, doc: Document, live: str | None, previous: str | None, entry: JournalEntry
    ) -> None:
        """Once `doc` is committed: delete the points of the generations it replaced, `live`
        (read before the commit) and `previous` (the one the commit reports replaced), and
        finish its journal entry; the index down, the entry stays open for recovery."""
        # Only the generations replaced, not "every one but mine": another process ingesting
        # this document into the same Qdrant server may have written its points and not yet
        # committed them. Both, as either alone can miss the one replaced: another process
        # may have committed its own generation since `live` was read (`previous` names it),
        # and a PostgreSQL commit replayed after its acknowledgement was lost
        # (PostgresDocumentStore runs a write again on a broken connection) reports `doc`'s
        # own generation as `previous` (`live` names the one replaced). Each of the two was
        # committed and then replaced, so no ingest in flight still needs its points.
        stale = sorted({g for g in (live, previous) if g and g != doc.generation})
        raced = None
        if previous and previous not in (live, doc.generation):
            # The entry names `live` as replaced: should this process stop here, recovery must
            # know the generation actually replaced too.
            raced = await asyncio.to_thread(
                self._journal.begin, doc.tenant_id, doc.doc_id, doc.generation, previous
            )
        try:
            for generation in stale:
                await asyncio.to_thread(
                    self._index.delete_document, doc.tenant_id, doc.doc_id, generation=generation
                )
            await asyncio.to_thread(self._journal.finish, entry)
            if raced is not None:
                await asyncio.to_thread(self._journal.finish, raced)
        except IndexUnavailableError:
            log.warning("old points not deleted; recovery will", extra={"doc_id": doc.doc_id})

    async def _indexed(self, doc: Document) -> bool:
        """Whether the index holds every point of `doc`'s generation. The store holding it is
        not enough: after a lost index (IndexLayoutError tells operators to delete it and
        re-ingest) a re-ingest must write the points again, not answer unchanged."""
        try:
            have = await asyncio.to_thread(
                self._index.count_document, doc.tenant_id, doc.doc_id, doc.generation
            )
        except IndexUnavailableError as exc:
            raise errors.BackendUnavailableError(
                f"the vector store is unavailable: {exc}"
            ) from None
        return have >= len(document_points(doc, None))

    async def _embed(self, texts: Sequence[str], deadline: float | None = None) -> np.ndarray:
        """The passages' embeddings, EMBED_SLICE at a time in a worker thread (the embedder
        batches each slice its own way, PASSAGE_BATCH_DEFAULTS). Raises DeadlineExceededError
        as soon as the pace so far says the rest would end past `deadline`."""
        if not texts:
            return np.zeros((0, self._embedder.dim), np.float32)
        texts = list(texts)
        parts = []
        pace = _Pace(len(texts), self._clock(), deadline)
        for start in range(0, len(texts), EMBED_SLICE):
            piece = texts[start : start + EMBED_SLICE]
            parts.append(await asyncio.to_thread(self._embedder.embed_passages, piece))
            pace.done(start + len(piece), self._clock())
        return np.concatenate(parts)

    async def _points(self, doc: Document, deadline: float | None = None) -> list[IndexPoint]:
        """The document's points (document_points) with their dense vectors."""
        texts = chunk_texts(doc)
        return document_points(doc, await self._embed(texts, deadline), texts)

    async def _locked(self, work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        """`work()` under the lock, in a task of its own that a cancelled caller (a client's
        deadline or cancel: grpc.aio cancels the handler) stops waiting for but does not stop.
        Its worker threads cannot be stopped mid-write: releasing the lock while they still
        write let the next ingest of the same document interleave with them (a stored
        generation with no points). The lock is released when the work has finished. The
        task runs without its request's deadline (`deadline_var`): a write going on after the
        caller left must not find it passed (the PostgreSQL store cuts its waits to it)."""
        await self._lock.acquire()
        task = asyncio.create_task(work(), context=detached_context())
        task.add_done_callback(self._locked_done)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                self._abandoned.add(task)
            raise

    def _locked_done(self, task: asyncio.Task[Any]) -> None:
        self._lock.release()
        if task in self._abandoned:
            self._abandoned.discard(task)
            # Nobody awaits it any more: its failure is logged here or not at all.
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.warning("a cancelled call's write failed", exc_info=exc)

    # -- delete / list ----------------------------------------------------------------------

    async def delete(self, tenant_id: str, doc_id: str) -> bool:
        """Delete the document (every generation's points too); whether the store held it.
        A `doc_id` no document could be stored under (`check_doc_id`) is refused."""
        check_tenant_id(tenant_id)
        if not doc_id.strip():
            raise errors.invalid("doc_id", "doc_id is required")
        check_doc_id(doc_id)
        return await self._locked(lambda: self._delete(tenant_id, doc_id))

    async def _delete(self, tenant_id: str, doc_id: str) -> bool:
        try:
            live = await asyncio.to_thread(self._store.document_generation, tenant_id, doc_id)
            entry = await asyncio.to_thread(self._journal.begin, tenant_id, doc_id, "", live or "")
            deleted = await asyncio.to_thread(self._store.delete, tenant_id, doc_id)
        except StoreUnavailableError as exc:
            raise _store_unavailable(exc) from None
        self._sections.forget(tenant_id, doc_id)
        try:
            # Every generation's points: the document is gone, and so are strays an earlier
            # crash left (an ingest of it racing this delete in another process loses anyway).
            await asyncio.to_thread(self._index.delete_document, tenant_id, doc_id)
            await asyncio.to_thread(self._journal.finish, entry)
        except IndexUnavailableError:
            log.warning("points not deleted; recovery will", extra={"doc_id": doc_id})
        return deleted

    def _summaries(self, tenant_id: str, page: ListPage) -> tuple[list[DocumentSummary], str]:
        # Read in batches, no further than the page needs (listing.read_page): the page ends
        # before page.size documents when they would overrun the response's byte budget.
        # Each document with its counts in one query: a re-ingest never pairs one
        # generation's title with another's counts.
        out, more = read_page(
            lambda after, limit: self._store.list_summaries(
                tenant_id, after=after, limit=limit, doc_ids=page.doc_ids
            ),
            page,
        )
        return out, page_token(out[-1].doc_id, page.listing) if more else ""

    async def list(
        self, tenant_id: str, page: ListPage | None = None
    ) -> tuple[list[DocumentSummary], str]:
        """One page of the tenant's documents with their counts, and the token of the next
        page ("" after the last). The page holds fewer than `page.size` documents when more
        would take the response past listing.MAX_LIST_RESPONSE_BYTES. Read in a worker
        thread (the page's batches: off the event loop, which a PostgreSQL store's round
        trips would hold)."""
        check_tenant_id(tenant_id)
        page = page or list_page(tenant_id, 0, "", ())
        return await asyncio.to_thread(self._summaries, tenant_id, page)
