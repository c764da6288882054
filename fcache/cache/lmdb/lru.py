"""Eviction in least-recently-used order, and the access-time notes that keep the order.

The rows this module owns (see the layout in fcache.cache.lmdb):

    meta   key -> u64 size, u64 last access (ns since the epoch), little-endian
    lru    u64 last access (big-endian, so it sorts) ‖ key -> b""   the eviction order
    info   b"total_bytes" -> u64, the sum of every stored value's size

The functions taking a transaction are transaction bodies: they run inside the caller's
write transaction (LmdbStore's), so the running total never disagrees with the entries.
`AccessNotes` is thread-safe.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Mapping

import lmdb

from fcache.cache.lmdb.env import Handle

# Reads do not write: a hit only notes the access time in memory, and the notes go to
# disk in one write transaction at most every _TOUCH_INTERVAL_S (checked on the next hit),
# with the next put, on close and at exit. Writing on every hit would serialize all
# readers of the node on LMDB's single writer lock and fsync each time (~8 ms against
# ~50 µs for the read). LRU order only needs to be roughly right at that scale, so losing
# the notes of a crashed process is fine. _TOUCH_BATCH only bounds the notes' memory.
_TOUCH_BATCH = 4096
_TOUCH_INTERVAL_S = 10.0

META = struct.Struct("<QQ")  # size, last access ns
U64 = struct.Struct("<Q")
LRU_TIME = struct.Struct(">Q")
TOTAL_BYTES = b"total_bytes"


class AccessNotes:
    """Access times noted in memory since the last write of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._touches: dict[bytes, int] = {}
        self._touches_since = 0.0

    def note(self, k: bytes) -> bool:
        """Note an access to `k` now; whether the notes are due to be written."""
        now = time.time_ns()
        with self._lock:
            if not self._touches:
                self._touches_since = time.monotonic()
            self._touches[k] = now
            return (
                len(self._touches) >= _TOUCH_BATCH
                or time.monotonic() - self._touches_since >= _TOUCH_INTERVAL_S
            )

    def take(self) -> dict[bytes, int]:
        """The notes so far, forgotten here: the caller writes them (`apply_touches`)."""
        with self._lock:
            touches, self._touches = self._touches, {}
        return touches


def has_value(txn: lmdb.Transaction, h: Handle, k: bytes) -> bool:
    """Whether key's value row exists (what makes an entry present), without reading it."""
    return bool(txn.cursor(db=h.artifacts).set_key(k))


def total(txn: lmdb.Transaction, h: Handle) -> int:
    raw = txn.get(TOTAL_BYTES, db=h.info)
    return 0 if raw is None else U64.unpack(raw)[0]


def remove(txn: lmdb.Transaction, h: Handle, k: bytes) -> int:
    """Delete key's value, meta and LRU row; the bytes freed (0 if absent)."""
    raw = txn.get(k, db=h.meta)
    txn.delete(k, db=h.artifacts)
    if raw is None:
        return 0
    size, atime = META.unpack(raw)
    txn.delete(k, db=h.meta)
    txn.delete(LRU_TIME.pack(atime) + k, db=h.lru)
    return size


def evict_lru(
    txn: lmdb.Transaction, h: Handle, total: int, limit: int, keep: bytes | None
) -> tuple[int, int]:
    """Evict oldest-accessed entries (never `keep`) until total <= limit: (evicted, total)."""
    victims = []
    for lru_key, _ in txn.cursor(db=h.lru):
        if total <= limit:
            break
        k = lru_key[LRU_TIME.size :]
        if k == keep:
            continue
        raw = txn.get(k, db=h.meta)
        total -= 0 if raw is None else META.unpack(raw)[0]
        victims.append(k)
    for k in victims:
        remove(txn, h, k)
    return len(victims), total


def apply_touches(txn: lmdb.Transaction, h: Handle, touches: Mapping[bytes, int]) -> None:
    """Move noted accesses into meta and the LRU order; entries deleted meanwhile are skipped."""
    for k, when in touches.items():
        raw = txn.get(k, db=h.meta)
        if raw is None:
            continue
        size, atime = META.unpack(raw)
        if when <= atime:
            continue
        txn.delete(LRU_TIME.pack(atime) + k, db=h.lru)
        txn.put(LRU_TIME.pack(when) + k, b"", db=h.lru)
        txn.put(k, META.pack(size, when), db=h.meta)
