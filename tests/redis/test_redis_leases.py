"""Compile leases in a real Redis: one holder, waiters get the artifact, only the owner
releases, renewal outlives the ttl, a dead owner's lease is taken over."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fcache.cache.redis import RedisStore, layout
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats
from tests.redis.support import RedisServer
from tests.service.support import ROOT

KEY = "ab" * 16
NewStore = Callable[..., RedisStore]


@pytest.fixture
def new_store(redis_server: RedisServer) -> Iterator[NewStore]:
    """RedisStores on the test's server, closed after the test: a lease a test leaves held
    would otherwise be renewed by its store's thread after the server is gone (warnings
    in whichever test runs next)."""
    made: list[RedisStore] = []

    def make(stats: CacheStats, **options: float) -> RedisStore:
        made.append(RedisStore(redis_server.url(), stats, **options))
        return made[-1]

    yield make
    for store in made:
        store.close()


def test_one_holder_and_the_waiter_gets_the_artifact(
    redis_server: RedisServer, new_store: NewStore
) -> None:
    holder_stats, waiter_stats = CacheStats(), CacheStats()
    holder = new_store(holder_stats)
    waiter = new_store(waiter_stats)
    grant = holder.acquire(KEY, 5.0)
    assert grant is not None and not isinstance(grant, bytes)
    told: list[bool] = []
    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(waiter.acquire(KEY, 10.0, lambda: told.append(True)))
    )
    thread.start()
    time.sleep(0.3)
    holder.put(KEY, b"the artifact")
    holder.release(grant)
    thread.join(10)
    assert result == [b"the artifact"] and told == [True]
    assert holder_stats.tier("redis").lease_grants == 1
    assert waiter_stats.tier("redis").lease_waits == 1
    assert redis_server.client().get(layout.lease_key(KEY)) is None


def test_a_waiter_gives_up_after_its_wait(redis_server: RedisServer, new_store: NewStore) -> None:
    holder = new_store(CacheStats())
    waiter = new_store(CacheStats())
    assert holder.try_lease(KEY) is not None
    start = time.monotonic()
    assert waiter.acquire(KEY, 0.5) is None
    assert 0.5 <= time.monotonic() - start < 3


def test_only_the_owner_releases(redis_server: RedisServer, new_store: NewStore) -> None:
    """A holder whose lease lapsed and was taken over cannot release its successor's."""
    first = new_store(CacheStats(), lease_ttl_s=30)
    second = new_store(CacheStats())
    stale = first.try_lease(KEY)
    assert stale is not None
    redis_server.client().delete(layout.lease_key(KEY))  # as if its ttl had run out
    current = second.try_lease(KEY)
    assert current is not None
    first.release(stale)
    assert redis_server.client().get(layout.lease_key(KEY)) == current.holder.encode()
    second.release(current)
    assert redis_server.client().get(layout.lease_key(KEY)) is None


def test_a_held_lease_is_renewed_past_its_ttl(
    redis_server: RedisServer, new_store: NewStore
) -> None:
    holder = new_store(CacheStats(), lease_ttl_s=0.6)
    other = new_store(CacheStats())
    grant = holder.try_lease(KEY)
    assert grant is not None
    time.sleep(2.0)  # three ttls: it lives only because it is renewed
    assert other.try_lease(KEY) is None and holder.holds(grant)
    holder.release(grant)
    assert not holder.holds(grant)
    assert other.try_lease(KEY) is not None


_HOLD_AND_HANG = """
import sys, time
from fcache.cache.redis import RedisStore
from fcache.stats import CacheStats
store = RedisStore(sys.argv[1], CacheStats(), lease_ttl_s=1.0)
assert store.try_lease(sys.argv[2]) is not None
print("held", flush=True)
time.sleep(600)
"""


def test_a_dead_owner_is_taken_over_within_the_ttl(
    redis_server: RedisServer, new_store: NewStore
) -> None:
    """The owner, another process, is SIGKILLed mid-compile: it stops renewing, its lease
    lapses within its ttl, and the waiter takes it over."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _HOLD_AND_HANG, redis_server.url(), KEY],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "held"
        waiter = new_store(CacheStats())
        time.sleep(1.5)  # longer than the ttl: the living owner renews it
        assert waiter.try_lease(KEY) is None
        owner.kill()
        owner.wait(10)
        start = time.monotonic()
        grant = waiter.acquire(KEY, 10.0)
        assert grant is not None and not isinstance(grant, bytes)
        assert time.monotonic() - start < 2.5  # within the ttl (1 s) and a poll or two
    finally:
        owner.kill()
        owner.wait(10)


def test_a_dead_redis_refuses_leases_fast(redis_server: RedisServer, new_store: NewStore) -> None:
    """The tiered cache then falls back to its local leases (tests/redis/test_redis_faults.py)."""
    stats = CacheStats()
    store = new_store(stats, timeout_s=1.0)
    redis_server.kill()
    refused = []
    for _ in range(5):
        start = time.monotonic()
        with pytest.raises(StoreUnavailable) as failure:
            store.acquire(KEY, 60.0)
        assert time.monotonic() - start < 2
        refused.append("skipped (circuit open)" in str(failure.value))
    # Three failures open the breaker; the calls after it are refused without trying (and
    # counted all the same: the tier failed them).
    assert refused == [False, False, False, True, True]
    assert stats.tier("redis").errors == 5
