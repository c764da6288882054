"""Helpers for the server tests: server processes, artifacts, keys, clients, a raw stub.

`Launcher` starts `python -m service.main` (what the `fcache-server` script runs) on
127.0.0.1 port 0 and a Unix socket, waits for its ready file, and returns a
`ServerProcess` that knows the bound addresses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from fcache.cache import artifact
from fcache.cache.remote import CircuitBreaker, RemoteStore
from fcache.errors import StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    tcp: str
    unix: str
    db: Path
    log: Path
    args: tuple[str, ...] = field(default=())

    @property
    def pid(self) -> int:
        return self.process.pid

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM; the exit status once the server has drained and stopped."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Launcher:
    """Starts servers under one directory and stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._servers: list[ServerProcess] = []
        # Socket paths are short (AF_UNIX allows about 107 bytes; pytest's temp paths under
        # xdist can be longer): a directory of their own in the temp dir.
        self._sockets = Path(tempfile.mkdtemp(prefix="fcache-t-"))

    def socket(self, name: str) -> Path:
        """The Unix socket a server started with `name=name` listens on."""
        return self._sockets / f"{name}.sock"

    def __call__(self, *flags: str, db: Path | None = None, name: str = "") -> ServerProcess:
        workdir = self._root / (name or f"server{len(self._servers)}")
        workdir.mkdir(exist_ok=True)
        ready = workdir / "ready.json"
        ready.unlink(missing_ok=True)
        log = workdir / f"server{len(self._servers)}.log"
        db = db or workdir / "db"
        args = (
            "--db", str(db),
            "--listen", "127.0.0.1:0",
            "--listen", f"unix:{self.socket(workdir.name)}",
            "--ready-file", str(ready),
            "--grace", "10",
            # The TCP listener is open unless a test passes token files: allowed explicitly.
            "--insecure",
            *flags,
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "service.main", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        tcp, unix = _wait_ready(process, ready, log)
        server = ServerProcess(process, tcp, unix, db, log, args)
        self._servers.append(server)
        return server

    def stop_all(self) -> None:
        for server in self._servers:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGTERM)
        for server in self._servers:
            try:
                server.process.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(self._sockets, ignore_errors=True)


StartServer = Callable[..., ServerProcess]


def _wait_ready(process: subprocess.Popen[bytes], ready: Path, log: Path) -> tuple[str, str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            tcp, unix = json.loads(ready.read_text())["addresses"]
            return tcp, unix
        if process.poll() is not None:
            raise RuntimeError(
                f"fcache-server exited with {process.returncode}:\n{log.read_text()}"
            )
        time.sleep(0.02)
    process.kill()
    raise RuntimeError(f"fcache-server did not start in {START_TIMEOUT_S} s:\n{log.read_text()}")


def envelope(size: int, compile_seconds: float = 1.0) -> bytes:
    """A valid artifact envelope with a payload of `size` random bytes."""
    payload = os.urandom(size)
    return artifact.encode(
        artifact.Artifact("eager", "test", payload, compile_seconds=compile_seconds)
    )


def health_check(
    channel: grpc.Channel,
) -> grpc.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]:
    """The standard gRPC health service's Check method on `channel`."""
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        health_pb2.HealthCheckRequest.SerializeToString,
        health_pb2.HealthCheckResponse.FromString,
    )


def key_of(n: int) -> str:
    return f"{n:032x}"


def client(
    address: str,
    stats: CacheStats | None = None,
    token: str | None = None,
    timeout_s: float = 10.0,
    breaker: CircuitBreaker | None = None,
) -> RemoteStore:
    return RemoteStore(
        address, stats or CacheStats(), timeout_s=timeout_s, token=token, breaker=breaker
    )


class RawStub:
    """The five methods without RemoteStore's checks, to send what a bad client would."""

    def __init__(self, address: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        path = wire.method_path
        self._get = self.channel.unary_stream(
            path("Get"), pb.GetRequest.SerializeToString, pb.Transfer.FromString
        )
        self._put = self.channel.stream_unary(
            path("Put"), pb.Transfer.SerializeToString, pb.PutResponse.FromString
        )
        self._find = self.channel.unary_unary(
            path("FindMissing"),
            pb.FindMissingRequest.SerializeToString,
            pb.FindMissingResponse.FromString,
        )
        self._lease = self.channel.unary_stream(
            path("Lease"), pb.LeaseRequest.SerializeToString, pb.LeaseEvent.FromString
        )
        self._stats = self.channel.unary_unary(
            path("Stats"), pb.StatsRequest.SerializeToString, pb.StatsResponse.FromString
        )

    def get(self, key: str) -> list[pb.Transfer]:
        return list(self._get(pb.GetRequest(key=key), timeout=10, metadata=self.metadata))

    def put(self, messages: Iterable[pb.Transfer], timeout: float = 10) -> pb.PutResponse:
        return self._put(iter(messages), timeout=timeout, metadata=self.metadata)

    def find_missing(self, keys: list[str]) -> list[str]:
        request = pb.FindMissingRequest(keys=keys)
        return list(self._find(request, timeout=10, metadata=self.metadata).missing)

    def lease(self, key: str, wait_s: float = 0.0) -> grpc.Call:
        request = pb.LeaseRequest(key=key, wait_seconds=wait_s, hold_seconds=5)
        return self._lease(request, timeout=10, metadata=self.metadata)

    def stats(self) -> pb.StatsResponse:
        return self._stats(pb.StatsRequest(), timeout=10, metadata=self.metadata)

    def upload(self, key: str, data: bytes, **info_overrides: object) -> list[pb.Transfer]:
        """The messages of a Put of data under key, with BlobInfo fields overridden."""
        info = wire.blob_info(key, data)
        for name, value in info_overrides.items():
            setattr(info, name, value)
        return list(wire.transfer(info, data))

    def close(self) -> None:
        self.channel.close()


def assert_outage_warned_with_counts(
    caplog: Any, logger: str, get: Callable[[str], Any], calls: int = 20
) -> None:
    """`calls` reads through `get` (a tier that is down, warning every 0.3 s, not every
    minute) each raise StoreUnavailable, and `logger` warns when the outage starts and
    again while it lasts, each repeat with the count of calls failed since the last one
    (fcache.cache.outage)."""
    with caplog.at_level(logging.WARNING, logger=logger):
        for n in range(calls):
            with pytest.raises(StoreUnavailable):
                get(key_of(n))
            time.sleep(0.05)
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == logger
    ]
    assert len(warnings) >= 2, warnings
    assert "while it fails, a warning every" in warnings[0]
    counts = [int(w.split("still failing: ")[1].split()[0]) for w in warnings[1:]]
    assert all(n >= 1 for n in counts) and "since it failed first" in warnings[-1]
