"""LmdbStore: the local on-disk tier, one LMDB environment shared by the processes of a machine.

Every write is one transaction, so readers in any process see a put, an eviction or a
stats update whole or not at all, and the running total never disagrees with the entries.

Concurrency: any number of processes and threads; a forked child's first call reopens
the environment, with fresh locks (`after_fork_in_child`). LMDB serializes writers across
processes and never blocks readers. Failure contract: a directory that cannot be opened
or written, or any other LMDB failure raises `StoreUnavailable` from the call (and counts
an error). A full disk or map is `StoreFull` (a StoreUnavailable): a commit that fails
with ENOSPC, EFBIG, or the EIO that LMDB reports for a short write raises it, and nothing
is evicted to make room: what was acknowledged stays (issue #42); reads go on, and
writes work again once space frees. An invalid key, or a call on a closed store, is a
programming error: ValueError.

Version skew: `put` never replaces an envelope of a newer format (an older fcache's
write would otherwise destroy a newer one's entry in a shared directory).

Healing: an entry is its value row. A meta row left without one (an interrupted tool, a
hand edit) is absent to `get`, `contains`, `add` and `entries`, and `get` removes it. The
reader slots of processes killed inside a read transaction are freed within a second or
as soon as the file grows, counted as `stale_readers`, and a file that grew past its cap
all the same is compacted (fcache.cache.lmdb.upkeep).

The store runs the transactions; what they do lives beside it: the environment and fork
gate (env), eviction and access times (lru), leases (leases), persisted counters (stats),
the file's size (upkeep).
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
from fcache.cache.artifact import newer_than
from fcache.cache.lmdb import leases, lru, upkeep
from fcache.cache.lmdb import stats as persisted
from fcache.cache.lmdb.env import (
    DEFAULT_MAP_SIZE,
    LAYOUT,
    Environments,
    Handle,
    environments,
    modes,
)
from fcache.cache.store import LeaseGrant
from fcache.errors import StoreFull, StoreUnavailable
from fcache.protocol.limits import is_valid_key
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

_FULL_ERRORS = (lmdb.MapFullError, lmdb.DiskError)  # map full; ENOSPC
# What a failed commit on a full disk says: LMDB turns a short write into EIO; a file
# size limit (RLIMIT_FSIZE) is EFBIG.
_FULL_MESSAGES = ("No space left", "Input/output error", "Disk quota exceeded", "File too large")


class _Retired(Exception):
    """The handle's environment was replaced by a compacted copy: reopen and run again."""


