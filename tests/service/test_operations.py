"""What an operator's tools see of a running fcache-server, through their standard clients:
Prometheus metrics at /metrics (fetched as curl would, parsed by prometheus-client's own
parser), the gRPC health service (grpcio-health-checking's stub), server reflection
(grpcio-reflection's descriptor database), and counters that add up.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.parser import text_string_to_metric_families

from fcache.cache.signing import Signer
from fcache.cache.store import LeaseGrant
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats, Counters
from service.metrics import CLIENT_COUNTERS, SERVER_COUNTERS
from tests.reliability.support import key_file, signed
from tests.service.support import RawStub, ServerProcess, StartServer, client, envelope, key_of

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _metrics_address(server: ServerProcess) -> str:
    ready = json.loads((server.log.parent / "ready.json").read_text())
    return str(ready["metrics"])


def _scrape(address: str) -> Samples:
    """GET /metrics, as Prometheus (or curl) would; every sample by (name, labels)."""
    url = f"http://{address}/metrics"
    if shutil.which("curl"):
        text = subprocess.run(
            ["curl", "-sf", url], check=True, capture_output=True, text=True, timeout=10
        ).stdout
    else:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metered(start_server: StartServer) -> ServerProcess:
    return start_server("--metrics-listen", "127.0.0.1:0")


def test_metrics_parse_as_prometheus_text_and_move_when_a_client_works(
    metered: ServerProcess,
) -> None:
    address = _metrics_address(metered)
    before = _scrape(address)
    for name, _ in SERVER_COUNTERS.values():
        assert (f"fcache_server_{name}_total", ()) in before, name
    assert _value(before, "fcache_server_store_max_bytes") > 0
    assert _value(before, "process_resident_memory_bytes") > 0

    store = client(metered.tcp)
    data = envelope(100_000)
    try:
        assert store.get(key_of(1)) is None
        store.put(key_of(1), data)
        assert store.get(key_of(1)) == data
    finally:
        store.close()

    after = _scrape(address)
    # grpc-prometheus's names and labels: service and method apart, the call's shape.
    get = {"grpc_service": wire.SERVICE, "grpc_method": "Get", "grpc_type": "server_stream"}
    put = {"grpc_service": wire.SERVICE, "grpc_method": "Put", "grpc_type": "client_stream"}
    assert _value(after, "grpc_server_started_total", **put) == 1
    assert _value(after, "grpc_server_handled_total", **put, grpc_code="OK") == 1
    assert _value(after, "grpc_server_handled_total", **get, grpc_code="OK") == 1
    assert _value(after, "grpc_server_handled_total", **get, grpc_code="NOT_FOUND") == 1
    assert _value(after, "grpc_server_handling_seconds_count", **get) == 2
    assert not [name for name, labels in after if ("method", wire.method_path("Get")) in labels]
    assert _value(after, "fcache_server_hits_total") == 1
    assert _value(after, "fcache_server_misses_total") == 1
    assert _value(after, "fcache_server_puts_total") == 1
    assert _value(after, "fcache_server_written_bytes_total") == len(data)
    assert _value(after, "fcache_server_read_bytes_total") == len(data)
    assert _value(after, "fcache_server_store_bytes") > _value(before, "fcache_server_store_bytes")
    assert _value(after, "fcache_server_active_leases") == 0


def test_every_server_counter_is_exported_and_a_client_only_one_is_named_so() -> None:
    """A counter added to Counters must be exported or said to be a client's."""
    fields = {f.name for f in dataclasses.fields(Counters)}
    assert set(SERVER_COUNTERS) | CLIENT_COUNTERS == fields
    assert not set(SERVER_COUNTERS) & CLIENT_COUNTERS


