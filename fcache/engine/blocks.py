"""Blocks: a model's repeated layers compiled one by one, traced once for all of them.

Why. Capturing a whole model (Dynamo, then AOTAutograd's joint trace and partitioner) costs
time in proportion to its depth, and at 16 layers it is most of a cold start on a GPU
(10-13 s of a Hugging Face model's 13-17 s, bench/results/gpu-h100-steady-2026-11-26): the
16 identical layers are traced 16 times before fcache can see that they are one. Compiled
block by block with one backend, the first block is traced; every other one finds the
first's stored function (fcache.engine.whole.route: the same key, since the blocks have the same
code, types and tensor shapes), checks its guards against its own parameters and runs it.
Capture no longer grows with depth (CPU, Hugging Face Llama, hidden 64: 1.6 s at 2 and at
16 layers, against 3.1 and 10.5 s for the whole model).

The price. What is not in a block is compiled module by module (embeddings, the last norm,
the output layer: each module outside the blocks that holds parameters) or runs in eager
(the code between them, a loss the model computes), nothing fuses across a module's edge,
and each compiled module's call checks its guards: a steady step is slower than the whole
model's, most where the host bounds it.
That is why `fcache.jit(model, blocks=True)` is a choice and not the default: for jobs
whose start matters more than their steady step (short runs, debugging, many restarts).

What counts as the blocks: the `nn.ModuleList` holding the most parameters among those
whose children (two or more) are all of one class and hold parameters: a transformer's
layers. A block that reads its own index or a cache (a KV cache built during training,
alternating attention kinds) has guards that differ from block to block: it is traced
again where they fail, correct but slower (pass `use_cache=False` to a Hugging Face
model when training).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fcache.errors import FcacheError


def repeated_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of repeated blocks (module docstring); FcacheError if it has none.
    A block is a module with a forward of its own: a list of containers (a ModuleList of
    ModuleLists, iterated by the model's code) is not a list of blocks."""
    best: tuple[int, str, torch.nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(child) for child in module}
        sizes = [sum(p.numel() for p in child.parameters()) for child in module]
        if len(kinds) != 1 or min(sizes) == 0 or not _has_forward(next(iter(kinds))):
            continue
        if best is None or sum(sizes) > best[0]:
            best = (sum(sizes), name, module)
    if best is None:
        raise FcacheError(
            f"fcache.jit(blocks=True): {type(model).__name__} has no nn.ModuleList of two or "
            "more modules of one class with parameters (a transformer's layers); compile "
            "it whole with fcache.jit(model)"
        )
    return best[2]


def compile_blocks(
    model: torch.nn.Module,
    blocks: torch.nn.ModuleList,
    compile_one: Callable[[torch.nn.Module], Callable[..., Any]],
) -> int:
    """Compile, in place, each of the model's repeated `blocks` (`repeated_blocks`) and
    each module outside them
    that holds parameters of its own (embeddings, the last norm, the output layer); how
    many blocks. `compile_one(module)` gives what calling the module runs from then on
    (set as its `_compiled_call_impl`, as `nn.Module.compile()` does): every module stays
    where it was, with its names, its parameters and its state_dict keys.

    The modules outside are compiled each on its own: a few ops, traced in well under a
    second, but an output layer in eager is a matmul cuBLAS runs on its slow kernels where
    the classes are not a multiple of 8 (GPT-2's 50,257), where fcache pads it
    (fcache.engine.rewrite.matmuls). A module holding the blocks (an encoder with parameters of its
    own beside its layers) stays in eager: compiled, it would trace every layer again."""
    inside = {id(m) for m in blocks.modules()}
    holding = {id(m) for m in model.modules() if any(c is blocks for c in m.modules())}
    outside = [
        module
        for module in model.modules()
        if id(module) not in inside
        and id(module) not in holding
        and _has_forward(type(module))
        and any(True for _ in module.parameters(recurse=False))
    ]
    for module in [*outside, *blocks]:
        module._compiled_call_impl = CompiledCall(compile_one(module))
    return len(blocks)


def _has_forward(kind: type) -> bool:
    """Whether modules of this class compute something when called (not a container)."""
    return getattr(kind, "forward", None) is not torch.nn.Module.forward


class CompiledCall:
    """What a module compiled in place runs when called (its `_compiled_call_impl`). A
    copy of the module (`copy.deepcopy`, an EMA of the weights, say) or a pickle of it
    gets none: the compiled call belongs to this module's parameters, and a copy that ran
    it would compute with the original's. The copy runs in eager."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _nothing, ()


def _nothing() -> None:
    return None
