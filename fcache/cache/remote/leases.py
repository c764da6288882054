"""The Lease stream of fcache.v1: single flight across every client of one server.

`RemoteLeases` is the Leases half of RemoteStore (fcache.cache.store.Leases), mixed into
it: `acquire` opens a Lease call and follows its events until a grant, the artifact
(verified by the wire's Assembler before it is returned), or the end of the wait. A grant
holds its streaming call open until `release` cancels it; a holder that dies drops the
connection, and the server passes the lease on. Each step of the call (the first answer,
the wait, the artifact) is bounded by a `Watchdog`, though the call lives as long as the
lease. Failures go through the store's `_rpc` (breaker, counting, StoreUnavailable);
after the server refused this client's token for writes, leases are declined locally.
Thread-safe: held calls are guarded by the store's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import grpc

from fcache.cache.remote.channel import StreamCall, Stub, Watchdog
from fcache.cache.store import LeaseGrant
from fcache.errors import CorruptArtifact, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats

T = TypeVar("T")


class RemoteLeases:
    """acquire/release over the Lease stream; needs the RemoteStore it is mixed into."""

    # Provided by RemoteStore.
    name: str
    _stats: CacheStats
    _timeout_s: float
    _hold_s: float
    _metadata: tuple[tuple[str, str], ...]
    _lock: threading.Lock
    _held: dict[str, StreamCall]
    _writable: bool
    max_artifact_bytes: int

    def _rpc(self, what: str, call: Callable[[Stub], T]) -> T:
        raise NotImplementedError

    def _read_only(self, exc: grpc.RpcError) -> None:
        raise NotImplementedError

    def acquire(
        self, key: str, wait_s: float, waiting: Callable[[], None] | None = None
    ) -> LeaseGrant | bytes | None:
        """Single flight across every client of the server (see Leases in fcache.cache.store).

        A grant holds a streaming call open until `release`; a holder that dies drops the
        connection, and the server passes the lease on."""
        if not self._writable:
            return None
        request = pb.LeaseRequest(key=key, wait_seconds=wait_s, hold_seconds=self._hold_s)

        def call(stub: Stub) -> LeaseGrant | bytes | None:
            deadline = wait_s + self._hold_s + self._timeout_s
            stream = stub.lease(request, timeout=deadline, metadata=self._metadata)
            try:
                return self._follow_lease(key, wait_s, stream, waiting)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    self._stats.add(self.name, rejected=1)
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
        self,
        key: str,
        wait_s: float,
        stream: StreamCall,
        waiting: Callable[[], None] | None,
    ) -> LeaseGrant | bytes | None:
        """Read lease events until a grant, the artifact (verified), or the wait's end."""
        watchdog = Watchdog(stream)
        watchdog.arm(self._timeout_s)
        assembler: wire.Assembler | None = None
        try:
            for event in stream:
                kind = event.WhichOneof("event")
                if kind == "granted":
                    watchdog.disarm()
                    with self._lock:
                        self._held[event.granted.lease_id] = stream
                    self._stats.add(self.name, lease_grants=1)
                    return LeaseGrant(key=key, holder=event.granted.lease_id)
                if kind == "waiting":
                    self._stats.add(self.name, lease_waits=1)
                    watchdog.arm(wait_s + self._timeout_s)
                    if waiting is not None:
                        waiting()
                elif kind == "info":
                    assembler = wire.Assembler(
                        event.info, expected_key=key, max_size=self.max_artifact_bytes
                    )
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
