"""Tensor constants of an aten graph written as ops, so that regions compute them.

AOTAutograd lifts a tensor the model builds from Python values (Falcon's `fused_qkv[...,
[-2], :]` indexes with a list, which becomes `_tensor_constant0 = tensor([-2])`) into a
`get_attr` node. Left as it is, the constant is a region *input*: Inductor sees a runtime
index where torch.compile's Inductor sees a constant, and on torch 2.13's CPU backend an
`index_put` with a negative runtime index writes out of bounds (heap corruption, the
process killed by glibc), while the same graph with the index written as `full([1], -2)`
computes eager's values. A runtime input is also what validation must invent a value for
(integer inputs are zeros), so a compiled region was never checked on the index the model
uses.

`inline_small(gm)` rewrites each `get_attr` of a small plain tensor (at most SMALL
elements) into `aten.full` (every element equal) or a `cat` of one-element `full`s,
viewed to its shape: ops that every executor and the canonical form already know, so the
constant's values become part of the region's canonical text and key. Larger constants
stay `get_attr` nodes (eager inputs of regions; fcache.frontend.graph_text stores them).
Deterministic: depends only on the graph and the constants' values.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten

# Elements a constant may have to be written as ops (a cat of that many one-element fulls
# at most): index lists and scalars, not tables.
SMALL = 16


def inline_small(gm: fx.GraphModule) -> int:
    """Rewrite, in place, each get_attr of a small tensor constant into ops that build it
    (module docstring), and drop the attributes no node reads any more; the number of
    constants rewritten."""
    rewritten: set[str] = set()
    for node in list(gm.graph.nodes):
        value = constant_of(gm, node)
        if value is None or value.numel() > SMALL or not _plain(value):
            continue
        with gm.graph.inserting_before(node):
            built = _build(gm.graph, value, node.meta.get("val"))
        built.meta.update(node.meta)
        node.replace_all_uses_with(built)
        gm.graph.erase_node(node)
        rewritten.add(str(node.target))
    if not rewritten:
        return 0
    # The attributes no node reads any more go: AOTAutogradCache (torch 2.11) serializes a
    # graph's CUDA constants under its fake mode and fails, so the program went unstored.
    still = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for target in rewritten - still:
        *path, name = target.split(".")
        owner: torch.nn.Module = gm
        for part in path:
            owner = getattr(owner, part)
        if hasattr(owner, name):
            delattr(owner, name)
    gm.recompile()
    return len(rewritten)


def constant_of(owner: torch.nn.Module, node: fx.Node) -> torch.Tensor | None:
    """The tensor a get_attr node reads from `owner`, None for any other node or value."""
    if node.op != "get_attr" or not isinstance(node.target, str):
        return None
    value = owner
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _plain(value: torch.Tensor) -> bool:
    """A dense tensor of real numbers that ops can rebuild exactly, needing no gradient."""
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and not value.requires_grad
        and not value.is_complex()
        and not value.is_quantized
        and value.device.type != "meta"
    )


def _build(graph: fx.Graph, value: torch.Tensor, traced: object) -> fx.Node:
    """Nodes that compute `value` (contiguous, on its device), each with the value later
    stages read from `meta["val"]`: a fake tensor of the traced constant's fake mode where
    it has one (partitioning and views read only its facts)."""
    options = {"dtype": value.dtype, "device": value.device, "pin_memory": False}
    mode = getattr(traced, "fake_mode", None)

    def call(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> fx.Node:
        node = graph.call_function(op, args, kwargs)
        values = fx.node.map_arg(args, lambda n: n.meta["val"])
        with mode if mode is not None else contextlib.nullcontext():  # type: ignore[attr-defined]
            node.meta["val"] = op(*values, **kwargs)
        return node

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # AOTAutograd compiles under a fake mode; this is real
        items = value.detach().cpu().flatten().tolist()
    shape = list(value.shape)
    if not items or all(_same(v, items[0]) for v in items):
        return call(aten.full.default, (shape, items[0] if items else 0), options)
    parts = [call(aten.full.default, ([1], v), options) for v in items]
    flat = call(aten.cat.default, (parts,), {})
    return call(aten.view.default, (flat, shape), {})


def _same(a: bool | int | float, b: bool | int | float) -> bool:
    """Equal as values, NaN equal to NaN and 0.0 unequal to -0.0 (a full of either would
    differ)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b and type(a) is type(b)
