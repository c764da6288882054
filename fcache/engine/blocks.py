"""Blocks: a model's repeated layers compiled one by one, traced once for all of them.

Why. Capturing a whole model (Dynamo, then AOTAutograd's joint trace and partitioner) costs
time in proportion to its depth, and at 16 layers it is most of a cold start on a GPU
(10-13 s of a Hugging Face model's 13-17 s, bench/results/gpu-h100-steady-2026-11-26): the
16 identical layers are traced 16 times before fcache can see that they are one. Compiled
block by block with one backend, the first block is traced; every other one finds the
first's stored function (fcache.engine.whole: the same key, since the blocks have the same
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

import torch

from fcache.errors import FcacheError


def repeated_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of repeated blocks (module docstring); FcacheError if it has none."""
    best: tuple[int, str, torch.nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(child) for child in module}
        sizes = [sum(p.numel() for p in child.parameters()) for child in module]
        if len(kinds) != 1 or min(sizes) == 0:
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
    model: torch.nn.Module, compile_one: Callable[[torch.nn.Module], torch.nn.Module]
) -> int:
    """Replace, in place, each of the model's repeated blocks and each module outside them
    that holds parameters of its own (embeddings, the last norm, the output layer) by
    `compile_one(module)`; how many blocks. The parameters stay the model's (a compiled
    module wraps its module). The modules outside are compiled each on its own: a few
    ops, traced in well under a second, but an output layer in eager is a matmul cuBLAS
    runs on its slow kernels where the classes are not a multiple of 8 (GPT-2's 50,257),
    where fcache pads it (fcache.engine.matmuls)."""
    blocks = repeated_blocks(model)
    inside = {id(m) for m in blocks.modules()}
    outside = [
        (parent, name, child)
        for parent in model.modules()
        if id(parent) not in inside
        for name, child in parent.named_children()
        if id(child) not in inside and any(True for _ in child.parameters(recurse=False))
    ]
    for parent, name, child in outside:
        setattr(parent, name, compile_one(child))
    for index, block in enumerate(blocks):
        blocks[index] = compile_one(block)
    return len(blocks)
