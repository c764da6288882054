"""LmdbStore: the local on-disk tier, one LMDB environment shared by the processes of a machine.

Layout, versioned like bazel-remote's `cas.v2`: `<dir>/lmdb.v1/{data,lock}.mdb` holding
named databases

    artifacts   key -> envelope bytes (opaque here; the tiered cache verifies them)
    meta        key -> u64 size, u64 last access (ns since the epoch), little-endian
    lru         u64 last access (big-endian, so it sorts) ‖ key -> b""   the eviction order
    info        b"total_bytes" -> u64, the sum of every stored value's size
    leases      key -> JSON lease record: holder, host, pid_space, pid, start, deadline
    stats       tier name -> JSON of `Counters`, summed over every process that recorded

Every write is one transaction, so readers in any process see a put, an eviction or a
stats update whole or not at all, and the running total never disagrees with the entries.

Concurrency: any number of processes and threads. LMDB serializes writers across
processes and never blocks readers. Failure contract: a directory that cannot be opened
or written, a full disk, a map that eviction cannot make room in, or any other LMDB
failure raises `StoreUnavailable` from the call (and counts an error). An invalid key,
or a call on a closed store, is a programming error: ValueError.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from fcache.cache.store import LeaseGrant, is_valid_key
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

LAYOUT = "lmdb.v1"

# One fixed, sparse reservation for every process. Growing the map later is what corrupts
# databases (py-lmdb #269: two processes resizing at once), and a process that opened with
# a different size than the others would resize on its first commit. 1 TiB costs address
# space only: without writemap the file grows with its contents, not with the map.
DEFAULT_MAP_SIZE = 1 << 40

# Slots in the shared reader table, fixed by the first opener: ranks × threads of a node,
# with room for slots that SIGKILLed processes leave until reader_check() frees them.
MAX_READERS = 4096

# Reads do not write: a hit only notes the access time in memory, and the notes go to
# disk in one write transaction at most every _TOUCH_INTERVAL_S (checked on the next hit),
# with the next put, on close and at exit. Writing on every hit would serialize all
# readers of the node on LMDB's single writer lock and fsync each time (~8 ms against
# ~50 µs for the read). LRU order only needs to be roughly right at that scale, so losing
# the notes of a crashed process is fine. _TOUCH_BATCH only bounds the notes' memory.
_TOUCH_BATCH = 4096
_TOUCH_INTERVAL_S = 10.0

# Lease polling: quick at first (most compiles of a region take a second or less), then
# at most four times a second per waiter so that many waiting ranks cost little.
_POLL_FIRST_S = 0.02
_POLL_MAX_S = 0.25
_POLL_GROWTH = 1.5

_META = struct.Struct("<QQ")  # size, last access ns
_U64 = struct.Struct("<Q")
_LRU_TIME = struct.Struct(">Q")
_TOTAL_BYTES = b"total_bytes"
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


# --- the environment of this process ---------------------------------------------------


class _ForkGate:
    """Makes fork() wait until no transaction of this process is in flight.

    A child must not use its parent's environment, and py-lmdb refuses to open it again
    until the inherited handle is closed; closing aborts whatever transactions the handle
    still has. Had another parent thread been inside a read transaction at fork time,
    that abort would release the *parent's* reader slot while the parent still reads. So
    fork waits for transactions to finish, and the child inherits none.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._forking = 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking += 1
            while self._active:
                self._cond.wait()

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking -= 1
            self._cond.notify_all()


@dataclass(slots=True)
class _Handle:
    """This process's one open environment on a directory, shared by every LmdbStore on it."""

    path: str
    env: lmdb.Environment
    artifacts: lmdb._Database
    meta: lmdb._Database
    lru: lmdb._Database
    info: lmdb._Database
    leases: lmdb._Database
    stats: lmdb._Database
    pid: int
    refs: int = 0


# LMDB forbids opening one environment twice in a process (its fcntl locks belong to the
# process, so closing either handle would drop both's locks): one handle per real path.
_handles: dict[str, _Handle] = {}
_registry_lock = threading.Lock()
_gate = _ForkGate()


def _before_fork() -> None:
    _registry_lock.acquire()
    _gate.before_fork()


