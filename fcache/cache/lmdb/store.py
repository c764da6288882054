"""LmdbStore: the local on-disk tier, one LMDB environment shared by the processes of a machine.

Every write is one transaction, so readers in any process see a put, an eviction or a
stats update whole or not at all, and the running total never disagrees with the entries.

Concurrency: any number of processes and threads. LMDB serializes writers across
processes and never blocks readers. Failure contract: a directory that cannot be opened
or written, a full disk, a map that eviction cannot make room in, or any other LMDB
failure raises `StoreUnavailable` from the call (and counts an error). An invalid key,
or a call on a closed store, is a programming error: ValueError.

The store runs the transactions; what they do lives beside it: the environment and fork
gate (env), eviction and access times (lru), leases (leases), persisted counters (stats).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from fcache import process
from fcache.cache.lmdb import leases, lru
from fcache.cache.lmdb import stats as persisted
from fcache.cache.lmdb.env import DEFAULT_MAP_SIZE, LAYOUT, Environments, Handle, environments
from fcache.cache.store import LeaseGrant
from fcache.errors import StoreUnavailable
from fcache.protocol.limits import is_valid_key
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

_FULL_ERRORS = (lmdb.MapFullError, lmdb.DiskError)  # map full; ENOSPC

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored artifact as `LmdbStore.entries` lists it; the value is not read."""

    key: str
    size: int
    last_access: float  # seconds since the epoch


class _StoreFull(StoreUnavailable):
    """The map or the disk is full; `put` evicts harder and retries once before raising."""


