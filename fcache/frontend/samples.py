"""Sample inputs of a region: tensors of its exact input layouts, filled reproducibly, for
the runs that need real values (validation against eager, autotuning a compile).

Floating inputs are seeded normal values; integer inputs are zeros (a valid index into
anything); booleans are random. One exception: a max pool's window offsets (Inductor's
low-memory max pool saves the argmax as an offset inside the window) are turned into input
positions by `_low_memory_max_pool_offsets_to_indices`, and an offset of zero there is the
window's first element, in the padding for the windows along the input's edge: the pool's
backward then scatters outside its output (eager ResNet's region under bf16 autocast
corrupted the heap on torch 2.11's CPU). Those inputs get, for every window, the offset of
its first element inside the input (`_pool_offsets`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fcache.frontend.canonicalize import CanonicalRegion, Ref


def inputs_for(region: CanonicalRegion, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    """Tensors of the region's input layouts on `device`, filled reproducibly (the same
    seed, device type and torch give the same values).

    Values are drawn where they live: a generator on the CPU costs about 10 ns an element
    on one core, 0.1-0.5 s for a transformer region's inputs at batch 2 x 2048, and a
    cold start draws them twice per region (the compile's autotuning, then validation),
    partly on the path to the first step; a CUDA generator takes milliseconds."""
    # The pool options of each input that is a max pool's saved window offsets.
    pools = {
        node.args[0].index: node.args[1:6]
        for node in region.nodes
        if node.op == POOL_OFFSETS and isinstance(node.args[0], Ref) and node.args[0].kind == "in"
    }
    generators: dict[torch.device, torch.Generator] = {}
    tensors = []
    for i, spec in enumerate(region.inputs):
        where = device if spec.device_type == device.type else torch.device(spec.device_type)
        if (gen := generators.get(where)) is None:
            gen = generators[where] = torch.Generator(device=where).manual_seed(seed)
        if spec.dtype.is_floating_point or spec.dtype.is_complex:
            value = torch.randn(spec.shape, generator=gen, dtype=torch.float32, device=where)
        elif spec.dtype == torch.bool:
            value = torch.randint(0, 2, spec.shape, generator=gen, device=where).bool()
        elif i in pools:
            kernel, _, stride, padding, dilation = pools[i]
            value = _pool_offsets(spec.shape, kernel, stride, padding, dilation).to(where)
        else:
            value = torch.zeros(spec.shape, dtype=torch.int64, device=where)
        tensors.append(relaid(value.to(dtype=spec.dtype), spec.stride))
    return tensors


# Inductor's prim that turns a max pool's saved window offsets into input positions.
POOL_OFFSETS = "prims._low_memory_max_pool_offsets_to_indices.default"


def _pool_offsets(
    shape: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> torch.Tensor:
    """Window offsets of `shape` (leading dims, then one per pooled dim) that each name
    the window's first element inside the input: per pooled dim, the first step j with
    out * stride - padding + j * dilation >= 0 (torch's pools keep every window's last
    element inside the input, so that one is too), flattened in row-major order."""
    dims = len(kernel)
    flat = torch.zeros((), dtype=torch.int64)
    for d in range(dims):
        out = torch.arange(shape[len(shape) - dims + d], dtype=torch.int64)
        start = out * stride[d] - padding[d]
        step = torch.clamp((-start + dilation[d] - 1) // dilation[d], 0, kernel[d] - 1)
        view = [1] * dims
        view[d] = -1
        flat = flat * kernel[d] + step.view(view)
    return flat.expand(tuple(shape))


def relaid(tensor: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """A copy of `tensor` with these strides. A stride of 0 (an expanded dim) is kept as a
    broadcast of the first slice, since no memory holds distinct values there."""
    broadcast = [
        d for d, (s, n) in enumerate(zip(stride, tensor.shape, strict=True)) if s == 0 and n > 1
    ]
    base = tensor
    for d in broadcast:
        base = base.narrow(d, 0, 1)
    out = torch.empty_strided(base.shape, stride, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(base).expand(tensor.shape)


def probe_region(device: torch.device) -> CanonicalRegion:
    """A tiny region (two vectors scaled and added): compiling it once in a fresh process
    pays an executor's one-time costs (imports, the device's context, its compiler's own
    start-up) before real regions arrive."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fcache.frontend.canonicalize import canonicalize
    from fcache.frontend.partition import partition

    def probe(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    x, y = (torch.empty(1024, device=device) for _ in range(2))
    graph = make_fx(probe, tracing_mode="fake")(x, y)
    (region,) = partition(graph.graph).regions
    return canonicalize(region)
