"""CUDA graphs for the stitched program: each forward and backward graph captured once and
replayed, as torch.compile(mode="reduce-overhead") does for Inductor's graphs.

A stitched graph calls many small things per step (eager ops between regions, one call
per region), so its steady step is often bound by the host, not the GPU. Replaying a CUDA
graph launches all of its kernels at once. This uses torch's own CUDA-graph trees (the
machinery behind "reduce-overhead" and the "cudagraphs" backend): one memory pool per
device, static inputs (parameters, buffers) read in place, other inputs copied into the
graph's buffers, inputs mutated or graphs with CPU work skipped with a logged reason.

Static inputs are torch's: for a forward, the inputs AOTAutograd's metadata marks static
(`static_input_indices`: with Dynamo inlining modules, as it does by default, parameters
and buffers are ordinary graph inputs, so counting the ones AOTAutograd lifted finds none),
for a backward the inputs before its tangents. Anything not static is copied into the
graph's own buffers at every replay: every parameter, before this was so (a copy of all
weights each forward, and a second copy of them held in the pool). The program records
the indices (`ProgramGraph.static_inputs`), so a warm process, which traces nothing,
replays with the same ones.

Opt-in (`Settings.cuda_graphs`, FCACHE_CUDA_GRAPHS=1): outputs of a replay live in the
pool until the next replay overwrites them, the contract of "reduce-overhead" too (keep
a result past the next step only as a clone), and static shapes are assumed (a new shape
is captured anew). One `CudaGraphs` per Dynamo graph (for a whole stored function, its one
graph): its forward decides for its backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

Boxed = Callable[[list[Any]], Any]


class CudaGraphs:
    """Wraps the compiled forward and backward of one Dynamo graph in CUDA graphs."""

    def __init__(self) -> None:
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool

        self._enabled = BoxedBool(True)
        self._device = BoxedDeviceIndex(None)

    def __call__(
        self,
        kind: str,
        gm: fx.GraphModule,
        inputs: Sequence[Any],
        fn: Boxed,
        static: Sequence[int],
    ) -> Boxed:
        """`fn` (the compiled `kind` graph: forward, backward or inference) in a CUDA graph,
        its inputs at `static` read in place, or `fn` itself when the graph cannot be
        captured."""
        from torch._dynamo.backends import cudagraphs as cg
        from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
        from torch._inductor.cudagraph_utils import (
            get_placeholder_info,
            log_cudagraph_skip_and_bump_counter,
        )
        from torch._inductor.utils import BoxedBool

        backward = kind == "backward"
        if backward and not self._enabled:
            return fn
        if not backward and not _on_cuda(gm):  # a CPU model: nothing to capture, nothing to say
            BoxedBool.disable(self._enabled)
            return fn
        # Mutations are judged by `_mutated`; torch's check is given every input as fixed.
        placeholders = get_placeholder_info(gm.graph)
        if skip := _mutated(gm, static) or cg.check_for_skip(gm, len(placeholders)):
            log_cudagraph_skip_and_bump_counter(f"fcache: no CUDA graph: {skip}")
            if not backward:
                BoxedBool.disable(self._enabled)
                return fn
            # The forward was captured: its tree must know the backward runs eagerly.
            manager = get_manager(self._device.value or 0, create_if_none_exists=False)
            if manager is None:
                return fn

            def run_backward(args: list[Any]) -> Any:
                manager.set_to_running_backward()
                return fn(args)

            run_backward._boxed_call = True  # type: ignore[attr-defined]
            return run_backward
        device = cg.get_device_index(gm)
        if not backward:
            self._device.set(device)
        settings = {
            "device_index": device,
            "is_backward": backward,
            "is_inference": kind == "inference",
            "stack_traces": cg.get_stack_traces(gm),
            "placeholders": placeholders,
            "mutated_input_idxs": cg.find_input_mutations(gm.graph),
        }
        replay: list[Boxed] = []

        # Made at the first call, from its inputs, as Inductor's own wrapper does: a graph
        # rebuilt from a stored function has no example inputs to make it from.
        def run(args: list[Any]) -> Any:
            if not replay:
                replay.append(cudagraphify_impl(fn, list(args), list(static), **settings))
            return replay[0](args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


def static_inputs(kind: str, gm: fx.GraphModule) -> tuple[int, ...]:
    """The inputs of the `kind` graph AOTAutograd is compiling that keep their address
    from call to call, as torch.compile's own compiler takes them (compile_fx): for a
    forward or inference graph the metadata's static inputs (parameters and buffers),
    for a backward the inputs before its tangents (what the forward saved). Called while
    AOTAutograd compiles `gm`."""
    import torch._guards
    from torch._inductor.utils import count_tangents

    if kind == "backward":
        return tuple(range(count_tangents(gm)))
    context = torch._guards.TracingContext.try_get()
    metadata = context.fw_metadata if context is not None else None
    return tuple(metadata.static_input_indices) if metadata is not None else ()


def _mutated(gm: fx.GraphModule, static: Sequence[int]) -> str | None:
    """Why `gm` cannot be replayed for a mutated input, if it cannot: an input the graph
    writes to is copied in at each replay, and the write would land in the copy. A static
    input is read in place: its writes land where they belong (torch's own check takes
    only the first inputs for static, `check_for_skip`'s count, which is then given all)."""
    from torch._dynamo import config
    from torch._dynamo.backends import cudagraphs as cg

    if config.cudagraph_backend_support_input_mutation:
        return None
    mutated = cg.find_input_mutations(gm.graph) - set(static)
    if not mutated:
        return None
    return cg.get_mutation_stack_trace(cg.get_placeholder_info(gm.graph), mutated)


def _on_cuda(gm: fx.GraphModule) -> bool:
    from torch._dynamo.backends.cudagraphs import get_device_node_mapping

    return any(d.type == "cuda" for d in get_device_node_mapping(gm))
