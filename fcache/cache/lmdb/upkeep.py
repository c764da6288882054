"""Keeping a store's file near its cap: stale reader slots freed within seconds, and the
file compacted when it has grown past the cap all the same (issue #42).

Why the file grows. LMDB reuses the pages a commit frees only once no reader can still
see them. A process killed inside a read transaction leaves its reader slot behind, and
with it the oldest snapshot any reader holds: until the slot is freed, every commit takes
new pages, and the file grows with every write (20 killed readers grew a 4 MiB cache to
118 MiB in 28 s when slots were freed every 30 s). LMDB never shrinks its file.

Readers (`check_readers`): the slots of dead processes are freed at a store's first
transaction, then every READER_CHECK_S seconds, and at once whenever the map's last page
has moved since the last check (the file grew: the sign that pages could not be reused).
So a killed reader costs at most the writes of a second or so, not 30 s of them.

Compaction (`maybe_compact`): after a write, when data.mdb is larger than COMPACT_OVER
times the larger of the cap and the pages in use (plus COMPACT_SLACK), the store is
copied with LMDB's compacting copy (mdb_env_copy2, MDB_CP_COMPACT) and the copy swapped
in at the same path, atomically (renameat2 RENAME_EXCHANGE). While it copies, the process
holds a write transaction on the old environment: no commit can land there, so the copy
holds every acknowledged write. In that same transaction it marks the old environment
retired, and every transaction (fcache.cache.lmdb.store) checks the mark first: a process
still on the old file moves to the copy before it reads or writes again, so no write can
land in the retired file. Readers meanwhile read the old file, which is the copy's
snapshot. Where the exchange is not available (no renameat2, a file system without
RENAME_EXCHANGE), compaction is skipped and logged once; the prompt reader checks remain.

Functions of LmdbStore's internals (handles from fcache.cache.lmdb.env), one job: the
file's size. Thread-safe as the store is.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import lmdb

from fcache.cache.lmdb.env import Environments, Handle

log = logging.getLogger(__name__)

# How often a process frees the reader slots of dead processes at the latest, seconds;
# sooner when the file grew.
READER_CHECK_S = 1.0
# Compact when the file exceeds this many times max(cap, pages in use), plus the slack
# (LMDB's meta pages, B-trees and freelist of a small store).
COMPACT_OVER = 1.25
COMPACT_SLACK = 1 << 20
# A process considers compacting a store at most this often, seconds.
COMPACT_CHECK_S = 2.0
# The row of the `info` database that marks an environment replaced by a compacted copy.
RETIRED = b"retired"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_MADV_DONTNEED = 4
# How much of a value read_unmapped copies before it drops the mapped pages again.
_UNMAP_SLICE = 8 << 20


def check_readers(
    envs: Environments, h: Handle, due_only: bool, count: Callable[[int], None]
) -> int:
    """Free the reader slots of dead processes (if due, when `due_only`); how many freed.
    Due: never checked, READER_CHECK_S passed, or the map grew since the last check."""
    now = time.monotonic()
    try:
        # Inside the fork gate, as every call into the environment: fork waits for it.
        with envs.transaction():
            last_page = int(h.env.info()["last_pgno"])
            grew = last_page > h.pages_checked
            if due_only and not grew and now - h.readers_checked < READER_CHECK_S:
                return 0
            h.readers_checked = now
            h.pages_checked = last_page
            freed = int(h.env.reader_check())
    except lmdb.Error as exc:
        log.debug("reader_check failed: %s", exc)
        return 0
    if freed:
        log.info("local cache: freed %d reader slots of dead processes", freed)
        count(freed)
    return freed


def read_unmapped(txn: lmdb.Transaction, h: Handle, k: bytes) -> memoryview | None:
    """Key's value copied out of the map a slice at a time, each slice's pages dropped from
    this process's mappings after it is copied (madvise MADV_DONTNEED on the whole file:
    the pages stay in the page cache). A process that reads large entries would otherwise
    count each entry's pages in its resident memory, besides its own copy, for as long as
    the kernel keeps them (fcache-server's memory bound, service.budget). Safe while other
    threads read: the map is read-only (no writemap), and a page touched again is simply
    mapped again. A transaction body."""
    value = txn.get(k, db=h.artifacts)  # a view into the map (buffers=True), no copy
    if value is None:
        return None
    out = bytearray(len(value))
    address, length = _map_address(h), file_size(h.path)
    libc = ctypes.CDLL(None, use_errno=True)
    length = (length + 4095) // 4096 * 4096
    for start in range(0, len(value), _UNMAP_SLICE):
        out[start : start + _UNMAP_SLICE] = value[start : start + _UNMAP_SLICE]
        if address and length:
            libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), _MADV_DONTNEED)
    return memoryview(out).toreadonly()


def _map_address(h: Handle) -> int:
    """Where this process maps the environment's data file (LMDB reports it only for fixed
    maps): the mapping of data.mdb in /proc/self/maps; 0 if there is none to be found."""
    if h.map_address:
        return h.map_address
    target = os.path.join(h.path, "data.mdb")
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    h.map_address = int(fields[0].split("-")[0], 16)
                    break
    except OSError:
        return 0
    return h.map_address


def file_size(path: str) -> int:
    """The size of the data file of the environment at `path` (0 if there is none)."""
    try:
        return os.stat(os.path.join(path, "data.mdb")).st_size
    except OSError:
        return 0


def used_bytes(txn: lmdb.Transaction, h: Handle) -> int:
    """Bytes of the pages the store's databases use (what a compacted copy needs)."""
    stats = [txn.stat(db) for db in (h.artifacts, h.meta, h.lru, h.info, h.leases, h.stats)]
    stats.append(h.env.stat())
    pages = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
    return int(pages * stats[-1]["psize"])


