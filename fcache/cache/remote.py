"""RemoteStore: the fcache-server tier, a ByteStore and Leases over gRPC.

Contract:

- Thread-safe. The channel is opened on first use, and again in a forked child (gRPC
  channels do not survive fork), so a store may be built before workers fork.
- Every call has a deadline: `timeout_s` (settings.server_timeout_s) for Get, Put,
  FindMissing and Stats. A Lease call lives as long as the lease, but each step of it
  (the first answer, the wait, the artifact) is bounded too.
- Every failure raises `fcache.errors.StoreUnavailable`, is counted as `errors` in the
  "remote" tier of the stats, and logs one warning per outage (later ones at DEBUG).
  After `breaker_failures` failures in a row the store stops calling the server for
  `breaker_cooldown_s` seconds and raises at once: a dead server costs each region one
  fast exception, not one deadline.
- Nothing received is returned before its size and checksum match the BlobInfo that
  preceded it; a mismatch counts `corrupt` and fails the call.
- A refused upload (read-only token, or an artifact the server rejects) is not an
  outage: it counts `rejected` and raises StoreUnavailable without tripping the breaker.
  After the first refusal of a read-only token (one warning), puts raise at once and
  leases are declined locally, without asking the server.

Only the tiered cache (when a server is configured), the CLI and fcache-server import
this module, so `import fcache` never loads gRPC or the generated stubs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from fcache.cache.store import LeaseGrant
from fcache.config import Settings
from fcache.errors import ConfigError, CorruptArtifact, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.limits import FIND_MISSING_BATCH
from fcache.stats import CacheStats, Counters

log = logging.getLogger(__name__)

T = TypeVar("T")
TIER = "remote"
_CHANNEL_OPTIONS = (
    # Reconnect soon after a server restart instead of backing off for up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    # Connections are shared between channels to one address through a process-wide pool;
    # a forked child would get its parent's connection back, whose socket is not its own.
    ("grpc.use_local_subchannel_pool", 1),
)


class CircuitBreaker:
    """Counts consecutive failures; open (refusing calls) for `cooldown_s` after `failures`.

    Thread-safe. After the cooldown, calls go through again; one more failure reopens it
    at once, and one success closes it.
    """

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until = 0.0

    def allows(self) -> bool:
        with self._lock:
            return self._clock() >= self._open_until

    def succeeded(self) -> int:
        """Record a success; returns how many failures in a row it ended."""
        with self._lock:
            ended, self._consecutive = self._consecutive, 0
            return ended

    def failed(self) -> int:
        """Record a failure; returns how many there have been in a row, this one included."""
        with self._lock:
            self._consecutive += 1
            if self._consecutive >= self._failures:
                self._open_until = self._clock() + self._cooldown_s
            return self._consecutive


class _StreamCall(Protocol):
    """A response-streaming call as grpc returns it: iterate for messages, or cancel."""

    def __iter__(self) -> Iterator[Any]: ...

    def cancel(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Stub:
    """A channel and its five method callables; valid in the process that made it."""

    channel: grpc.Channel
    get: grpc.UnaryStreamMultiCallable
    put: grpc.StreamUnaryMultiCallable
    find_missing: grpc.UnaryUnaryMultiCallable
    lease: grpc.UnaryStreamMultiCallable
    stats: grpc.UnaryUnaryMultiCallable
    pid: int


def _open_stub(address: str, tls_ca: bytes | None) -> _Stub:
    if tls_ca is None:
        channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
        channel = grpc.secure_channel(address, creds, options=_CHANNEL_OPTIONS)
    path = wire.method_path
    return _Stub(
        channel=channel,
        get=channel.unary_stream(
            path("Get"), pb.GetRequest.SerializeToString, pb.Transfer.FromString
        ),
        put=channel.stream_unary(
            path("Put"), pb.Transfer.SerializeToString, pb.PutResponse.FromString
        ),
        find_missing=channel.unary_unary(
            path("FindMissing"),
            pb.FindMissingRequest.SerializeToString,
            pb.FindMissingResponse.FromString,
        ),
        lease=channel.unary_stream(
            path("Lease"), pb.LeaseRequest.SerializeToString, pb.LeaseEvent.FromString
        ),
        stats=channel.unary_unary(
            path("Stats"), pb.StatsRequest.SerializeToString, pb.StatsResponse.FromString
        ),
        pid=os.getpid(),
    )


class _Watchdog:
    """Cancels a streaming call when its next step does not arrive in time.

    gRPC's sync API bounds a whole call, not one message; a lease call lives for minutes
    but each of its steps must come within seconds.
    """

    def __init__(self, call: _StreamCall) -> None:
        self._call = call
        self._timer: threading.Timer | None = None
        self.fired = False

    def arm(self, seconds: float) -> None:
        self.disarm()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self.fired = True
        self._call.cancel()


# Answers that refuse one upload: the server is fine, so the breaker ignores them.
_REFUSALS = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class _Refused(Exception):
    """The server answered, and said no; not an outage, so the breaker ignores it."""


class RemoteStore:
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
    ) -> None:
        self.address = address
        self._stats = stats
        self._timeout_s = timeout_s
        self._hold_s = hold_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._tls_ca = tls_ca
        self._breaker = breaker or CircuitBreaker()
        self._lock = threading.Lock()
        self._stub: _Stub | None = None
        self._held: dict[str, _StreamCall] = {}
        self._writable = True
        _live_stores.add(self)

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
            token=_read_token(settings.token_file) if settings.token_file else None,
            tls_ca=_read_file("tls_ca", settings.tls_ca) if settings.tls_ca else None,
        )

    # -- ByteStore ---------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        def call(stub: _Stub) -> bytes | None:
            stream = stub.get(
                pb.GetRequest(key=key), timeout=self._timeout_s, metadata=self._metadata
            )
            try:
                return _receive(stream, key)
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

        def call(stub: _Stub) -> None:
            try:
                stub.put(
                    wire.transfer(wire.blob_info(key, data), data),
                    timeout=self._timeout_s,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._read_only(exc)
                if exc.code() in _REFUSALS:
                    self._stats.add(TIER, rejected=1)
                    raise _Refused(f"{exc.code().name}: {exc.details()}") from None
                raise

        self._rpc(f"Put {key} ({len(data)} bytes)", call)

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

            def call(stub: _Stub, request: pb.FindMissingRequest = request) -> Any:
                return stub.find_missing(request, timeout=self._timeout_s, metadata=self._metadata)

            response = self._rpc(f"FindMissing ({len(request.keys)} keys)", call)
            missing.extend(response.missing)
        return missing

    # -- Leases ------------------------------------------------------------------------

    def acquire(self, key: str, wait_s: float) -> LeaseGrant | bytes | None:
        """Single flight across every client of the server (see Leases in store.py).

        A grant holds a streaming call open until `release`; a holder that dies drops the
        connection, and the server passes the lease on."""
        if not self._writable:
            return None
        request = pb.LeaseRequest(key=key, wait_seconds=wait_s, hold_seconds=self._hold_s)

        def call(stub: _Stub) -> LeaseGrant | bytes | None:
            deadline = wait_s + self._hold_s + self._timeout_s
            stream = stub.lease(request, timeout=deadline, metadata=self._metadata)
            try:
                return self._follow_lease(key, wait_s, stream)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._stats.add(TIER, rejected=1)
                    self._read_only(exc)
                    return None
                raise

        return self._rpc(f"Lease {key}", call)

    def release(self, grant: LeaseGrant) -> None:
        with self._lock:
            stream = self._held.pop(grant.holder, None)
        if stream is not None:
            stream.cancel()

    def _follow_lease(
        self, key: str, wait_s: float, stream: _StreamCall
    ) -> LeaseGrant | bytes | None:
        """Read lease events until a grant, the artifact (verified), or the wait's end."""
        watchdog = _Watchdog(stream)
        watchdog.arm(self._timeout_s)
        assembler: wire.Assembler | None = None
        try:
            for event in stream:
                kind = event.WhichOneof("event")
                if kind == "granted":
                    watchdog.disarm()
                    with self._lock:
                        self._held[event.granted.lease_id] = stream
                    self._stats.add(TIER, lease_grants=1)
                    return LeaseGrant(key=key, holder=event.granted.lease_id)
                if kind == "waiting":
                    self._stats.add(TIER, lease_waits=1)
                    watchdog.arm(wait_s + self._timeout_s)
                elif kind == "info":
                    assembler = wire.Assembler(event.info, expected_key=key)
                    watchdog.arm(self._timeout_s)
                elif kind == "chunk" and assembler is not None:
                    assembler.add(event.chunk)
                else:
                    raise CorruptArtifact(f"Lease {key}: unexpected {kind!r} event")
        except grpc.RpcError:
            if watchdog.fired:
                raise StoreUnavailable(f"Lease {key}: no answer from the server in time") from None
            raise
        except BaseException:
            stream.cancel()
            raise
        finally:
            watchdog.disarm()
        # The stream ended: with the artifact, or (no artifact) the wait ran out.
        return assembler.finish() if assembler is not None else None

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

    # -- Plumbing ----------------------------------------------------------------------

    def _current_stub(self) -> _Stub:
        with self._lock:
            if self._stub is None or self._stub.pid != os.getpid():
                # In a forked child the parent's channel and lease calls are unusable and
                # must not be closed from here; drop them and start afresh.
                self._held = {}
                self._stub = _open_stub(self.address, self._tls_ca)
            return self._stub

    def _rpc(self, what: str, call: Callable[[_Stub], T]) -> T:
        """Run one call under the breaker; map every failure to StoreUnavailable."""
        if not self._breaker.allows():
            raise StoreUnavailable(f"fcache-server {self.address}: {what}: skipped (circuit open)")
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
            log.info("fcache-server %s answers again", self.address)
        return result

    def _failed(self, what: str, why: str) -> StoreUnavailable:
        self._stats.add(TIER, errors=1)
        in_a_row = self._breaker.failed()
        message = f"fcache-server {self.address}: {what}: {why}"
        if in_a_row == 1:
            log.warning("%s (later failures are logged at DEBUG until it answers again)", message)
        else:
            log.debug("%s (%d failures in a row)", message, in_a_row)
        return StoreUnavailable(message)

    def _read_only(self, exc: grpc.RpcError) -> None:
        if self._writable:
            self._writable = False
            log.warning(
                "fcache-server %s refuses writes from this token (%s); reading only",
                self.address,
                exc.details(),
            )


