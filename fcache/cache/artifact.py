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
    36      H     header: UTF-8 JSON object, keys sorted, no spaces
                    executor, executor_version  who produced the payload
                    producer                    versions of what built it (torch, ...)
                    compile_seconds             what a hit saves
                    key                         [[name, value], ...]: the components the
                                                cache key hashes (`fcache explain`)
                    region                      the canonical region's text, for people
                    restride                    [[output, [strides]], ...]: outputs the
                                                executor lays out otherwise than eager, and
                                                eager's strides (fcache.engine.compile.validate)
                    meta                        executor-specific strings
                    signature                   only in signed entries: {"alg":
                                                "hmac-sha256", "key_id": 16 hex characters,
                                                "mac": 64 hex characters}
    36+H    N     payload: executor-specific bytes

The signature (fcache.cache.signing) is an HMAC-SHA256 with the producers' signing key
over `signed_message(key, artifact)`:

    b"fcache-signature-v1\\x00"
    key                      the cache key, 32 ASCII bytes: an entry moved to another
                             key no longer verifies
    u16 FORMAT_VERSION       little-endian
    u32 len, executor        UTF-8, length little-endian
    u32 len, executor_version
    sha256(payload)          32 bytes
    sha256(header')          32 bytes; header' is the header above without "signature",
                             serialized the same way, so every other field is covered too

The signature lives in the header, a field readers before it ignore, so signing did not
change the format version: older fcache versions still read signed entries. The checksum
covers the signature like every other byte.

`decode` checks magic, version, lengths and checksum before anything else reads the
bytes, so a torn write, a flipped bit or a truncated download is a `CorruptArtifact`,
never a wrong kernel. A format version above FORMAT_VERSION is `NewerFormat`, not
corrupt: the caller treats it as a miss and leaves it for the newer readers. The checksum
catches accidents only; what stops a writer without the key is the signature, which the
readers that hold the key check after `decode` (fcache.cache.signing.Signer.verify).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import xxhash

from fcache.errors import CorruptArtifact, NewerFormat

MAGIC = b"FCA\x01"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<4sHHIQ16s")
PREAMBLE_SIZE = _PREAMBLE.size  # 36
SIGNED_DOMAIN = b"fcache-signature-v1\x00"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class Signature:
    """Who vouches for an envelope: the MAC and the id of the key that made it."""

    key_id: str
    mac: str
    alg: str = "hmac-sha256"


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
    # Set by fcache.cache.signing.Signer.sign; None for an unsigned entry.
    signature: Signature | None = None

    @property
    def refused(self) -> str | None:
        """Why this executor cannot have the key's region (a fcache.stats.FALLBACK_REASONS
        key), if this entry is a refusal rather than code (see `refusal`)."""
        return self.meta.get(REFUSED)


REFUSED = "refused"


def refusal(executor: str, executor_version: str, reason: str) -> Artifact:
    """An entry that says the executor failed on the key's region for a reason that will
    not change (its result did not validate, its compiler raised). Stored under the key
    like an artifact and verified like one, it lets every later process skip straight to
    the next executor instead of compiling and failing again. No payload: nothing to run."""
    return Artifact(executor, executor_version, b"", meta={REFUSED: reason})


def _fields(artifact: Artifact) -> dict[str, Any]:
    return {
        "executor": artifact.executor,
        "executor_version": artifact.executor_version,
        "compile_seconds": round(float(artifact.compile_seconds), 6),
        "producer": dict(artifact.producer),
        "key": [list(pair) for pair in artifact.key],
        "region": artifact.region,
        "restride": [[index, list(stride)] for index, stride in artifact.restride],
        "meta": dict(artifact.meta),
    }


def _json(fields: Mapping[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def signed_message(key: str, artifact: Artifact) -> bytes:
    """What a signature covers (the layout is in the module docstring): the key, the format
    version, the executor's identity, and digests of the payload and of every other header
    field. Computed from the artifact, so signer and verifier agree on it exactly."""
    parts = [SIGNED_DOMAIN, key.encode("ascii"), _U16.pack(FORMAT_VERSION)]
    for text in (artifact.executor, artifact.executor_version):
        raw = text.encode()
        parts += [_U32.pack(len(raw)), raw]
    parts.append(hashlib.sha256(artifact.payload).digest())
    parts.append(hashlib.sha256(_json(_fields(artifact))).digest())
    return b"".join(parts)


def encode(artifact: Artifact) -> bytes:
    fields = _fields(artifact)
    if artifact.signature is not None:
        sig = artifact.signature
        fields["signature"] = {"alg": sig.alg, "key_id": sig.key_id, "mac": sig.mac}
    header = _json(fields)
    digest = xxhash.xxh3_128(header + artifact.payload).digest()
    preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header), len(artifact.payload), digest)
    return b"".join((preamble, header, artifact.payload))


def format_version(data: bytes | memoryview) -> int | None:
    """The envelope format version of `data`, from its preamble; None if it has none."""
    if len(data) < PREAMBLE_SIZE or bytes(data[:4]) != MAGIC:
        return None
    return int(_U16.unpack_from(data, 4)[0])


def newer_than(stored: bytes | memoryview, incoming: bytes | memoryview) -> bool:
    """Whether `stored` is an envelope of a newer format than `incoming`: an older fcache
    must not replace it (its readers would lose the entry to one they cannot read)."""
    mine, theirs = format_version(incoming), format_version(stored)
    return theirs is not None and (mine is None or theirs > mine)


def decode(data: bytes | memoryview) -> Artifact:
    """Bytes -> Artifact; raises CorruptArtifact for anything but a whole, intact envelope,
    NewerFormat for the envelope of a newer fcache. Does not check the signature."""
    return _decode(data, copy=True)


def inspect(data: bytes | memoryview) -> Artifact:
    """As `decode`, but the payload is a read-only view of `data`, not a copy: for checking
    an envelope and its signature without holding it twice (fcache-server). The view
    lives as long as `data`; never hand such an artifact to an executor."""
    return _decode(data, copy=False)


def _decode(data: bytes | memoryview, copy: bool) -> Artifact:
    view = memoryview(data)
    if len(view) < PREAMBLE_SIZE:
        raise CorruptArtifact(f"artifact is {len(view)} bytes, shorter than its preamble")
    magic, version, _, hlen, plen, digest = _PREAMBLE.unpack_from(view)
    if magic != MAGIC:
        raise CorruptArtifact(f"bad magic {bytes(magic)!r}")
    if version > FORMAT_VERSION:
        raise NewerFormat(f"envelope version {version}, this fcache reads {FORMAT_VERSION}")
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
            payload=bytes(body[hlen:]) if copy else body[hlen:].toreadonly(),  # type: ignore[arg-type]
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
            signature=_signature(header.get("signature")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptArtifact(f"unreadable header: {exc}") from None


def _signature(raw: object) -> Signature | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"signature is a {type(raw).__name__}")
    return Signature(key_id=str(raw["key_id"]), mac=str(raw["mac"]), alg=str(raw["alg"]))
