"""LmdbStore's newer duties: modes, first write wins, healing, backups, stale readers."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import lmdb
import pytest

from fcache.cache.lmdb import LAYOUT, LmdbStore, upkeep
from fcache.stats import CacheStats


def key(i: int) -> str:
    return f"{i:032x}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_private_by_default(tmp_path: Path) -> None:
    os.umask(0o022)
    s = LmdbStore(tmp_path / "cache", 1 << 20)
    s.put(key(1), b"x")
    s.close()
    env = tmp_path / "cache" / LAYOUT
    assert mode(tmp_path / "cache") == 0o700
    assert mode(env) == 0o700
    assert mode(env / "data.mdb") == mode(env / "lock.mdb") == 0o600


def test_an_existing_loose_layout_is_tightened(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    env = cache / LAYOUT
    s = LmdbStore(cache, 1 << 20)
    s.put(key(1), b"x")
    s.close()
    env.chmod(0o755)  # as fcache before this change left them
    (env / "data.mdb").chmod(0o644)
    s = LmdbStore(cache, 1 << 20)
    assert s.get(key(1)) == b"x"
    s.close()
    assert (mode(env), mode(env / "data.mdb")) == (0o700, 0o600)
    assert mode(cache) == 0o755  # a directory that existed is not ours to change


def test_a_group_shares_the_cache(tmp_path: Path) -> None:
    gid = os.getgid()
    s = LmdbStore(tmp_path / "shared", 1 << 20, group=gid)
    s.close()
    env = tmp_path / "shared" / LAYOUT
    assert mode(env) == 0o2770
    assert mode(env / "data.mdb") == 0o660
    assert env.stat().st_gid == gid


def test_add_is_first_write_wins_and_compare_and_swap(tmp_path: Path) -> None:
    s = LmdbStore(tmp_path, 1 << 20)
    assert s.add(key(1), b"first") is None
    assert s.add(key(1), b"second") == b"first"  # refused: the stored bytes come back
    assert s.get(key(1)) == b"first"
    assert s.add(key(1), b"third", replacing=b"wrong") == b"first"
    assert s.add(key(1), b"third", replacing=b"first") is None  # the swap
    assert s.get(key(1)) == b"third"
    assert s.total_bytes() == 5
    s.close()


def test_a_meta_row_without_its_value_is_absent_and_removed(tmp_path: Path) -> None:
    s = LmdbStore(tmp_path, 1 << 20)
    s.put(key(1), b"value")
    s.put(key(2), b"other")
    s.close()  # one environment per process: let the raw handle below have it
    env = lmdb.open(str(tmp_path / LAYOUT), max_dbs=8, map_size=1 << 40)
    with env.begin(write=True) as txn:  # the value row goes behind the meta row's back
        txn.delete(key(1).encode(), db=env.open_db(b"artifacts", txn=txn))
    env.close()
    s = LmdbStore(tmp_path, 1 << 20)
    assert not s.contains(key(1))
    assert s.size_of(key(1)) is None
    assert [e.key for e in s.entries()] == [key(2)]
    assert s.get(key(1)) is None  # and removes the orphan
    assert s.total_bytes() == len(b"other")
    assert s.add(key(1), b"again") is None  # fillable again
    assert s.get(key(1)) == b"again"
    s.close()


def test_backup_is_a_consistent_store(tmp_path: Path) -> None:
    s = LmdbStore(tmp_path / "live", 1 << 20)
    for i in range(20):
        s.put(key(i), bytes([i]) * 1000)
    target = s.backup(tmp_path / "copy")
    s.put(key(99), b"after")  # not in the copy
    assert target == tmp_path / "copy" / LAYOUT
    copy = LmdbStore(tmp_path / "copy", 1 << 20)
    assert {e.key for e in copy.entries()} == {key(i) for i in range(20)}
    assert all(copy.get(key(i)) == bytes([i]) * 1000 for i in range(20))
    assert copy.total_bytes() == 20_000
    copy.close()
    with pytest.raises(ValueError, match="not empty"):
        s.backup(tmp_path / "copy")
    s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_stale_reader_slots_are_freed_and_counted(tmp_path: Path) -> None:
    s = LmdbStore(tmp_path, 1 << 20)
    s.put(key(1), b"x")
    s.close()  # the children open the environment themselves, as other processes do
    pids = []
    for _ in range(5):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a reader killed inside its read transaction
            env = lmdb.open(str(tmp_path / LAYOUT), max_dbs=8, map_size=1 << 40)
            txn = env.begin()
            os.write(write, b"r")
            time.sleep(60)
            txn.abort()
            os._exit(0)
        os.read(read, 1)
        pids.append(pid)
    # This process opens the environment while the readers live, so it does not reset
    # the reader table as a first opener would: only reader_check can free their slots.
    stats = CacheStats()
    checker = LmdbStore(tmp_path, 1 << 20, stats)
    checker.get(key(1))  # the first check: all five alive
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    time.sleep(upkeep.READER_CHECK_S)  # the real interval, not a patched one
    checker.get(key(1))
    assert stats.tier("local").stale_readers == 5
    checker.close()
