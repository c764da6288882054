"""CanonicalRegion + Target + executor -> CacheKey.

The key is xxh3-128 over a named list of components. Every fact that changes the compiled
kernel is a component: the canonical region (ops, constants, input dtypes, shapes and
strides, device type), the device's capability, the executor with its version and
toolchain (torch, triton, nvFuser, CUDA versions), the options that change generated code,
and fcache's own key format. Nothing else is: not parameter or node names, not layer
indices, device indices, paths or process ids.

Each component is logged at DEBUG and kept on the key, so `fcache explain` can say which
component made two regions miss each other (JAX's cache_key.py does the same).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import xxhash

from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target

log = logging.getLogger(__name__)

# Bump when the meaning of a key changes (what is hashed, or how).
KEY_FORMAT = "fcache-key-1"


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A region's cache key: `digest` (32 hex chars) and the components it hashes."""

    digest: str
    components: tuple[tuple[str, str], ...]

    def component(self, name: str) -> str:
        return dict(self.components)[name]


def region_digest(region: CanonicalRegion) -> str:
    return xxhash.xxh3_128_hexdigest(region.text)


def make_key(
    region: CanonicalRegion,
    target: Target,
    executor: str,
    executor_version: str,
    toolchain: Mapping[str, str],
) -> CacheKey:
    """The key of a region compiled by one executor for one target.

    `toolchain` holds the executor's version-like facts and code-changing options
    (e.g. {"torch": "2.11.0+git...", "triton": "3.6.0"}); sorted, so their order does not matter.
    """
    components: list[tuple[str, str]] = [
        ("format", KEY_FORMAT),
        ("region", region_digest(region)),
        ("target", f"{target.device_type}:{target.capability}"),
        ("executor", f"{executor}-{executor_version}"),
    ]
    components += sorted((f"toolchain.{k}", str(v)) for k, v in toolchain.items())
    hasher = xxhash.xxh3_128()
    for name, value in components:
        # Length-prefixed, so no two component lists serialize to the same bytes.
        for part in (name.encode(), value.encode()):
            hasher.update(len(part).to_bytes(4, "little"))
            hasher.update(part)
    key = CacheKey(hasher.hexdigest(), tuple(components))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("key %s: %s", key.digest, " ".join(f"{n}={v}" for n, v in components))
    return key
