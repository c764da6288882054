"""LmdbStore on a real LMDB in tmp_path, shared with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fcache.cache.artifact import decode
from fcache.cache.lmdb import LAYOUT, LmdbStore
from fcache.cache.store import ByteStore, LeaseGrant
from fcache.errors import StoreFull, StoreUnavailable
from fcache.stats import CacheStats, Counters

ROOT = Path(__file__).resolve().parents[3]


def key(i: int) -> str:
    return f"{i:032x}"


@pytest.fixture
def stats() -> CacheStats:
    return CacheStats()


@pytest.fixture
def store(tmp_path: Path, stats: CacheStats) -> Iterator[LmdbStore]:
    s = LmdbStore(tmp_path, 1 << 20, stats)
    yield s
    s.close()


def python(code: str, *args: object) -> subprocess.Popen[str]:
    """A fresh interpreter (no state inherited) running `code` with args in sys.argv[1:]."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


# --- bytes ------------------------------------------------------------------------------


def test_is_a_byte_store(store: LmdbStore) -> None:
    assert isinstance(store, ByteStore)
    assert store.name == "local"


def test_put_get_delete(store: LmdbStore) -> None:
    assert store.get(key(1)) is None
    store.put(key(1), b"one")
    assert store.get(key(1)) == b"one"
    assert store.contains(key(1))
    store.put(key(1), b"uno")
    assert store.get(key(1)) == b"uno"
    store.delete(key(1))
    assert store.get(key(1)) is None
    assert not store.contains(key(1))
    store.delete(key(1))  # absent: not an error


def test_layout_is_versioned(store: LmdbStore, tmp_path: Path) -> None:
    store.put(key(1), b"x")
    assert (tmp_path / LAYOUT / "data.mdb").is_file()