def _after_fork_in_parent() -> None:
    _gate.after_fork_in_parent()
    _registry_lock.release()


def _after_fork_in_child() -> None:
    # The child has only the forking thread: start from fresh locks rather than inherit
    # ones that other parent threads might have held. Inherited handles are closed and
    # replaced lazily, when a store sees that its handle's pid is not this process's.
    global _registry_lock, _gate
    _registry_lock = threading.Lock()
    _gate = _ForkGate()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


_DB_NAMES = ("artifacts", "meta", "lru", "info", "leases", "stats")


def _open_handle(path: str, map_size: int) -> _Handle:
    try:
        os.makedirs(path, exist_ok=True)
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=8,
            max_readers=MAX_READERS,
            # Cached read transactions would keep reader slots across fork.
            max_spare_txns=0,
            # Durable commits; writemap stays off because with it ENOSPC kills the process.
            sync=True,
            metasync=True,
            writemap=False,
        )
        # Free the reader slots of processes that died without closing (SIGKILL, OOM).
        env.reader_check()
        dbs = {name: env.open_db(name.encode()) for name in _DB_NAMES}
    except (lmdb.Error, OSError) as exc:
        raise StoreUnavailable(f"cannot open the local cache at {path}: {exc}") from exc
    return _Handle(path=path, env=env, pid=os.getpid(), **dbs)


def _acquire_handle(path: str, map_size: int) -> _Handle:
    with _registry_lock:
        handle = _handles.get(path)
        if handle is not None and handle.pid != os.getpid():
            # Inherited through fork: the gate guaranteed it has no transaction in
            # flight, so closing it touches nothing of the parent's.
            handle.env.close()
            handle = None
        if handle is None:
            handle = _open_handle(path, map_size)
            _handles[path] = handle
        handle.refs += 1
        return handle


def _release_handle(handle: _Handle) -> None:
    with _registry_lock:
        if handle.pid != os.getpid() or _handles.get(handle.path) is not handle:
            return  # a parent's handle; _acquire_handle closes it if this process reopens
        handle.refs -= 1
        if handle.refs == 0:
            del _handles[handle.path]
            handle.env.close()


# --- lease holders ------------------------------------------------------------------------


def _pid_space() -> str:
    """Where a pid names the same process: this boot of this machine and this pid
    namespace (containers on one node may share a directory but not their pids). The
    hostname stands in where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return socket.gethostname()


_HOST = socket.gethostname()
_PID_SPACE = _pid_space()


@dataclass(frozen=True, slots=True)
class _LeaseRecord:
    """What the leases database holds per key (as JSON)."""

    holder: str  # unique per grant
    host: str  # for people reading the record
    pid_space: str  # see _pid_space
    pid: int
    start: int | None  # process start time in clock ticks since boot, None without /proc
    deadline: float  # seconds since the epoch

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> _LeaseRecord | None:
        """None for a record this version cannot read; such a lease counts as abandoned."""
        try:
            raw = json.loads(data)
            start = raw["start"]
            return cls(
                holder=str(raw["holder"]),
                host=str(raw["host"]),
                pid_space=str(raw["pid_space"]),
                pid=int(raw["pid"]),
                start=None if start is None else int(start),
                deadline=float(raw["deadline"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def is_live(self, now: float) -> bool:
        """Held by a running process and not past its deadline. A holder in another pid
        space (another container, or another machine on a network share, which LMDB does
        not support anyway) cannot be checked, so only the deadline ends its lease."""
        if now >= self.deadline:
            return False
        return self.pid_space != _PID_SPACE or _process_is(self.pid, self.start)


def _process_start(pid: int) -> int | None:
    """Start time of a running process (/proc/<pid>/stat field 22); None if there is no
    such process, it is a zombie, or the system has no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped by its parent
        return None
    return int(fields[19])


