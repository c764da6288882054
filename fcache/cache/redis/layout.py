"""How one artifact lies in Redis: key names and the entry's frame. Pure functions, no I/O.

Every key of one cache key shares the hash tag `{KEY}`, so that in a Redis Cluster they
live in one slot and a pipeline, MGET or Lua script may touch them together:

    fcache:v1:{KEY}                the entry: a 48-byte frame, then the bytes inline when
                                   they fit one chunk
    fcache:v1:{KEY}:GEN:I          chunk I of a larger entry (GEN: the put's generation)
    fcache:v1:{KEY}:lease          the compile lease: its holder's token (fcache.cache.redis.leases)

The frame (little-endian):

    offset  size  field
    0       4     magic b"FCR\\x01"
    4       4     chunks N (u32); 0: the bytes follow the frame inline
    8       8     size of the bytes (u64)
    16      16    xxh3-128 of the bytes
    32      16    generation: 16 random bytes, new for every put

A put writes the chunks under a fresh generation first and the frame last, so a reader
that finds a frame finds a whole generation, or (a chunk evicted by Redis's LRU, or
deleted by a newer put) a gap it reports as a miss, never a mixture. What is read back is
checked against the frame's size and digest before it leaves the store; the artifact
envelope inside is then decoded and verified like every other tier's by the tiered cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

PREFIX = "fcache:v1:"
MAGIC = b"FCR\x01"
_FRAME = struct.Struct("<4sIQ16s16s")
FRAME_SIZE = _FRAME.size  # 48
# Redis refuses a value over proto-max-bulk-len (512 MiB by default), and one large value
# holds its single thread while it is copied; 8 MiB chunks keep each command short.
CHUNK_BYTES = 8 << 20


class BadFrame(ValueError):
    """The bytes under an entry key are no frame of ours, or do not match it."""


class TooLarge(BadFrame):
    """A frame declaring more bytes than this reader takes (another writer's larger bound,
    or a forgery): refused unread, and left for the readers that take it."""


@dataclass(frozen=True, slots=True)
class Frame:
    chunks: int
    size: int
    digest: bytes
    generation: bytes

    def pack(self) -> bytes:
        return _FRAME.pack(MAGIC, self.chunks, self.size, self.digest, self.generation)


def entry_key(key: str) -> str:
    return f"{PREFIX}{{{key}}}"


def lease_key(key: str) -> str:
    return f"{PREFIX}{{{key}}}:lease"


def chunk_keys(key: str, frame: Frame) -> list[str]:
    base = f"{PREFIX}{{{key}}}:{frame.generation.hex()}"
    return [f"{base}:{i}" for i in range(frame.chunks)]


def frame_for(data: bytes, generation: bytes, chunk_bytes: int) -> Frame:
    """The frame of a put of `data`: inline (0 chunks) when it fits one chunk."""
    chunks = 0 if len(data) <= chunk_bytes else -(-len(data) // chunk_bytes)
    return Frame(chunks, len(data), xxhash.xxh3_128(data).digest(), generation)


def split(data: bytes, chunk_bytes: int) -> list[bytes]:
    return [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]


def parse_head(value: bytes) -> Frame:
    """The frame at the start of an entry value (its first FRAME_SIZE bytes suffice);
    BadFrame if there is none."""
    if len(value) < FRAME_SIZE:
        raise BadFrame(f"an entry of {len(value)} bytes, shorter than its frame")
    magic, chunks, size, digest, generation = _FRAME.unpack_from(value)
    if magic != MAGIC:
        raise BadFrame(f"bad magic {bytes(magic)!r}")
    return Frame(chunks, size, digest, generation)


def parse(value: bytes, max_size: int) -> tuple[Frame, bytes]:
    """(frame, inline bytes) of a whole entry value; BadFrame if it is no frame of ours, or
    it declares more than `max_size` bytes (refused before any chunk is fetched)."""
    frame = parse_head(value)
    chunks, size = frame.chunks, frame.size
    if size > max_size:
        raise TooLarge(f"the entry declares {size} bytes, over this reader's limit {max_size}")
    inline = value[FRAME_SIZE:]
    if chunks and inline:
        raise BadFrame("a chunked entry with inline bytes")
    return frame, inline


def check(frame: Frame, data: bytes) -> bytes:
    """`data` if it is what the frame describes; BadFrame otherwise."""
    if len(data) != frame.size:
        raise BadFrame(f"{len(data)} bytes where the frame says {frame.size}")
    if xxhash.xxh3_128(data).digest() != frame.digest:
        raise BadFrame("checksum mismatch")
    return data
