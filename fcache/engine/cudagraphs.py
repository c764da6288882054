"""CUDA graphs for the stitched program: each forward and backward graph captured once and
replayed, as torch.compile(mode="reduce-overhead") does for Inductor's graphs.

A stitched graph calls many small things per step (eager ops between regions, one call
per region), so its steady step is often bound by the host, not the GPU. Replaying a CUDA
graph launches all of its kernels at once. This uses torch's own CUDA-graph trees (the
machinery behind "reduce-overhead" and the "cudagraphs" backend): one memory pool per
device, static inputs read in place, other inputs copied into the graph's buffers, graphs
that write to a copied input or do CPU work skipped with a logged reason.

Which inputs are which (`InputRoles`) is decided while AOTAutograd compiles the graph, as
Inductor's compiler decides it (compile_fx): a forward's static inputs are those
AOTAutograd's metadata marks static (`static_input_indices`: parameters and buffers; with
Dynamo inlining modules, its default, they are ordinary graph inputs, and counting the
inputs AOTAutograd lifted, as torch's "cudagraphs" backend does, finds none: every weight
was then copied into the pool at each replay), a backward's the inputs before its
tangents (what the forward saved); the mutated ones from the graph's ops on their own
tensors. The program records them (`ProgramGraph.input_roles`): a warm process traces
nothing, and the graph it rebuilds from text shares one fake tensor per layout, which
would make inputs of one shape look like aliases of a mutated one.

Opt-in (`Settings.cuda_graphs`, FCACHE_CUDA_GRAPHS=1): outputs of a replay live in the
pool until the next replay overwrites them, the contract of "reduce-overhead" too (keep
a result past the next step only as a clone), and static shapes are assumed (a new shape
is captured anew). One `CudaGraphs` per Dynamo graph (for a whole stored function, its one
graph): its forward decides for its backward.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

log = logging.getLogger(__name__)

Boxed = Callable[[list[Any]], Any]


@dataclass(frozen=True)
class InputRoles:
    """Inputs of one compiled graph by position: `static` keep their address from call to
    call (read in place by a replay), `mutated` are written to by the graph."""

    static: tuple[int, ...] = ()
    mutated: tuple[int, ...] = ()


def input_roles(kind: str, gm: fx.GraphModule, static: tuple[int, ...]) -> InputRoles | None:
    """The roles of the inputs of the `kind` graph AOTAutograd is compiling (forward,
    backward or inference): `fallback_roles`, with a forward's static inputs `static`
    (AOTAutograd's `static_input_indices`, which the caller reads). None where they cannot
    be told (the graph then gets `fallback_roles` when it is wrapped, and is replayed
    correctly but copies more)."""
    try:
        roles = fallback_roles(kind, gm)
    except Exception as exc:  # CUDA graphs' business only: never the compile's
        log.debug("fcache: input roles of a %s graph unknown: %s", kind, exc)
        return None
    return roles if kind == "backward" else InputRoles(static, roles.mutated)


def fallback_roles(kind: str, gm: fx.GraphModule) -> InputRoles:
    """Roles read from a graph alone: a backward's leading inputs (what the forward
    saved) static, a forward's none; mutations as the graph shows them, which for a graph
    rebuilt from text may count inputs of a mutated one's layout too (a skip then, never
    a wrong replay)."""
    from torch._dynamo.backends import cudagraphs as cg
    from torch._inductor.utils import count_tangents

    static = tuple(range(count_tangents(gm))) if kind == "backward" else ()
    return InputRoles(static, tuple(sorted(cg.find_input_mutations(gm.graph))))


class CudaGraphs:
    """Wraps the compiled forward and backward of one Dynamo graph in CUDA graphs."""

    def __init__(self) -> None:
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool

        self._enabled = BoxedBool(True)
        self._device = BoxedDeviceIndex(None)

    def __call__(self, kind: str, gm: fx.GraphModule, fn: Boxed, roles: InputRoles) -> Boxed:
        """`fn` (the compiled `kind` graph: forward, backward or inference) in a CUDA graph
        that reads `roles.static` in place, or `fn` itself when the graph cannot be
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
        placeholders = get_placeholder_info(gm.graph)
        # Mutations are judged here, from the roles; torch's check (CPU ops, devices,
        # incompatible ops) is told every input is fixed so that it judges none.
        if skip := _mutated(placeholders, roles) or cg.check_for_skip(gm, len(placeholders)):
            log_cudagraph_skip_and_bump_counter(f"fcache: no CUDA graph: {skip}")
            if not backward:
                BoxedBool.disable(self._enabled)
                return fn
            device_index = self._device

            # The forward was captured: its tree must know the backward runs eagerly. The
            # tree is made at the forward's first call, after this backward was compiled.
            def run_backward(args: list[Any]) -> Any:
                manager = get_manager(device_index.value or 0, create_if_none_exists=False)
                if manager is not None:
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
            "mutated_input_idxs": set(roles.mutated),
        }
        replay: list[Boxed] = []
        lock = threading.Lock()

        # Made at the first call, from its inputs, as Inductor's own wrapper does: a graph
        # rebuilt from a stored function has no example inputs to make it from.
        def run(args: list[Any]) -> Any:
            if not replay:
                with lock:
                    if not replay:
                        replay.append(
                            cudagraphify_impl(fn, list(args), list(roles.static), **settings)
                        )
            return replay[0](args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run


def _mutated(placeholders: Any, roles: InputRoles) -> str | None:
    """Why the graph cannot be replayed for a mutated input, if it cannot: an input the
    graph writes to is copied in at each replay, and the write would land in the copy. A
    static input is read in place: its writes land where they belong."""
    from torch._dynamo import config
    from torch._inductor.cudagraph_utils import get_mutation_stack_trace

    if config.cudagraph_backend_support_input_mutation:
        return None
    copied = set(roles.mutated) - set(roles.static)
    return get_mutation_stack_trace(placeholders, copied) if copied else None


def _on_cuda(gm: fx.GraphModule) -> bool:
    from torch._dynamo.backends.cudagraphs import get_device_node_mapping

    return any(d.type == "cuda" for d in get_device_node_mapping(gm))