def _process_is(pid: int, start: int | None) -> bool:
    """Whether process `pid`, started at `start`, still runs. Comparing start times
    catches a pid that the kernel has handed to a new process since."""
    if os.path.isdir("/proc/self"):
        started = _process_start(pid)
        return started is not None and (start is None or started == start)
    try:  # no /proc (macOS): existence is all we can learn
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _new_lease(hold_s: float) -> _LeaseRecord:
    pid = os.getpid()
    # Random per grant, so that a holder whose lease was taken over (deadline passed)
    # cannot release its successor's, even one in the same process.
    holder = f"{_HOST}/{pid}/{os.urandom(6).hex()}"
    return _LeaseRecord(
        holder=holder,
        host=_HOST,
        pid_space=_PID_SPACE,
        pid=pid,
        start=_process_start(pid),
        deadline=time.time() + hold_s,
    )


# --- the store --------------------------------------------------------------------------


class LmdbStore:
    """The local tier: artifact bytes by key in LMDB, bounded by `max_bytes` with LRU eviction.

    Implements `ByteStore` and `Leases` (fcache.cache.store). Thread-safe; one instance
    may be shared by all threads of a process, and any number of processes may open the
    same directory. After fork, a child's first call reopens the environment for itself.

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
        try:
            self._handle: _Handle | None = _acquire_handle(self._env_path, map_size)
        except StoreUnavailable:
            self._count(errors=1)
            raise
        self._lock = threading.Lock()  # guards _handle replacement and the touch notes
        self._touches: dict[bytes, int] = {}
        self._touches_since = 0.0
        self._atexit = _flush_touches_at_exit(weakref.ref(self))
        atexit.register(self._atexit)

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
        touches = self._take_touches()

        def write(txn: lmdb.Transaction, h: _Handle) -> int:
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

        def remove(txn: lmdb.Transaction, h: _Handle) -> None:
            total = _total(txn, h)
            total -= _remove(txn, h, k)
            txn.put(_TOTAL_BYTES, _U64.pack(total), db=h.info)

        self._run("delete", True, remove)

    # What the CLI and the server need ------------------------------------------------------

    def contains(self, key: str) -> bool:
        k = _key(key)
        return self._run("contains", False, lambda txn, h: txn.get(k, db=h.meta) is not None)

    def entries(self) -> list[Entry]:
        """Every stored entry, in key order, read in one transaction; values are not read."""

        def scan(txn: lmdb.Transaction, h: _Handle) -> list[Entry]:
            out = []
            for k, raw in txn.cursor(db=h.meta):
                size, atime = _META.unpack(raw)
                out.append(Entry(k.decode(), size, atime / 1e9))
            return out

        return self._run("entries", False, scan)

    def total_bytes(self) -> int:
        return self._run("total_bytes", False, _total)

    def evict_to(self, max_bytes: int) -> int:
        """Evict least recently used entries until at most `max_bytes` remain; how many."""
        evicted = self._evict(max_bytes, keep=None)
        self._count(evictions=evicted)
        return evicted

    def record(self, counters_by_tier: Mapping[str, Counters]) -> None:
        """Add deltas to the persisted counters, all tiers in one transaction."""
        deltas = {t: c for t, c in counters_by_tier.items() if not c.is_zero()}
        if deltas:
            self._run("record", True, lambda txn, h: _add_stats(txn, h, deltas))

    def read_stats(self) -> dict[str, Counters]:
        """Persisted counters by tier, as recorded by every process so far."""

        def read(txn: lmdb.Transaction, h: _Handle) -> dict[str, Counters]:
            return {k.decode(): _counters(raw) for k, raw in txn.cursor(db=h.stats)}

        return self._run("read_stats", False, read)

    def clear_stats(self) -> None:
        """Forget the persisted counters (`fcache stats --zero`)."""
        self._run("clear_stats", True, lambda txn, h: txn.drop(h.stats, delete=False))

    def flush(self) -> None:
        """Write pending access-time notes now (close() and process exit do it too)."""
        touches = self._take_touches()
        if touches:
            self._run("flush", True, lambda txn, h: _apply_touches(txn, h, touches))

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
            atexit.unregister(self._atexit)
            _release_handle(handle)

    # Leases ------------------------------------------------------------------------------

    def acquire(self, key: str, wait_s: float) -> LeaseGrant | bytes | None:
        """Single flight among the processes sharing this directory.

        Returns the artifact bytes if they are (or become) stored; a grant if no live
        process holds the key's lease (a dead holder's or one past its deadline is taken
        over); None once `wait_s` passed with neither. A grant lasts `wait_s` too: as long
        as callers are prepared to wait for someone else's compile."""
        k = _key(key)
        give_up = time.monotonic() + wait_s
        delay = _POLL_FIRST_S
        waited = False
        while True:
            outcome = self._run("acquire", True, lambda txn, h: _try_lease(txn, h, k, wait_s))
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
                delay = min(delay * _POLL_GROWTH, _POLL_MAX_S)

    def release(self, grant: LeaseGrant) -> None:
        """Remove the lease record if it is still this grant's (not taken over since)."""
        k = _key(grant.key)

        def drop(txn: lmdb.Transaction, h: _Handle) -> None:
            raw = txn.get(k, db=h.leases)
            record = None if raw is None else _LeaseRecord.from_bytes(raw)
            if record is not None and record.holder == grant.holder:
                txn.delete(k, db=h.leases)

        self._run("release", True, drop)

    def _lease_changed(self, k: bytes, record: _LeaseRecord) -> bool:
        """Whether the artifact is stored, or `record` is no longer the key's live lease."""

        def look(txn: lmdb.Transaction, h: _Handle) -> bool:
            if txn.get(k, db=h.meta) is not None:
                return True
            raw = txn.get(k, db=h.leases)
            current = None if raw is None else _LeaseRecord.from_bytes(raw)
            return current != record or not record.is_live(time.time())

        return self._run("acquire", False, look)

    # Internals ---------------------------------------------------------------------------

    def _run(self, op: str, write: bool, body: Callable[[lmdb.Transaction, _Handle], T]) -> T:
        """Run `body` in one transaction; a failure is counted as an error of this tier."""
        try:
            return self._transact(op, write, body)
        except StoreUnavailable:
            self._count(errors=1)
            raise

    def _transact(self, op: str, write: bool, body: Callable[[lmdb.Transaction, _Handle], T]) -> T:
        """Run `body` in one transaction, translating LMDB's failures to StoreUnavailable."""
        handle = self._current_handle()
        for attempt in (1, 2):
            try:
                with _gate.transaction(), handle.env.begin(write=write) as txn:
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

    def _current_handle(self) -> _Handle:
        with self._lock:
            if self._handle is None:
                raise ValueError(f"{self!r} is closed")
            if self._handle.pid != os.getpid():
                self._handle = _acquire_handle(self._env_path, self._map_size)
            return self._handle

    def _put_txn(
        self, txn: lmdb.Transaction, h: _Handle, k: bytes, data: bytes, touches: dict[bytes, int]
    ) -> int:
        _apply_touches(txn, h, touches)
        total = _total(txn, h) - _remove(txn, h, k)
        now = time.time_ns()
        txn.put(k, data, db=h.artifacts)
        txn.put(k, _META.pack(len(data), now), db=h.meta)
        txn.put(_LRU_TIME.pack(now) + k, b"", db=h.lru)
        evicted, total = _evict_lru(txn, h, total + len(data), self.max_bytes, keep=k)
        txn.put(_TOTAL_BYTES, _U64.pack(total), db=h.info)
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
        touches = self._take_touches()

        def evict(txn: lmdb.Transaction, h: _Handle) -> int:
            _apply_touches(txn, h, touches)
            evicted, total = _evict_lru(txn, h, _total(txn, h), max_bytes, keep)
            txn.put(_TOTAL_BYTES, _U64.pack(total), db=h.info)
            return evicted

        return self._run("evict", True, evict)

    def _note_access(self, k: bytes) -> None:
        now = time.time_ns()
        with self._lock:
            if not self._touches:
                self._touches_since = time.monotonic()
            self._touches[k] = now
            due = (
                len(self._touches) >= _TOUCH_BATCH
                or time.monotonic() - self._touches_since >= _TOUCH_INTERVAL_S
            )
        if due:
            try:
                self.flush()
            except StoreUnavailable as exc:
                # The read succeeded; a lost access time only makes LRU order rougher.
                log.debug("dropped access-time notes: %s", exc)

    def _take_touches(self) -> dict[bytes, int]:
        with self._lock:
            touches, self._touches = self._touches, {}
        return touches

    def _count(self, **deltas: int) -> None:
        if self._stats is not None and any(deltas.values()):
            self._stats.add(self.name, **deltas)


