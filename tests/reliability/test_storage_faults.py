"""The rows of tests/reliability/README.md about the store: same-key storm (1), kill -9
mid-stream, mid-commit and mid-eviction (3), readers killed in read transactions (5), bit-flip
at rest (6), a full disk (10), three times the cap (11), a blob deleted behind the index
(12), map pressure from several processes (22), live backup and restore (24).

Real LMDB, real servers (127.0.0.1 port 0 and a Unix socket in the test's directory),
real processes killed with SIGKILL, a real size-limited file system (a tmpfs; skipped
where the machine does not allow mounting one). Each test checks what was acknowledged
against what is there, through `Ledger`, and reads nothing it does not verify.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import grpc
import lmdb
import pytest

from fcache.cache.artifact import Artifact, encode
from fcache.cache.lmdb import LAYOUT, LmdbStore
from fcache.cache.lmdb.env import DEFAULT_MAP_SIZE
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats
from tests.reliability.support import (
    ROOT,
    STALE_READERS,
    Ledger,
    MiB,
    fill,
    key_of,
    signed,
    small_filesystem,
    verified,
)
from tests.service.support import RawStub, StartServer, client


def _raw_counts(db: Path) -> dict[str, int]:
    """Rows per named database of a store, read with a handle of our own (read-only)."""
    env = lmdb.open(
        str(db / LAYOUT), max_dbs=8, map_size=DEFAULT_MAP_SIZE, readonly=True, lock=False
    )
    try:
        with env.begin() as txn:
            return {
                name: txn.stat(env.open_db(name.encode(), txn=txn, create=False))["entries"]
                for name in ("artifacts", "meta", "lru")
            }
    finally:
        env.close()


# -- row 1 -----------------------------------------------------------------------------

STORM = """
import os, sys
from fcache.cache.signing import Signer
from fcache.protocol import wire
from tests.reliability.support import key_of, signed
from tests.service.support import RawStub

address, key_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
signer = Signer.from_file(key_path)
go_read, go_write = os.pipe()
children = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        # The same region compiled by each writer: same payload, its own compile time.
        data = signed(signer, key_of(1), 64 << 10, seed=1, compile_seconds=1.0 + i)
        stub = RawStub(address)
        os.read(go_read, 1)  # all start together
        try:
            code = 10 + int(stub.put(stub.upload(key_of(1), data), timeout=60).stored)
        except Exception as exc:
            print(f"writer {i}: {exc}", file=sys.stderr)
            code = 1
        os._exit(code)
    children.append(pid)
