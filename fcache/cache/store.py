"""The contracts between fcache's cache tiers: keys, byte stores and single-flight leases.

A store maps a key (the 32 lowercase hex characters of an xxh3-128 digest) to the bytes of
an artifact envelope (fcache.cache.artifact). Stores never look inside the bytes; the
tiered cache decodes and verifies them. The same contracts serve the local LMDB store,
the gRPC client and the server's own storage. The key pattern is the wire's
(fcache.protocol.limits), re-exported here for the stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fcache.protocol.limits import KEY_PATTERN, is_valid_key

__all__ = ["KEY_PATTERN", "ByteStore", "LeaseGrant", "Leases", "is_valid_key"]


@runtime_checkable
class ByteStore(Protocol):
    """One tier. Failure contract: a tier that cannot serve a call raises
    `fcache.errors.StoreUnavailable`, having counted it as `errors` in its own tier of the
    stats it was given (the tiered cache does not count it again, only warns and skips the
    tier). Implementations are safe to call from several threads."""

    name: str

    def get(self, key: str) -> bytes | None:
        """The bytes stored under key, or None."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store bytes under key, atomically: readers see all of them or nothing."""
        ...

    def delete(self, key: str) -> None:
        """Forget key (a corrupt entry, say). Absent keys are not an error."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The holder compiles the key's region, then puts the artifact or releases the lease.
    A grant expires on its own when its holder dies or its deadline passes."""

    key: str
    holder: str


class Leases(Protocol):
    """Single flight: of all processes that miss on one key, one compiles it."""

    def acquire(
        self, key: str, wait_s: float, waiting: Callable[[], None] | None = None
    ) -> LeaseGrant | bytes | None:
        """Either a grant (you compile), the artifact bytes that another holder has put
        meanwhile, or None when wait_s passed with neither (the caller compiles anyway).
        `waiting` is called once another holder is known to hold the key, before the
        wait for it (fcache.engine.compile.slots gives its compile slot back then)."""
        ...

    def release(self, grant: LeaseGrant) -> None:
        """Give the lease up: after a put, or when the compile failed."""
        ...
