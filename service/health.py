"""The standard grpc.health.v1.Health service (grpcio-health-checking), for probes and
load balancers.

Reports SERVING for "" (the whole server) and "fcache.v1.Cache" once `set_serving(True)`
ran, and NOT_SERVING for both from the moment a shutdown begins (`set_serving(False)`, for
good: a server that drains never serves again), so that a balancer stops sending new work
while in-flight calls finish. Watch streams each change. An unknown service is NOT_FOUND
for Check and SERVICE_UNKNOWN for Watch, as the standard says. Event-loop only.

The servicer is grpcio-health-checking's own asyncio implementation; this module only
registers it under the generic-handler interface the server uses for all its services,
so the health service is what `grpc_health_probe`, Kubernetes' gRPC probes and
`grpc_health.v1` clients expect, byte for byte.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2

from fcache.protocol import wire

SERVICE = "grpc.health.v1.Health"
SERVICES = ("", wire.SERVICE)


class HealthServicer:
    def __init__(self) -> None:
        self._servicer = health.aio.HealthServicer()

    async def set_serving(self, serving: bool) -> None:
        """SERVING for every service, or NOT_SERVING for good (a shutdown began)."""
        if not serving:
            await self._servicer.enter_graceful_shutdown()
            return
        for name in SERVICES:
            await self._servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self._servicer.Check,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self._servicer.Watch,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
                ),
            },
        )
