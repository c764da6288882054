"""Static key/value caches as static addresses, for CUDA graphs.

A static cache's tensors (Transformers' `StaticCache`, any cache that says
`is_compileable`) are written in place at fixed addresses by the decode step. Transformers
marks them static addresses (`torch._dynamo.mark_static_address`) when it creates them, but
not while Dynamo traces that call, and under fcache it is traced (the prefill). Unmarked,
the decode step's graph writes into inputs with no fixed address, and CUDA graphs
(FCACHE_CUDA_GRAPHS=1) cannot replay it ("mutated inputs": the H200 ran every decode step
without one, bench/results/gpu-2026-11-29). `mark_static_caches` marks them, as
Transformers does outside a trace, before Dynamo sees a call's arguments.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from fcache import process


def mark_static_caches(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Marks the tensors of every static key/value cache among a call's arguments (a
    cache that says `is_compileable`: Transformers' StaticCache) as static addresses."""
    for value in (*args, *kwargs.values()):
        if not isinstance(value, torch.Tensor) and _is_static_cache(value):
            mark_static_cache(value)


def _is_static_cache(value: object) -> bool:
    try:
        return getattr(value, "is_compileable", False) is True
    except Exception:  # an argument's own __getattr__ may raise anything: not a cache
        return False


def _marked() -> weakref.WeakKeyDictionary[Any, bool]:
    """Caches whose tensors a walk found all marked already: their layers are made in their
    first call, and later calls only write into them, so the walk (about 50 us a decode
    step for a 4-layer cache on a CPU host) is not repeated at every token."""
    return process.shared("static_caches.marked", weakref.WeakKeyDictionary)


def mark_static_cache(cache: object) -> None:
    """Marks the tensors a static key/value cache holds (its layers' keys, values and
    lengths, nested caches' too) as static addresses, as Transformers does where it is not
    traced; those marked already are left as they are."""
    try:
        if _marked().get(cache):
            return
    except TypeError:  # unhashable, or no weak reference: walked at every call
        pass
    tensors = _tensors(cache)
    fresh = [t for t in tensors if getattr(t, "_dynamo_static_input_type", None) is None]
    for tensor in fresh:
        torch._dynamo.mark_static_address(tensor)
    if tensors and not fresh:
        with contextlib.suppress(TypeError):
            _marked()[cache] = True


def _tensors(value: object, depth: int = 0) -> list[torch.Tensor]:
    """The tensors `value` holds in its attributes, lists, tuples and dicts, to depth 4 (a
    cache, its layers, their tensors)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 4 or isinstance(value, str | bytes | int | float | bool | type(None)):
        return []
    if isinstance(value, list | tuple):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        items = getattr(value, "__dict__", {}).values()
    return [t for item in items for t in _tensors(item, depth + 1)]