def _flush_touches_at_exit(ref: weakref.ref[LmdbStore]) -> Callable[[], None]:
    # A weak reference, so that registering with atexit does not keep the store alive.
    def flush() -> None:
        store = ref()
        if store is not None:
            try:
                store.flush()
            except (StoreUnavailable, ValueError) as exc:
                log.debug("access times not written at exit: %s", exc)

    return flush


# --- transaction bodies -------------------------------------------------------------------


def _key(key: str) -> bytes:
    if not is_valid_key(key):
        raise ValueError(f"invalid cache key {key!r}: expected 32 lowercase hex characters")
    return key.encode()


def _total(txn: lmdb.Transaction, h: _Handle) -> int:
    raw = txn.get(_TOTAL_BYTES, db=h.info)
    return 0 if raw is None else _U64.unpack(raw)[0]


def _remove(txn: lmdb.Transaction, h: _Handle, k: bytes) -> int:
    """Delete key's value, meta and LRU row; the bytes freed (0 if absent)."""
    raw = txn.get(k, db=h.meta)
    txn.delete(k, db=h.artifacts)
    if raw is None:
        return 0
    size, atime = _META.unpack(raw)
    txn.delete(k, db=h.meta)
    txn.delete(_LRU_TIME.pack(atime) + k, db=h.lru)
    return size


