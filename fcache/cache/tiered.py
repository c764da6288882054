"""TieredCache: the byte tiers (local LMDB, then fcache-server, then Redis) as the one cache the
pipeline calls.

Look-ups go down the tiers in order and copy a hit back up into the tiers above it.
Everything read is decoded and verified (fcache.cache.artifact) before it is returned or
copied up, so a corrupt entry is a counted miss, deleted from the tier that held it,
never a wrong kernel. An entry in a newer envelope format is a miss too (counted
`incompatible`), left where it is for the newer readers.

Trust: `open` always has a signer (fcache.cache.signing.signer_for: the key file set, or
the cache directory's own key, made on first use). Every artifact put is signed for its
key, and every artifact read must carry a valid signature for the key it was read under
before it is returned, copied into a faster tier or handed to an executor; one that does
not is refused (a miss, counted `unverified`, logged), and reported to the tier that held
it (`report_bad`: fcache-server then drops it, so the put that follows is not refused as
a conflict) or left where it was (a put of ours replaces it). Only `verify=False`
(FCACHE_VERIFY=0, logged loudly) reads unverified entries; a cache built without a signer
(tests) neither signs nor checks.

Failure contract: no method raises because a tier failed. A tier raising
`StoreUnavailable` has counted its own error. The local tier then backs off (one
warning): its reads go on, and writes after a failed write are skipped for a while and
tried again (fcache.cache.backoff), so a disk that filled up is used again once it has
room. The remote and Redis tiers keep being asked (their clients have a circuit breaker that
fails fast during an outage and lets the server back in after it, and log the outage
themselves).
Thread-safe.

Counted here, per tier: hits, misses, bytes_read, compile_seconds_saved, corrupt,
unverified, incompatible, puts, bytes_written. Stores count their own errors, evictions
and lease activity.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from fcache import process
from fcache.cache.artifact import Artifact, decode, encode
from fcache.cache.backoff import Backoff
from fcache.cache.lmdb import LmdbStore
from fcache.cache.memory import LoadedRegions
from fcache.cache.signing import Signer, signer_for
from fcache.cache.store import ByteStore, LeaseGrant, Leases
from fcache.config import Settings, group_id, redact_url
from fcache.errors import CorruptArtifact, NewerFormat, StoreUnavailable, Unverified
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

# Tiers that fail fast while down and come back by themselves: no back-off of ours.
_RECOVERING_TIERS = frozenset({"remote", "redis"})


class TieredCache:
    """Artifacts by key across `stores` (fastest first), with single flight through `leases`,
    and above them `memory`, the in-process tier of loaded (callable) regions.

    `leases` is normally the remote store when a server is configured (its server gives
    single flight across its clients, and across nodes when it has a Redis), else the Redis
    store when one is configured (single flight across nodes), else the local store;
    `fallback_leases` (the local store, then) serves while `leases` fails, so ranks sharing
    a cache directory still compile a region once when the server or Redis is down. A
    compile lease waits at most `lease_timeout_s` for another process's compile. Use one
    TieredCache per CacheStats: `flush_stats` persists every counter of `stats` that
    changed since the last flush. `signer` signs what is put and checks what is read (see
    the module docstring).
    """

    def __init__(
        self,
        stores: Sequence[ByteStore],
        leases: Leases | None,
        stats: CacheStats,
        *,
        fallback_leases: Leases | None = None,
        lease_timeout_s: float = 900.0,
        memory_entries: int = 4096,
        signer: Signer | None = None,
        verify: bool = True,
    ) -> None:
        names = [store.name for store in stores]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        self._stores = tuple(stores)
        self._leases = tuple(x for x in (leases, fallback_leases) if x is not None)
        self._stats = stats
        self.signer = signer
        # Reads are checked against the signer unless verification was turned off.
        self._checker = signer if verify else None
        # Holds objects, not bytes: nothing in it is verified again, shared or persisted.
        self.memory: LoadedRegions[object] = LoadedRegions(memory_entries, stats)
        self.lease_timeout_s = lease_timeout_s
        self._lock = threading.Lock()
        # Per tier: when reading, and when writing, may be tried again after a failure.
        self._reads = {name: Backoff() for name in names}
        self._writes = {name: Backoff() for name in names}
        self._warned: set[str] = set()
        self._owned: tuple[ByteStore, ...] = ()
        self._closed = False
        # Where this process's counters are persisted for `fcache stats`.
        self._stats_sink = next((s for s in stores if isinstance(s, LmdbStore)), None)
        self._flush_lock = threading.Lock()
        self._flushed: dict[str, Counters] = {}
        self._fork_snapshot: dict[str, Counters] | None = None
        process.watch(self)

    @classmethod
    def open(cls, settings: Settings, stats: CacheStats) -> TieredCache:
        """The tiers `settings` asks for. An unusable cache directory or server costs one
        warning and that tier; the cache then works with what is left (possibly nothing
        but the caller's in-memory tier). The returned cache owns and closes its stores.
        A signing key file that is set but cannot be used (unreadable, too short, readable
        by others) raises ConfigError: it is never silently dropped."""
        signer = signer_for(settings)
        group = group_id(settings.cache_group) if settings.cache_group else None
        stores: list[ByteStore] = []
        local: LmdbStore | None = None
        try:
            local = LmdbStore(settings.cache_dir, settings.max_bytes, stats, group=group)
            stores.append(local)
        except StoreUnavailable as exc:
            _warn(f"fcache: the cache directory is unusable, caching in memory only: {exc}")
        remote = _connect_remote(settings, stats) if settings.server else None
        if remote is not None:
            stores.append(remote)
        shared = _connect_redis(settings, stats) if settings.redis else None
        if shared is not None:
            stores.append(shared)
        leases = remote or shared
        cache = cls(
            stores,
            leases or local,
            stats,
            fallback_leases=local if leases is not None else None,
            lease_timeout_s=settings.lease_timeout_s,
            memory_entries=settings.memory_entries,
            signer=signer,
            verify=settings.verify,
        )
        cache._owned = tuple(stores)
        return cache

    @property
    def tiers(self) -> tuple[str, ...]:
        """Names of the byte tiers, in look-up order."""
        return tuple(s.name for s in self._stores)

    def get(self, key: str) -> tuple[Artifact, str] | None:
        """The verified artifact and the name of the tier that had it, or None (a miss)."""
        return self.lookup(key)[0]

    def lookup(self, key: str) -> tuple[tuple[Artifact, str] | None, tuple[str, ...]]:
        """`get`'s answer, and the tiers asked on the way that failed (or were skipped
        while failing): those did not miss, and a model's stats say so."""
        failed = []
        for index, store in enumerate(self._stores):
            if not self._reads[store.name].allows():
                failed.append(store.name)
                continue
            found, answered = self._read(store, key)
            if found is not None:
                artifact, data = found
                self._write(self._stores[:index], key, data)
                return (artifact, store.name), tuple(failed)
            if not answered:
                failed.append(store.name)
        return None, tuple(failed)

    def put(self, key: str, artifact: Artifact) -> None:
        """Sign (with a signer), encode once and store in every tier that takes writes now;
        failures are counted, not raised."""
        if self.signer is not None:
            artifact = self.signer.sign(key, artifact)
        self._write(self._stores, key, encode(artifact))

    def discard(self, key: str) -> None:
        """Delete key from every tier: its artifact verified but its executor cannot use it."""
        for store in self._stores:
            if self._writes[store.name].allows():
                self._delete(store, key)

    @contextmanager
    def compile_lease(
        self, key: str, waiting: Callable[[], None] | None = None
    ) -> Iterator[Artifact | None]:
        """Single flight around a compile. Yields the verified artifact if another process
        produced it meanwhile, else None: the caller compiles now and calls `put` inside the
        block. The lease is released on leaving the block, also on an exception. Without
        leases, or when they fail or time out, yields None (compiling twice is only slower).
        `waiting`: called when another process holds the lease, before waiting for it."""
        leases, outcome = self._acquire(key, waiting)
        if isinstance(outcome, bytes):
            artifact = self._verify_leased(leases, key, outcome)
            if artifact is not None:
                yield artifact
                return
        try:
            yield None
        finally:
            if isinstance(outcome, LeaseGrant):
                self._release(leases, outcome)

    def flush_stats(self) -> None:
        """Add this process's counters since the last flush to the local tier's persisted
        stats (all tiers), so `fcache stats` sums every process. Also runs at exit. A failed
        flush keeps the delta for the next one."""
        sink = self._stats_sink
        if sink is None or self._closed or not self._writes[sink.name].allows():
            return
        with self._flush_lock:
            current = self._stats.snapshot()
            delta = {tier: _minus(c, self._flushed.get(tier)) for tier, c in current.items()}
            try:
                sink.record(delta)
            except StoreUnavailable as exc:
                log.debug("stats not persisted: %s", exc)
                return
            self._flushed = current

    def close(self) -> None:
        """Flush stats and close the stores `open` created. Idempotent."""
        if self._closed:
            return
        self.flush_stats()
        self._closed = True
        process.unwatch(self)
        self.memory.clear()
        for store in self._owned:
            close: Callable[[], None] | None = getattr(store, "close", None)
            if close is not None:
                close()

    # Process hooks (fcache.process) ------------------------------------------------------

    def at_exit(self) -> None:
        try:
            self.flush_stats()
        except ValueError as exc:  # its store was closed by its owner before exit
            log.debug("stats not persisted at exit: %s", exc)

    # A forked child inherits its parent's counters; what the parent had not flushed yet is
    # the parent's to flush. So the child's baseline is the snapshot taken just before fork.
    def before_fork(self) -> None:
        self._fork_snapshot = self._stats.snapshot()

    def after_fork_in_child(self) -> None:
        if self._fork_snapshot is not None:
            self._flushed = self._fork_snapshot
        # Another parent thread may have held these at fork; the child has only one.
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    # Internals ---------------------------------------------------------------------------

    def _read(self, store: ByteStore, key: str) -> tuple[tuple[Artifact, bytes] | None, bool]:
        """(the verified artifact and its bytes, or None for a miss; whether the tier
        answered: False when it failed, which is no miss)."""
        try:
            data = store.get(key)
        except StoreUnavailable as exc:
            self._failed(store, exc, self._reads)
            return None, False
        self._recovered(store, self._reads)
        if data is None:
            self._stats.add(store.name, misses=1)
            return None, True
        artifact = self._verify(store, key, data)
        if artifact is None:
            return None, True
        self._stats.add(
            store.name,
            hits=1,
            bytes_read=len(data),
            compile_seconds_saved=artifact.compile_seconds,
        )
        return (artifact, data), True

    def _verify(self, store: ByteStore, key: str, data: bytes) -> Artifact | None:
        """Decode and check the signature. A corrupt entry is counted as corrupt and a
        miss, and deleted; a newer format's, or one that fails the signature, is a counted
        miss left in place (a put of ours replaces it)."""
        try:
            artifact = decode(data)
            if self._checker is not None:
                self._checker.verify(key, artifact)
            return artifact
        except CorruptArtifact as exc:
            self._stats.add(store.name, corrupt=1, misses=1)
            log.warning("dropping corrupt entry %s from the %s cache: %s", key, store.name, exc)
            self._delete(store, key)
        except NewerFormat as exc:
            self._stats.add(store.name, incompatible=1, misses=1)
            log.info("skipping %s in the %s cache: %s", key, store.name, exc)
        except Unverified as exc:
            self._stats.add(store.name, unverified=1, misses=1)
            log.warning("refusing %s from the %s cache, not loading it: %s", key, store.name, exc)
            self._report(store, key, data, str(exc))
        return None

    def _report(self, store: ByteStore, key: str, data: bytes, why: str) -> None:
        """Tell a tier that can be told (fcache-server) that its entry failed our check, so
        that it drops it and our put that follows is stored rather than refused."""
        report: Callable[[str, bytes, str], None] | None = getattr(store, "report_bad", None)
        if report is None:
            return
        try:
            report(key, data, why)
        except StoreUnavailable as exc:
            log.debug("could not report %s to the %s cache: %s", key, store.name, exc)

    def _delete(self, store: ByteStore, key: str) -> None:
        try:
            store.delete(key)
        except StoreUnavailable as exc:
            self._failed(store, exc, self._writes)

    def _write(self, stores: Sequence[ByteStore], key: str, data: bytes) -> None:
        for store in stores:
            if not self._writes[store.name].allows():
                continue
            try:
                store.put(key, data)
            except StoreUnavailable as exc:
                self._failed(store, exc, self._writes)
            else:
                self._recovered(store, self._writes)
                self._stats.add(store.name, puts=1, bytes_written=len(data))

    def _acquire(
        self, key: str, waiting: Callable[[], None] | None
    ) -> tuple[Leases | None, LeaseGrant | bytes | None]:
        """Ask the first lease provider that answers; (None, None) when none does."""
        for leases in self._leases:
            if not self._writable(leases):
                continue
            try:
                return leases, leases.acquire(key, self.lease_timeout_s, waiting)
            except StoreUnavailable as exc:
                self._failed(leases, exc, self._writes)
        return None, None

    def _release(self, leases: Leases | None, grant: LeaseGrant) -> None:
        if leases is None:
            return
        try:
            leases.release(grant)
        except StoreUnavailable as exc:
            # The lease lapses by itself: its holder's deadline or death ends it.
            self._failed(leases, exc, self._writes)

    def _verify_leased(self, leases: Leases | None, key: str, data: bytes) -> Artifact | None:
        """Bytes another process put while we waited: verified, counted as a hit of the
        lease's tier and copied into the tiers above it."""
        source = next((s for s in self._stores if s is leases), None)
        if source is None:  # leases that are no tier of ours
            try:
                artifact = decode(data)
                if self._checker is not None:
                    self._checker.verify(key, artifact)
                return artifact
            except (CorruptArtifact, NewerFormat, Unverified) as exc:
                log.warning("leased artifact %s is not usable: %s", key, exc)
                return None
        artifact = self._verify(source, key, data)
        if artifact is not None:
            self._stats.add(
                source.name,
                hits=1,
                bytes_read=len(data),
                compile_seconds_saved=artifact.compile_seconds,
            )
            self._write(self._stores[: self._stores.index(source)], key, data)
        return artifact

    def _writable(self, tier: object) -> bool:
        backoff = self._writes.get(getattr(tier, "name", ""))
        return backoff is None or backoff.allows()

    def _failed(self, tier: object, exc: StoreUnavailable, which: dict[str, Backoff]) -> None:
        name = getattr(tier, "name", type(tier).__name__)
        if name in _RECOVERING_TIERS:
            log.debug("%s tier failed: %s", name, exc)
            return
        backoff = which.get(name)
        if backoff is not None:
            backoff.failed()
        with self._lock:
            first = name not in self._warned
            self._warned.add(name)
        if first:
            _warn(
                f"fcache: the {name} cache failed ({exc}); going on without it for now, "
                "and trying it again after a pause"
            )
        else:
            log.debug("%s tier failed again: %s", name, exc)

    def _recovered(self, tier: object, which: dict[str, Backoff]) -> None:
        backoff = which.get(getattr(tier, "name", ""))
        if backoff is not None and backoff.failures and backoff.succeeded():
            log.info("fcache: the %s cache works again", getattr(tier, "name", tier))


