"""The artifact envelope: a compiled region as bytes, and back.

Every tier (memory aside), the wire and the server store exactly these bytes. No pickle:
a fixed binary preamble, a JSON header and the executor's opaque payload.

    offset  size  field
    0       4     magic b"FCA\\x01"
    4       2     envelope format version (u16, little-endian) = FORMAT_VERSION
    6       2     reserved, 0
    8       4     header length H (u32)
    12      8     payload length N (u64)
    20      16    xxh3-128 of bytes [36, 36 + H + N), big-endian digest
    36      H     header: UTF-8 JSON object, keys sorted
                    executor, executor_version  who produced the payload
                    producer                    versions of what built it (torch, ...)
                    compile_seconds             what a hit saves
                    key                         [[name, value], ...]: the components the
                                                cache key hashes (`fcache explain`)
                    region                      the canonical region's text, for people
                    restride                    [[output, [strides]], ...]: outputs the
                                                executor lays out otherwise than eager, and
                                                eager's strides (fcache.engine.validate)
                    meta                        executor-specific strings
    36+H    N     payload: executor-specific bytes

`decode` checks magic, version, lengths and checksum before anything else reads the
bytes, so a torn write, a flipped bit or a truncated download is a `CorruptArtifact`,
never a wrong kernel.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import xxhash

from fcache.errors import CorruptArtifact

MAGIC = b"FCA\x01"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<4sHHIQ16s")
PREAMBLE_SIZE = _PREAMBLE.size  # 36


@dataclass(frozen=True, slots=True)
class Artifact:
    """A compiled region as an executor produced it. Immutable."""

    executor: str
    executor_version: str
    payload: bytes
    compile_seconds: float = 0.0
    producer: Mapping[str, str] = field(default_factory=dict)
    # The key's named components and the canonical region it was compiled from: what a
    # person (or `fcache explain`) needs to tell why two regions did not share a kernel.
    key: tuple[tuple[str, str], ...] = ()
    region: str = ""
    # Outputs to copy into eager's strides after each call: (output index, strides).
    restride: tuple[tuple[int, tuple[int, ...]], ...] = ()
    meta: Mapping[str, str] = field(default_factory=dict)


def encode(artifact: Artifact) -> bytes:
    header = json.dumps(
        {
            "executor": artifact.executor,
            "executor_version": artifact.executor_version,
            "compile_seconds": round(float(artifact.compile_seconds), 6),
            "producer": dict(artifact.producer),
            "key": [list(pair) for pair in artifact.key],
            "region": artifact.region,
            "restride": [[index, list(stride)] for index, stride in artifact.restride],
            "meta": dict(artifact.meta),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    digest = xxhash.xxh3_128(header + artifact.payload).digest()
    preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header), len(artifact.payload), digest)
    return b"".join((preamble, header, artifact.payload))


def decode(data: bytes | memoryview) -> Artifact:
    """Bytes -> Artifact; raises CorruptArtifact for anything but a whole, intact envelope."""
    view = memoryview(data)
    if len(view) < PREAMBLE_SIZE:
        raise CorruptArtifact(f"artifact is {len(view)} bytes, shorter than its preamble")
    magic, version, _, hlen, plen, digest = _PREAMBLE.unpack_from(view)
    if magic != MAGIC:
        raise CorruptArtifact(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise CorruptArtifact(f"envelope version {version}, this fcache reads {FORMAT_VERSION}")
    if PREAMBLE_SIZE + hlen + plen != len(view):
        raise CorruptArtifact(
            f"artifact is {len(view)} bytes, its preamble says {PREAMBLE_SIZE + hlen + plen}"
        )
    body = view[PREAMBLE_SIZE:]
    if xxhash.xxh3_128(body).digest() != digest:
        raise CorruptArtifact("checksum mismatch")
    try:
        header = json.loads(bytes(body[:hlen]))
        return Artifact(
            executor=str(header["executor"]),
            executor_version=str(header["executor_version"]),
            payload=bytes(body[hlen:]),
            compile_seconds=float(header["compile_seconds"]),
            producer={str(k): str(v) for k, v in header["producer"].items()},
            # Absent from entries written before these fields had their own place.
            key=tuple((str(n), str(v)) for n, v in header.get("key", ())),
            region=str(header.get("region", "")),
            restride=tuple(
                (int(index), tuple(int(x) for x in stride))
                for index, stride in header.get("restride", ())
            ),
            meta={str(k): str(v) for k, v in header["meta"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptArtifact(f"unreadable header: {exc}") from None