class LmdbStore:
    """The local tier: artifact bytes by key in LMDB, bounded by `max_bytes` with LRU eviction.

    Implements `ByteStore` and `Leases` (fcache.cache.store). Thread-safe; one instance
    may be shared by all threads of a process, and any number of processes may open the
    same directory. After fork, a child's first call reopens the environment for itself;
    after `fcache.process.reset()` (which closes every environment), so does the next call.

    `stats`, if given, receives what only the store can see, under tier "local": errors
    (every StoreUnavailable raised), evictions, lease grants and lease waits. Hits and
    misses are counted by the caller.
    `map_size` must be the same for every process opening the directory; keep the default
    outside tests. `max_bytes` counts value bytes; LMDB's own pages add a few percent.
    """

    name = "local"

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        stats: CacheStats | None = None,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes={max_bytes} must be > 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._stats = stats
        self._map_size = map_size
        self._env_path = os.path.realpath(self.path / LAYOUT)
        self._envs: Environments = environments()
        try:
            self._handle: Handle | None = self._envs.acquire(self._env_path, map_size)
        except StoreUnavailable:
            self._count(errors=1)
            raise
        self._lock = threading.Lock()  # guards _handle replacement
        self._touches = lru.AccessNotes()
        process.watch(self)  # at_exit writes the access-time notes

    def __repr__(self) -> str:
        return f"LmdbStore({str(self.path)!r}, max_bytes={self.max_bytes})"

    # ByteStore -------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        k = _key(key)
        data = self._run("get", False, lambda txn, h: txn.get(k, db=h.artifacts))
        if data is not None:
            self._note_access(k)
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store `data`, evicting least recently used entries beyond `max_bytes` in the same
        transaction. A value larger than `max_bytes` is not stored (it would evict
        everything and still not fit). Raises StoreUnavailable if the disk or map is full
        even after evicting half of the cache."""
        k = _key(key)
        if len(data) > self.max_bytes:
            log.info("not caching %s: %d bytes exceed max_bytes=%d", key, len(data), self.max_bytes)
            return
        touches = self._touches.take()

        def write(txn: lmdb.Transaction, h: Handle) -> int:
            return self._put_txn(txn, h, k, data, touches)

        try:
            evicted = self._transact("put", True, write)
        except _StoreFull as exc:
            log.warning("local cache full (%s); evicting half of it", exc)
            self._make_room()
            evicted = self._run("put", True, write)
        except StoreUnavailable:
            self._count(errors=1)
            raise
        self._count(evictions=evicted)

    def delete(self, key: str) -> None:
        k = _key(key)

        def remove(txn: lmdb.Transaction, h: Handle) -> None:
            total = lru.total(txn, h)
            total -= lru.remove(txn, h, k)
            txn.put(lru.TOTAL_BYTES, lru.U64.pack(total), db=h.info)

        self._run("delete", True, remove)

    # What the CLI and the server need ------------------------------------------------------

    def contains(self, key: str) -> bool:
        k = _key(key)
        return self._run("contains", False, lambda txn, h: txn.get(k, db=h.meta) is not None)

    def entries(self) -> list[Entry]:
        """Every stored entry, in key order, read in one transaction; values are not read."""

        def scan(txn: lmdb.Transaction, h: Handle) -> list[Entry]:
            out = []
            for k, raw in txn.cursor(db=h.meta):
                size, atime = lru.META.unpack(raw)
                out.append(Entry(k.decode(), size, atime / 1e9))
            return out

        return self._run("entries", False, scan)

    def total_bytes(self) -> int:
        return self._run("total_bytes", False, lru.total)

    def evict_to(self, max_bytes: int) -> int:
        """Evict least recently used entries until at most `max_bytes` remain; how many."""
        evicted = self._evict(max_bytes, keep=None)
        self._count(evictions=evicted)
        return evicted

    def record(self, counters_by_tier: Mapping[str, Counters]) -> None:
        """Add deltas to the persisted counters, all tiers in one transaction."""
        deltas = {t: c for t, c in counters_by_tier.items() if not c.is_zero()}
        if deltas:
            self._run("record", True, lambda txn, h: persisted.add_stats(txn, h, deltas))

    def read_stats(self) -> dict[str, Counters]:
        """Persisted counters by tier, as recorded by every process so far."""
        return self._run("read_stats", False, persisted.read_stats)

    def clear_stats(self) -> None:
        """Forget the persisted counters (`fcache stats --zero`)."""
        self._run("clear_stats", True, persisted.clear_stats)

    def flush(self) -> None:
        """Write pending access-time notes now (close() and process exit do it too)."""
        touches = self._touches.take()
        if touches:
            self._run("flush", True, lambda txn, h: lru.apply_touches(txn, h, touches))

    def close(self) -> None:
        """Flush access times and release this store's share of the environment.
        Idempotent; later calls on the store raise ValueError."""
        with self._lock:
            if self._handle is None:
                return
        try:
            self.flush()
        except StoreUnavailable as exc:
            log.debug("access times not written on close: %s", exc)
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            process.unwatch(self)
            self._envs.release(handle)

    def at_exit(self) -> None:
        """Write the access-time notes at process exit (fcache.process calls it)."""
        try:
            self.flush()
        except (StoreUnavailable, ValueError) as exc:
            log.debug("access times not written at exit: %s", exc)

    # Leases ------------------------------------------------------------------------------

    def acquire(self, key: str, wait_s: float) -> LeaseGrant | bytes | None:
        """Single flight among the processes sharing this directory.

        Returns the artifact bytes if they are (or become) stored; a grant if no live
        process holds the key's lease (a dead holder's or one past its deadline is taken
        over); None once `wait_s` passed with neither. A grant lasts `wait_s` too: as long
        as callers are prepared to wait for someone else's compile."""
        k = _key(key)
        give_up = time.monotonic() + wait_s
        delay = leases.POLL_FIRST_S
        waited = False
        while True:
            outcome = self._run("acquire", True, lambda txn, h: leases.try_lease(txn, h, k, wait_s))
            if isinstance(outcome, LeaseGrant):
                self._count(lease_grants=1)
                return outcome
            if isinstance(outcome, bytes):
                return outcome
            if not waited:
                waited = True
                self._count(lease_waits=1)
                log.debug("waiting for %s, compiled by %s", key, outcome.holder)
            # Poll read-only, so that waiters do not queue on the writer lock; try the write
            # transaction again only once the artifact is there or the lease changed hands.
            while not self._lease_changed(k, outcome):
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return None
                time.sleep(min(delay, remaining))
                delay = min(delay * leases.POLL_GROWTH, leases.POLL_MAX_S)

    def release(self, grant: LeaseGrant) -> None:
        """Remove the lease record if it is still this grant's (not taken over since)."""
        k = _key(grant.key)
        self._run("release", True, lambda txn, h: leases.drop_lease(txn, h, k, grant.holder))

    def _lease_changed(self, k: bytes, record: leases.LeaseRecord) -> bool:
        """Whether the artifact is stored, or `record` is no longer the key's live lease."""
        return self._run("acquire", False, lambda txn, h: leases.lease_changed(txn, h, k, record))

    # Internals ---------------------------------------------------------------------------

    def _run(self, op: str, write: bool, body: Callable[[lmdb.Transaction, Handle], T]) -> T:
        """Run `body` in one transaction; a failure is counted as an error of this tier."""
        try:
            return self._transact(op, write, body)
        except StoreUnavailable:
            self._count(errors=1)
            raise

    def _transact(self, op: str, write: bool, body: Callable[[lmdb.Transaction, Handle], T]) -> T:
        """Run `body` in one transaction, translating LMDB's failures to StoreUnavailable."""
        handle = self._current_handle()
        for attempt in (1, 2):
            try:
                with self._envs.transaction(), handle.env.begin(write=write) as txn:
                    return body(txn, handle)
            except lmdb.ReadersFullError as exc:
                # Slots of killed processes; free them and try once more.
                if attempt == 2 or handle.env.reader_check() == 0:
                    raise StoreUnavailable(f"local cache {op}: {exc}") from exc
            except _FULL_ERRORS as exc:
                raise _StoreFull(f"local cache {op} at {self._env_path}: {exc}") from exc
            except (lmdb.Error, OSError) as exc:
                raise StoreUnavailable(f"local cache {op} at {self._env_path}: {exc}") from exc
        raise AssertionError("unreachable")

    def _current_handle(self) -> Handle:
        with self._lock:
            if self._handle is None:
                raise ValueError(f"{self!r} is closed")
            if self._handle.pid != os.getpid() or self._handle.closed:
                # Forked (the registry closes the inherited handle), or process.reset()
                # closed the environment: reopen through this process's registry now.
                self._envs = environments()
                self._handle = self._envs.acquire(self._env_path, self._map_size)
            return self._handle

    def _put_txn(
        self, txn: lmdb.Transaction, h: Handle, k: bytes, data: bytes, touches: dict[bytes, int]
    ) -> int:
        lru.apply_touches(txn, h, touches)
        total = lru.total(txn, h) - lru.remove(txn, h, k)
        now = time.time_ns()
        txn.put(k, data, db=h.artifacts)
        txn.put(k, lru.META.pack(len(data), now), db=h.meta)
        txn.put(lru.LRU_TIME.pack(now) + k, b"", db=h.lru)
        evicted, total = lru.evict_lru(txn, h, total + len(data), self.max_bytes, keep=k)
        txn.put(lru.TOTAL_BYTES, lru.U64.pack(total), db=h.info)
        return evicted

    def _make_room(self) -> None:
        """Evict half of the cache, in two commits. Freed pages let the map or file take
        new values without growing, but the pages that commit T frees belong to snapshot
        T-1, which LMDB's second meta page keeps (for crash recovery) until commit T+1:
        only commit T+2 may reuse them. So a quarter goes first, and the second quarter's
        commit makes the first quarter's pages available to the put that follows."""
        total = self.total_bytes()
        evicted = self._evict(total * 3 // 4, keep=None)
        evicted += self._evict(total // 2, keep=None)
        self._count(evictions=evicted)

    def _evict(self, max_bytes: int, keep: bytes | None) -> int:
        touches = self._touches.take()

        def evict(txn: lmdb.Transaction, h: Handle) -> int:
            lru.apply_touches(txn, h, touches)
            evicted, total = lru.evict_lru(txn, h, lru.total(txn, h), max_bytes, keep)
            txn.put(lru.TOTAL_BYTES, lru.U64.pack(total), db=h.info)
            return evicted

        return self._run("evict", True, evict)

    def _note_access(self, k: bytes) -> None:
        if self._touches.note(k):
            try:
                self.flush()
            except StoreUnavailable as exc:
                # The read succeeded; a lost access time only makes LRU order rougher.
                log.debug("dropped access-time notes: %s", exc)

    def _count(self, **deltas: int) -> None:
        if self._stats is not None and any(deltas.values()):
            self._stats.add(self.name, **deltas)


def _key(key: str) -> bytes:
    if not is_valid_key(key):
        raise ValueError(f"invalid cache key {key!r}: expected 32 lowercase hex characters")
    return key.encode()
