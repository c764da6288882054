"""The standard grpc.health.v1.Health service, for probes and load balancers.

Reports SERVING for "" (the whole server) and "fcache.v1.Cache" while the server runs,
and NOT_SERVING from the moment a shutdown begins, so that a balancer stops sending new
work while in-flight calls drain. Watch streams each change. Event-loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from fcache.protocol import wire
from fcache.protocol._gen.grpc.health.v1 import health_pb2 as pb

SERVICE = "grpc.health.v1.Health"
Status = pb.HealthCheckResponse.ServingStatus


class HealthServicer:
    def __init__(self) -> None:
        self._status: dict[str, Status] = {"": pb.HealthCheckResponse.SERVING}
        self._status[wire.SERVICE] = pb.HealthCheckResponse.SERVING
        self._changed = asyncio.Condition()

    async def set_serving(self, serving: bool) -> None:
        status = pb.HealthCheckResponse.SERVING if serving else pb.HealthCheckResponse.NOT_SERVING
        async with self._changed:
            for name in self._status:
                self._status[name] = status
            self._changed.notify_all()

    async def check(
        self, request: pb.HealthCheckRequest, context: aio.ServicerContext
    ) -> pb.HealthCheckResponse:
        if request.service not in self._status:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return pb.HealthCheckResponse(status=self._status[request.service])

    async def watch(
        self, request: pb.HealthCheckRequest, context: aio.ServicerContext
    ) -> AsyncIterator[pb.HealthCheckResponse]:
        service = request.service
        last: Status | None = None
        while True:
            async with self._changed:
                while self._current(service) == last:
                    await self._changed.wait()
                last = self._current(service)
            yield pb.HealthCheckResponse(status=last)

    def _current(self, service: str) -> Status:
        return self._status.get(service, pb.HealthCheckResponse.SERVICE_UNKNOWN)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self.check,
                    request_deserializer=pb.HealthCheckRequest.FromString,
                    response_serializer=pb.HealthCheckResponse.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self.watch,
                    request_deserializer=pb.HealthCheckRequest.FromString,
                    response_serializer=pb.HealthCheckResponse.SerializeToString,
                ),
            },
        )
