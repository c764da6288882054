"""A node server with an upstream: misses read through and are kept, puts are written back."""

from __future__ import annotations

import time

from tests.service.support import RawStub, StartServer, client, envelope, key_of


def _eventually(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_node_miss_is_served_from_the_upstream_and_kept(start_server: StartServer) -> None:
    upstream = start_server(name="upstream")
    node = start_server("--upstream", upstream.tcp, name="node")
    key, data = key_of(1), envelope(2 << 20, compile_seconds=3.0)
    client(upstream.unix).put(key, data)

    assert RawStub(node.unix).find_missing([key, key_of(2)]) == [key_of(2)]
    assert client(node.unix).get(key) == data
    counters = RawStub(node.unix).stats().counters
    assert counters["hits"] == 1 and counters["compile_seconds_saved"] == 3.0

    upstream.terminate()  # kept locally: served without the upstream
    assert client(node.unix).get(key) == data
    assert RawStub(node.unix).stats().entries == 1


def test_a_put_on_the_node_is_written_back_to_the_upstream(start_server: StartServer) -> None:
    upstream = start_server(name="upstream")
    node = start_server("--upstream", upstream.unix, name="node")
    key, data = key_of(3), envelope(1000)
    client(node.tcp).put(key, data)
    _eventually(lambda: RawStub(upstream.tcp).find_missing([key]) == [])
    assert client(upstream.tcp).get(key) == data


def test_a_lease_reads_through_before_granting(start_server: StartServer) -> None:
    upstream = start_server(name="upstream")
    node = start_server("--upstream", upstream.tcp, name="node")
    key, data = key_of(4), envelope(1000)
    client(upstream.tcp).put(key, data)
    assert client(node.tcp).acquire(key, 1.0) == data  # no compile on the node


def test_a_dead_upstream_is_a_miss_and_counted(start_server: StartServer) -> None:
    upstream = start_server(name="upstream")
    node = start_server("--upstream", upstream.tcp, name="node")
    upstream.kill()
    store = client(node.tcp)
    assert store.get(key_of(5)) is None
    key, data = key_of(6), envelope(1000)
    store.put(key, data)  # the local write succeeds; the write-back fails later
    assert store.get(key) == data
    _eventually(lambda: RawStub(node.tcp).stats().counters["errors"] >= 2)
