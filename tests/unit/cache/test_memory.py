"""LoadedRegions: an entry-bounded, thread-safe LRU of loaded callables."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from fcache.cache.memory import LoadedRegions
from fcache.stats import CacheStats


def fn(tag: int) -> Callable[[], int]:
    return lambda: tag


def test_get_returns_the_object_put() -> None:
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(4)
    f = fn(1)
    regions.put("a", f)
    assert regions.get("a") is f
    assert regions.get("b") is None
    assert len(regions) == 1


def test_least_recently_used_is_evicted_and_counted() -> None:
    stats = CacheStats()
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(2, stats)
    regions.put("a", fn(1))
    regions.put("b", fn(2))
    assert regions.get("a") is not None  # "b" is now the least recently used
    regions.put("c", fn(3))
    assert "b" not in regions
    assert "a" in regions and "c" in regions
    counted = stats.tier("memory")
    assert (counted.hits, counted.misses, counted.evictions) == (1, 0, 1)
    assert regions.get("b") is None
    assert stats.tier("memory").misses == 1


def test_replacing_a_key_does_not_evict() -> None:
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(2)
    regions.put("a", fn(1))
    regions.put("b", fn(2))
    regions.put("a", fn(3))
    assert len(regions) == 2
    assert regions.get("a")() == 3
    assert regions.get("b")() == 2


def test_membership_neither_counts_nor_reorders() -> None:
    stats = CacheStats()
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(2, stats)
    regions.put("a", fn(1))
    regions.put("b", fn(2))
    assert "a" in regions
    regions.put("c", fn(3))  # "a" is still the oldest
    assert "a" not in regions
    assert stats.tier("memory").hits == 0


def test_clear() -> None:
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(2)
    regions.put("a", fn(1))
    regions.clear()
    assert len(regions) == 0 and regions.get("a") is None


def test_invalid_use_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        LoadedRegions(0)
    with pytest.raises(ValueError, match="None"):
        LoadedRegions(1).put("a", None)


def test_concurrent_use_keeps_the_bound_and_the_counts() -> None:
    stats = CacheStats()
    regions: LoadedRegions[Callable[[], int]] = LoadedRegions(8, stats)
    rounds, threads = 2000, 4

    def work(offset: int) -> None:
        for i in range(rounds):
            name = str((i + offset) % 16)
            if regions.get(name) is None:
                regions.put(name, fn(i))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    counted = stats.tier("memory")
    assert len(regions) == 8
    assert counted.hits + counted.misses == rounds * threads
    # Every miss puts; a put racing another thread's put of the same key evicts nothing.
    assert 0 < counted.evictions <= counted.misses - 8
