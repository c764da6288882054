"""RedisStore against a real redis-server: the layout, atomic puts, what it refuses, and
eviction left to Redis. In-process; each test its own redis-server."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fcache.cache.artifact import Artifact, encode
from fcache.cache.redis import RedisStore, layout
from fcache.cache.remote import CircuitBreaker
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.stats import CacheStats
from tests.redis.support import RedisServer
from tests.reliability.support import key_file, signed
from tests.service.support import assert_outage_warned_with_counts

KiB = 1 << 10


def key_of(n: int) -> str:
    return f"{n:032x}"


def store_on(server: RedisServer, stats: CacheStats | None = None, **kw: object) -> RedisStore:
    kw.setdefault("chunk_bytes", 4 * KiB)
    return RedisStore(server.url(), stats or CacheStats(), **kw)  # type: ignore[arg-type]


def test_round_trips_inline_and_chunked_under_one_hash_tag(redis_server: RedisServer) -> None:
    store = store_on(redis_server, ttl_s=600)
    small, large = os.urandom(100), os.urandom(4 * KiB * 5 + 7)
    store.put(key_of(1), small)
    store.put(key_of(2), large)
    assert store.get(key_of(1)) == small and store.get(key_of(2)) == large
    assert store.get(key_of(3)) is None
    keys = sorted(k.decode() for k in redis_server.client().keys("*"))
    # One entry key for the small one; an entry and six chunks for the large one, each
    # under its cache key's hash tag, each with the ttl asked for.
    assert [k for k in keys if key_of(1) in k] == [f"fcache:v1:{{{key_of(1)}}}"]
    assert len([k for k in keys if f"{{{key_of(2)}}}" in k]) == 7
    assert all(0 < redis_server.client().pttl(k) <= 600_000 for k in keys)
    assert store.find_missing([key_of(1), key_of(3), key_of(2)]) == [key_of(3)]


def test_without_a_ttl_entries_stay_until_redis_evicts_them(redis_server: RedisServer) -> None:
    store = store_on(redis_server)
    store.put(key_of(1), os.urandom(9 * KiB))
    assert all(redis_server.client().pttl(k) == -1 for k in redis_server.client().keys("*"))


def test_the_last_put_wins_and_leaves_no_chunks_behind(redis_server: RedisServer) -> None:
    store = store_on(redis_server)
    first, second = os.urandom(20 * KiB), os.urandom(9 * KiB)
    store.put(key_of(1), first)
    store.put(key_of(1), second)
    assert store.get(key_of(1)) == second
    assert len(redis_server.client().keys("*")) == 1 + 3  # the entry and 3 chunks
    store.put(key_of(1), b"inline")
    assert store.get(key_of(1)) == b"inline"
    assert len(redis_server.client().keys("*")) == 1


def test_readers_see_a_whole_put_or_the_previous_one(redis_server: RedisServer) -> None:
    """Chunked puts racing a reader: every read is one of the values put, whole."""
    writer, reader = store_on(redis_server), store_on(redis_server)
    values = [os.urandom(16 * KiB + i) for i in range(6)]
    writer.put(key_of(1), values[0])
    stop = threading.Event()
    seen: list[bytes | None] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(reader.get(key_of(1)))

    thread = threading.Thread(target=read)
    thread.start()
    for _ in range(10):
        for value in values:
            writer.put(key_of(1), value)
    stop.set()
    thread.join()
    assert seen and all(v is None or v in values for v in seen)
    # A read that lost a race with a newer put's clean-up is a miss, never a mixture.
    assert sum(v is not None for v in seen) > len(seen) // 2


def test_a_chunk_evicted_is_a_counted_miss(redis_server: RedisServer) -> None:
    stats = CacheStats()
    store = store_on(redis_server, stats)
    store.put(key_of(1), os.urandom(10 * KiB))
    chunk = next(k for k in redis_server.client().keys("*") if k.endswith(b":1"))
    redis_server.client().delete(chunk)
    assert store.get(key_of(1)) is None
    assert stats.tier("redis").evictions == 1 and stats.tier("redis").corrupt == 0
    assert redis_server.client().keys("*") == []  # the rest of the entry went with it


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "flipped", "oversized"],
)
def test_a_damaged_entry_is_refused_and_counted(redis_server: RedisServer, damage: str) -> None:
    stats = CacheStats()
    store = store_on(redis_server, stats, max_artifact_bytes=64 * KiB)
    data = os.urandom(3 * KiB)
    store.put(key_of(1), data)
    client, entry = redis_server.client(), layout.entry_key(key_of(1))
    value = client.get(entry)
    assert value is not None
    planted = {
        "garbage": b"not a frame at all, but bytes someone wrote",
        "truncated": value[:-1],
        "flipped": value[:100] + bytes([value[100] ^ 1]) + value[101:],
        "oversized": layout.Frame(0, 1 << 40, b"\0" * 16, b"\0" * 16).pack(),
    }[damage]
    client.set(entry, planted)
    assert store.get(key_of(1)) is None
    counters = stats.tier("redis")
    if damage == "oversized":
        # Refused unread, and left for readers with a larger bound.
        assert counters.rejected == 1 and client.get(entry) == planted
    else:
        assert counters.corrupt == 1 and client.get(entry) is None
    store.put(key_of(1), data)  # fillable again
    assert store.get(key_of(1)) == data


def _tiered(tmp_path: Path, server: RedisServer, key: Path) -> TieredCache:
    """A process's tiers with this key (as every process has one: fcache.cache.signing)."""
    settings = Settings(cache_dir=tmp_path / "local", redis=server.url(), signing_key_file=key)
    return TieredCache.open(settings, CacheStats())


