"""LoadedRegions: the in-process tier, an entry-bounded LRU of loaded (callable) regions.

Unlike the other tiers it holds objects, not bytes: what an executor's `load` returned,
so a region seen again in the same process costs a dictionary look-up. Nothing here is
persisted or shared between processes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from fcache.stats import CacheStats

V = TypeVar("V")


class LoadedRegions(Generic[V]):
    """At most `max_entries` values by key; putting one more evicts the least recently used.

    Values are never None (None means absent). Thread-safe: every method takes one lock.
    Counts hits, misses and evictions into `stats` under tier "memory" when given one.
    """

    name = "memory"

    def __init__(self, max_entries: int, stats: CacheStats | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries={max_entries} must be >= 1")
        self.max_entries = max_entries
        self._stats = stats
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, V] = OrderedDict()

    def get(self, key: str) -> V | None:
        """The value under key, now the most recently used; None (a counted miss) if absent."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
        if value is None:
            self._count(misses=1)
        else:
            self._count(hits=1)
        return value

    def put(self, key: str, value: V) -> None:
        """Store value under key (replacing any); evict the least recently used beyond the bound."""
        if value is None:
            raise ValueError("LoadedRegions cannot hold None (it means absent)")
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            evicted = 0
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                evicted += 1
        if evicted:
            self._count(evictions=evicted)

    def __contains__(self, key: object) -> bool:
        """Membership without counting a hit or touching the LRU order."""
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _count(self, **deltas: int) -> None:
        if self._stats is not None:
            self._stats.add(self.name, **deltas)