def limit(max_bytes: int, used: int) -> int:
    """The file size past which a store is compacted."""
    return int(COMPACT_OVER * max(max_bytes, used)) + COMPACT_SLACK


def maybe_compact(
    envs: Environments, h: Handle, max_bytes: int, dir_mode: int, file_mode: int
) -> bool:
    """Compact the store if its file is past `limit`; whether it did. Never raises: a
    compaction that fails leaves the store as it was (and is logged)."""
    now = time.monotonic()
    if now - h.compact_checked < COMPACT_CHECK_S or h.retired:
        return False
    h.compact_checked = now
    size = file_size(h.path)
    if size <= limit(max_bytes, 0):
        return False
    try:
        with envs.transaction(h), h.env.begin(write=True) as txn:
            if txn.get(RETIRED, db=h.info) is not None:
                return False  # another process compacted it meanwhile
            used = used_bytes(txn, h)
            if size <= limit(max_bytes, used):
                return False
            if not _swap_in_copy(h, dir_mode, file_mode):
                h.compact_checked = float("inf")  # not on this system: do not try again
                return False
            txn.put(RETIRED, b"1", db=h.info)
    except (lmdb.Error, OSError) as exc:
        log.warning("local cache at %s: compaction failed, going on without: %s", h.path, exc)
        return False
    log.info(
        "local cache at %s: compacted %d bytes to %d (cap %d)",
        h.path,
        size,
        file_size(h.path),
        max_bytes,
    )
    envs.retire(h)
    return True


def _swap_in_copy(h: Handle, dir_mode: int, file_mode: int) -> bool:
    """Copy the environment, compacted, and exchange the copy with it at its path. Runs
    inside the caller's write transaction, so nothing commits meanwhile. The old files
    end up in the copy's temporary directory and are removed (processes that still map
    them keep them until they move on)."""
    parent = os.path.dirname(h.path)
    scratch = tempfile.mkdtemp(prefix=f".{os.path.basename(h.path)}.compact-", dir=parent)
    swapped = False
    try:
        os.chmod(scratch, dir_mode)
        # The copy reads through a read transaction of its own: the last commit, which is
        # the state the caller's write transaction started from.
        h.env.copy(scratch, compact=True)
        data = os.path.join(scratch, "data.mdb")
        os.chmod(data, file_mode)
        if os.stat(h.path).st_gid != os.stat(scratch).st_gid:
            os.chown(data, -1, os.stat(h.path).st_gid)
            os.chown(scratch, -1, os.stat(h.path).st_gid)
        fd = os.open(data, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        swapped = _exchange(scratch, h.path)
        if swapped:
            _fsync_dir(parent)
        return swapped
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _exchange(a: str, b: str) -> bool:
    """Swap two directories atomically; False (logged) where this system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        error = "no renameat2 in this C library"
    else:
        rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if rc == 0:
            return True
        error = os.strerror(ctypes.get_errno())
    log.warning("local cache: cannot swap in a compacted copy here (%s); not compacting", error)
    return False


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
