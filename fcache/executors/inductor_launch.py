"""Triton kernels of a loaded Inductor wrapper, launched straight through their launcher.

A wrapper launches each kernel with `kernel.run(*args, stream=...)`, Inductor's
`CachingAutotuner.run`: at every launch it looks for a debug mode, installs Triton's
allocator, checks that autotuning and coordinate descent are done, whether to save the
cubin, whether to dump launch parameters or tensors and whether a profiler is on, and only
then calls the one launcher left. That is 3-5 us of Python per launch on an H100 host,
about a third of a launch, and a training step of a 16-layer Llama launches about 380
Triton kernels. For a kernel fcache loaded, every one of those checks has one answer
once it has run: a single config (fcache keeps only autotuning's winner), no coordinate
descent left, no cubin to save, no dump configured, launched by Inductor's static CUDA
launcher (which supports no global scratch, so Triton's allocator is never asked).

`direct(namespace)` gives a wrapper's namespace with each kernel behind a `Launch`: its
first launch goes through `CachingAutotuner.run` (which also finishes loading it); from
then on, when those answers hold, the launcher is called directly. A profiler or a debug
mode switched on later sends launches back through `CachingAutotuner.run`, so their
records stay complete. Where this torch names those switches otherwise, or a kernel does
not qualify, every launch takes Inductor's path: speed is lost, never a check.

Newer Inductor does the same itself (`CachingAutotuner._cached_launcher`, in torch 2.13
with the same conditions); its kernels are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch.autograd import profiler as _profiler

try:
    from torch.utils._debug_mode import get_active_debug_mode
except ImportError:  # no debug modes in this torch

    def get_active_debug_mode() -> None:
        return None


# Whether this torch exposes the switch `Launch.run` reads; otherwise nothing is direct.
_SWITCHES = hasattr(_profiler, "_is_profiler_enabled")


class Launch:
    """One kernel of a loaded wrapper: `run` as `CachingAutotuner.run`, without its
    per-launch checks once they are settled (see the module docstring)."""

    __slots__ = ("decided", "launcher", "tuner")

    def __init__(self, tuner: Any) -> None:
        self.tuner = tuner
        self.launcher: Callable[..., Any] | None = None
        # Whether `launcher` is final: the tuner is down to one launcher, so what `settled`
        # says of it holds from then on (a kernel that does not qualify is not asked again
        # at every launch).
        self.decided = False

    def run(self, *args: Any, stream: Any, **kwargs: Any) -> Any:
        launcher = self.launcher
        if launcher is not None and not kwargs and not _switched_on():
            return launcher(*args, stream=stream)
        result = self.tuner.run(*args, stream=stream, **kwargs)
        if not self.decided:
            self.launcher = settled(self.tuner)
            self.decided = len(getattr(self.tuner, "launchers", ())) == 1
        return result

    def __getattr__(self, name: str) -> Any:  # anything else a wrapper reads of its kernel
        return getattr(self.tuner, name)


def _switched_on() -> bool:
    """A profiler or a debug mode is on: it records launches in CachingAutotuner.run."""
    return _profiler._is_profiler_enabled or get_active_debug_mode() is not None


def settled(tuner: Any) -> Callable[..., Any] | None:
    """The launcher `tuner.run` would call with no check left to make, or None."""
    launchers = getattr(tuner, "launchers", ())
    if not _SWITCHES or len(launchers) != 1:
        return None
    (launcher,) = launchers
    meta = getattr(tuner, "inductor_meta", None) or {}
    pending_descent = meta.get("coordinate_descent_tuning", False) and not getattr(
        launcher.config, "found_by_coordesc", False
    )
    if (
        pending_descent
        or not getattr(launcher, "_is_static", False)
        or getattr(launcher, "store_cubin", True)
        or getattr(tuner, "triton_interpret", True)
        or getattr(tuner, "dump_launch_params", True)
        or getattr(tuner, "dump_launch_tensors", True)
    ):
        return None
    return launcher


def direct(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a loaded wrapper's namespace with every Triton kernel behind a `Launch`
    (none where Inductor launches directly itself)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    def wrapped(value: Any) -> Any:
        if isinstance(value, CachingAutotuner) and not hasattr(value, "_cached_launcher"):
            return Launch(value)
        return value

    return {name: wrapped(value) for name, value in namespace.items()}
