"""The local on-disk tier: one LMDB environment shared by the processes of a machine.

Layout, versioned like bazel-remote's `cas.v2`: `<dir>/lmdb.v1/{data,lock}.mdb` holding
named databases

    artifacts   key -> envelope bytes (opaque here; the tiered cache verifies them)
    meta        key -> u64 size, u64 last access (ns since the epoch), little-endian
    lru         u64 last access (big-endian, so it sorts) ‖ key -> b""   the eviction order
    info        b"total_bytes" -> u64, the sum of every stored value's size
    leases      key -> JSON lease record: holder, host, pid_space, pid, start, deadline
    stats       tier name -> JSON of `Counters`, summed over every process that recorded

A layout change that old readers cannot read gets a new directory name (`LAYOUT`).

Modules, one job each: `store` (LmdbStore, the transactions), `env` (the process's open
environments and the fork gate), `lru` (eviction, access times), `leases` (single flight
among processes), `stats` (persisted counters). Only `LmdbStore`, `Entry` and `LAYOUT`
are public; the contract is LmdbStore's.
"""

from fcache.cache.lmdb.env import LAYOUT
from fcache.cache.lmdb.store import Entry, LmdbStore

__all__ = ["LAYOUT", "Entry", "LmdbStore"]
