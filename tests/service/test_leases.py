"""Single flight through the server: one caller compiles, the others wait and receive the
artifact; a holder that goes away passes the lease on."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fcache.cache.store import LeaseGrant
from fcache.stats import CacheStats
from tests.service.support import (
    ROOT,
    RawStub,
    ServerProcess,
    StartServer,
    client,
    envelope,
    key_of,
)


class Background:
    """Runs fn in a thread; `result()` joins it and returns (or raises) what fn did."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._outcome: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._outcome.append(("ok", fn()))
        except BaseException as exc:  # handed to the test thread by result()
            self._outcome.append(("error", exc))

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 20.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "still running"
        kind, value = self._outcome[0]
        if kind == "error":
            raise value
        return value


def _wait_for_waiters(server: ServerProcess, count: int) -> None:
    stub = RawStub(server.tcp)
    deadline = time.monotonic() + 10
    while stub.stats().waiting_callers < count:
        assert time.monotonic() < deadline, "the waiter never arrived"
        time.sleep(0.02)


def test_one_is_granted_the_other_waits_and_receives_the_artifact(
    shared_server: ServerProcess,
) -> None:
    key, data = key_of(1), envelope(3 << 20, compile_seconds=4.0)
    holder_stats, waiter_stats = CacheStats(), CacheStats()
    holder = client(shared_server.tcp, holder_stats)
    waits: list[str] = []
    grant = holder.acquire(key, 5.0, waiting=lambda: waits.append("holder"))
    assert isinstance(grant, LeaseGrant) and grant.key == key
    waiter = Background(
        lambda: client(shared_server.unix, waiter_stats).acquire(
            key, 10.0, waiting=lambda: waits.append("waiter")
        )
    )
    _wait_for_waiters(shared_server, 1)
    assert not waiter.done()
    holder.put(key, data)
    holder.release(grant)
    assert waiter.result() == data
    assert holder_stats.tier("remote").lease_grants == 1
    assert waiter_stats.tier("remote").lease_waits == 1
    assert waits == ["waiter"]  # told once, when it had to wait (fcache.engine.compile.slots)


def test_a_released_lease_passes_to_the_waiter(shared_server: ServerProcess) -> None:
    key = key_of(2)
    holder = client(shared_server.tcp)
    grant = holder.acquire(key, 5.0)
    assert isinstance(grant, LeaseGrant)
    waiter = Background(lambda: client(shared_server.tcp).acquire(key, 10.0))
    _wait_for_waiters(shared_server, 1)
    holder.release(grant)  # the compile failed: give up without a put
    second = waiter.result()
    assert isinstance(second, LeaseGrant) and second.holder != grant.holder


_HOLDER = """
import sys, time
from fcache.cache.remote import RemoteStore
from fcache.stats import CacheStats
store = RemoteStore(sys.argv[1], CacheStats())  # dropping it would end the lease
grant = store.acquire(sys.argv[2], 5.0)
print(type(grant).__name__, flush=True)
time.sleep(60)
"""


def test_a_holder_that_dies_passes_the_lease_on(shared_server: ServerProcess) -> None:
    key = key_of(3)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, shared_server.unix, key],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "LeaseGrant"
        waiter = Background(lambda: client(shared_server.tcp).acquire(key, 20.0))
        _wait_for_waiters(shared_server, 1)
        holder.kill()  # SIGKILL mid-compile: no release, only a dropped connection
        assert isinstance(waiter.result(), LeaseGrant)
    finally:
        holder.kill()
        holder.wait()


def test_a_waiter_gives_up_after_its_wait(shared_server: ServerProcess) -> None:
    key = key_of(4)
    holder = client(shared_server.tcp)
    grant = holder.acquire(key, 5.0)
    start = time.monotonic()
    assert client(shared_server.tcp).acquire(key, 0.5) is None
    assert 0.4 < time.monotonic() - start < 5
    holder.release(grant)  # type: ignore[arg-type]


def test_a_lease_held_past_its_limit_passes_on(start_server: StartServer) -> None:
    server = start_server("--max-lease", "1")
    holder = client(server.tcp)
    grant = holder.acquire(key_of(5), 5.0)  # held, never released
    assert isinstance(grant, LeaseGrant)
    # Waits are bounded by --max-lease too; join late enough that the holder's lease
    # clearly runs out before this wait does.
    time.sleep(0.3)
    start = time.monotonic()
    second = client(server.tcp).acquire(key_of(5), 5.0)
    assert isinstance(second, LeaseGrant)
    assert 0.3 < time.monotonic() - start < 1


def test_lease_of_a_stored_key_returns_the_artifact(shared_server: ServerProcess) -> None:
    key, data = key_of(6), envelope(1000)
    store = client(shared_server.tcp)
    store.put(key, data)
    assert store.acquire(key, 1.0) == data


def test_many_waiters_all_receive_one_compile(shared_server: ServerProcess) -> None:
    key, data = key_of(7), envelope(100_000)
    holder = client(shared_server.tcp)
    grant = holder.acquire(key, 5.0)
    waiters = [Background(lambda: client(shared_server.unix).acquire(key, 10.0)) for _ in range(6)]
    _wait_for_waiters(shared_server, 6)
    holder.put(key, data)
    holder.release(grant)  # type: ignore[arg-type]
    assert [w.result() for w in waiters] == [data] * 6


@pytest.mark.parametrize("wait_s", [0.0])
def test_a_zero_wait_returns_at_once(shared_server: ServerProcess, wait_s: float) -> None:
    key = key_of(8)
    holder = client(shared_server.tcp)
    grant = holder.acquire(key, 5.0)
    start = time.monotonic()
    assert client(shared_server.tcp).acquire(key, wait_s) is None
    assert time.monotonic() - start < 2
    holder.release(grant)  # type: ignore[arg-type]
