"""Stitching: a partitioned graph with each region replaced by its compiled callable.

The result runs the code of an FX GraphModule that calls, in the original order, the
eager ops between regions and one callable per region. FX's code generation frees each
intermediate after its last use, so peak memory matches the graph run op by op. The boxed
calling convention (a list in, cleared on entry) lets AOTAutograd free inputs early too.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Collection, Mapping
from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen

from fcache.engine.rewrite.matmuls import pad_matmuls
from fcache.engine.rewrite.views import REGION_INPUTS, Boxed, folding, layout
from fcache.executors.base import CompiledRegion, unchecked
from fcache.executors.eager import fast_eager
from fcache.frontend.partition import Partition, Region

# What a node's meta says of its value: a FakeTensor (a traced graph), or the facts a
# stored graph keeps (fcache.frontend.graph_text).
_FACTS = ("val", "fcache_val")


def stitch(
    partition: Partition,
    compiled: Mapping[Region, CompiledRegion],
    owner: torch.nn.Module,
    returned: Collection[int] = (),
) -> Boxed:
    """The partition as one boxed callable (a list in). Regions missing from `compiled`
    run their nodes in eager; `owner` supplies the attributes that get_attr nodes read.
    Its views run folded from the second call (fcache.engine.rewrite.views). `returned`: the
    output positions the caller hands on as they are (fcache.engine.rewrite.matmuls)."""

    def module(graph: fx.Graph) -> Boxed:
        forward = fx.GraphModule(owner, graph).forward
        # FX gives every GraphModule its own class, so marking the class's function marks
        # only this graph's forward as taking AOTAutograd's boxed (list) arguments.
        forward.__func__._boxed_call = True  # type: ignore[attr-defined]
        return forward

    return folding(lambda checked: stitched_graph(partition, compiled, checked, returned), module)


def stitched_graph(
    partition: Partition,
    compiled: Mapping[Region, CompiledRegion],
    checked: bool = True,
    returned: Collection[int] = (),
) -> fx.Graph:
    """The partition as one graph: its eager nodes copied, each compiled region one call,
    casts and misaligned matmuls made fast (fcache.executors.eager, fcache.engine.rewrite.matmuls).
    Every value keeps its traced facts (`meta`), which folding views reads. Unless
    `checked`, a region whose inputs all have a traced layout runs its unchecked variant
    (fcache.executors.base.unchecked): the caller checks those layouts (REGION_INPUTS
    marks the calls)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for step in partition.steps:
        if not isinstance(step, Region):
            env[step] = graph.node_copy(step, env.__getitem__)
        elif (fn := compiled.get(step)) is None:
            for node in step.nodes:
                env[node] = graph.node_copy(node, env.__getitem__)
        else:
            inputs = [env[n] for n in step.inputs]
            if not checked and all(layout(n) is not None for n in inputs):
                fn = unchecked(fn)
            call = graph.call_function(_target(fn), (inputs,))
            call.meta[REGION_INPUTS] = True
            call.name = f"region{step.index}"
            for k, node in enumerate(step.outputs):
                env[node] = out = graph.call_function(operator.getitem, (call, k))
                out.meta.update((m, node.meta[m]) for m in _FACTS if m in node.meta)
    graph.set_codegen(_BoxedCodeGen())
    fast_eager(graph)
    pad_matmuls(graph, returned)
    return graph


def _target(fn: CompiledRegion) -> CompiledRegion:
    """`fn`, or a plain Python function around it. FX's code generation refers to a call
    target by its qualified name when that looks like torch's (a pybind method of torch._C
    does), so targets must be Python functions from outside torch; the extra frame costs
    well under a microsecond."""
    if isinstance(fn, types.FunctionType) and not (fn.__module__ or "").startswith("torch"):
        return fn

    def region(inputs: list[Any]) -> Any:
        return fn(inputs)

    return region