def test_security_and_overload_counters_reach_metrics_as_stats_shows_them(
    start_server: StartServer, tmp_path: Path
) -> None:
    """unverified, conflicts, duplicates and overloaded were in `fcache stats --server`
    only; every server counter in /metrics now has the Stats RPC's value."""
    key = key_file(tmp_path)
    signer = Signer.from_file(key)
    server = start_server(
        "--metrics-listen", "127.0.0.1:0", "--signing-key-file", str(key),
        "--max-upload-bytes", "1M", "--max-inflight-bytes", "1M", name="guarded",
    )  # fmt: skip
    stub = RawStub(server.tcp)
    try:
        first = signed(signer, key_of(1), 1000, seed=1)
        assert stub.put(stub.upload(key_of(1), first)).stored
        assert not stub.put(stub.upload(key_of(1), first)).stored  # a duplicate
        other = signed(signer, key_of(1), 1000, seed=2)
        assert _code(lambda: stub.put(stub.upload(key_of(1), other))) == "ALREADY_EXISTS"
        unsigned = signed(None, key_of(2), 1000, seed=3)
        assert _code(lambda: stub.put(stub.upload(key_of(2), unsigned))) == "FAILED_PRECONDITION"
        # An upload that declared 900K and sent none of it holds 900K of the 1M in flight
        # (reserved at its BlobInfo); the next is refused as overloaded.
        held = stub.upload(key_of(3), signed(signer, key_of(3), 900_000, seed=4))[:1]
        released = threading.Event()

        def stalled() -> Iterator[pb.Transfer]:
            yield from held
            released.wait(20)

        hold = stub._put.future(stalled(), timeout=30)
        time.sleep(0.5)
        late = signed(signer, key_of(4), 900_000, seed=5)
        assert _code(lambda: stub.put(stub.upload(key_of(4), late))) == "RESOURCE_EXHAUSTED"
        hold.cancel()  # never completed: the upload is dropped, not stored
        released.set()
        time.sleep(0.5)  # the server's side of the cancelled call ends
        counters = stub.stats().counters
        samples = _scrape(_metrics_address(server))
    finally:
        stub.close()
    for field in ("unverified", "conflicts", "duplicates", "overloaded"):
        assert counters[field] >= 1, field
    assert counters["puts"] == 1
    for field, (name, _) in SERVER_COUNTERS.items():
        assert _value(samples, f"fcache_server_{name}_total") == counters[field], field


def _code(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return str(refused.value.code().name)


def test_metrics_count_refused_calls_by_code(start_server: StartServer, tmp_path: Path) -> None:
    tokens = tmp_path / "write-tokens"
    tokens.write_text("secret\n")
    server = start_server(
        "--metrics-listen", "127.0.0.1:0", "--write-token-file", str(tokens), name="auth"
    )
    stub = RawStub(server.tcp)  # no token
    try:
        with pytest.raises(grpc.RpcError) as refused:
            stub.get(key_of(2))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        stub.close()
    samples = _scrape(_metrics_address(server))
    get = {"grpc_service": wire.SERVICE, "grpc_method": "Get", "grpc_type": "server_stream"}
    assert _value(samples, "grpc_server_handled_total", **get, grpc_code="UNAUTHENTICATED") == 1
    assert _value(samples, "fcache_server_rejected_total") == 1


def test_metrics_listen_is_refused_when_it_cannot_bind(start_server: StartServer) -> None:
    with pytest.raises(RuntimeError, match="metrics_listen"):
        start_server("--metrics-listen", "192.0.2.1:0", name="unbindable")


def test_health_answers_through_the_standard_client(shared_server: ServerProcess) -> None:
    with grpc.insecure_channel(shared_server.tcp) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", wire.SERVICE):
            request = health_pb2.HealthCheckRequest(service=service)
            assert stub.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=wire.SERVICE), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_turns_not_serving_on_sigterm(start_server: StartServer) -> None:
    server = start_server("--grace", "3", name="draining")
    with grpc.insecure_channel(server.tcp) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=wire.SERVICE), timeout=20)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        server.process.terminate()
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert server.process.wait(20) == 0


def test_reflection_describes_the_services(shared_server: ServerProcess) -> None:
    with grpc.insecure_channel(shared_server.tcp) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {wire.SERVICE, "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(database)
        cache = pool.FindServiceByName(wire.SERVICE)
        assert {m.name for m in cache.methods} == {
            "Get",
            "Put",
            "FindMissing",
            "Lease",
            "Stats",
            "Report",
        }
        put = cache.methods_by_name["Put"]
        assert put.client_streaming and put.input_type.full_name == "fcache.v1.Transfer"


def test_regions_missed_once_are_counted_once(start_server: StartServer) -> None:
    """What a client does for each cold region (Get, Lease, Put): one miss, one grant."""
    server = start_server(name="counting")
    store = client(server.tcp, CacheStats())
    try:
        for n in range(10):
            key = key_of(100 + n)
            assert store.get(key) is None
            grant = store.acquire(key, 5.0)
            assert isinstance(grant, LeaseGrant)
            store.put(key, envelope(1000))
            store.release(grant)
        counters = store.server_stats()["counters"]
    finally:
        store.close()
    assert counters["misses"] == 10  # type: ignore[index]
    assert counters["lease_grants"] == 10  # type: ignore[index]
    assert counters["puts"] == 10  # type: ignore[index]
    assert counters["hits"] == 0  # type: ignore[index]
