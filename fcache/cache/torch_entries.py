"""Torch's own cache entries (Inductor's and AOTAutograd's remote-cache values) as fcache
artifacts: the one format `fcache.share_torch_compile` and fcache's stored programs
(fcache.engine.programs.store) both keep in fcache's tiers.

Torch's key ("pt2:fx-graph-v1::<key>:c1") becomes an fcache key, the 32-hex xxh3-128 of
"torch:" + that key: a namespace of its own, apart from fcache's region keys (which hash
named components, never this prefix). Torch's value (JSON bytes: base64 of its pickle) is
stored opaque, as the payload of fcache's envelope, with executor "torch", torch's version,
and torch's key in `meta`. `unwrap` hands the value back only for the key it was stored
for; fcache never unpickles it itself.
"""

from __future__ import annotations

import json

import xxhash

from fcache.cache.artifact import Artifact, decode, encode
from fcache.errors import CorruptArtifact

EXECUTOR = "torch"
KEY_PREFIX = "torch:"


def fcache_key(torch_key: str) -> str:
    """The fcache key (32 lowercase hex) under which torch's entry `torch_key` is stored."""
    return xxhash.xxh3_128_hexdigest((KEY_PREFIX + torch_key).encode())


def cache_name(torch_key: str) -> str:
    """The Inductor cache a key belongs to: "fx-graph-v1" of "pt2:fx-graph-v1::abc:c1"."""
    if torch_key.startswith("pt2:") and "::" in torch_key:
        return torch_key[len("pt2:") :].split("::", 1)[0].split(":")[0] or "unknown"
    return "unknown"


def wrap(torch_key: str, value: bytes, torch_version: str) -> bytes:
    """Torch's value as an fcache envelope."""
    return encode(artifact(torch_key, value, torch_version))


def artifact(torch_key: str, value: bytes, torch_version: str) -> Artifact:
    """Torch's value as an fcache artifact (what a TieredCache puts, signing it)."""
    return Artifact(
        executor=EXECUTOR,
        executor_version=torch_version,
        payload=bytes(value),
        compile_seconds=_compile_seconds(value),
        producer={"torch": torch_version},
        meta={"torch_key": torch_key, "cache": cache_name(torch_key)},
    )


def unwrap(torch_key: str, data: bytes) -> bytes:
    """Torch's value out of an envelope; CorruptArtifact if it is not whole, or is not the
    entry for `torch_key`."""
    return value_of(torch_key, decode(data))


def value_of(torch_key: str, artifact: Artifact) -> bytes:
    """Torch's value out of a decoded artifact; CorruptArtifact if it is not the entry for
    `torch_key`."""
    if artifact.executor != EXECUTOR or artifact.meta.get("torch_key") != torch_key:
        raise CorruptArtifact(
            f"entry {fcache_key(torch_key)} holds {artifact.executor} "
            f"{artifact.meta.get('torch_key', '(no torch key)')!r}, not {torch_key!r}"
        )
    return artifact.payload


def _compile_seconds(value: bytes) -> float:
    """What a hit saves, from torch's value when it says (FX entries carry time_taken_ms)."""
    if not value.startswith(b"{"):
        return 0.0
    try:
        taken = json.loads(value).get("time_taken_ms")
    except (ValueError, AttributeError):
        return 0.0
    return float(taken) / 1000 if isinstance(taken, int | float) else 0.0
