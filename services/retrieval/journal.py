"""The ingest journal: what index writes were started, so a crash never leaves litter behind.

Before ingestion writes index points of a new generation (or deletes a document) it appends
an entry and fsyncs; when the document store has committed and the old points are gone it
appends a done marker. At start-up, recovery deletes, for every entry without a done marker,
the points of every generation the store does not hold. One JSON object per line.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JournalEntry:
    """An index write in flight for one document."""

    seq: int
    tenant_id: str
    doc_id: str
    generation: str  # "" for a delete
    replaces: str | None = None
    """The generation the store held when the entry began ("" none), whose points are deleted
    once the new one is committed; None in entries written before it was recorded."""


class IngestJournal:
    """Append-only, fsynced; compacted at recovery."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._drop_torn_tail()
        self._seq = max((e.seq for e in self._read()[0]), default=0)

    def _drop_torn_tail(self) -> None:
        """Cut a last line a crash left without its newline: the next append would join it
        and both would be unreadable, losing that entry. Nothing relied on the torn one: its
        `begin()` never returned (and a lost done marker only makes recovery redo cleanup)."""
        if not self._path.exists():
            return
        with open(self._path, "r+b") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())

    def _read(self) -> tuple[list[JournalEntry], set[int]]:
        started: list[JournalEntry] = []
        done: set[int] = set()
        if not self._path.exists():
            return started, done
        for line in self._path.read_text(encoding="utf-8").splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash mid-append
            if "done" in obj:
                done.add(int(obj["done"]))
            else:
                started.append(
                    JournalEntry(
                        int(obj["seq"]), obj["tenant_id"], obj["doc_id"], obj["gen"], obj.get("old")
                    )
                )
        return started, done

    def _append(self, obj: dict[str, object]) -> None:
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def begin(
        self, tenant_id: str, doc_id: str, generation: str, replaces: str | None = None
    ) -> JournalEntry:
        with self._lock:
            self._seq += 1
            entry = JournalEntry(self._seq, tenant_id, doc_id, generation, replaces)
            self._append(_line(entry))
            return entry

    def finish(self, entry: JournalEntry) -> None:
        with self._lock:
            self._append({"done": entry.seq})

    def pending(self) -> list[JournalEntry]:
        """Entries begun and never finished, oldest first."""
        with self._lock:
            started, done = self._read()
        return [e for e in started if e.seq not in done]

    def compact(self) -> None:
        """Keep only unfinished entries (call after recovery has handled them)."""
        with self._lock:
            started, done = self._read()
            keep = [e for e in started if e.seq not in done]
            tmp = self._path.with_suffix(".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for e in keep:
                    f.write(json.dumps(_line(e), ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)


def _line(e: JournalEntry) -> dict[str, object]:
    obj: dict[str, object] = {
        "seq": e.seq,
        "tenant_id": e.tenant_id,
        "doc_id": e.doc_id,
        "gen": e.generation,
    }
    if e.replaces is not None:
        obj["old"] = e.replaces
    return obj
