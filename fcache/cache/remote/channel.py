"""How a RemoteStore reaches its server: the channel and stub of each process, and the
watchdog that bounds each step of a streaming call.

A `Stub` (a channel and the five method callables of fcache.v1.Cache) is valid only in
the process that opened it: gRPC channels do not survive fork, so RemoteStore opens a new
one in a forked child (the pid check) and never closes its parent's. The service glue is
built here from the descriptors rather than generated (see scripts/gen_proto.sh). The
TLS CA and the bearer token are read from the files that settings name; an unreadable or
malformed file raises ConfigError. `Watchdog` is used by one call at a time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from fcache.errors import ConfigError
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb

_CHANNEL_OPTIONS = (
    # Reconnect soon after a server restart instead of backing off for up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    # Connections are shared between channels to one address through a process-wide pool;
    # a forked child would get its parent's connection back, whose socket is not its own.
    ("grpc.use_local_subchannel_pool", 1),
)


class StreamCall(Protocol):
    """A response-streaming call as grpc returns it: iterate for messages, or cancel."""

    def __iter__(self) -> Iterator[Any]: ...

    def cancel(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Stub:
    """A channel and its six method callables; valid in the process that made it."""

    channel: grpc.Channel
    get: grpc.UnaryStreamMultiCallable
    put: grpc.StreamUnaryMultiCallable
    find_missing: grpc.UnaryUnaryMultiCallable
    lease: grpc.UnaryStreamMultiCallable
    stats: grpc.UnaryUnaryMultiCallable
    report: grpc.UnaryUnaryMultiCallable
    pid: int


def open_stub(address: str, tls_ca: bytes | None) -> Stub:
    if tls_ca is None:
        channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
        channel = grpc.secure_channel(address, creds, options=_CHANNEL_OPTIONS)
    path = wire.method_path
    return Stub(
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
        report=channel.unary_unary(
            path("Report"), pb.ReportRequest.SerializeToString, pb.ReportResponse.FromString
        ),
        pid=os.getpid(),
    )


class Watchdog:
    """Cancels a streaming call when its next step does not arrive in time.

    gRPC's sync API bounds a whole call, not one message; a lease call lives for minutes
    but each of its steps must come within seconds.
    """

    def __init__(self, call: StreamCall) -> None:
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


def read_file(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(setting, str(path), f"a readable file ({exc.strerror})") from None


def read_token(path: Path) -> str:
    token = read_file("token_file", path).decode("utf-8", "replace").strip()
    if not token or any(c.isspace() for c in token):
        raise ConfigError("token_file", str(path), "a file holding one token")
    return token
