"""CacheServicer: the fcache.v1.Cache protocol (proto/fcache/v1/cache.proto) on a NodeStorage.

This module is the one place where exceptions become gRPC status codes (`_STATUS`):
handlers raise typed errors carrying the offending value (key, size), and `_status`
turns each into its code (and the counter it adds to). An exception not in the table is
a bug: it is logged with its traceback, counted as an error, and answered INTERNAL.
Requests are parsed here too, not by gRPC, so a malformed message is INVALID_ARGUMENT
rather than UNKNOWN.

Bounded memory: `CallGate` bounds the calls in flight (`max_concurrent_rpcs`), short
calls and Lease streams apart, so that lease waiters never take the slot their holder's
Put needs; `ByteBudget` bounds their bytes (service.budget). A Put reserves its declared
size before it takes a chunk, a Get the stored entry's size before it reads it; past
either bound the call ends with RESOURCE_EXHAUSTED, counted `overloaded`. A full store
is RESOURCE_EXHAUSTED too: the Put is refused, never acknowledged and then evicted. An
upload that sends nothing for `upload_idle_s` ends, so a stalled uploader cannot keep its
share.

Puts: first write wins, except over an entry that cannot be trusted (service.storage). A
Put whose BlobInfo names exactly the bytes stored (size and checksum) is answered at once,
stored = false, without the upload (a duplicate); any other Put of a stored key is
received and compared: the same executor and payload is a duplicate too, different ones a
conflict, ALREADY_EXISTS (counted `conflicts`, logged). Report: a reader that refused
the entry it got says so, and the server drops it (service.storage.NodeStorage.report).

Leases: a wait or hold that is not a finite number of seconds >= 0 is INVALID_ARGUMENT
(NaN, inf and -1 were once granted for the longest lease).

Why grpc.aio rather than the thread-pool server: a Lease call stays open for as long as
a region compiles (seconds to minutes), for its holder and for every waiter. With one
thread per call, N waiters would occupy N threads, and once they occupied the whole pool
the holder's Put could not run: a deadlock, not only a slowdown. Under asyncio a waiting
call costs a coroutine; blocking work (LMDB, hashing) runs on NodeStorage's thread pool.

Counters (the tier given): hits (artifacts served, by Get or by Lease), misses (Gets
that found nothing: a client asks Get first and leases only after a miss, so a Lease
counts no second miss), bytes_read, compile_seconds_saved, rejected, unverified (uploads
without a valid signature), duplicates, conflicts, overloaded, reported, lease_grants,
lease_waits, errors. Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

import fcache
from fcache.errors import (
    CorruptArtifact,
    FcacheError,
    NewerFormat,
    StoreFull,
    StoreUnavailable,
    Unverified,
)
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.limits import (
    CHECKSUM_BYTES,
    FIND_MISSING_BATCH,
    MAX_ARTIFACT_BYTES,
    is_valid_key,
)
from fcache.stats import CacheStats
from service.budget import ByteBudget, CallGate, Overloaded
from service.cluster import ClusterLeases
from service.leases import Closed, Delivered, Event, Fulfilled, LeaseTable, Ticket
from service.storage import Conflict, NodeStorage, Served

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class InvalidRequest(FcacheError):
    """The request breaks the protocol: a malformed key, an oversized upload, bad order."""


class NotFound(FcacheError):
    """Neither this server nor its upstream holds the key."""


class ShuttingDown(FcacheError):
    """The server stops; the caller should compile, or retry elsewhere."""


# Exception -> (status code, the counter it adds to, if any). First match wins.
_STATUS: tuple[tuple[type[Exception], grpc.StatusCode, str | None], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
    # Raised only for uploads (a transfer or envelope that does not verify); entries that
    # rot at rest are dropped by NodeStorage and surface as NotFound.
    (CorruptArtifact, grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
    (NewerFormat, grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
    # An upload this server's signing key does not vouch for.
    (Unverified, grpc.StatusCode.FAILED_PRECONDITION, "unverified"),
    (Conflict, grpc.StatusCode.ALREADY_EXISTS, "conflicts"),
    (NotFound, grpc.StatusCode.NOT_FOUND, None),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded"),
    # The store counted its own error; reads go on.
    (StoreFull, grpc.StatusCode.RESOURCE_EXHAUSTED, None),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE, None),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE, None),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_upload_bytes: int
    max_lease_s: float
    # Artifact bytes held by calls in flight, at most (service.budget).
    max_inflight_bytes: int = 1 << 30
    # An upload that sends nothing for this long ends, giving its reservation back.
    upload_idle_s: float = 30.0
    # Short calls in flight at most, and Lease streams at most (service.budget.CallGate).
    max_calls: int = 1024


class CacheServicer:
    def __init__(
        self,
        storage: NodeStorage,
        leases: LeaseTable,
        stats: CacheStats,
        tier: str,
        limits: Limits,
        cluster: ClusterLeases | None = None,
        tier_stats: CacheStats | None = None,
    ) -> None:
        self._storage = storage
        self._leases = leases
        # With a Redis: leases across nodes, and the Redis tier's own counters.
        self._cluster = cluster
        self._tier_stats = tier_stats
        self._stats = stats
        self._tier = tier
        self._limits = limits
        self._budget = ByteBudget(limits.max_inflight_bytes)
        self._gate = CallGate(limits.max_calls)
        self._started = time.monotonic()

    # -- the six methods ---------------------------------------------------------------

    async def get(
        self, request: pb.GetRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.Transfer]:
        key = _checked_key(request.key)
        size = await self._storage.size_of(key)
        with self._budget.reserve(size or 0, f"Get {key}"):
            served = await self._storage.get(key)
            if served is None:
                self._stats.add(self._tier, misses=1)
                raise NotFound(f"no artifact {key}")
            self._count_hit(served)
            for message in wire.transfer(served.info, served.data):
                yield message

    async def put(
        self, requests: AsyncIterator[pb.Transfer], context: aio.ServicerContext
    ) -> pb.PutResponse:
        messages = aiter(requests)
        first = await _next(messages, self._limits.upload_idle_s, "Put")
        if first is None or first.WhichOneof("part") != "info":
            raise InvalidRequest("a Put must begin with its BlobInfo")
        info = self._checked_upload(first.info)
        with self._budget.reserve(info.size, f"Put {info.key}"):
            if await self._storage.holds(info):
                # These very bytes are stored: spare the caller the upload.
                self._stats.add(self._tier, duplicates=1)
                return pb.PutResponse(stored=False, committed_size=info.size)
            data = await _receive_upload(info, messages, self._limits.upload_idle_s)
            outcome = await self._storage.put(info, data)
        if not outcome.stored:
            self._stats.add(self._tier, duplicates=1)
        self._leases.fulfil(info.key, outcome.served)
        return pb.PutResponse(stored=outcome.stored, committed_size=info.size)

    async def find_missing(
        self, request: pb.FindMissingRequest, context: aio.ServicerContext
    ) -> pb.FindMissingResponse:
        if len(request.keys) > FIND_MISSING_BATCH:
            raise InvalidRequest(
                f"FindMissing of {len(request.keys)} keys; at most {FIND_MISSING_BATCH}"
            )
        keys = [_checked_key(k) for k in request.keys]
        return pb.FindMissingResponse(missing=await self._storage.missing(keys))

    async def lease(
        self, request: pb.LeaseRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.LeaseEvent]:
        key = _checked_key(request.key)
        for name in ("wait_seconds", "hold_seconds"):
            value = getattr(request, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidRequest(f"Lease {key}: {name}={value!r}; expected finite seconds >= 0")
        size = await self._storage.size_of(key)
        with self._budget.reserve(size or 0, f"Lease {key}"):
            served = await self._storage.get(key)
            if served is not None:
                self._count_hit(served)
                for event in _artifact_events(served):
                    yield event
                return
        ticket = self._leases.join(key)
        try:
            async for event in self._follow(ticket, request):
                yield event
        finally:
            self._leases.leave(ticket)
            if self._cluster is not None:
                self._cluster.release(ticket)

    async def report(
        self, request: pb.ReportRequest, context: aio.ServicerContext
    ) -> pb.ReportResponse:
        key = _checked_key(request.key)
        if len(request.checksum) != CHECKSUM_BYTES:
            raise InvalidRequest(f"Report {key}: a checksum of {CHECKSUM_BYTES} bytes")
        dropped = await self._storage.report(key, request.checksum, request.reason[:200])
        return pb.ReportResponse(dropped=dropped)

    async def stats(
        self, request: pb.StatsRequest, context: aio.ServicerContext
    ) -> pb.StatsResponse:
        entries, size = await self._storage.size()
        upstream = self._storage.upstream
        # Every tier of the server's stats: its own, its store's evictions, and its
        # upstream client's errors.
        counters = self._stats.total().to_dict()
        if self._tier_stats is not None:
            # The Redis tier's own hits, misses, bytes and errors, as "redis.NAME": readers
            # that do not know them ignore them (fcache.stats.Counters.from_dict).
            for tier, tier_counters in self._tier_stats.snapshot().items():
                for name, value in tier_counters.to_dict().items():
                    counters[f"{tier}.{name}"] = value
        return pb.StatsResponse(
            entries=entries,
            bytes=size,
            max_bytes=self._storage.store.max_bytes,
            uptime_seconds=time.monotonic() - self._started,
            server_version=fcache.__version__,
            upstream=upstream.address if upstream else "",
            counters=counters,
            active_leases=self._leases.active_leases,
            waiting_callers=self._leases.waiting_callers,
        )

    # -- steps -------------------------------------------------------------------------

    def _checked_upload(self, info: pb.BlobInfo) -> pb.BlobInfo:
        _checked_key(info.key)
        limit = min(self._limits.max_upload_bytes, MAX_ARTIFACT_BYTES)
        if info.size > limit:
            raise InvalidRequest(
                f"artifact {info.key} is {info.size} bytes; this server accepts at most {limit}"
            )
        return info

    async def _follow(
        self, ticket: Ticket, request: pb.LeaseRequest
    ) -> AsyncIterator[pb.LeaseEvent]:
        """The events of one lease call after its ticket joined the line."""
        max_s = self._limits.max_lease_s
        # Finite and >= 0 (checked by `lease`); 0 hold: the longest.
        wait_s = min(request.wait_seconds, max_s)
        hold_s = min(request.hold_seconds, max_s) if request.hold_seconds > 0 else max_s
        told_to_wait = not ticket.holding
        if told_to_wait:
            self._stats.add(self._tier, lease_waits=1)
            waiting = pb.LeaseWaiting(waiters=self._leases.waiters(ticket.key))
            yield pb.LeaseEvent(waiting=waiting)
        loop = asyncio.get_running_loop()
        wait_until = loop.time() + wait_s
        while True:
            timeout = hold_s if ticket.holding else wait_until - loop.time()
            event = await _next_event(ticket, timeout)
            if event is None or isinstance(event, Fulfilled):
                return  # a waiter that gives up compiles alone: its Get counted the miss
            if isinstance(event, Closed):
                raise ShuttingDown(f"server shutting down; lease of {ticket.key} ended")
            if isinstance(event, Delivered):
                self._count_hit(event.served)
                for message in _artifact_events(event.served):
                    yield message
                return
            # Granted, now or after a holder left: the key may have landed meanwhile.
            stored = await self._storage.contains(ticket.key)
            served = await self._storage.get(ticket.key) if stored else None
            if served is not None:
                self._leases.fulfil(ticket.key, served)
                self._count_hit(served)
                for message in _artifact_events(served):
                    yield message
                return
            if self._cluster is not None:
                outcome = await self._cluster.claim(ticket)
                if outcome is False:
                    # Another node compiles it: wait for its artifact, or for its lease.
                    if not told_to_wait:
                        told_to_wait = True
                        self._stats.add(self._tier, lease_waits=1)
                        yield pb.LeaseEvent(waiting=pb.LeaseWaiting(waiters=0))
                    outcome = await self._cluster.wait(ticket, wait_until)
                if isinstance(outcome, bytes):
                    upstream = self._cluster.upstream
                    served = await self._storage.adopt(upstream, ticket.key, outcome)
                    if served is not None:
                        self._leases.fulfil(ticket.key, served)
                        self._count_hit(served)
                        for message in _artifact_events(served):
                            yield message
                        return
            # The caller's Get counted its miss; a grant is not a second one (10 regions
            # missed are 10 misses, not 20).
            self._stats.add(self._tier, lease_grants=1)
            granted = pb.LeaseGranted(lease_id=ticket.lease_id, expires_in_seconds=hold_s)
            yield pb.LeaseEvent(granted=granted)

    def _count_hit(self, served: Served) -> None:
        self._stats.add(
            self._tier,
            hits=1,
            bytes_read=len(served.data),
            compile_seconds_saved=served.compile_seconds,
        )

    # -- registration and the status map -----------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            wire.SERVICE,
            {
                "Get": grpc.unary_stream_rpc_method_handler(
                    self._streamed(self.get, pb.GetRequest, CallGate.SHORT),
                    response_serializer=_serialize,
                ),
                "Put": grpc.stream_unary_rpc_method_handler(
                    self._answered(self.put, pb.Transfer, streaming=True),
                    response_serializer=_serialize,
                ),
                "FindMissing": grpc.unary_unary_rpc_method_handler(
                    self._answered(self.find_missing, pb.FindMissingRequest),
                    response_serializer=_serialize,
                ),
                "Lease": grpc.unary_stream_rpc_method_handler(
                    self._streamed(self.lease, pb.LeaseRequest, CallGate.LEASE),
                    response_serializer=_serialize,
                ),
                "Stats": grpc.unary_unary_rpc_method_handler(
                    self._answered(self.stats, pb.StatsRequest), response_serializer=_serialize
                ),
                "Report": grpc.unary_unary_rpc_method_handler(
                    self._answered(self.report, pb.ReportRequest), response_serializer=_serialize
                ),
            },
        )

    def _answered(
        self,
        method: Callable[[Any, aio.ServicerContext], Awaitable[Resp]],
        request_type: type,
        streaming: bool = False,
    ) -> Callable[[Any, aio.ServicerContext], Awaitable[Resp]]:
        async def call(raw: Any, context: aio.ServicerContext) -> Resp:
            try:
                with self._gate.enter(CallGate.SHORT, method.__name__):
                    request = (
                        _parsed_stream(request_type, raw)
                        if streaming
                        else _parsed(request_type, raw)
                    )
                    return await method(request, context)
            except aio.AbortError:
                raise
            except Exception as exc:  # the one exception-to-status map
                await context.abort(*self._status(exc))
                raise  # not reached: abort raises

        return call

    def _streamed(
        self,
        method: Callable[[Any, aio.ServicerContext], AsyncIterator[Resp]],
        request_type: type,
        pool: str,
    ) -> Callable[[bytes, aio.ServicerContext], AsyncIterator[Resp]]:
        async def call(raw: bytes, context: aio.ServicerContext) -> AsyncIterator[Resp]:
            try:
                with self._gate.enter(pool, method.__name__):
                    async for message in method(_parsed(request_type, raw), context):
                        yield message
            except aio.AbortError:
                raise
            except Exception as exc:  # the one exception-to-status map
                await context.abort(*self._status(exc))
                raise  # not reached: abort raises

        return call

    def _status(self, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """The status code and details a caller gets for exc; counts what it counts."""
        for error, code, counter in _STATUS:
            if isinstance(exc, error):
                if counter is not None:
                    self._stats.add(self._tier, **{counter: 1})
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("refused: %s", exc)  # an alert: a writer without the key
                return code, str(exc)
        log.error("internal error", exc_info=exc)
        self._stats.add(self._tier, errors=1)
        return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


def _parsed(request_type: type, raw: bytes) -> Any:
    """A request message from its bytes; InvalidRequest if they are not one."""
    try:
        return request_type.FromString(raw)  # type: ignore[attr-defined]
    except DecodeError as exc:
        raise InvalidRequest(f"malformed {request_type.__name__}: {exc}") from None


async def _parsed_stream(request_type: type, raws: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    async for raw in raws:
        yield _parsed(request_type, raw)


async def _receive_upload(
    info: pb.BlobInfo, messages: AsyncIterator[pb.Transfer], idle_s: float
) -> memoryview:
    """The rest of an upload after its BlobInfo, verified against it (wire.Assembler)."""
    assembler = wire.Assembler(info)
    while (message := await _next(messages, idle_s, f"Put of {info.key}")) is not None:
        if message.WhichOneof("part") != "chunk":
            raise InvalidRequest(f"Put of {info.key}: a message that is not a chunk")
        assembler.add(message.chunk)
    # A view of the one receive buffer: no second copy of the upload (service.budget).
    return assembler.finish_view()


async def _next(messages: AsyncIterator[pb.Transfer], idle_s: float, what: str) -> Any:
    """The upload's next message, or None at its end. An upload that sends nothing for
    idle_s ends (INVALID_ARGUMENT): a stalled uploader must not hold its reserved bytes."""
    try:
        return await asyncio.wait_for(anext(messages, None), idle_s)
    except asyncio.TimeoutError:
        raise InvalidRequest(f"{what}: nothing received for {idle_s:.0f} s") from None


def _checked_key(key: str) -> str:
    if not is_valid_key(key):
        raise InvalidRequest(f"malformed key {key[:80]!r}: expected 32 lowercase hex characters")
    return key


def _artifact_events(served: Served) -> Iterator[pb.LeaseEvent]:
    yield pb.LeaseEvent(info=served.info)
    for chunk in wire.chunks(served.data):
        yield pb.LeaseEvent(chunk=chunk)


async def _next_event(ticket: Ticket, timeout: float) -> Event | None:
    """The ticket's next event, or None once timeout seconds pass without one."""
    try:
        return await asyncio.wait_for(ticket.events.get(), max(timeout, 0.0))
    except asyncio.TimeoutError:
        # An event queued in the same loop iteration as the timeout still counts: a holder
        # whose lease ran out at the moment this wait did has passed it on to us.
        return None if ticket.events.empty() else ticket.events.get_nowait()