@pytest.mark.parametrize("bad", ["", "ABCDEF" * 6, "0" * 31, "0" * 33, "../" + "0" * 29])
def test_invalid_keys_are_refused(store: LmdbStore, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid cache key"):
        store.get(bad)
    with pytest.raises(ValueError, match="invalid cache key"):
        store.put(bad, b"x")


def test_total_bytes_follows_puts_overwrites_and_deletes(store: LmdbStore) -> None:
    store.put(key(1), b"a" * 100)
    store.put(key(2), b"b" * 50)
    store.put(key(1), b"c" * 30)  # overwrite: 100 -> 30
    assert store.total_bytes() == 80
    store.delete(key(2))
    assert store.total_bytes() == 30
    assert [(e.key, e.size) for e in store.entries()] == [(key(1), 30)]


def test_eviction_follows_last_access_not_insertion(tmp_path: Path, stats: CacheStats) -> None:
    store = LmdbStore(tmp_path, 300, stats)
    for i in (1, 2, 3):
        store.put(key(i), bytes([i]) * 100)
    assert store.get(key(1)) is not None  # 1 is now more recent than 2 and 3
    store.put(key(4), b"d" * 100)
    assert {e.key for e in store.entries()} == {key(1), key(3), key(4)}
    assert store.total_bytes() == 300
    assert stats.tier("local").evictions == 1
    # gc: evict down to one entry; the most recently used survives.
    assert store.evict_to(100) == 2
    assert [e.key for e in store.entries()] == [key(4)]
    assert stats.tier("local").evictions == 3
    store.close()


def test_value_larger_than_the_bound_is_not_stored(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, 100)
    store.put(key(1), b"k" * 60)
    store.put(key(2), b"x" * 101)
    assert store.get(key(2)) is None
    assert store.get(key(1)) == b"k" * 60  # nothing evicted for it
    store.close()


def test_access_times_reach_disk_on_flush(store: LmdbStore) -> None:
    store.put(key(1), b"x")
    before = store.entries()[0].last_access
    time.sleep(0.01)
    store.get(key(1))
    assert store.entries()[0].last_access == before  # batched, not written per hit
    store.flush()
    assert store.entries()[0].last_access > before


def test_persists_across_reopen(tmp_path: Path) -> None:
    first = LmdbStore(tmp_path, 1 << 20)
    first.put(key(1), b"kept")
    first.record({"local": Counters(hits=2)})
    first.close()
    again = LmdbStore(tmp_path, 1 << 20)
    assert again.get(key(1)) == b"kept"
    assert again.total_bytes() == 4
    assert again.read_stats()["local"].hits == 2
    again.close()


def test_two_stores_on_one_directory_share_the_environment(tmp_path: Path) -> None:
    # LMDB forbids opening an environment twice in a process; the store must cope.
    a = LmdbStore(tmp_path, 1 << 20)
    b = LmdbStore(tmp_path / "." / "", 1 << 20)
    a.put(key(1), b"shared")
    a.close()
    assert b.get(key(1)) == b"shared"  # closing one did not close the other
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.get(key(1))
    b.close()  # idempotent


def test_stats_accumulate_across_records(store: LmdbStore) -> None:
    store.record({"local": Counters(hits=1, bytes_read=10), "memory": Counters()})
    store.record({"local": Counters(hits=2, compile_seconds_saved=1.5)})
    persisted = store.read_stats()
    assert set(persisted) == {"local"}  # an all-zero delta writes nothing
    assert (persisted["local"].hits, persisted["local"].bytes_read) == (3, 10)
    assert persisted["local"].compile_seconds_saved == 1.5
    store.clear_stats()
    assert store.read_stats() == {}


# --- failures ---------------------------------------------------------------------------


def test_unusable_directory_raises_store_unavailable(tmp_path: Path, stats: CacheStats) -> None:
    # A regular file where a directory is needed: unwritable even for root.
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot open"):
        LmdbStore(blocker / "cache", 1 << 20, stats)
    assert stats.tier("local").errors == 1


def test_a_full_map_refuses_writes_and_evicts_nothing(tmp_path: Path, stats: CacheStats) -> None:
    # Issue #42: no acknowledged entry is evicted to make room; the write is refused.
    store = LmdbStore(tmp_path, 1 << 30, stats, map_size=1 << 20)
    acknowledged = []
    refused = 0
    for i in range(40):  # 4 MB through a 1 MiB map
        try:
            store.put(key(i), bytes([i]) * 100_000)
        except StoreFull:
            refused += 1
            continue
        acknowledged.append(i)
    assert refused > 0 and acknowledged
    assert stats.tier("local").evictions == 0
    assert all(store.get(key(i)) == bytes([i]) * 100_000 for i in acknowledged)
    assert store.total_bytes() == sum(e.size for e in store.entries()) < 1 << 20
    store.close()


def test_full_map_that_eviction_cannot_cure_raises(tmp_path: Path, stats: CacheStats) -> None:
    store = LmdbStore(tmp_path, 1 << 30, stats, map_size=1 << 20)
    store.put(key(1), b"small")
    with pytest.raises(StoreUnavailable):
        store.put(key(2), b"x" * (2 << 20))
    assert stats.tier("local").errors == 1
    assert store.get(key(2)) is None
    store.close()


# --- processes --------------------------------------------------------------------------

WRITER = """
import os, random, sys
from pathlib import Path
from fcache.cache.artifact import Artifact, decode, encode
from fcache.cache.lmdb import LmdbStore

store = LmdbStore(Path(sys.argv[1]), int(sys.argv[2]))
rng = random.Random(int(sys.argv[3]))
keys = [f"{i:032x}" for i in range(12)]
reads = 0
for _ in range(200):
    key = rng.choice(keys)
    if rng.random() < 0.5:
        payload = os.urandom(rng.randrange(1, 4000))
        store.put(key, encode(Artifact("eager", "1", payload)))
    elif (data := store.get(key)) is not None:
        decode(data)  # raises CorruptArtifact on a torn or mixed value
        reads += 1
store.close()
print(reads)
"""


def test_two_processes_share_keys_without_corruption(tmp_path: Path) -> None:
    bound = 20_000  # below what 12 keys of ~2 kB need: evictions run concurrently too
    procs = [python(WRITER, tmp_path, bound, seed) for seed in (1, 2)]
    reads = [int(finish(p)) for p in procs]
    assert all(n > 0 for n in reads)
    store = LmdbStore(tmp_path, bound)
    entries = store.entries()
    assert entries
    for entry in entries:
        data = store.get(entry.key)
        assert data is not None and len(data) == entry.size
        decode(data)
    assert store.total_bytes() == sum(e.size for e in entries) <= bound
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_reopens_and_shares_the_data(store: LmdbStore) -> None:
    store.put(key(1), b"parent")
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 3
        try:
            code = 0 if store.get(key(1)) == b"parent" else 1
            store.put(key(2), b"child")
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get(key(2)) == b"child"


# --- leases -----------------------------------------------------------------------------

WAITER = """
import sys, time
from pathlib import Path
from fcache.cache.lmdb import LmdbStore
from fcache.stats import CacheStats

stats = CacheStats()
store = LmdbStore(Path(sys.argv[1]), 1 << 20, stats)
print("ready", flush=True)
start = time.monotonic()
got = store.acquire(sys.argv[2], 20.0)
assert isinstance(got, bytes), got
print(got.decode(), time.monotonic() - start, stats.tier("local").lease_waits)
"""

HOLDER = """
import sys, time
from pathlib import Path
from fcache.cache.lmdb import LmdbStore

store = LmdbStore(Path(sys.argv[1]), 1 << 20)
grant = store.acquire(sys.argv[2], 60.0)
print(type(grant).__name__, grant.holder, flush=True)
time.sleep(60)
"""


def test_first_acquirer_is_granted_and_counted(store: LmdbStore, stats: CacheStats) -> None:
    grant = store.acquire(key(1), 5.0)
    assert grant == LeaseGrant(key(1), grant.holder)
    assert stats.tier("local").lease_grants == 1
    store.release(grant)


def test_stored_artifact_is_returned_instead_of_a_grant(store: LmdbStore) -> None:
    store.put(key(1), b"done")
    assert store.acquire(key(1), 5.0) == b"done"


def test_second_process_waits_and_gets_the_bytes(store: LmdbStore) -> None:
    grant = store.acquire(key(1), 30.0)
    assert isinstance(grant, LeaseGrant)
    waiter = python(WAITER, store.path, key(1))
    assert waiter.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # the waiter polls meanwhile
    store.put(key(1), b"compiled")
    store.release(grant)
    value, waited_s, waits = finish(waiter).split()
    assert value == "compiled"
    assert float(waited_s) >= 0.4
    assert int(waits) == 1


def test_lease_of_a_killed_holder_is_taken_over(store: LmdbStore, stats: CacheStats) -> None:
    holder = python(HOLDER, store.path, key(1))
    kind, holder_id = holder.stdout.readline().split()
    assert kind == "LeaseGrant"
    assert store.acquire(key(1), 0.2) is None  # alive: we wait, then give up
    assert stats.tier("local").lease_waits == 1
    holder.kill()
    holder.wait()
    start = time.monotonic()
    grant = store.acquire(key(1), 10.0)
    assert isinstance(grant, LeaseGrant) and grant.holder != holder_id
    assert time.monotonic() - start < 1.0  # noticed the death, did not sit out the deadline


def test_lease_past_its_deadline_is_taken_over_and_release_is_ours_only(
    store: LmdbStore,
) -> None:
    first = store.acquire(key(1), 0.2)  # the grant lasts 0.2 s
    assert isinstance(first, LeaseGrant)
    start = time.monotonic()
    second = store.acquire(key(1), 5.0)
    assert isinstance(second, LeaseGrant) and second.holder != first.holder
    assert time.monotonic() - start >= 0.15
    store.release(first)  # stale: must not free the successor's lease
    assert store.acquire(key(1), 0.1) is None
    store.release(second)
    assert isinstance(store.acquire(key(1), 0.1), LeaseGrant)


def test_release_without_put_hands_the_lease_on(store: LmdbStore) -> None:
    grant = store.acquire(key(1), 30.0)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(store.acquire(key(1), 10.0)))
    waiter.start()
    time.sleep(0.2)
    store.release(grant)  # the compile failed: someone else must try
    waiter.join(5)
    assert len(got) == 1 and isinstance(got[0], LeaseGrant)
    assert got[0].holder != grant.holder


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_reused_pid_is_not_mistaken_for_the_holder() -> None:
    # The only way to get a reused pid on purpose is to claim one: our own pid, with a
    # start time that is not ours, stands for a new process that inherited a dead
    # holder's pid.
    from fcache.cache.lmdb.leases import process_is, process_start

    me, started = os.getpid(), process_start(os.getpid())
    assert started is not None
    assert process_is(me, started)
    assert not process_is(me, started + 1)
