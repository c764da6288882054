"""Target: the facts of a device that compiled code depends on, and the versions of the
compilers that built it.

Used by keys (a kernel built for one target is not reused on another) and by executors
(whether they can compile for it). Deliberately not the device index: ranks on different
GPUs of one kind share every kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


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
