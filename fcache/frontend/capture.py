"""Capture: Dynamo + AOTAutograd hand fcache aten graphs, forward and backward.

Dynamo captures Python into FX graphs (one per graph break); AOTAutograd traces each into a
forward and a backward aten graph, decomposed to Inductor's core op set so that every
executor sees the same small vocabulary. `aot` is that configuration, given the three graph
compilers; `make_backend` is the plain torch.compile backend around it that hands each
aten graph to a function (tests and tools use it to look at graphs). fcache's own backend,
which also stores what it compiled for warm processes, is fcache.engine.backend.

`CAPTURE_VERSION` names this configuration: anything here or in partitioning that changes
the graphs fcache stores, or what a stored program holds, must bump it, so that stored
programs of the old one are not used (3: programs hold their inputs' roles for CUDA graphs;
4: attention with a constant causal mask runs as is_causal, fcache.frontend.causal; 5: the
engine's modules moved into folders, so the classes a stored program pickles have new paths;
6: an embedding's backward with many indices per row is kept whole, `decompositions`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

from fcache.frontend.causal import restore_is_causal

CAPTURE_VERSION = "fcache-capture-6"

GraphCompiler = Callable[[fx.GraphModule, Sequence[Any], str], Callable[..., Any]]
# An AOTAutograd graph compiler: (aten graph, example inputs) -> compiled graph.
AotCompiler = Callable[[fx.GraphModule, Sequence[Any]], Any]


@functools.cache
def decompositions() -> dict[Any, Any]:
    # Some of Inductor's decompositions read `torch._inductor.lowering` without importing
    # it (max_pool2d's, torch 2.13): a process that has not compiled with Inductor yet
    # would fail to capture a pooling model.
    import torch._inductor.lowering
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    embedding_backward = torch.ops.aten.embedding_dense_backward.default
    if embedding_backward in table:
        table[embedding_backward] = functools.partial(
            _embedding_backward, table[embedding_backward]
        )
    return table


def _embedding_backward(decompose: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An embedding's backward, decomposed unless it has many indices per row: then it stays
    `embedding_dense_backward`, which partitioning leaves out of every region for eager's
    kernel (fcache.frontend.ops.CONTENDED_INDICES says why). NotImplemented is how a
    decomposition declines: the tracer records the op itself."""
    from fcache.frontend.ops import contended_rows

    named = dict(zip(("grad_output", "indices", "num_weights"), args, strict=False)) | kwargs
    indices, rows = named.get("indices"), named.get("num_weights")
    if indices is not None and contended_rows(indices.numel(), rows):
        return NotImplemented
    return decompose(*args, **kwargs)


def aot(forward: AotCompiler, backward: AotCompiler, inference: AotCompiler) -> Any:
    """AOTAutograd as fcache captures: Inductor's decompositions and min-cut partitioner."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(
        fw_compiler=forward,
        bw_compiler=backward,
        inference_compiler=inference,
        decompositions=decompositions(),
        # Recomputes cheap ops in the backward instead of saving them, as Inductor does.
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )


def make_backend(compile_graph: GraphCompiler) -> Callable[..., Any]:
    """A torch.compile backend that sends every aten graph to `compile_graph(gm, inputs,
    label)`, where label names the graph for progress and errors ("forward 1", ...)."""
    counter = itertools.count(1)

    def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        restore_is_causal(gm)  # as fcache's own backend does
        n = next(counter)

        def compiler(label: str) -> AotCompiler:
            def compile_one(module: fx.GraphModule, inputs: Sequence[Any]) -> Any:
                return compile_graph(module, inputs, f"{label} {n}")

            return compile_one

        return aot(compiler("forward"), compiler("backward"), compiler("inference"))(
            gm, example_inputs
        )

    return backend
