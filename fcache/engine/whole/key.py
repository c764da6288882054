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
from collections.abc import Callable, Sequence
from typing import Any

import torch
import xxhash

from fcache.target import options_digest, torch_version

# Part of every key: bump when what is stored, or how it is keyed, changes (v2: the
# programs inside hold their inputs' roles for CUDA graphs; v3: attention with a constant
# causal mask runs as is_causal, fcache.frontend.causal; v4: the engine's modules moved into
# folders, so the classes a stored function pickles have new paths).
FORMAT = "fcache-whole-v4"


def call_key(
    target: Callable[..., Any],
    model: torch.nn.Module | None,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    dynamic: bool,
    session: Any,
) -> str:
    """torch-style key ("pt2:fcache-whole-v4::<xxh3-128>:c1") of the function `target`
    would be for these inputs, computed without tracing. What it leaves out, the stored
    function checks on load (its guards, and the sources Dynamo traced)."""
    settings = session.settings
    parts = {
        "format": FORMAT,
        "python": list(sys.version_info[:2]),  # bytecode
        "torch": torch_version(),
        "function": f"{target.__module__}.{target.__qualname__}",
        "source": _digest(inspect.getsource(target)),
        "model": _module_tree(model) if model is not None else None,
        "args": [_describe(a) for a in args[1 if model is not None else 0 :]],
        "kwargs": {k: _describe(v) for k, v in sorted(kwargs.items())},
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
    tensors = [[n, _describe(t)] for n, t in model.named_parameters()]
    tensors += [[n, _describe(t)] for n, t in model.named_buffers()]
    return [modules, tensors]


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _override(module: torch.nn.Module) -> str | None:
    """A `forward` set on the instance (not its class): its code, which the class's name
    does not tell."""
    forward = vars(module).get("forward")
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    if forward is None:
        return None
    if code is None:
        return _name(type(forward))
    return _digest(repr((code.co_code, code.co_consts, code.co_names)))


def _describe(value: Any) -> Any:
    """An input's metadata, the same in every process; TypeError for what has none."""
    if isinstance(value, torch.Tensor):
        return [
            "tensor", list(value.shape), list(value.stride()), str(value.dtype),
            value.device.type, value.requires_grad, type(value).__qualname__,
        ]  # fmt: skip
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_describe(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[str(k), _describe(v)] for k, v in value.items()]]
    raise TypeError(f"an input of type {type(value).__qualname__}")


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
