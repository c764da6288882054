"""TieredCache over a real LMDB tier (and a dict-backed stand-in for the server tier)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fcache.cache.artifact import FORMAT_VERSION, Artifact, encode
from fcache.cache.lmdb import LmdbStore
from fcache.cache.signing import Signer
from fcache.cache.store import LeaseGrant
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.errors import ConfigError, StoreUnavailable
from fcache.stats import CacheStats

ROOT = Path(__file__).resolve().parents[3]
KEY = "0123456789abcdef0123456789abcdef"
ARTIFACT = Artifact("eager", "1", b"kernel bytes", compile_seconds=2.5, producer={"torch": "x"})


class DictStore:
    """A minimal real ByteStore and Leases held in a dict, standing in for the server
    tier (one process, so every lease is granted); `down` makes every call fail the way
    an unreachable server does."""

    def __init__(self, name: str = "remote") -> None:
        self.name = name
        self.data: dict[str, bytes] = {}
        self.down = False
        self.calls = 0

    def get(self, key: str) -> bytes | None:
        self._call()
        return self.data.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._call()
        self.data[key] = data

    def delete(self, key: str) -> None:
        self._call()
        self.data.pop(key, None)

    def acquire(
        self, key: str, wait_s: float, waiting: Callable[[], None] | None = None
    ) -> LeaseGrant | bytes | None:
        self._call()
        return self.data.get(key) or LeaseGrant(key, "dict")

    def release(self, grant: LeaseGrant) -> None:
        self._call()

    def _call(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable(f"{self.name} is down")


@pytest.fixture
def stats() -> CacheStats:
    return CacheStats()


@pytest.fixture
def local(tmp_path: Path, stats: CacheStats) -> Iterator[LmdbStore]:
    store = LmdbStore(tmp_path / "local", 1 << 20, stats)
    yield store
    store.close()


@pytest.fixture
def cache(local: LmdbStore, stats: CacheStats) -> Iterator[TieredCache]:
    tiered = TieredCache([local], local, stats, lease_timeout_s=10.0)
    yield tiered
    tiered.close()


def test_put_then_get_counts_per_tier(cache: TieredCache, stats: CacheStats) -> None:
    assert cache.get(KEY) is None
    cache.put(KEY, ARTIFACT)
    assert cache.get(KEY) == (ARTIFACT, "local")
    counted = stats.tier("local")
    size = len(encode(ARTIFACT))
    assert (counted.misses, counted.hits, counted.puts) == (1, 1, 1)
    assert counted.bytes_read == counted.bytes_written == size
    assert counted.compile_seconds_saved == 2.5


def test_corrupt_entry_is_counted_deleted_and_a_miss(
    cache: TieredCache, local: LmdbStore, stats: CacheStats, caplog: pytest.LogCaptureFixture
) -> None:
    data = encode(ARTIFACT)
    local.put(KEY, data[:-1] + bytes([data[-1] ^ 0x40]))  # one flipped payload bit
    assert cache.get(KEY) is None
    assert (stats.tier("local").corrupt, stats.tier("local").misses) == (1, 1)
    assert not local.contains(KEY)
    assert "corrupt" in caplog.text
    cache.put(KEY, ARTIFACT)  # the region compiled again
    assert cache.get(KEY) == (ARTIFACT, "local")


def test_hit_in_a_lower_tier_is_written_back(local: LmdbStore, stats: CacheStats) -> None:
    remote = DictStore()
    cache = TieredCache([local, remote], remote, stats)
    remote.data[KEY] = encode(ARTIFACT)
    assert cache.get(KEY) == (ARTIFACT, "remote")
    assert local.get(KEY) == remote.data[KEY]
    assert (stats.tier("local").misses, stats.tier("local").puts) == (1, 1)
    assert stats.tier("remote").hits == 1
    calls = remote.calls
    assert cache.get(KEY) == (ARTIFACT, "local")
    assert remote.calls == calls  # served above the remote tier


def test_put_writes_every_tier(local: LmdbStore, stats: CacheStats) -> None:
    remote = DictStore()
    TieredCache([local, remote], remote, stats).put(KEY, ARTIFACT)
    assert local.get(KEY) == remote.data[KEY] == encode(ARTIFACT)


def test_a_local_tier_that_cannot_write_warns_once_keeps_reading_and_retries_later(
    tmp_path: Path, stats: CacheStats
) -> None:
    tiny = LmdbStore(tmp_path, 1 << 30, stats, map_size=1 << 20)
    remote = DictStore()
    cache = TieredCache([tiny, remote], remote, stats)
    huge = Artifact("eager", "1", b"x" * (2 << 20))  # larger than the map: nothing cures it
    with pytest.warns(RuntimeWarning, match="local cache failed") as caught:
        cache.put(KEY, huge)
    assert len(caught) == 1
    assert stats.tier("local").errors == 1  # counted once, by the store
    assert cache.tiers == ("local", "remote")  # not switched off
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert cache.get(KEY) == (huge, "remote")  # the local copy failed: not there
        assert stats.tier("local").misses == 1  # but the local tier was asked: reads go on
        cache.put("2" * 32, ARTIFACT)  # in the back-off: skipped, not tried
    assert stats.tier("local").errors == 1
    assert not tiny.contains("2" * 32)
    cache._writes["local"]._retry_at = 0.0  # the back-off is over
    cache.put("2" * 32, ARTIFACT)
    assert tiny.contains("2" * 32)  # written again
    tiny.close()


def test_failing_remote_tier_is_neither_disabled_nor_fatal(
    local: LmdbStore, stats: CacheStats
) -> None:
    remote = DictStore()
    remote.down = True
    cache = TieredCache([local, remote], remote, stats)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the remote client warns about its own outages
        assert cache.get(KEY) is None
        cache.put(KEY, ARTIFACT)
        with cache.compile_lease("f" * 32) as got:
            assert got is None
    assert local.get(KEY) == encode(ARTIFACT)
    remote.down = False  # the server is back: its breaker lets it in, and so do we
    cache.put(KEY, ARTIFACT)
    assert remote.data[KEY] == encode(ARTIFACT)
    assert cache.tiers == ("local", "remote")


def test_local_leases_stand_in_while_the_remote_ones_fail(
    local: LmdbStore, stats: CacheStats
) -> None:
    remote = DictStore()
    remote.down = True
    cache = TieredCache([local, remote], remote, stats, fallback_leases=local)
    with cache.compile_lease(KEY) as got:
        assert got is None
        assert stats.tier("local").lease_grants == 1  # single flight on the node still
        assert local.acquire(KEY, 0.05) is None  # held: another rank would wait
    assert isinstance(local.acquire(KEY, 0.05), LeaseGrant)  # released on exit


def test_unwritable_cache_dir_means_one_warning_and_memory_only(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    stats = CacheStats()
    with pytest.warns(RuntimeWarning, match="caching in memory only") as caught:
        cache = TieredCache.open(Settings(cache_dir=blocker / "cache"), stats)
    assert len(caught) == 1
    assert cache.tiers == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put(KEY, ARTIFACT)
        assert cache.get(KEY) is None
        with cache.compile_lease(KEY) as got:
            assert got is None
        cache.flush_stats()
    cache.close()


def test_open_builds_the_local_tier_with_settings(tmp_path: Path, stats: CacheStats) -> None:
    settings = Settings(cache_dir=tmp_path, max_bytes=1 << 20, lease_timeout_s=7.0)
    cache = TieredCache.open(settings, stats)
    assert cache.tiers == ("local",)
    assert cache.lease_timeout_s == 7.0
    cache.put(KEY, ARTIFACT)
    cache.close()
    reopened = LmdbStore(tmp_path, 1 << 20)
    assert reopened.contains(KEY)
    reopened.close()


def test_compile_lease_releases_on_exception(cache: TieredCache, local: LmdbStore) -> None:
    with pytest.raises(RuntimeError, match="compiler crashed"), cache.compile_lease(KEY) as got:
        assert got is None
        raise RuntimeError("compiler crashed")
    start = time.monotonic()
    with cache.compile_lease(KEY) as got:
        assert got is None
    assert time.monotonic() - start < 0.5  # granted at once: nobody held the lease


def test_compile_lease_yields_what_the_holder_put(cache: TieredCache, stats: CacheStats) -> None:
    holding = threading.Event()

    def holder() -> None:
        with cache.compile_lease(KEY) as got:
            assert got is None
            holding.set()
            time.sleep(0.3)
            cache.put(KEY, ARTIFACT)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(5)
    waits: list[bool] = []  # whether the artifact was stored when `waiting` was called
    with cache.compile_lease(KEY, waiting=lambda: waits.append(thread.is_alive())) as got:
        assert got == ARTIFACT
    thread.join()
    assert stats.tier("local").lease_waits == 1
    assert waits == [True]  # once, before the wait (a compile slot goes back then)


def test_compile_lease_granted_at_once_does_not_call_waiting(cache: TieredCache) -> None:
    waits: list[bool] = []
    with cache.compile_lease(KEY, waiting=lambda: waits.append(True)) as got:
        assert got is None
    assert waits == []


def test_flush_stats_persists_deltas_only(cache: TieredCache, local: LmdbStore) -> None:
    cache.get(KEY)
    cache.put(KEY, ARTIFACT)
    cache.flush_stats()
    cache.flush_stats()  # nothing new: nothing added
    persisted = local.read_stats()["local"]
    assert (persisted.misses, persisted.puts) == (1, 1)
    cache.get(KEY)
    cache.flush_stats()
    persisted = local.read_stats()["local"]
    assert (persisted.misses, persisted.puts, persisted.hits) == (1, 1, 1)


COMPILER = """
import sys, time
from pathlib import Path
from fcache.cache.artifact import Artifact
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.stats import CacheStats

