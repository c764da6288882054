"""Capturing real aten graphs and regions for tests, through fcache's own capture backend.
The graphs themselves run in eager: no executor is involved."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.frontend.canonicalize import CanonicalRegion, canonicalize
from fcache.frontend.capture import make_backend
from fcache.frontend.partition import partition


def capture_with(run: Callable[[Any], object], target: Any) -> list[fx.GraphModule]:
    """The aten graphs fcache's backend receives while run(compiled target) runs, in order
    (forward graphs when they are captured, backward graphs when backward runs)."""
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, inputs: Any, label: str) -> Any:
        graphs.append(gm)
        forward = gm.forward

        def call(args: list[Any]) -> Any:
            return forward(*args)

        call._boxed_call = True  # type: ignore[attr-defined]
        return call

    torch._dynamo.reset()
    try:
        run(torch.compile(target, backend=make_backend(record), dynamic=False))
    finally:
        torch._dynamo.reset()
    return graphs


def capture(fn: Callable[..., Any], *args: Any, backward: bool = True) -> list[fx.GraphModule]:
    """The aten graphs of fn(*args) (forward, then backward of a sum of its output)."""

    def run(compiled: Any) -> None:
        out = compiled(*args)
        if backward:
            out = out[0] if isinstance(out, tuple) else out
            out.float().sum().backward()

    return capture_with(run, fn)


def capture_regions(run: Callable[[Any], object], target: Any) -> list[CanonicalRegion]:
    """Every distinct canonical region of the graphs captured while run(compiled target)
    runs, in first-seen order."""
    found: dict[bytes, CanonicalRegion] = {}
    for gm in capture_with(run, target):
        for region in partition(gm.graph).regions:
            canon = canonicalize(region)
            found.setdefault(canon.text, canon)
    return list(found.values())


@functools.cache
def model_regions(family: str, dtype: torch.dtype) -> tuple[CanonicalRegion, ...]:
    """The regions of one training step of a small example model, on CPU."""
    cfg = ModelConfig(family=family, layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    model = build(cfg).to(dtype)
    tokens = sample_tokens(cfg, 2, 8)
    return tuple(capture_regions(lambda compiled: compiled(tokens).float().sum().backward(), model))


def random_inputs(region: CanonicalRegion, seed: int = 0) -> list[torch.Tensor]:
    """Inputs with the region's exact dtypes, shapes and strides, on the devices its specs
    name (cuda or cpu), filled with seeded random values."""
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for spec in region.inputs:
        device = torch.device("cuda" if spec.device_type == "cuda" else "cpu")
        if spec.dtype.is_floating_point:
            value = torch.randn(spec.shape, generator=gen)
        elif spec.dtype == torch.bool:
            value = torch.randint(0, 2, spec.shape, generator=gen).bool()
        else:
            value = torch.randint(0, 16, spec.shape, generator=gen)
        inputs.append(spec.empty(device).copy_(value))
    return inputs


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides wherever the extent is above 1 (strides of size-1 dims are free)."""
    return all(x == y for x, y, n in zip(a.stride(), b.stride(), b.shape, strict=True) if n > 1)
