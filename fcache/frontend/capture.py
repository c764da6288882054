"""Capture: a torch.compile backend that hands fcache aten graphs, forward and backward.

Dynamo captures Python into FX graphs (one per graph break); AOTAutograd traces each into a
forward and a backward aten graph, decomposed to Inductor's core op set so that every
executor sees the same small vocabulary. Each aten graph then goes to the function the
caller gave (`fcache.engine.session.Session.compile_graph`, through `fcache.api`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

GraphCompiler = Callable[[fx.GraphModule, Sequence[Any], str], Callable[..., Any]]
# Per Dynamo graph (its graph and example inputs), something that may wrap each compiled
# aten graph: wrapper(kind, aten graph, example inputs, compiled) -> callable, where kind is
# "forward", "backward" or "inference" (fcache.engine.cudagraphs.CudaGraphs is one).
Wrapper = Callable[[str, fx.GraphModule, Sequence[Any], Callable[..., Any]], Callable[..., Any]]
WrapperFactory = Callable[[fx.GraphModule, Sequence[Any]], Wrapper]


@functools.cache
def _decompositions() -> dict[Any, Any]:
    from torch._inductor.decomposition import select_decomp_table

    return dict(select_decomp_table())


def make_backend(
    compile_graph: GraphCompiler, wrap: WrapperFactory | None = None
) -> Callable[..., Any]:
    """A torch.compile backend that sends every aten graph to `compile_graph(gm, inputs,
    label)`, where label names the graph for progress and errors ("forward 1", ...), and
    hands the result to `wrap(dynamo graph, inputs)` when given."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    counter = itertools.count(1)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        n = next(counter)
        wrapper = wrap(gm, example_inputs) if wrap is not None else None

        def compiler(label: str) -> Callable[..., Any]:
            def compile_one(module: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
                compiled = compile_graph(module, inputs, f"{label} {n}")
                return compiled if wrapper is None else wrapper(label, module, inputs, compiled)

            return compile_one

        aot = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=_decompositions(),
            # Recomputes cheap ops in the backward instead of saving them, as Inductor does.
            partition_fn=min_cut_rematerialization_partition,
            keep_inference_input_mutations=True,
        )
        return aot(gm, example_inputs)

    return backend
