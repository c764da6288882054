"""Stitching: a partitioned graph with each region replaced by its compiled callable.

The result is an FX GraphModule whose generated Python calls, in the original order, the
eager ops between regions and one callable per region. FX's code generation frees each
intermediate after its last use, so peak memory matches the graph run op by op. The boxed
calling convention (a list in, cleared on entry) lets AOTAutograd free inputs early too.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen

from fcache.executors.base import CompiledRegion
from fcache.executors.eager import fast_eager
from fcache.frontend.partition import Partition, Region


def stitch(
    partition: Partition,
    compiled: Mapping[Region, CompiledRegion],
    owner: torch.nn.Module,
) -> fx.GraphModule:
    """The partition as one GraphModule. Regions missing from `compiled` run their nodes
    in eager; `owner` supplies the attributes that get_attr nodes read."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for step in partition.steps:
        if not isinstance(step, Region):
            env[step] = graph.node_copy(step, env.__getitem__)
        elif (fn := compiled.get(step)) is None:
            for node in step.nodes:
                env[node] = graph.node_copy(node, env.__getitem__)
        else:
            call = graph.call_function(_as_function(fn), ([env[n] for n in step.inputs],))
            call.name = f"region{step.index}"
            for k, node in enumerate(step.outputs):
                env[node] = graph.call_function(operator.getitem, (call, k))
    graph.set_codegen(_BoxedCodeGen())
    fast_eager(graph)
    module = fx.GraphModule(owner, graph)
    return module


def _as_function(fn: CompiledRegion) -> CompiledRegion:
    """A plain Python function around `fn`. FX's code generation refers to a call target by
    its qualified name when that looks like torch's (a pybind method of torch._C does), so
    targets must be functions of ours; the extra frame costs well under a microsecond."""

    def region(inputs: list[Any]) -> Any:
        return fn(inputs)

    return region
