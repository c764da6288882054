"""`fcache-server health [ADDR]`: ask a server's standard health service, as a probe does.

    fcache-server health unix:/run/fcache/fcache.sock      # exit 0: SERVING

What the deploy/ manifests run as their liveness and readiness checks: through the Unix
socket, so that a server needs no TCP listener (and no token on one) only to be probed.
The health service is open (service.health), and on the socket the caller is the server's
own user, whom the peer check admits. Exit 0 when the answer is SERVING; 1 for any other
answer, no answer within the timeout, or a server that is not there; 2 for a bad address.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fcache.errors import ConfigError
from service.config import DEFAULT_LISTEN, parse_listen_address


def check(address: str, timeout_s: float = 5.0) -> str:
    """The health service's answer for the whole server ("SERVING", "NOT_SERVING", ...);
    raises grpc.RpcError when the server does not answer."""
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fcache-server health",
        description="Ask a server's health service; exit 0 when it is SERVING.",
    )
    p.add_argument(
        "address",
        nargs="?",
        default=DEFAULT_LISTEN[0],
        metavar="ADDR",
        help=f"unix:/path or host:port (default: {DEFAULT_LISTEN[0]})",
    )
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        address = parse_listen_address("ADDR", args.address)
    except ConfigError as exc:
        print(f"fcache-server health: {exc}", file=sys.stderr)
        return 2
    try:
        status = check(address, args.timeout)
    except grpc.RpcError as exc:
        print(f"fcache-server health: {address}: {exc.code().name}", file=sys.stderr)
        return 1
    print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1
