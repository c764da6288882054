"""What an operator's tools see of a running fcache-server, through their standard clients:
Prometheus metrics at /metrics (fetched as curl would, parsed by prometheus-client's own
parser), the gRPC health service (grpcio-health-checking's stub), server reflection
(grpcio-reflection's descriptor database), and counters that add up.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.parser import text_string_to_metric_families

from fcache.cache.store import LeaseGrant
from fcache.protocol import wire
from fcache.stats import CacheStats
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
    for name in ("hits", "misses", "puts", "bytes_written", "evictions", "lease_waits"):
        assert (f"fcache_server_{name}_total", ()) in before, name
    assert _value(before, "fcache_server_max_bytes") > 0
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
    get, put = wire.method_path("Get"), wire.method_path("Put")
    assert _value(after, "fcache_server_requests_total", method=put, code="OK") == 1
    assert _value(after, "fcache_server_requests_total", method=get, code="OK") == 1
    assert _value(after, "fcache_server_requests_total", method=get, code="NOT_FOUND") == 1
    assert _value(after, "fcache_server_request_duration_seconds_count", method=get) == 2
    assert _value(after, "fcache_server_hits_total") == 1
    assert _value(after, "fcache_server_misses_total") == 1
    assert _value(after, "fcache_server_puts_total") == 1
    assert _value(after, "fcache_server_bytes_written_total") == len(data)
    assert _value(after, "fcache_server_bytes_read_total") == len(data)
    assert _value(after, "fcache_server_bytes") > _value(before, "fcache_server_bytes")
    assert _value(after, "fcache_server_active_leases") == 0


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
    get = wire.method_path("Get")
    assert _value(samples, "fcache_server_requests_total", method=get, code="UNAUTHENTICATED") == 1
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
