"""The fcache.v1.Cache protocol over the real wire: round trips, bad input, Stats, health."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2

from fcache.errors import StoreUnavailable
from fcache.protocol import wire
from fcache.protocol.wire import checksum
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

MiB = 1 << 20


@pytest.fixture(params=["tcp", "unix"])
def address(request: pytest.FixtureRequest, shared_server: ServerProcess) -> str:
    return shared_server.tcp if request.param == "tcp" else shared_server.unix


@pytest.fixture
def raw(shared_server: ServerProcess) -> RawStub:
    stub = RawStub(shared_server.tcp)
    yield stub
    stub.close()


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_put_then_get_round_trips(address: str) -> None:
    key = key_of(1 if address.startswith("unix") else 2)
    data = envelope(3 * MiB + 17)  # several chunks, the last one short
    store = client(address)
    assert store.get(key) is None
    store.put(key, data)
    assert store.get(key) == data
    assert store.find_missing([key]) == []


def test_64_mib_artifact_round_trips_intact(shared_server: ServerProcess) -> None:
    key, data = key_of(3), envelope(64 * MiB)
    store = client(shared_server.unix, timeout_s=60)
    store.put(key, data)
    got = store.get(key)
    assert got is not None and len(got) == len(data) and checksum(got) == checksum(data)


def test_put_of_a_stored_key_keeps_the_first_copy(raw: RawStub) -> None:
    key, data = key_of(4), envelope(1000)
    assert raw.put(raw.upload(key, data)).stored is True
    assert raw.put(raw.upload(key, data)).stored is False


def test_get_of_an_absent_key_is_not_found(raw: RawStub) -> None:
    assert _code(lambda: raw.get(key_of(5))) == grpc.StatusCode.NOT_FOUND


def test_find_missing_reports_absent_keys_in_request_order(raw: RawStub) -> None:
    present = key_of(6)
    raw.put(raw.upload(present, envelope(10)))
    keys = [key_of(9), present, key_of(7), key_of(8)]
    assert raw.find_missing(keys) == [key_of(9), key_of(7), key_of(8)]


# -- item 4: bad input is INVALID_ARGUMENT, and nothing is stored ---------------------------


@pytest.mark.parametrize(
    "key", ["", "ABCDEF0123456789ABCDEF0123456789", "0" * 31, "0" * 33, "../" + "0" * 29, "g" * 32]
)
def test_malformed_key_is_invalid_argument(raw: RawStub, key: str) -> None:
    data = envelope(10)
    assert _code(lambda: raw.put(raw.upload(key, data))) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: raw.get(key)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: raw.find_missing([key])) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: list(raw.lease(key))) == grpc.StatusCode.INVALID_ARGUMENT


def _refused_and_absent(raw: RawStub, key: str, messages: list[object]) -> str:
    with pytest.raises(grpc.RpcError) as info:
        raw.put(messages)  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raw.find_missing([key]) == [key]
    return info.value.details()


def test_checksum_mismatch_is_refused(raw: RawStub) -> None:
    key, data = key_of(10), envelope(2 * MiB)
    details = _refused_and_absent(raw, key, raw.upload(key, data, checksum=checksum(b"other")))
    assert key in details and "checksum" in details


def test_declared_size_larger_than_sent_is_refused(raw: RawStub) -> None:
    key, data = key_of(11), envelope(1000)
    details = _refused_and_absent(raw, key, raw.upload(key, data, size=len(data) + 1))
    assert key in details and str(len(data) + 1) in details


def test_more_bytes_than_declared_are_refused(raw: RawStub) -> None:
    key, data = key_of(12), envelope(1000)
    details = _refused_and_absent(raw, key, raw.upload(key, data, size=len(data) - 1))
    assert key in details


def test_bytes_that_are_no_envelope_are_refused(raw: RawStub) -> None:
    key = key_of(13)
    _refused_and_absent(raw, key, raw.upload(key, b"not an fcache artifact"))


def test_upload_must_begin_with_blob_info(raw: RawStub) -> None:
    key, data = key_of(14), envelope(10)
    _refused_and_absent(raw, key, raw.upload(key, data)[1:])


def test_bad_checksum_length_is_refused(raw: RawStub) -> None:
    key, data = key_of(15), envelope(10)
    _refused_and_absent(raw, key, raw.upload(key, data, checksum=b"short"))


def test_oversized_upload_is_refused_before_its_bytes(start_server: StartServer) -> None:
    server = start_server("--max-upload-bytes", "1M")
    raw = RawStub(server.tcp)
    key, data = key_of(16), envelope(MiB + 1)
    details = _refused_and_absent(raw, key, raw.upload(key, data))
    assert key in details and str(len(data)) in details and str(MiB) in details
    # The client sees a refusal, not an outage: counted as rejected, not as an error.
    stats = CacheStats()
    with pytest.raises(StoreUnavailable, match="INVALID_ARGUMENT"):
        client(server.tcp, stats).put(key, data)
    assert stats.tier("remote").rejected == 1 and stats.tier("remote").errors == 0
    assert raw.stats().counters["rejected"] == 2


def test_find_missing_of_too_many_keys_is_refused(raw: RawStub) -> None:
    keys = [key_of(n) for n in range(10_001)]
    assert _code(lambda: raw.find_missing(keys)) == grpc.StatusCode.INVALID_ARGUMENT


# -- Stats and health ---------------------------------------------------------------------


def test_stats_count_what_happened(start_server: StartServer) -> None:
    server = start_server("--max-bytes", "3M", "--max-upload-bytes", "2M")
    raw = RawStub(server.unix)
    first, second = envelope(MiB + 100, compile_seconds=2.0), envelope(MiB + 100)
    raw.put(raw.upload(key_of(1), first))
    raw.get(key_of(1))
    raw.get(key_of(1))
    _code(lambda: raw.get(key_of(2)))  # a miss
    _code(lambda: raw.put(raw.upload(key_of(3), first, checksum=bytes(16))))  # rejected
    raw.put(raw.upload(key_of(4), second))
    raw.put(raw.upload(key_of(5), second))  # over 3M: evicts the least recently used
    stats = raw.stats()
    counters = stats.counters
    assert (counters["hits"], counters["misses"], counters["puts"]) == (2, 1, 3)
    assert counters["rejected"] == 1 and counters["evictions"] == 1
    assert counters["compile_seconds_saved"] == pytest.approx(4.0)
    assert counters["bytes_read"] == 2 * len(first)
    assert stats.entries == 2 and stats.bytes == 2 * len(second)
    assert stats.max_bytes == 3 * MiB and stats.uptime_seconds > 0
    assert stats.server_version and stats.upstream == ""


def test_fetch_server_stats_gives_plain_data(shared_server: ServerProcess) -> None:
    from fcache.cache.remote import fetch_server_stats
    from fcache.config import Settings

    stats = fetch_server_stats(shared_server.tcp, Settings())
    assert stats["address"] == shared_server.tcp
    assert set(stats["counters"]) >= {"hits", "misses", "puts", "evictions", "errors"}  # type: ignore[arg-type]
    assert isinstance(stats["entries"], int) and isinstance(stats["uptime_seconds"], float)


def test_health_reports_serving(shared_server: ServerProcess) -> None:
    with grpc.insecure_channel(shared_server.tcp) as channel:
        check = health_check(channel)
        for service in ("", wire.SERVICE):
            response = check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