os.write(go_write, b"g" * n)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
print(" ".join(map(str, codes)))
"""


def test_same_key_storm(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Row 1: 100 processes write one key at once. Every write succeeds, exactly one entry
    results (one Put stored, 99 duplicates, no conflict), and no temp files remain."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the server keeps its private sockets
    server = start_server("--signing-key-file", str(signing_key))
    done = subprocess.run(
        [sys.executable, "-c", STORM, server.unix, str(signing_key), "100"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    codes = [int(c) for c in done.stdout.split()]
    assert sorted(codes) == [10] * 99 + [11], done.stderr[-3000:]  # all succeeded, one stored
    stub = RawStub(server.tcp)
    stats = stub.stats()
    assert (stats.entries, stats.counters["puts"], stats.counters["duplicates"]) == (1, 1, 99)
    assert stats.counters["conflicts"] == 0
    data = b"".join(m.chunk for m in stub.get(key_of(1))[1:])
    verified(signer, key_of(1), data)
    stub.close()
    assert server.terminate() == 0
    assert sorted(p.name for p in (server.db / LAYOUT).iterdir()) == ["data.mdb", "lock.mdb"]
    assert list(scratch.iterdir()) == []  # the private socket directory went with it


# -- row 3 -----------------------------------------------------------------------------


def _writer(address: str, signer: Signer, ledger: Ledger, first: int, stop: threading.Event,
            size: int = 64 << 10) -> None:  # fmt: skip
    store = client(address, timeout_s=5.0)
    n = first
    while not stop.is_set():
        key = key_of(n)
        data = signed(signer, key, size, seed=n)
        try:
            store.put(key, data)
        except StoreUnavailable:
            return  # the server died: this write was never acknowledged
        ledger.ack(key, data)
        n += 1
    store.close()


@pytest.mark.parametrize("moment", ["mid-stream", "mid-commit", "mid-eviction"])
def test_kill_9_of_the_server(
    moment: str, start_server: StartServer, signing_key: Path, signer: Signer
) -> None:
    """Row 3: SIGKILL while an upload streams, while commits run, while each commit evicts.
    Every acknowledged write is there after a restart (or was evicted before a younger
    one), no entry is partial, and the restarted server serves and takes writes."""
    cap = "2M" if moment == "mid-eviction" else "1G"
    server = start_server("--signing-key-file", str(signing_key), "--max-bytes", cap)
    ledger = Ledger()
    stop = threading.Event()
    writers = 1 if moment == "mid-eviction" else 4  # one: its acks are the eviction order
    threads = [
        threading.Thread(target=_writer, args=(server.unix, signer, ledger, i * 100_000, stop))
        for i in range(writers)
    ]
    big_key = key_of(999_999_999)
    if moment == "mid-stream":
        big = signed(signer, big_key, 48 * MiB, seed=7)
        threads.append(threading.Thread(target=_upload_slowly, args=(server.tcp, big_key, big)))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(ledger.acked) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    server.kill()  # SIGKILL
    stop.set()
    for thread in threads:
        thread.join(30)
    assert len(ledger.acked) >= 40

    restarted = start_server("--signing-key-file", str(signing_key), "--max-bytes", cap,
                             db=server.db)  # fmt: skip
    reader = client(restarted.tcp, timeout_s=10.0)
    counts = _raw_counts(restarted.db)
    assert counts["artifacts"] == counts["meta"] == counts["lru"]  # nothing half-written
    stored = RawStub(restarted.tcp).stats()
    if moment == "mid-eviction":
        order = list(ledger.acked)
        present = [k for k in order if reader.get(k) is not None]
        # Least recently used first: what is left is the youngest run of acknowledgments.
        assert present == order[len(order) - len(present) :]
        assert stored.bytes <= 2 * MiB
        ledger.check(reader.get, signer, evictions=len(order) - len(present))
    else:
        ledger.check(reader.get, signer)  # all there
        got = reader.get(big_key)  # never acknowledged: absent, or whole
        assert got is None or verified(signer, big_key, got).payload
    fresh = key_of(777_777_777)  # no writer's
    reader.put(fresh, signed(signer, fresh, 1000, seed=42))  # takes writes again
    assert reader.get(fresh) is not None


def _upload_slowly(address: str, key: str, data: bytes) -> None:
    stub = RawStub(address)
    messages = stub.upload(key, data)

    def slow():  # type: ignore[no-untyped-def]
        for message in messages:
            time.sleep(0.05)
            yield message

    with contextlib.suppress(grpc.RpcError):  # killed mid-stream, as intended
        stub.put(slow(), timeout=60)
    stub.close()


# -- row 5 -----------------------------------------------------------------------------


def test_200_readers_killed_inside_read_transactions(tmp_path: Path) -> None:
    """Row 5: 200 processes SIGKILLed while reading. reader_check frees their slots (all
    200 counted) at the store's own interval (no patched one), so pages are reused and the
    file stays near the cap while writes churn the cache many times over; every
    acknowledged, unevicted entry is intact."""
    stats = CacheStats()
    store = LmdbStore(tmp_path, 4 * MiB, stats)  # open first: no first-opener table reset
    store.put(key_of(0), b"seed")
    done = subprocess.run(
        [sys.executable, "-c", STALE_READERS, str(tmp_path / LAYOUT), "200"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "killed 200", done.stderr[-2000:]
    ledger = Ledger()
    for n in range(1, 161):  # 40 MiB through a 4 MiB cache
        data = signed(None, key_of(n), 256 << 10, seed=n)
        store.put(key_of(n), data)
        ledger.ack(key_of(n), data)
        time.sleep(0.002)
    assert stats.tier("local").stale_readers == 200
    size = (tmp_path / LAYOUT / "data.mdb").stat().st_size
    assert size < 16 * MiB, f"data.mdb grew to {size} bytes"
    present, missing = ledger.check(store.get, None, evictions=stats.tier("local").evictions)
    assert present > 0 and missing > 0
    store.close()


# -- row 6 -----------------------------------------------------------------------------


def _flip_in_file(path: Path, marker: bytes) -> None:
    data = path.read_bytes()
    at = data.index(marker)
    with open(path, "r+b") as f:
        f.seek(at + 10)
        f.write(bytes([data[at + 10] ^ 0x01]))


def test_bit_flip_at_rest_locally_and_on_the_server(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path
) -> None:
    """Row 6: a flipped bit in a stored value. A miss, corrupt +1, the entry refilled by the
    next put, and the read after that a hit; on the server and in the local tier."""
    marker = b"fcache-bit-flip-marker" * 4  # where in data.mdb the payload is
    artifact = Artifact("text", "1", os.urandom(100_000) + marker, compile_seconds=1.0)
    # Local tier.
    stats = CacheStats()
    local = LmdbStore(tmp_path / "local", 64 * MiB, stats)
    cache = TieredCache([local], local, stats, signer=signer)
    cache.put(key_of(1), artifact)
    _flip_in_file(tmp_path / "local" / LAYOUT / "data.mdb", marker)
    assert cache.get(key_of(1)) is None
    assert (stats.tier("local").corrupt, stats.tier("local").misses) == (1, 1)
    cache.put(key_of(1), artifact)  # refilled (the region compiled again)
    assert cache.get(key_of(1)) is not None and stats.tier("local").hits == 1
    cache.close()
    local.close()
    # Server.
    server = start_server("--signing-key-file", str(signing_key))
    remote = client(server.tcp)
    envelope = signer.sign(key_of(2), artifact)
    remote.put(key_of(2), encode(envelope))
    _flip_in_file(server.db / LAYOUT / "data.mdb", marker)
    assert remote.get(key_of(2)) is None  # NOT_FOUND: dropped, not served
    assert RawStub(server.tcp).stats().counters["corrupt"] == 1
    remote.put(key_of(2), encode(envelope))
    verified(signer, key_of(2), remote.get(key_of(2)))  # type: ignore[arg-type]


# -- row 10 ----------------------------------------------------------------------------


def test_full_disk(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path
) -> None:
    """Row 10: the server's file system fills up. Writes there is no room for get
    RESOURCE_EXHAUSTED (nothing acknowledged is evicted to make room: issue #42), reads go
    on, writes resume once space frees, nothing is corrupt; the client's local tier on a
    full disk keeps reading and writes again later. LMDB runs with writemap off (with it,
    ENOSPC would kill the process)."""
    with small_filesystem(tmp_path / "fs", "16m") as fs:
        server = start_server("--signing-key-file", str(signing_key), "--max-bytes", "1G",
                              db=fs / "db")  # fmt: skip
        remote = client(server.tcp, timeout_s=20.0)
        ledger = Ledger()
        for n in range(6):
            data = signed(signer, key_of(n), 512 << 10, seed=n)
            remote.put(key_of(n), data)
            ledger.ack(key_of(n), data)
        ballast = fill(fs)
        refused = 0
        for n in range(6, 12):  # free pages may take some; never corrupts, never evicts
            data = signed(signer, key_of(n), 512 << 10, seed=n)
            try:
                remote.put(key_of(n), data)
                ledger.ack(key_of(n), data)
            except StoreUnavailable as exc:
                assert "RESOURCE_EXHAUSTED" in str(exc)
                refused += 1
        huge = signed(signer, key_of(100), 6 * MiB, seed=100)  # more than the file can hold
        with pytest.raises(StoreUnavailable, match="RESOURCE_EXHAUSTED"):
            remote.put(key_of(100), huge)
        stats = RawStub(server.tcp).stats()
        ledger.check(remote.get, signer, evictions=int(stats.counters["evictions"]))  # reads go on
        ballast.unlink()  # space frees
        remote.put(key_of(100), huge)  # writes resume
        assert remote.get(key_of(100)) == huge
        counts = _raw_counts(server.db)
        assert counts["artifacts"] == counts["meta"]
        assert server.terminate() == 0

        # The client's local tier on the same (again full) file system.
        stats_c = CacheStats()
        local = LmdbStore(fs / "client", 1 << 30, stats_c)
        assert local._current_handle().env.flags()["writemap"] is False
        cache = TieredCache([local], local, stats_c, signer=signer)
        art = Artifact("text", "1", os.urandom(256 << 10))
        cache.put(key_of(1), art)
        ballast = fill(fs)
        with pytest.warns(RuntimeWarning, match="local cache failed"):
            for n in range(2, 40):
                cache.put(key_of(n), Artifact("text", "1", os.urandom(256 << 10)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache.get(key_of(1)) is not None or stats_c.tier("local").evictions > 0
        ballast.unlink()
        cache._writes["local"]._retry_at = 0.0  # the back-off is over
        cache.put(key_of(99), art)
        assert cache.get(key_of(99)) is not None  # written again
        cache.close()
        local.close()


# -- row 11 ----------------------------------------------------------------------------


def test_three_times_the_cap(start_server: StartServer, signing_key: Path, signer: Signer) -> None:
    """Row 11: 12 MiB written through a 4 MiB server. Size stays at the cap, recently read
    entries survive, every eviction is counted, and meta rows go with their values."""
    server = start_server("--signing-key-file", str(signing_key), "--max-bytes", "4M")
    remote = client(server.tcp)
    ledger = Ledger()
    hot = [key_of(n) for n in range(2)]
    for n in range(48):  # 48 x 256 KiB = 12 MiB
        data = signed(signer, key_of(n), 256 << 10, seed=n)
        remote.put(key_of(n), data)
        ledger.ack(key_of(n), data)
        for key in hot[: n + 1]:
            assert remote.get(key) is not None  # read between puts: recently used
    stats = RawStub(server.tcp).stats()
    assert stats.bytes <= 4 * MiB
    assert stats.counters["evictions"] == 48 - stats.entries
    evicted = int(stats.counters["evictions"])
    _, missing = ledger.check(remote.get, signer, evictions=evicted)
    assert missing == stats.counters["evictions"] > 0
    assert all(remote.get(k) is not None for k in hot)
    counts = _raw_counts(server.db)
    assert counts["artifacts"] == counts["meta"] == counts["lru"] == stats.entries


# -- row 12 ----------------------------------------------------------------------------


def test_a_blob_deleted_behind_the_index(
    start_server: StartServer, signing_key: Path, signer: Signer
) -> None:
    """Row 12: a value row deleted behind its meta row. A miss everywhere (FindMissing,
    Get: NOT_FOUND, not an internal error), and the key fills again."""
    server = start_server("--signing-key-file", str(signing_key))
    remote = client(server.tcp)
    a, b = (signed(signer, key_of(n), 10_000, seed=n) for n in (1, 2))
    remote.put(key_of(1), a)
    remote.put(key_of(2), b)
    env = lmdb.open(str(server.db / LAYOUT), max_dbs=8, map_size=DEFAULT_MAP_SIZE)
    with env.begin(write=True) as txn:
        txn.delete(key_of(1).encode(), db=env.open_db(b"artifacts", txn=txn))
    env.close()
    raw = RawStub(server.tcp)
    assert raw.find_missing([key_of(1), key_of(2)]) == [key_of(1)]
    with pytest.raises(grpc.RpcError) as info:
        raw.get(key_of(1))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert raw.put(raw.upload(key_of(1), a)).stored  # fillable again
    assert remote.get(key_of(1)) == a and remote.get(key_of(2)) == b
    assert raw.stats().counters["errors"] == 0
    counts = _raw_counts(server.db)
    assert counts["artifacts"] == counts["meta"] == 2


# -- row 22 ----------------------------------------------------------------------------

PRESSURE = """
import os, random, sys
from fcache.cache.lmdb import LmdbStore
from fcache.cache.lmdb.env import DEFAULT_MAP_SIZE

path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
store = LmdbStore(path, 2 << 20)
assert store._current_handle().env.info()["map_size"] == DEFAULT_MAP_SIZE
acked = []
for n in range(150):
    key = f"{seed:08x}{n:024x}"
    data = rng.randbytes(rng.randrange(1, 200_000))
    store.put(key, data)
    acked.append(key)
    other = rng.choice(acked)
    got = store.get(other)
    assert got is None or len(got) > 0
store.close()
print("ok")
"""


def test_map_pressure_from_several_processes(tmp_path: Path) -> None:
    """Row 22: four processes fill and evict one small cache at once. No MDB_CORRUPTED (one
    fixed map, never resized; LMDB's single writer), the total matches the entries, and
    every row has its partners."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", PRESSURE, str(tmp_path)]
    procs = [
        subprocess.Popen([*command, str(seed)], env=env, stdout=-1, stderr=-1, text=True)
        for seed in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip() == "ok", err[-3000:]
    store = LmdbStore(tmp_path, 2 << 20)
    entries = store.entries()
    assert sum(e.size for e in entries) == store.total_bytes() <= 2 << 20
    assert all(store.get(e.key) is not None for e in entries)
    store.close()
    counts = _raw_counts(tmp_path)
    assert counts["artifacts"] == counts["meta"] == counts["lru"] == len(entries)


# -- row 24 ----------------------------------------------------------------------------


def test_live_backup_and_restore(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path
) -> None:
    """Row 24: `fcache-server backup` while writes go on, then a server on the copy. The
    copy holds every write acknowledged before the backup began, only acknowledged ones,
    each verifying."""
    server = start_server("--signing-key-file", str(signing_key))
    ledger = Ledger()
    for n in range(30):
        data = signed(signer, key_of(n), 50_000, seed=n)
        client(server.tcp).put(key_of(n), data)
        ledger.ack(key_of(n), data)
    before = set(ledger.acked)
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(server.unix, signer, ledger, 1000, stop))
    writer.start()
    time.sleep(0.2)
    done = subprocess.run(
        [sys.executable, "-m", "service.main", "backup", str(tmp_path / "copy"),
         "--db", str(server.db)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    stop.set()
    writer.join(30)
    assert done.returncode == 0, done.stderr
    assert "backed up" in done.stdout
    copy = LmdbStore(tmp_path / "copy", 1 << 30)
    keys = {e.key for e in copy.entries()}
    copy.close()
    assert before <= keys <= set(ledger.acked)
    restored = start_server("--signing-key-file", str(signing_key), db=tmp_path / "copy")
    reader = client(restored.tcp)
    for key in keys:
        assert reader.get(key) == ledger.acked[key]
        verified(signer, key, ledger.acked[key])
    again = subprocess.run(
        [sys.executable, "-m", "service.main", "backup", str(tmp_path / "copy"),
         "--db", str(server.db)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 2 and "not empty" in again.stderr
    os.kill(server.pid, signal.SIGTERM)