T = TypeVar("T")
_Body = Callable[[lmdb.Transaction, Handle], T]  # a transaction body


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored artifact as `LmdbStore.entries` lists it; the value is not read."""

    key: str
    size: int
    last_access: float  # seconds since the epoch


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
    `group` (a gid) shares the directory with a group (modes in fcache.cache.lmdb.env).
    """

    name = "local"

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        stats: CacheStats | None = None,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        group: int | None = None,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes={max_bytes} must be > 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._stats = stats
        self._map_size = map_size
        self._group = group
        self._env_path = os.path.realpath(self.path / LAYOUT)
        self._envs: Environments = environments()
        try:
            self._handle: Handle | None = self._envs.acquire(self._env_path, map_size, group)
        except StoreUnavailable:
            self._count(errors=1)
            raise
        self._lock = threading.Lock()  # guards _handle replacement
        self._touches = lru.AccessNotes()
        process.watch(self)  # at_exit writes the access-time notes; fork renews the locks

    def __repr__(self) -> str:
        return f"LmdbStore({str(self.path)!r}, max_bytes={self.max_bytes})"

    # ByteStore -------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        k = _key(key)

        def read(txn: lmdb.Transaction, h: Handle) -> tuple[bytes | None, bool]:
            data = txn.get(k, db=h.artifacts)
            return data, data is None and txn.get(k, db=h.meta) is not None

        data, orphaned = self._run("get", False, read)
        if data is not None:
            self._note_access(k)
        elif orphaned:
            log.warning("local cache: %s has a meta row but no value; removing it", key)
            self.delete(key)
        return data

    def peek(self, key: str) -> bytes | None:
        """The stored bytes, without marking the entry used: for readers that only look
        (`fcache ls`, `fcache explain`), so that looking does not reorder what eviction
        takes first."""
        k = _key(key)
        return self._run("peek", False, lambda txn, h: txn.get(k, db=h.artifacts))

    def put(self, key: str, data: bytes) -> None:
        """Store `data`, evicting least recently used entries beyond `max_bytes` in the same
        transaction. A value larger than `max_bytes` is not stored (it would evict
        everything and still not fit), nor one that would replace an envelope of a newer
        format. Raises StoreFull if the disk or map has no room (nothing is evicted to
        make some), StoreUnavailable for other failures."""
        k = _key(key)
        if len(data) > self.max_bytes:
            log.info("not caching %s: %d bytes exceed max_bytes=%d", key, len(data), self.max_bytes)
            return
        touches = self._touches.take()

        def write(txn: lmdb.Transaction, h: Handle) -> int:
            current = txn.get(k, db=h.artifacts)
            if current is not None and newer_than(current, data):
                log.info("local cache: keeping %s, written by a newer fcache", key)
                lru.apply_touches(txn, h, touches)
                return 0
            return self._put_txn(txn, h, k, data, touches)

        self._count(evictions=self._write("put", write))

    def add(self, key: str, data: bytes, replacing: bytes | None = None) -> bytes | None:
        """Store `data` only if nothing is stored under key, or what is stored is exactly
        `replacing`; atomically (one write transaction: of racing adds one wins). Returns
        None when stored, else the bytes that are stored (and stay). Evicts and fails like
        `put`; a value larger than `max_bytes` is not stored (None is returned all the
        same, as `put` returns: nothing else is stored either)."""
        k = _key(key)
        if len(data) > self.max_bytes:
            log.info("not caching %s: %d bytes exceed max_bytes=%d", key, len(data), self.max_bytes)
            return None
        touches = self._touches.take()

        def write(txn: lmdb.Transaction, h: Handle) -> tuple[bytes | None, int]:
            current = txn.get(k, db=h.artifacts)
            if current is not None and current != replacing:
                return current, 0
            return None, self._put_txn(txn, h, k, data, touches)

        current, evicted = self._write("add", write)
        self._count(evictions=evicted)
        return current

    def _write(self, op: str, body: Callable[[lmdb.Transaction, Handle], T]) -> T:
        """Run a write transaction; then compact the file if it grew past its cap. A full
        disk or map raises StoreFull: nothing acknowledged is evicted to make room."""
        try:
            result = self._run(op, True, body)
        except StoreFull as exc:
            log.warning("local cache full, refusing the write (nothing evicted): %s", exc)
            raise
        handle = self._handle
        if handle is not None:
            dir_mode, file_mode = modes(self._group)
            upkeep.maybe_compact(self._envs, handle, self.max_bytes, dir_mode, file_mode)
        return result

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
        return self._run("contains", False, lambda txn, h: lru.has_value(txn, h, k))

    def size_of(self, key: str) -> int | None:
        """The stored value's size in bytes, without reading it; None if absent."""
        k = _key(key)

        def size(txn: lmdb.Transaction, h: Handle) -> int | None:
            raw = txn.get(k, db=h.meta)
            if raw is None or not lru.has_value(txn, h, k):
                return None
            return int(lru.META.unpack(raw)[0])

        return self._run("size_of", False, size)

    def entries(self) -> list[Entry]:
        """Every stored entry, in key order, read in one transaction; values are not read."""

        def scan(txn: lmdb.Transaction, h: Handle) -> list[Entry]:
            out = []
            for k, raw in txn.cursor(db=h.meta):
                if not lru.has_value(txn, h, k):
                    continue  # a meta row left behind: absent (get removes it)
                size, atime = lru.META.unpack(raw)
                out.append(Entry(k.decode(), size, atime / 1e9))
            return out

        return self._run("entries", False, scan)

    def backup(self, dest: Path) -> Path:
        """A consistent, compacted copy of the store into `dest` (which must not hold one
        already), made while it is in use: LMDB copies one read transaction's snapshot.
        `dest` can then be opened as a store (or served with `fcache-server --db dest`).
        Returns the directory of the copied environment."""
        dir_mode, _ = modes(self._group)
        target = Path(dest) / LAYOUT
        if target.exists() and any(target.iterdir()):
            raise ValueError(f"{target} is not empty; back up into a new directory")
        try:
            target.mkdir(mode=dir_mode, parents=True, exist_ok=True)
        except OSError as exc:
            self._count(errors=1)
            raise StoreUnavailable(f"cannot create the backup directory {target}: {exc}") from exc

        def copy(txn: lmdb.Transaction, h: Handle) -> None:
            # The copy is this read transaction's snapshot: entries, meta, LRU and the
            # total_bytes row of one state, whatever writers commit meanwhile.
            h.env.copy(str(target), compact=True, txn=txn)

        self._run("backup", False, copy)
        return target

    def get_unmapped(self, key: str) -> memoryview | None:
        """As `get`, the pages read leaving resident memory (upkeep.read_unmapped)."""
        k = _key(key)
        data = self._run("get", False, lambda txn, h: upkeep.read_unmapped(txn, h, k), True)
        if data is not None:
            self._note_access(k)  # served: recently used
        return data

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

    def after_fork_in_child(self) -> None:
        """Fresh locks: another parent thread may have held them at the fork (a reader
        noting an access, say), and the child has only the forking thread. The parent's
        access-time notes are the parent's to write."""
        self._lock = threading.Lock()
        self._touches = lru.AccessNotes()

    def at_exit(self) -> None:
        """Write the access-time notes at process exit (fcache.process calls it)."""
        try:
            self.flush()
        except (StoreUnavailable, ValueError) as exc:
            log.debug("access times not written at exit: %s", exc)

    # Leases ------------------------------------------------------------------------------

    def acquire(
        self, key: str, wait_s: float, waiting: Callable[[], None] | None = None
    ) -> LeaseGrant | bytes | None:
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
                if waiting is not None:
                    waiting()
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

    def _run(self, op: str, write: bool, body: _Body[T], buffers: bool = False) -> T:
        """Run `body` in one transaction; a failure is counted as an error of this tier.
        `buffers`: values are views into the map, valid only inside `body`."""
        try:
            return self._transact(op, write, body, buffers)
        except StoreUnavailable:
            self._count(errors=1)
            raise

    def _transact(self, op: str, write: bool, body: _Body[T], buffers: bool = False) -> T:
        """Run `body` in one transaction, translating LMDB's failures to StoreUnavailable
        (StoreFull for a write the disk or map has no room for)."""
        handle = self._current_handle()
        self._check_readers(handle, due_only=True)
        for attempt in (1, 2, 3):
            try:
                with (
                    self._envs.transaction(handle),
                    handle.env.begin(write=write, buffers=buffers) as txn,
                ):
                    if txn.get(upkeep.RETIRED, db=handle.info) is not None:
                        raise _Retired
                    return body(txn, handle)
            except _Retired:
                # Compacted by some process: move to the copy, which holds every commit.
                self._envs.retire(handle)
                handle = self._current_handle()
                continue
            except lmdb.ReadersFullError as exc:
                # Slots of killed processes; free them and try once more.
                if attempt == 2 or self._check_readers(handle, due_only=False) == 0:
                    raise StoreUnavailable(f"local cache {op}: {exc}") from exc
            except (lmdb.Error, OSError) as exc:
                where = f"local cache {op} at {self._env_path}: {exc}"
                if write and (
                    isinstance(exc, _FULL_ERRORS) or any(m in str(exc) for m in _FULL_MESSAGES)
                ):
                    raise StoreFull(where) from exc
                raise StoreUnavailable(where) from exc
        raise StoreUnavailable(f"local cache {op}: the environment kept being replaced")

    def _check_readers(self, handle: Handle, *, due_only: bool) -> int:
        """Free the reader slots of dead processes (when due, if `due_only`); how many."""
        return upkeep.check_readers(
            self._envs, handle, due_only, lambda n: self._count(stale_readers=n)
        )

    def _current_handle(self) -> Handle:
        with self._lock:
            if self._handle is None:
                raise ValueError(f"{self!r} is closed")
            if self._handle.retired and self._handle.pid == os.getpid():
                # Replaced by a compacted copy: give the old handle back, open the copy.
                old, self._handle = self._handle, None
                self._envs.release(old)
                self._handle = self._envs.acquire(self._env_path, self._map_size, self._group)
            elif self._handle.pid != os.getpid() or self._handle.closed:
                # Forked (the registry closes the inherited handle), or process.reset()
                # closed the environment: reopen through this process's registry now.
                self._envs = environments()
                self._handle = self._envs.acquire(self._env_path, self._map_size, self._group)
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
