"""Sample inputs of a region: tensors of its exact input layouts, filled reproducibly, for
the runs that need real values (validation against eager, autotuning a compile).

Floating inputs are seeded normal values; integer inputs are zeros (a valid index into
anything); booleans are random.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fcache.frontend.canonicalize import CanonicalRegion


def inputs_for(region: CanonicalRegion, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    """Tensors of the region's input layouts on `device`, filled reproducibly (the same
    seed, device type and torch give the same values).

    Values are drawn where they live: a generator on the CPU costs about 10 ns an element
    on one core, 0.1-0.5 s for a transformer region's inputs at batch 2 x 2048, and a
    cold start draws them twice per region (the compile's autotuning, then validation),
    partly on the path to the first step; a CUDA generator takes milliseconds."""
    generators: dict[torch.device, torch.Generator] = {}
    tensors = []
    for spec in region.inputs:
        where = device if spec.device_type == device.type else torch.device(spec.device_type)
        if (gen := generators.get(where)) is None:
            gen = generators[where] = torch.Generator(device=where).manual_seed(seed)
        if spec.dtype.is_floating_point or spec.dtype.is_complex:
            value = torch.randn(spec.shape, generator=gen, dtype=torch.float32, device=where)
        elif spec.dtype == torch.bool:
            value = torch.randint(0, 2, spec.shape, generator=gen, device=where).bool()
        else:
            value = torch.zeros(spec.shape, dtype=torch.int64, device=where)
        tensors.append(relaid(value.to(dtype=spec.dtype), spec.stride))
    return tensors


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
