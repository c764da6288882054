"""ByteBudget and CallGate: the bounds on what fcache-server holds at once.

Uploads are received whole before they are verified and stored, and answers are read
whole from the store before they are sent, so each call in flight holds up to one
artifact. gRPC bounds how many calls run at once (`max_concurrent_rpcs`); this bounds
their bytes: a call reserves the size it is about to hold (an upload's declared size
before its first chunk is accepted, a stored entry's size before it is read) and gives it
back when it ends. A reservation that would take the total past the limit is refused
at once with `Overloaded` (RESOURCE_EXHAUSTED to the caller, who compiles or retries),
rather than queued: a stalled uploader must not hold others' memory hostage.

What the bound means for memory (issue #42): an upload is received into one buffer of
its size and verified without copying its payload, an answer is read once from the store
and verified likewise, so the calls' artifacts take at most `limit` bytes. LMDB copies
the value a commit writes into pages of its own until the commit ends, and commits are
one at a time: one more value, at most max_upload_bytes. Above that, gRPC's and Python's
own buffers: `RSS_OVERHEAD` documents the constant the server's resident memory stays
within, over its size at rest (tests/reliability/test_server_bounds.py measures it).

CallGate bounds calls in flight (`max_concurrent_rpcs`) in two pools: the short calls
(Get, Put, FindMissing, Stats, Report) and the Lease streams. A Lease stream lives as long
as a compile, for its holder and every waiter; were they counted with the short calls,
N waiters could take every slot and refuse the holder's own Put, which is what ends
their wait. Each pool refuses past its bound at once with `Overloaded`, counted
`overloaded` like the byte budget's refusals (gRPC's own limit would refuse uncounted).

Event-loop only (no locks): reservations are taken and returned by coroutines of one loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fcache.errors import FcacheError

# Resident memory over the server's size at rest, beyond max_inflight_bytes plus one
# max_upload_bytes (LMDB's copy of the value being committed): gRPC's stream buffers
# (answers it has taken but not yet sent when a call's reservation ends), the slice of the
# store's file being copied out (fcache.cache.lmdb.upkeep.read_unmapped), Python's
# allocator. Measured on a 2-core CPU VM with 8 x 60 MiB Puts, then Gets, at once, 256 MiB
# in flight and 64 MiB uploads (tests/reliability/test_bounds.py): 338-522 MiB over the
# base, the most with the whole suite running beside it; before issue #42, 718 MiB.
RSS_OVERHEAD = 256 << 20


class Overloaded(FcacheError):
    """The server is at its bound of bytes (or calls) in flight; try again later."""


class ByteBudget:
    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"limit={limit} must be > 0")
        self.limit = limit
        self.in_use = 0

    @contextmanager
    def reserve(self, size: int, what: str) -> Iterator[None]:
        """Hold `size` bytes for the block; Overloaded if they do not fit now."""
        if self.in_use + size > self.limit:
            raise Overloaded(
                f"{what}: {size} bytes would exceed the {self.limit} bytes this server holds "
                f"in flight ({self.in_use} in use); try again later"
            )
        self.in_use += size
        try:
            yield
        finally:
            self.in_use -= size


class CallGate:
    """Calls in flight, at most `limit` short calls and `limit` Lease streams."""

    SHORT = "short"
    LEASE = "lease"

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"limit={limit} must be > 0")
        self.limit = limit
        self.in_flight = {self.SHORT: 0, self.LEASE: 0}

    @contextmanager
    def enter(self, pool: str, what: str) -> Iterator[None]:
        """Count one call of `pool` for the block; Overloaded if the pool is full."""
        if self.in_flight[pool] >= self.limit:
            raise Overloaded(
                f"{what}: {self.limit} {pool} calls in flight already (--max-concurrent-rpcs); "
                "try again later"
            )
        self.in_flight[pool] += 1
        try:
            yield
        finally:
            self.in_flight[pool] -= 1
