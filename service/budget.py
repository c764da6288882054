"""ByteBudget: the bound on artifact bytes fcache-server holds in memory at once.

Uploads are received whole before they are verified and stored, and answers are read
whole from the store before they are sent, so each call in flight holds up to one
artifact. gRPC bounds how many calls run at once (`max_concurrent_rpcs`); this bounds
their bytes: a call reserves the size it is about to hold (an upload's declared size
before its first chunk is accepted, a stored entry's size before it is read) and gives it
back when it ends. A reservation that would take the total past the limit is refused
at once with `Overloaded` (RESOURCE_EXHAUSTED to the caller, who compiles or retries),
rather than queued: a stalled uploader must not hold others' memory hostage.

Event-loop only (no locks): reservations are taken and returned by coroutines of one loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fcache.errors import FcacheError


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
