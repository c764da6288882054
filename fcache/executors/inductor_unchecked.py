"""The lean variant of a loaded Inductor wrapper's `call` (fcache.executors.base.unchecked):
without its size and stride asserts and its device guard (inductor_source.unchecked_source),
its kernels launched directly (inductor_launch). A stitched graph runs it from its second
call, once it has checked its regions' inputs itself (fcache.engine.rewrite.views)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fcache.executors.inductor_launch import direct
from fcache.executors.inductor_source import DROPPED_NAMES, unchecked_source


def unchecked_call(module: Any, source: str) -> Callable[[list[torch.Tensor]], Any] | None:
    """The wrapper's `call` without its size and stride asserts and its device guard
    (inductor_source.unchecked_source), compiled in the namespace of the module `source`
    was loaded as (its kernels launched directly: fcache.executors.inductor_launch): the
    same verified code, less the asserts; it enters the guard only where the current
    device is not the region's. None where there is no such variant."""
    variant = unchecked_source(source)
    if variant is None:
        return None
    try:
        code = compile(
            variant.text, getattr(module, "__file__", None) or "<fcache-wrapper>", "exec"
        )
    except SyntaxError:  # not the form the rewrite knows: no variant
        return None
    namespace: dict[str, Any] = {}
    # The artifact's own code, verified before it loaded, with its kernels launched
    # without Inductor's per-launch checks once those are settled (inductor_launch).
    exec(code, direct(vars(module)), namespace)
    lean = namespace["call"]
    # The same function less its asserts, or none: the same names and locals (a bound
    # method's `self` aside), so a cut or misread body gives no variant. Compared with the
    # wrapper's own `call`, beneath any wrapping of it (a profiler's timer, say).
    original = getattr(inspect.unwrap(getattr(module, "call", None)), "__code__", None)
    names, local = set(lean.__code__.co_names), set(lean.__code__.co_varnames)
    if original is None or (
        not names <= set(original.co_names)
        or not set(original.co_names) - names <= DROPPED_NAMES
        or local != set(original.co_varnames) - {"self"}
    ):
        return None
    if variant.device is None:
        return lean
    return _on_device(lean, module.call, variant.device)


def _on_device(
    lean: Callable[[list[torch.Tensor]], Any],
    guarded: Callable[[list[torch.Tensor]], Any],
    index: int,
) -> Callable[[list[torch.Tensor]], Any]:
    """`lean` (a wrapper's call without its device guard) where cuda:`index` is the
    current device, as it almost always is (one call into torch, well under a
    microsecond); elsewhere `guarded`, the wrapper's own call, guard included."""

    def on_device(args: list[torch.Tensor]) -> Any:
        if _current_device() == index:
            return lean(args)
        return guarded(args)

    on_device.__wrapped__ = lean  # type: ignore[attr-defined]
    return on_device


# The calling thread's current CUDA device; -1 in a torch built without CUDA.
_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", lambda: -1)
