"""CUDA graphs for the stitched program: each forward and backward graph captured once and
replayed, as torch.compile(mode="reduce-overhead") does for Inductor's graphs.

A stitched graph calls many small things per step (eager ops between regions, one call
per region), so its steady step is often bound by the host, not the GPU. Replaying a CUDA
graph launches all of its kernels at once. This uses torch's own CUDA-graph trees (the
machinery behind "reduce-overhead" and the "cudagraphs" backend): one memory pool per
device, static inputs (parameters, buffers) read in place, other inputs copied into the
graph's buffers, inputs mutated or graphs with CPU work skipped with a logged reason.

Opt-in (`Settings.cuda_graphs`, FCACHE_CUDA_GRAPHS=1): outputs of a replay live in the
pool until the next replay overwrites them, the contract of "reduce-overhead" too (keep
a result past the next step only as a clone), and static shapes are assumed (a new shape
is captured anew). One `CudaGraphs` per Dynamo graph: its forward decides for its backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

Boxed = Callable[[list[Any]], Any]


class CudaGraphs:
    """Wraps the compiled forward and backward of one Dynamo graph in CUDA graphs."""

    def __init__(self, dynamo_gm: fx.GraphModule, dynamo_inputs: Sequence[Any]) -> None:
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool

        self._dynamo_inputs = len(dynamo_inputs)
        self._enabled = BoxedBool(True)
        self._device = BoxedDeviceIndex(None)

    def __call__(self, kind: str, gm: fx.GraphModule, inputs: Sequence[Any], fn: Boxed) -> Boxed:
        """`fn` (the compiled `kind` graph: forward, backward or inference) in a CUDA graph,
        or `fn` itself when the graph cannot be captured."""
        from torch._dynamo.backends import cudagraphs as cg
        from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
        from torch._inductor.cudagraph_utils import (
            get_placeholder_info,
            log_cudagraph_skip_and_bump_counter,
        )
        from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments

        backward = kind == "backward"
        if backward and not self._enabled:
            return fn
        if not backward and not _on_cuda(gm):  # a CPU model: nothing to capture, nothing to say
            BoxedBool.disable(self._enabled)
            return fn
        if backward:
            fixed = count_tangents(gm)
        else:
            fixed = num_fw_fixed_arguments(self._dynamo_inputs, len(inputs))
        if skip := cg.check_for_skip(gm, fixed):
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
        out = cudagraphify_impl(
            fn,
            list(inputs),
            range(fixed),
            device_index=device,
            is_backward=backward,
            is_inference=kind == "inference",
            stack_traces=cg.get_stack_traces(gm),
            placeholders=get_placeholder_info(gm.graph),
            mutated_input_idxs=cg.find_input_mutations(gm.graph),
        )
        out._boxed_call = True  # type: ignore[attr-defined]
        return out  # type: ignore[no-any-return]


def _on_cuda(gm: fx.GraphModule) -> bool:
    from torch._dynamo.backends.cudagraphs import get_device_node_mapping

    return any(d.type == "cuda" for d in get_device_node_mapping(gm))
