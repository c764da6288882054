"""RemoteStore: the fcache-server tier, a ByteStore and Leases over gRPC.

Contract:

- Thread-safe. The channel is opened on first use, and again in a forked child (gRPC
  channels do not survive fork), so a store may be built before workers fork.
- Every call has a deadline: `timeout_s` (settings.server_timeout_s) for Get, Put,
  FindMissing and Stats. A Lease call lives as long as the lease, but each step of it
  (the first answer, the wait, the artifact) is bounded too.
- Every failure raises `fcache.errors.StoreUnavailable` and is counted as `errors` in the
  "remote" tier of the stats (never as a miss). After `breaker_failures` failures in a
  row the store stops calling the server for `breaker_cooldown_s` seconds and raises at
  once: a dead server costs each region one fast exception, not one deadline; those
  skipped calls count as errors too. An outage is a warning at once and again every
  `warn_every_s` while it lasts, with the count of failed calls (`outage.OutageLog`).
- Nothing received is returned before its size and checksum match the BlobInfo that
  preceded it; a mismatch counts `corrupt` and fails the call. A BlobInfo declaring more
  than `max_artifact_bytes` (this client's own limit: the smaller of the local cache bound
  and the protocol's MAX_ARTIFACT_BYTES) fails the call before a chunk is taken in.
- A refused upload (read-only token, or an artifact the server rejects) is not an
  outage: it counts `rejected` and raises StoreUnavailable without tripping the breaker.
  So does an upload the server refuses because it holds other contents under the key
  (ALREADY_EXISTS, counted `conflicts`), or because it is full or at its bound of calls
  or bytes in flight (RESOURCE_EXHAUSTED, counted `overloaded`).
- `report_bad` tells the server that an entry it served failed this reader's signature
  check (the Report RPC), so that the server drops it and the reader's own Put is not
  refused as a conflict. A server too old to know Report, or a read-only token, makes it
  a no-op.
- A token sent over plaintext TCP (no TLS CA set) costs one warning: it travels in clear.
  After the first refusal of a read-only token (one warning), puts raise at once and
  leases are declined locally, without asking the server.

Only the tiered cache (when a server is configured), the CLI and fcache-server import
this package, so `import fcache` never loads gRPC or the generated stubs.

The Lease half lives in `leases` (mixed in), the channel and watchdog in `channel`, the
breaker in `breaker`. A forked child starts with a fresh lock (`after_fork_in_child`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import grpc

from fcache import process
from fcache.cache.outage import WARN_EVERY_S, OutageLog
from fcache.cache.remote.breaker import CircuitBreaker
from fcache.cache.remote.channel import StreamCall, Stub, open_stub, read_file, read_token
from fcache.cache.remote.leases import RemoteLeases
from fcache.config import Settings
from fcache.errors import ConfigError, CorruptArtifact, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.limits import FIND_MISSING_BATCH, MAX_ARTIFACT_BYTES
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

T = TypeVar("T")
TIER = "remote"

# Answers that refuse one upload: the server is fine, so the breaker ignores them; each
# with the counter it adds to.
_REFUSALS = {
    grpc.StatusCode.PERMISSION_DENIED: "rejected",
    grpc.StatusCode.INVALID_ARGUMENT: "rejected",
    grpc.StatusCode.ALREADY_EXISTS: "conflicts",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "overloaded",
}


class _Refused(Exception):
    """The server answered, and said no; not an outage, so the breaker ignores it."""


class RemoteStore(RemoteLeases):
    """An fcache-server, as a cache tier. See the module docstring for the contract."""

    name = TIER

    def __init__(
        self,
        address: str,
        stats: CacheStats,
        *,
        timeout_s: float = 10.0,
        hold_s: float = 900.0,
        token: str | None = None,
        tls_ca: bytes | None = None,
        breaker: CircuitBreaker | None = None,
        max_artifact_bytes: int = MAX_ARTIFACT_BYTES,
        warn_every_s: float = WARN_EVERY_S,
    ) -> None:
        self.address = address
        self.max_artifact_bytes = min(max_artifact_bytes, MAX_ARTIFACT_BYTES)
        self._stats = stats
        self._timeout_s = timeout_s
        self._hold_s = hold_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls_ca = tls_ca
        self._breaker = breaker or CircuitBreaker()
        self._outage = OutageLog(log, f"fcache-server {address}", warn_every_s)
        self._lock = threading.Lock()
        self._stub: Stub | None = None
        self._held: dict[str, StreamCall] = {}
        self._writable = True
        if token and tls_ca is None and not address.startswith("unix:"):
            log.warning(
                "fcache-server %s: the token is sent over plaintext TCP; set FCACHE_TLS_CA "
                "(a TLS server) or use a Unix socket",
                address,
            )
        process.watch(self)

    @classmethod
    def connect(cls, settings: Settings, stats: CacheStats) -> RemoteStore:
        """The store for settings.server; raises ConfigError for an unreadable token or CA.

        Connecting is lazy: an unreachable server shows on the first call, not here.
        """
        if settings.server is None:
            raise ConfigError("server", None, "an fcache-server address")
        return cls(
            settings.server,
            stats,
            timeout_s=settings.server_timeout_s,
            hold_s=settings.lease_timeout_s,
            token=read_token(settings.token_file) if settings.token_file else None,
            tls_ca=read_file("tls_ca", settings.tls_ca) if settings.tls_ca else None,
            max_artifact_bytes=settings.max_bytes,
        )

    # -- ByteStore ---------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        def call(stub: Stub) -> bytes | None:
            stream = stub.get(
                pb.GetRequest(key=key), timeout=self._timeout_s, metadata=self._metadata
            )
            try:
                return _receive(stream, key, self.max_artifact_bytes)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise
            except CorruptArtifact:
                stream.cancel()  # stop receiving the rest of a transfer already refused
                raise

        return self._rpc(f"Get {key}", call)

    def put(self, key: str, data: bytes) -> None:
        """Upload. Raises StoreUnavailable if the server refused it (and, without asking,
        once the server has refused this client's token for writes)."""
        if not self._writable:
            raise StoreUnavailable(f"fcache-server {self.address}: Put {key}: read-only token")

        def call(stub: Stub) -> None:
            try:
                stub.put(
                    wire.transfer(wire.blob_info(key, data), data),
                    timeout=self._timeout_s,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._read_only(exc)
                counter = _REFUSALS.get(exc.code())
                if counter is not None:
                    self._stats.add(TIER, **{counter: 1})
                    raise _Refused(f"{exc.code().name}: {exc.details()}") from None
                raise

        self._rpc(f"Put {key} ({len(data)} bytes)", call)

    def report_bad(self, key: str, data: bytes, why: str) -> None:
        """Tell the server this reader refused its entry `data` for key (see the module
        docstring). Raises StoreUnavailable if the server cannot be reached."""
        if not self._writable:
            return
        request = pb.ReportRequest(key=key, checksum=wire.checksum(data), reason=why[:200])

        def call(stub: Stub) -> None:
            try:
                stub.report(request, timeout=self._timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED):
                    log.debug("fcache-server %s takes no report: %s", self.address, exc.details())
                    return
                raise

        self._rpc(f"Report {key}", call)

    def delete(self, key: str) -> None:
        """A no-op: clients cannot delete from a shared server. The server verifies every
        envelope it stores and serves, and drops corrupt ones itself."""

    def contains(self, key: str) -> bool:
        return not self.find_missing([key])

    def find_missing(self, keys: Iterable[str]) -> list[str]:
        """The keys a Get would miss, in the given order."""
        keys = list(keys)
        missing: list[str] = []
        for start in range(0, len(keys), FIND_MISSING_BATCH):
            request = pb.FindMissingRequest(keys=keys[start : start + FIND_MISSING_BATCH])

            def call(stub: Stub, request: pb.FindMissingRequest = request) -> Any:
                return stub.find_missing(request, timeout=self._timeout_s, metadata=self._metadata)

            response = self._rpc(f"FindMissing ({len(request.keys)} keys)", call)
            missing.extend(response.missing)
        return missing

    # -- Server facts ------------------------------------------------------------------

    def server_stats(self) -> dict[str, object]:
        """The server's Stats, as plain data: sizes, uptime and `counters` by name."""
        response: pb.StatsResponse = self._rpc(
            "Stats",
            lambda stub: stub.stats(
                pb.StatsRequest(), timeout=self._timeout_s, metadata=self._metadata
            ),
        )
        return {
            "address": self.address,
            "server_version": response.server_version,
            "upstream": response.upstream or None,
            "uptime_seconds": response.uptime_seconds,
            "entries": response.entries,
            "bytes": response.bytes,
            "max_bytes": response.max_bytes,
            "active_leases": response.active_leases,
            "waiting_callers": response.waiting_callers,
            "counters": Counters.from_dict(response.counters).to_dict(),
            # A server's other tiers (its Redis: "redis.hits", ...), by tier.
            "tiers": _tiers(response.counters),
        }

    def close(self) -> None:
        """Release held leases and close the channel; a later call opens a new one."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
            stub, self._stub = self._stub, None
        for stream in held:
            stream.cancel()
        if stub is not None and stub.pid == os.getpid():
            stub.channel.close()

    def after_fork_in_child(self) -> None:
        # A forked child has only the thread that forked: a lock another parent thread held
        # at that moment would never be released. The channel is replaced on first use (the
        # pid check in _current_stub); the breaker renews its own lock.
        self._lock = threading.Lock()

    # -- Plumbing ----------------------------------------------------------------------

    def _current_stub(self) -> Stub:
        with self._lock:
            if self._stub is None or self._stub.pid != os.getpid():
                # In a forked child the parent's channel and lease calls are unusable and
                # must not be closed from here; drop them and start afresh.
                self._held = {}
                self._stub = open_stub(self.address, self._tls_ca)
            return self._stub

    def _fresh_channel(self) -> None:
        """After an outage, a new channel: the old one may sit in gRPC's reconnect back-off
        (up to seconds) although the server is back. Lease calls on the old channel keep
        it until they end."""
        with self._lock:
            stub, self._stub = self._stub, None
        if stub is not None and stub.pid == os.getpid() and not self._held:
            stub.channel.close()

    def _rpc(self, what: str, call: Callable[[Stub], T]) -> T:
        """Run one call under the breaker; map every failure to StoreUnavailable."""
        if not self._breaker.allows():
            self._stats.add(TIER, errors=1)  # not asked, so not a miss: the tier failed
            self._outage.failed(None)
            raise StoreUnavailable(f"fcache-server {self.address}: {what}: skipped (circuit open)")
        if self._breaker.probing():
            self._fresh_channel()
        try:
            result = call(self._current_stub())
        except _Refused as exc:
            raise StoreUnavailable(
                f"fcache-server {self.address}: {what}: refused: {exc}"
            ) from None
        except grpc.RpcError as exc:
            raise self._failed(what, f"{exc.code().name}: {exc.details()}") from None
        except CorruptArtifact as exc:
            self._stats.add(TIER, corrupt=1)
            raise self._failed(what, str(exc)) from None
        except StoreUnavailable as exc:
            raise self._failed(what, str(exc)) from None
        if self._breaker.succeeded():
            self._outage.recovered()
        return result

    def _failed(self, what: str, why: str) -> StoreUnavailable:
        self._stats.add(TIER, errors=1)
        self._breaker.failed()
        self._outage.failed(f"{what}: {why}")
        return StoreUnavailable(f"fcache-server {self.address}: {what}: {why}")

    def _read_only(self, exc: grpc.RpcError) -> None:
        if self._writable:
            self._writable = False
            log.warning(
                "fcache-server %s refuses writes from this token (%s); reading only",
                self.address,
                exc.details(),
            )


def _receive(stream: Iterator[pb.Transfer], key: str, max_size: int) -> bytes:
    """The artifact of a Get answer, verified; CorruptArtifact if it is not whole, or is
    declared larger than `max_size`."""
    assembler: wire.Assembler | None = None
    for message in stream:
        part = message.WhichOneof("part")
        if part == "info" and assembler is None:
            assembler = wire.Assembler(message.info, expected_key=key, max_size=max_size)
        elif part == "chunk" and assembler is not None:
            assembler.add(message.chunk)
        else:
            raise CorruptArtifact(f"Get {key}: unexpected {part!r} message")
    if assembler is None:
        raise CorruptArtifact(f"Get {key}: the answer carried no artifact")
    return assembler.finish()


def _tiers(counters: Mapping[str, float]) -> dict[str, dict[str, float]]:
    by_tier: dict[str, dict[str, float]] = {}
    for name, value in counters.items():
        tier, dot, field = name.partition(".")
        if dot:
            by_tier.setdefault(tier, {})[field] = value
    return {tier: Counters.from_dict(c).to_dict() for tier, c in sorted(by_tier.items())}


def fetch_server_stats(address: str, settings: Settings) -> dict[str, object]:
    """Stats of the server at `address`, using settings' token, CA and deadline.

    Raises StoreUnavailable when it cannot be reached, ConfigError for a bad address."""
    store = RemoteStore.connect(settings.replace(server=address), CacheStats())
    try:
        return store.server_stats()
    finally:
        store.close()
