"""Tokens: a missing or wrong one is UNAUTHENTICATED, a read token cannot write, health
is open, and a refused call stores nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats
from tests.service.support import (
    RawStub,
    ServerProcess,
    StartServer,
    client,
    envelope,
    health_check,
    key_of,
)

READ, WRITE = "read-token-1", "write-token-1"
KEY = key_of(42)


@pytest.fixture
def server(start_server: StartServer, tmp_path: Path) -> ServerProcess:
    (tmp_path / "read").write_text(f"{READ}\n\nold-read-token\n")
    (tmp_path / "write").write_text(f"{WRITE}\n")
    return start_server(
        "--read-token-file", str(tmp_path / "read"), "--write-token-file", str(tmp_path / "write")
    )


def _every_method(stub: RawStub) -> dict[str, Callable[[], object]]:
    data = envelope(100)
    return {
        "Get": lambda: stub.get(KEY),
        "Put": lambda: stub.put(stub.upload(KEY, data)),
        "FindMissing": lambda: stub.find_missing([KEY]),
        "Lease": lambda: list(stub.lease(KEY)),  # type: ignore[call-overload]
        "Stats": lambda: stub.stats(),
    }


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _nothing_stored(server: ServerProcess) -> bool:
    return RawStub(server.tcp, WRITE).find_missing([KEY]) == [KEY]


@pytest.mark.parametrize("token", [None, "wrong", READ + "x", ""])
def test_missing_or_wrong_token_is_unauthenticated(
    server: ServerProcess, token: str | None
) -> None:
    stub = RawStub(server.tcp, token)
    for method, call in _every_method(stub).items():
        assert _code(call) == grpc.StatusCode.UNAUTHENTICATED, method
    assert _nothing_stored(server)


def test_read_token_reads_but_cannot_write(server: ServerProcess) -> None:
    stub = RawStub(server.unix, READ)
    methods = _every_method(stub)
    assert _code(methods["Get"]) == grpc.StatusCode.NOT_FOUND
    assert stub.find_missing([KEY]) == [KEY]
    assert stub.stats().entries == 0
    assert _code(methods["Put"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(methods["Lease"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _nothing_stored(server)


def test_any_line_of_a_token_file_is_a_token(server: ServerProcess) -> None:
    assert RawStub(server.tcp, "old-read-token").find_missing([KEY]) == [KEY]


def test_write_token_reads_and_writes(server: ServerProcess) -> None:
    stats = CacheStats()
    store = client(server.tcp, stats, token=WRITE)
    data = envelope(1000)
    store.put(KEY, data)
    assert client(server.tcp, token=READ).get(KEY) == data
    assert RawStub(server.tcp, READ).stats().counters["rejected"] == 0


def test_refusals_are_counted(server: ServerProcess) -> None:
    _code(lambda: RawStub(server.tcp).get(KEY))
    _code(lambda: RawStub(server.tcp, READ).put([]))
    assert RawStub(server.tcp, READ).stats().counters["rejected"] == 2


def test_health_needs_no_token(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.tcp) as channel:
        check = health_check(channel)
        response = check(health_pb2.HealthCheckRequest(), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_remote_store_with_a_read_token_stops_writing(server: ServerProcess) -> None:
    stats = CacheStats()
    store = client(server.tcp, stats, token=READ)
    with pytest.raises(StoreUnavailable, match="PERMISSION_DENIED"):
        store.put(KEY, envelope(100))
    with pytest.raises(StoreUnavailable, match="read-only"):
        store.put(KEY, envelope(100))  # not sent: the server said no once
    assert store.acquire(KEY, 1.0) is None
    remote = stats.tier("remote")
    assert remote.rejected == 1 and remote.errors == 0
    assert store.get(KEY) is None  # reading still works, and the breaker stayed closed
    fresh = CacheStats()
    assert client(server.tcp, fresh, token=READ).acquire(KEY, 1.0) is None
    assert fresh.tier("remote").rejected == 1 and fresh.tier("remote").errors == 0
    assert _nothing_stored(server)


def test_remote_store_with_a_wrong_token_fails_like_an_outage(server: ServerProcess) -> None:
    stats = CacheStats()
    with pytest.raises(StoreUnavailable, match="UNAUTHENTICATED"):
        client(server.tcp, stats, token="wrong").get(KEY)
    assert stats.tier("remote").errors == 1
