"""A cache bounded by entries and by the characters its entries keep alive.

Caches keyed by value (texts, frozen messages) keep their keys alive: a count of entries
alone does not bound their memory when a request may bring many long texts. Not
thread-safe (each cache is used on one event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class BoundedCache(Generic[_K, _V]):
    """Values by key, at most `max_entries` of them keeping at most `max_chars` characters
    in all: the oldest go first to make room; an entry of more than `max_chars` characters
    is never kept."""

    __slots__ = ("_entries", "chars", "max_chars", "max_entries")

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self._entries: OrderedDict[_K, tuple[_V, int]] = OrderedDict()
        self.chars = 0
        """Characters the kept entries hold."""
        self.max_entries = max_entries
        self.max_chars = max_chars

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: _K) -> _V | None:
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: _K, value: _V, chars: int) -> None:
        """Keep `value` for `key`; the entry (key and value) holds `chars` characters."""
        entries = self._entries
        if chars > self.max_chars or key in entries:
            return
        while entries and (len(entries) >= self.max_entries or self.chars + chars > self.max_chars):
            self.chars -= entries.popitem(last=False)[1][1]
        entries[key] = (value, chars)
        self.chars += chars

    def clear(self) -> None:
        self._entries.clear()
        self.chars = 0
