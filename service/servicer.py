"""CacheServicer: the fcache.v1.Cache protocol (proto/fcache/v1/cache.proto) on a NodeStorage.

This module is the one place where exceptions become gRPC status codes (`_STATUS`):
handlers raise typed errors carrying the offending value (key, size), and `_status`
turns each into its code. An exception not in the table is a bug: it is logged with its
traceback, counted as an error, and answered INTERNAL.

Why grpc.aio rather than the thread-pool server: a Lease call stays open for as long as
a region compiles (seconds to minutes), for its holder and for every waiter. With one
thread per call, N waiters would occupy N threads, and once they occupied the whole pool
the holder's Put could not run: a deadlock, not only a slowdown. Under asyncio a waiting
call costs a coroutine; blocking work (LMDB, hashing) runs on NodeStorage's thread pool.

Counters (the tier given): hits (artifacts served, by Get or by Lease), misses (Gets
that found nothing: a client asks Get first and leases only after a miss, so a Lease
counts no second miss), bytes_read, compile_seconds_saved, rejected, lease_grants,
lease_waits, errors. Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc import aio

import fcache
from fcache.errors import CorruptArtifact, FcacheError, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.limits import FIND_MISSING_BATCH, is_valid_key
from fcache.stats import CacheStats
from service.leases import Closed, Delivered, Event, Fulfilled, LeaseTable, Ticket
from service.storage import NodeStorage, Served

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class InvalidRequest(FcacheError):
    """The request breaks the protocol: a malformed key, an oversized upload, bad order."""


class NotFound(FcacheError):
    """Neither this server nor its upstream holds the key."""


class ShuttingDown(FcacheError):
    """The server stops; the caller should compile, or retry elsewhere."""


_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    # Raised only for uploads (a transfer or envelope that does not verify); entries that
    # rot at rest are dropped by NodeStorage and surface as NotFound.
    (CorruptArtifact, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_upload_bytes: int
    max_lease_s: float


class CacheServicer:
    def __init__(
        self,
        storage: NodeStorage,
        leases: LeaseTable,
        stats: CacheStats,
        tier: str,
        limits: Limits,
    ) -> None:
        self._storage = storage
        self._leases = leases
        self._stats = stats
        self._tier = tier
        self._limits = limits
        self._started = time.monotonic()

    # -- the five methods --------------------------------------------------------------

    async def get(
        self, request: pb.GetRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.Transfer]:
        key = _checked_key(request.key)
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
        try:
            info, data = await self._receive_upload(requests)
            if data is None:
                return pb.PutResponse(stored=False, committed_size=info.size)
            served = await self._storage.put(info, data)
        except (InvalidRequest, CorruptArtifact):
            self._stats.add(self._tier, rejected=1)
            raise
        self._leases.fulfil(info.key, served)
        return pb.PutResponse(stored=True, committed_size=info.size)

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

    async def stats(
        self, request: pb.StatsRequest, context: aio.ServicerContext
    ) -> pb.StatsResponse:
        entries, size = await self._storage.size()
        upstream = self._storage.upstream
        return pb.StatsResponse(
            entries=entries,
            bytes=size,
            max_bytes=self._storage.store.max_bytes,
            uptime_seconds=time.monotonic() - self._started,
            server_version=fcache.__version__,
            upstream=upstream.address if upstream else "",
            # Every tier of the server's stats: its own, its store's evictions, and its
            # upstream client's errors.
            counters=self._stats.total().to_dict(),
            active_leases=self._leases.active_leases,
            waiting_callers=self._leases.waiting_callers,
        )

    # -- steps -------------------------------------------------------------------------

    async def _receive_upload(
        self, requests: AsyncIterator[pb.Transfer]
    ) -> tuple[pb.BlobInfo, bytes | None]:
        """The upload's verified info and bytes; no bytes if the key is stored already."""
        assembler: wire.Assembler | None = None
        async for message in requests:
            part = message.WhichOneof("part")
            if assembler is None:
                if part != "info":
                    raise InvalidRequest("a Put must begin with its BlobInfo")
                info = self._checked_upload(message.info)
                if await self._storage.contains(info.key):
                    # Same key, same bytes: keep ours and spare the caller the upload.
                    return info, None
                assembler = wire.Assembler(info)
            elif part == "chunk":
                assembler.add(message.chunk)
            else:
                raise InvalidRequest(f"Put of {assembler.info.key}: a second BlobInfo")
        if assembler is None:
            raise InvalidRequest("an empty Put")
        return assembler.info, assembler.finish()

    def _checked_upload(self, info: pb.BlobInfo) -> pb.BlobInfo:
        _checked_key(info.key)
        if info.size > self._limits.max_upload_bytes:
            raise InvalidRequest(
                f"artifact {info.key} is {info.size} bytes; this server accepts at most "
                f"{self._limits.max_upload_bytes}"
            )
        return info

    async def _follow(
        self, ticket: Ticket, request: pb.LeaseRequest
    ) -> AsyncIterator[pb.LeaseEvent]:
        """The events of one lease call after its ticket joined the line."""
        max_s = self._limits.max_lease_s
        wait_s = min(max(request.wait_seconds, 0.0), max_s)
        hold_s = min(request.hold_seconds, max_s) if request.hold_seconds > 0 else max_s
        if not ticket.holding:
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
                "Get": _with(
                    grpc.unary_stream_rpc_method_handler, self._streamed(self.get), pb.GetRequest
                ),
                "Put": _with(
                    grpc.stream_unary_rpc_method_handler, self._answered(self.put), pb.Transfer
                ),
                "FindMissing": _with(
                    grpc.unary_unary_rpc_method_handler,
                    self._answered(self.find_missing),
                    pb.FindMissingRequest,
                ),
                "Lease": _with(
                    grpc.unary_stream_rpc_method_handler,
                    self._streamed(self.lease),
                    pb.LeaseRequest,
                ),
                "Stats": _with(
                    grpc.unary_unary_rpc_method_handler,
                    self._answered(self.stats),
                    pb.StatsRequest,
                ),
            },
        )

    def _answered(
        self, method: Callable[[Req, aio.ServicerContext], Awaitable[Resp]]
    ) -> Callable[[Req, aio.ServicerContext], Awaitable[Resp]]:
        async def call(request: Req, context: aio.ServicerContext) -> Resp:
            try:
                return await method(request, context)
            except aio.AbortError:
                raise
            except Exception as exc:  # the one exception-to-status map
                await context.abort(*self._status(exc))
                raise  # not reached: abort raises

        return call

    def _streamed(
        self, method: Callable[[Req, aio.ServicerContext], AsyncIterator[Resp]]
    ) -> Callable[[Req, aio.ServicerContext], AsyncIterator[Resp]]:
        async def call(request: Req, context: aio.ServicerContext) -> AsyncIterator[Resp]:
            try:
                async for message in method(request, context):
                    yield message
            except aio.AbortError:
                raise
            except Exception as exc:  # the one exception-to-status map
                await context.abort(*self._status(exc))
                raise  # not reached: abort raises

        return call

    def _status(self, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """The status code and details a caller gets for exc."""
        for error, code in _STATUS:
            if isinstance(exc, error):
                return code, str(exc)
        log.error("internal error", exc_info=exc)
        self._stats.add(self._tier, errors=1)
        return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def _with(
    kind: Callable[..., grpc.RpcMethodHandler], behavior: object, request_type: type
) -> grpc.RpcMethodHandler:
    # Responses are serialized by protobuf itself; requests parsed by their message type.
    return kind(
        behavior,
        request_deserializer=request_type.FromString,  # type: ignore[attr-defined]
        response_serializer=lambda message: message.SerializeToString(),
    )


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