def _evict_lru(
    txn: lmdb.Transaction, h: _Handle, total: int, limit: int, keep: bytes | None
) -> tuple[int, int]:
    """Evict oldest-accessed entries (never `keep`) until total <= limit: (evicted, total)."""
    victims = []
    for lru_key, _ in txn.cursor(db=h.lru):
        if total <= limit:
            break
        k = lru_key[_LRU_TIME.size :]
        if k == keep:
            continue
        raw = txn.get(k, db=h.meta)
        total -= 0 if raw is None else _META.unpack(raw)[0]
        victims.append(k)
    for k in victims:
        _remove(txn, h, k)
    return len(victims), total


def _apply_touches(txn: lmdb.Transaction, h: _Handle, touches: Mapping[bytes, int]) -> None:
    """Move noted accesses into meta and the LRU order; entries deleted meanwhile are skipped."""
    for k, when in touches.items():
        raw = txn.get(k, db=h.meta)
        if raw is None:
            continue
        size, atime = _META.unpack(raw)
        if when <= atime:
            continue
        txn.delete(_LRU_TIME.pack(atime) + k, db=h.lru)
        txn.put(_LRU_TIME.pack(when) + k, b"", db=h.lru)
        txn.put(k, _META.pack(size, when), db=h.meta)


def _try_lease(
    txn: lmdb.Transaction, h: _Handle, k: bytes, hold_s: float
) -> bytes | LeaseGrant | _LeaseRecord:
    """The stored artifact, a new grant, or the live record of the current holder."""
    data = txn.get(k, db=h.artifacts)
    if data is not None:
        return data
    raw = txn.get(k, db=h.leases)
    current = None if raw is None else _LeaseRecord.from_bytes(raw)
    if current is not None and current.is_live(time.time()):
        return current
    if current is not None:
        log.info("taking over the lease of %s from %s", k.decode(), current.holder)
    record = _new_lease(hold_s)
    txn.put(k, record.to_bytes(), db=h.leases)
    return LeaseGrant(k.decode(), record.holder)


def _counters(raw: bytes) -> Counters:
    try:
        return Counters.from_dict(json.loads(raw))
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("unreadable persisted stats, counting from zero: %s", exc)
        return Counters()


def _add_stats(txn: lmdb.Transaction, h: _Handle, deltas: Mapping[str, Counters]) -> None:
    for tier, delta in deltas.items():
        raw = txn.get(tier.encode(), db=h.stats)
        counters = Counters() if raw is None else _counters(raw)
        counters.add(delta)
        txn.put(tier.encode(), json.dumps(counters.to_dict(), sort_keys=True).encode(), db=h.stats)