def _warn(message: str) -> None:
    # The user-facing sign that caching degraded: once per tier and process, never an error.
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _connect_remote(settings: Settings, stats: CacheStats) -> ByteStore | None:
    """The fcache-server tier, or None with one warning if it cannot be set up."""
    try:
        from fcache.cache.remote import RemoteStore
    except ImportError as exc:
        _warn(f"fcache: the server tier is not available ({exc}); going on without it")
        return None
    try:
        return RemoteStore.connect(settings, stats)
    except Exception as exc:  # an optional tier must never stop compilation
        _warn(f"fcache: cannot use fcache-server {settings.server}: {exc}; going on without it")
        return None


def _connect_redis(settings: Settings, stats: CacheStats) -> ByteStore | None:
    """The Redis tier, or None with one warning if it cannot be set up (redis-py missing)."""
    try:
        from fcache.cache.redis import RedisStore
    except ImportError as exc:
        _warn(f"fcache: the Redis tier needs redis-py ({exc}); going on without it")
        return None
    try:
        return RedisStore.connect(settings, stats)
    except Exception as exc:  # an optional tier must never stop compilation
        shown = redact_url(settings.redis or "")
        _warn(f"fcache: cannot use Redis {shown}: {exc}; going on without it")
        return None


def _minus(current: Counters, before: Counters | None) -> Counters:
    if before is None:
        return current
    old = before.to_dict()
    return Counters.from_dict({name: v - old[name] for name, v in current.to_dict().items()})
