"""The key of a whole stored function (fcache.engine.whole.route), computed without tracing.

What it leaves out, the stored function checks when it is loaded: Dynamo's guards (input
and parameter metadata, module attributes, grad and autocast state) and the checksums of
every source line Dynamo traced. The key only has to tell apart what those checks would
refuse, so that a process finds the one entry meant for it; it is the same in every
process and on every machine with the same versions (names, never addresses or paths).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import torch
import xxhash

from fcache.target import options_digest, torch_version

# Part of every key: bump when what is stored, or how it is keyed, changes (v2: the
# programs inside hold their inputs' roles for CUDA graphs; v3: attention with a constant
# causal mask runs as is_causal, fcache.frontend.causal; v4: the engine's modules moved into
# folders, so the classes a stored function pickles have new paths; v5: guard sources
# pickled without their computed fields, which torch 2.11 could not load back; v6: a stored
# function's results pickle as fcache.engine.whole.serializable.Bundled, and a graph-broken
# function is stored as its CompilePackage).
FORMAT = "fcache-whole-v6"


ALL: Final = "*"  # every dimension of every input tensor (JSON-able: it is part of the key)
# Dimensions (input path, dim) a key leaves out, ALL, or None (none: the exact signature).
Wildcard = frozenset[tuple[str, int]] | str | None


def call_key(
    target: Callable[..., Any],
    model: torch.nn.Module | None,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    dynamic: bool | None,
    session: Any,
    wildcard: Wildcard = None,
    marker: bool = False,
) -> str:
    """torch-style key ("pt2:fcache-whole-v5::<xxh3-128>:c1") of the function `target`
    would be for these inputs, computed without tracing. What it leaves out, the stored
    function checks on load (its guards, and the sources Dynamo traced).

    `wildcard`: the input dimensions (path, dim) whose sizes the key leaves out (ALL:
    every input tensor's), for a function compiled with those dimensions dynamic; the
    strides of a tensor with such a dimension are left out too (its guards check them).
    `marker`: the key of the record of which dimensions went dynamic (with ALL)."""
    settings = session.settings
    args = args[1 if model is not None else 0 :]
    parts = {
        "format": FORMAT,
        "python": list(sys.version_info[:2]),  # bytecode
        "torch": torch_version(),
        "function": f"{target.__module__}.{target.__qualname__}",
        "source": _digest(inspect.getsource(target)),
        "model": _module_tree(model) if model is not None else None,
        "args": [_describe(a, f"a{i}", wildcard) for i, a in enumerate(args)],
        "kwargs": {k: _describe(v, f"k:{k}", wildcard) for k, v in sorted(kwargs.items())},
        "wildcard": wildcard if wildcard is ALL or wildcard is None else sorted(wildcard),
        "marker": marker,
        "state": _global_state(),
        "dynamic": dynamic,
        "configs": {
            name: options_digest(module)
            for name, module in (
                ("dynamo", torch._dynamo.config),
                ("functorch", torch._functorch.config),
            )
        },
        "executors": list(settings.executors) if settings.executors is not None else None,
        "regions": settings.regions,
        "inductor_cuda": os.environ.get("FCACHE_INDUCTOR_CUDA", ""),
        "inductor_cpu": os.environ.get("FCACHE_INDUCTOR_CPU", ""),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return f"pt2:{FORMAT}::{xxhash.xxh3_128_hexdigest(text.encode())}:c1"


def _module_tree(model: torch.nn.Module) -> list[Any]:
    modules = [[n, _name(type(m)), m.training, _override(m)] for n, m in model.named_modules()]
    tensors = [[n, _describe(t, "")] for n, t in model.named_parameters()]
    tensors += [[n, _describe(t, "")] for n, t in model.named_buffers()]
    return [modules, tensors]


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _override(module: torch.nn.Module) -> str | None:
    """A `forward` set on the instance (not its class): its code, which the class's name
    does not tell."""
    forward = vars(module).get("forward")
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    if forward is None or _stands_for_own_forward(forward, module):
        return None
    if code is None:
        return _name(type(forward))
    return _digest(repr((code.co_code, code.co_consts, code.co_names)))


def _stands_for_own_forward(forward: object, module: torch.nn.Module) -> bool:
    """Whether `forward` is fcache's own compiled wrapper of the module's class forward,
    bound to this module (`module.forward = fcache.jit(module.forward)`): it runs what the
    class says, and a key with it is the module's own (`STANDS_FOR`)."""
    target, model = getattr(forward, STANDS_FOR, (None, None))
    return target is type(module).forward and model is module


# The attribute by which fcache's compiled wrapper names (its function, its module).
STANDS_FOR: Final = "fcache_stands_for"


def _describe(value: Any, path: str, wildcard: Wildcard = None) -> Any:
    """An input's metadata, the same in every process; TypeError for what has none.
    `path` names the input (a0, a0.1, k:labels), `wildcard` the dimensions left out."""
    if isinstance(value, torch.Tensor):
        shape: list[Any] = list(value.shape)
        stride: Any = list(value.stride())
        if path and wildcard is not None:
            left = [d for d in range(len(shape)) if wildcard is ALL or (path, d) in wildcard]
            for d in left:
                shape[d] = "*"
            if left:
                stride = ["contiguous", value.is_contiguous()]
        return [
            "tensor", shape, stride, str(value.dtype),
            value.device.type, value.requires_grad, type(value).__qualname__,
        ]  # fmt: skip
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    if isinstance(value, (list, tuple)):
        return [
            type(value).__name__,
            [_describe(v, f"{path}.{i}", wildcard) for i, v in enumerate(value)],
        ]
    if isinstance(value, dict):
        return [
            "dict",
            [[str(k), _describe(v, f"{path}.{k}", wildcard)] for k, v in value.items()],
        ]
    raise TypeError(f"an input of type {type(value).__qualname__}")


def tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """The input tensors by path, as `_describe` names them (`args` without the model)."""

    def walk(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from walk(v, f"{path}.{i}")
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, f"{path}.{k}")

    for i, a in enumerate(args):
        yield from walk(a, f"a{i}")
    for k, v in sorted(kwargs.items()):
        yield from walk(v, f"k:{k}")


def _global_state() -> dict[str, Any]:
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "autocast": [
            [d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))]
            for d in ("cpu", "cuda")
        ],
    }