def test_an_unsigned_or_corrupt_envelope_from_redis_is_refused_never_loaded(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """With a signing key, what was planted in Redis behind fcache's back (an unsigned
    envelope, one signed with another key, a corrupt one, all in valid frames) is a
    counted miss: not returned, not copied into the local tier."""
    key = key_file(tmp_path)
    signer = Signer.from_file(key)
    other = Signer.from_file(key_file(tmp_path, "other.key"))
    cache = _tiered(tmp_path, redis_server, key)
    planter = store_on(redis_server)
    unsigned = encode(Artifact("text", "1", b"print('pwned')"))
    corrupt = bytearray(signed(signer, key_of(3), 100))
    corrupt[-1] ^= 1
    planter.put(key_of(1), unsigned)
    planter.put(key_of(2), signed(other, key_of(2), 100))
    planter.put(key_of(3), bytes(corrupt))
    for n in (1, 2, 3):
        assert cache.get(key_of(n)) is None
    counters = cache._stats.tier("redis")
    assert counters.unverified == 2 and counters.corrupt == 1 and counters.hits == 0
    assert cache._stats.tier("local").puts == 0
    # What the signer put itself is read back, verified, and copied into the local tier.
    good = Artifact("text", "1", b"ok")
    cache.put(key_of(4), good)
    fresh = _tiered(tmp_path / "fresh", redis_server, key)
    found = fresh.get(key_of(4))
    assert found is not None and found[0].payload == b"ok" and found[1] == "redis"
    assert fresh._stats.tier("local").puts == 1
    cache.close()
    fresh.close()


def test_a_redis_cluster_url_stores_and_leases(tmp_path: Path) -> None:
    """redis+cluster://: a one-node Redis Cluster holding every slot."""
    server = RedisServer(cluster=True)
    try:
        store = RedisStore(server.url(), CacheStats(), chunk_bytes=4 * KiB)
        data = os.urandom(13 * KiB)
        store.put(key_of(7), data)
        assert store.get(key_of(7)) == data
        assert store.find_missing([key_of(7), key_of(8)]) == [key_of(8)]
        grant = store.try_lease(key_of(8))
        assert grant is not None and store.try_lease(key_of(8)) is None
        store.release(grant)
        assert store.server_info()["nodes"] == 1
        store.close()
    finally:
        server.close()


def test_a_full_redis_that_evicts_nothing_refuses_writes_not_reads(tmp_path: Path) -> None:
    """maxmemory with noeviction (Redis's default policy): writes are refused with OOM,
    counted `overloaded`, and do not open the breaker: reads go on."""
    server = RedisServer("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    try:
        stats = CacheStats()
        store = RedisStore(server.url(), stats, breaker=CircuitBreaker(failures=2))
        store.put(key_of(0), b"kept")
        refused = 0
        for n in range(1, 40):
            try:
                store.put(key_of(n), os.urandom(256 * KiB))
            except Exception:
                refused += 1
        assert refused > 0 and stats.tier("redis").overloaded == refused
        assert stats.tier("redis").errors == 0
        assert store.get(key_of(0)) == b"kept"
    finally:
        server.close()


def test_allkeys_lru_evicts_old_entries_and_they_read_as_misses(tmp_path: Path) -> None:
    """The recommended policy: writes keep succeeding past maxmemory, old entries go, and
    an entry that lost a chunk reads as a miss, never as corrupt."""
    server = RedisServer("--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
    try:
        stats = CacheStats()
        store = RedisStore(server.url(), stats, chunk_bytes=64 * KiB)
        values = {key_of(n): os.urandom(200 * KiB) for n in range(60)}  # 12 MiB in all
        for key, value in values.items():
            store.put(key, value)
        found = {key: store.get(key) for key in values}
        assert all(v is None or v == values[k] for k, v in found.items())
        assert 0 < sum(v is not None for v in found.values()) < len(values)
        assert found[key_of(59)] == values[key_of(59)]  # the newest stays
        assert stats.tier("redis").corrupt == 0 and stats.tier("redis").errors == 0
    finally:
        server.close()


def test_an_outage_is_warned_about_again_with_a_count(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """As the fcache-server tier does (fcache.cache.outage): a Redis that stays down is not
    one warning at start-up and then silence; every call is counted, skipped ones too."""
    stats = CacheStats()
    store = store_on(redis_server, stats, timeout_s=0.5, warn_every_s=0.3)
    redis_server.kill()
    try:
        assert_outage_warned_with_counts(caplog, "fcache.cache.redis.store", store.get)
    finally:
        store.close()
    assert stats.tier("redis").errors == 20