def _receive(stream: Iterator[pb.Transfer], key: str) -> bytes:
    """The artifact of a Get answer, verified; CorruptArtifact if it is not whole."""
    assembler: wire.Assembler | None = None
    for message in stream:
        part = message.WhichOneof("part")
        if part == "info" and assembler is None:
            assembler = wire.Assembler(message.info, expected_key=key)
        elif part == "chunk" and assembler is not None:
            assembler.add(message.chunk)
        else:
            raise CorruptArtifact(f"Get {key}: unexpected {part!r} message")
    if assembler is None:
        raise CorruptArtifact(f"Get {key}: the answer carried no artifact")
    return assembler.finish()


def fetch_server_stats(address: str, settings: Settings) -> dict[str, object]:
    """Stats of the server at `address`, using settings' token, CA and deadline.

    Raises StoreUnavailable when it cannot be reached, ConfigError for a bad address."""
    store = RemoteStore.connect(settings.replace(server=address), CacheStats())
    try:
        return store.server_stats()
    finally:
        store.close()


def _read_file(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(setting, str(path), f"a readable file ({exc.strerror})") from None


def _read_token(path: Path) -> str:
    token = _read_file("token_file", path).decode("utf-8", "replace").strip()
    if not token or any(c.isspace() for c in token):
        raise ConfigError("token_file", str(path), "a file holding one token")
    return token


# A forked child has only the thread that forked: a lock another parent thread held at
# that moment would never be released. Children start with fresh locks; the channel is
# replaced on first use (the pid check in _current_stub).
_live_stores: weakref.WeakSet[RemoteStore] = weakref.WeakSet()


def _fresh_locks_in_child() -> None:
    for store in list(_live_stores):
        store._lock = threading.Lock()
        store._breaker._lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks_in_child)