def _digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode())


def call_signature(
    model: torch.nn.Module | None, args: Sequence[Any], kwargs: dict[str, Any], sizes: bool = True
) -> Any:
    """What tells one call of a function from another in microseconds: the inputs' types,
    shapes, dtypes, devices and gradient flags, grad mode and the model's training flag.
    Calls alike here are alike to `call_key` but for what only the key reads (sources,
    configs, the module tree's tensors): a declined call's signature sends its next calls
    to torch.compile's route, which checks all of that with its own guards. Any object
    that is no tensor, number, string or container counts by its type alone. `sizes`
    False: a tensor counts by its rank, not its shape (the signature of every length of a
    decode loop's calls)."""
    return (
        model.training if model is not None else None,
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        _shape_of(args[1 if model is not None else 0 :], sizes),
        _shape_of(kwargs, sizes),
    )


def _shape_of(value: Any, sizes: bool = True) -> Any:
    if isinstance(value, torch.Tensor):
        shape = value.shape if sizes else value.dim()
        return (shape, value.dtype, value.device, value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_shape_of(v, sizes) for v in value))
    if isinstance(value, dict):
        return tuple((k, _shape_of(v, sizes)) for k, v in value.items())
    return type(value)


def unkeyable(args: Sequence[Any], kwargs: dict[str, Any]) -> type | None:
    """The type of the first input `call_key` cannot describe (a Hugging Face key/value
    cache, any object that is no tensor, number, string or container), None where there
    is none; `args` without the model. What `_describe` raises for, found without
    computing a key: it depends on the inputs' types alone."""

    def walk(value: Any) -> type | None:
        if value is None or isinstance(value, (torch.Tensor, bool, int, float, str)):
            return None
        if isinstance(value, (list, tuple)):
            return next((t for t in map(walk, value) if t is not None), None)
        if isinstance(value, dict):
            return next((t for t in map(walk, value.values()) if t is not None), None)
        return type(value)

    return walk(list(args)) or walk(kwargs)