cache = TieredCache.open(Settings(cache_dir=Path(sys.argv[1])), CacheStats())
key = sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()  # start together
if cache.get(key) is not None:
    print("hit")
else:
    with cache.compile_lease(key) as artifact:
        if artifact is None:
            time.sleep(0.5)  # compiling
            cache.put(key, Artifact("eager", "1", b"kernel", compile_seconds=0.5))
            print("compiled")
        else:
            print("waited", artifact.payload.decode())
"""  # stats reach the LMDB stats db through the atexit flush


def test_two_processes_compile_a_region_once(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COMPILER, str(tmp_path), KEY],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        results.append(out.strip())
    assert sorted(results)[0] == "compiled"
    assert sorted(results)[1] in ("hit", "waited kernel")
    store = LmdbStore(tmp_path, 1 << 20)
    persisted = store.read_stats()["local"]
    store.close()
    assert (persisted.puts, persisted.hits, persisted.lease_grants) == (1, 1, 1)


def test_signed_entries_verify_and_a_plant_under_another_key_is_refused(
    local: LmdbStore, stats: CacheStats
) -> None:
    signer = Signer(os.urandom(32))
    remote = DictStore()
    cache = TieredCache([local, remote], remote, stats, signer=signer)
    cache.put(KEY, ARTIFACT)
    found = cache.get(KEY)
    assert found is not None and found[0].signature is not None
    victim = "f" * 32
    remote.data[victim] = remote.data[KEY]  # a valid, signed artifact of another key
    assert cache.get(victim) is None
    assert (stats.tier("remote").unverified, stats.tier("remote").misses) == (1, 1)
    assert not local.contains(victim)  # never copied up
    assert victim in remote.data  # not ours to delete


def test_with_a_signer_unsigned_entries_are_refused_and_replaced_by_a_put(
    local: LmdbStore, stats: CacheStats
) -> None:
    local.put(KEY, encode(ARTIFACT))  # written by a process without the key
    cache = TieredCache([local], local, stats, signer=Signer(os.urandom(32)))
    assert cache.get(KEY) is None
    assert stats.tier("local").unverified == 1
    with cache.compile_lease(KEY) as ready:  # the lease hands over no unverified bytes
        assert ready is None
        cache.put(KEY, ARTIFACT)
    found = cache.get(KEY)
    assert found is not None and found[0].payload == ARTIFACT.payload


def test_a_newer_format_is_a_miss_and_stays(local: LmdbStore, stats: CacheStats) -> None:
    data = bytearray(encode(ARTIFACT))
    data[4:6] = (FORMAT_VERSION + 1).to_bytes(2, "little")
    local.put(KEY, bytes(data))
    cache = TieredCache([local], local, stats)
    assert cache.get(KEY) is None
    assert (stats.tier("local").incompatible, stats.tier("local").corrupt) == (1, 0)
    assert local.get(KEY) == bytes(data)  # left for the newer readers


def test_a_bad_signing_key_stops_open(tmp_path: Path, stats: CacheStats) -> None:
    loose = tmp_path / "key"
    loose.write_bytes(os.urandom(32))
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="FCACHE_SIGNING_KEY_FILE"):
        TieredCache.open(Settings(cache_dir=tmp_path, signing_key_file=loose), stats)
