"""SIGTERM: in-flight calls drain, acknowledged writes survive a restart, waiters are let go."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from tests.service.support import RawStub, ServerProcess, StartServer, client, envelope, key_of


def _slow_upload(key: str, data: bytes, started: threading.Event) -> Iterator[pb.Transfer]:
    """The Put messages of data, a chunk every 0.1 s; sets `started` after the first."""
    for index, message in enumerate(wire.transfer(wire.blob_info(key, data), data)):
        yield message
        if index == 1:
            started.set()
        time.sleep(0.1)


def test_sigterm_drains_an_upload_in_flight(start_server: StartServer) -> None:
    server = start_server()
    key, data = key_of(1), envelope(8 << 20)  # 8 chunks: about a second of upload
    started = threading.Event()
    outcome: list[object] = []
    stub = RawStub(server.tcp)
    thread = threading.Thread(
        target=lambda: outcome.append(stub.put(_slow_upload(key, data, started), timeout=30))
    )
    thread.start()
    assert started.wait(10)
    status = server.terminate()
    thread.join(30)
    assert status == 0
    assert len(outcome) == 1 and isinstance(outcome[0], pb.PutResponse) and outcome[0].stored

    restarted = start_server(db=server.db)
    assert client(restarted.tcp).get(key) == data


def test_sigterm_lets_lease_waiters_go_at_once(start_server: StartServer) -> None:
    server = start_server("--grace", "30")
    holder = client(server.tcp)
    assert holder.acquire(key_of(2), 30.0) is not None
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(_acquire_or_error(server, key_of(2))))
    waiter.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert server.terminate() == 0
    waiter.join(10)
    # Not held for the 30 s grace: the lease table closed first.
    assert time.monotonic() - start < 10
    assert results and "UNAVAILABLE" in str(results[0])


def _acquire_or_error(server: ServerProcess, key: str) -> object:
    from fcache.errors import StoreUnavailable

    try:
        return client(server.tcp).acquire(key, 30.0)
    except StoreUnavailable as exc:
        return exc
