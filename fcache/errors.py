"""fcache's few typed errors.

Each carries the offending value in its message. Inside the compile path most of them
never reach the user: a region that cannot be compiled falls back to the next executor,
and a cache failure becomes a counted miss. They surface where the user made a mistake
(a bad setting, a malformed server address) or asked for something that cannot be done.
"""

from __future__ import annotations


class FcacheError(Exception):
    """Base class of every error fcache raises on purpose."""


class ConfigError(FcacheError, ValueError):
    """A setting (environment variable, flag or argument) has an invalid value."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(f"{name}={value!r} is invalid: expected {expected}")
        self.name = name
        self.value = value


class CorruptArtifact(FcacheError):
    """Bytes read from a store are not a valid artifact envelope (bad magic, size or checksum)."""


class UnsupportedRegion(FcacheError):
    """An executor cannot compile a region; the next executor in the list is tried."""


class CompileError(FcacheError):
    """An executor failed on a region it claimed to support; the region falls back."""


class CompileInterrupted(CompileError):
    """A compile that did not finish (past its deadline, its worker died, the GPU ran out of
    memory): it says nothing about the region, so unlike other compile errors it is not
    remembered as a refusal."""


class StoreUnavailable(FcacheError):
    """A cache tier cannot be reached or written (unwritable directory, full disk, no server)."""


class StoreFull(StoreUnavailable):
    """A tier cannot take a write: its disk or map is full even after evicting (ENOSPC, or
    the EIO LMDB reports for it). Reads go on; writes are tried again later."""


class NewerFormat(FcacheError):
    """An envelope written by a newer fcache (a format version this one cannot read). A
    miss, never deleted: the newer readers that share the store still use it."""


class Unverified(FcacheError):
    """An envelope whose signature is missing, made with another key, or does not match its
    contents and key. Refused and counted, never loaded (fcache.cache.signing)."""
