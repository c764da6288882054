"""Target: the facts of a device that compiled code depends on, and the versions of the
compilers that built it.

Used by keys (a kernel built for one target is not reused on another) and by executors
(whether they can compile for it). Deliberately not the device index: ranks on different
GPUs of one kind share every kernel.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    """A device kind and its capability: the CUDA compute capability ("sm_90") or the
    CPU's vector ISA ("avx512"), because kernels built for one do not run (or run slowly)
    on another."""

    device_type: str
    capability: str

    @classmethod
    def of(cls, device: torch.device) -> Target:
        return _target(device.type, device.index if device.type == "cuda" else None)


@functools.cache
def _target(device_type: str, index: int | None) -> Target:
    # Memoized: a device's capability does not change while the process runs.
    if device_type == "cuda":
        major, minor = torch.cuda.get_device_capability(index)
        return Target("cuda", f"sm_{major}{minor}")
    if device_type == "cpu":
        # ATen's own dispatch level, read without compiling anything (Inductor's ISA probe
        # runs g++ several times, which a cache hit must not pay for).
        return Target("cpu", torch.backends.cpu.get_cpu_capability().lower())
    return Target(device_type, "unknown")


def torch_version() -> str:
    """torch as keys name it: its version and git revision."""
    return f"{torch.__version__}+{torch.version.git_version[:12]}"


def triton_version() -> str:
    """Triton's version, or "none" without Triton (a CPU build of torch)."""
    try:
        import triton
    except ImportError:
        return "none"
    return str(triton.__version__)


def options_digest(config: Any, ignored: Collection[str] = ()) -> str:
    """xxh3-128 of the options in effect of one of torch's config modules (Inductor's,
    Dynamo's, ...), leaving out `ignored`; the same in every process. When they cannot be
    hashed (a factory option without uuid()), a value of its own each call: what it keys
    is compiled every time rather than shared on a guess."""
    try:
        portable = config.save_config_portable()
    except RuntimeError as exc:
        log.warning("fcache: %s cannot be hashed (%s); not caching", config.__name__, exc)
        return "unhashable-" + os.urandom(8).hex()
    settings = {k: v for k, v in portable.items() if k not in ignored}
    text = json.dumps(_canonical(settings), sort_keys=True, separators=(",", ":"))
    return xxhash.xxh3_128_hexdigest(text.encode())


def _canonical(value: object) -> object:
    """A JSON-able form of a config value, the same in every process (sets sorted)."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # An object (an instance a factory option made): its class, not its repr, which may
    # hold an address that differs in every process.
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"
