"""Sample inputs of a region (fcache.frontend.samples): its exact layouts, the same values
for the same seed, drawn on the region's device."""

from __future__ import annotations

import pytest
import torch

from fcache.frontend.samples import inputs_for
from tests.graphs import capture_regions

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _regions(device: str) -> list:
    x = torch.randn(8, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    i = torch.tensor([1, 0, 3], device=device)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.t().tanh() * w[:, None].expand(16, 8)).sum(0) + (x[i] > 0).sum()

    return capture_regions(lambda c: c(x, w).sum().backward(), f)


@pytest.mark.parametrize("device", DEVICES)
def test_samples_have_the_regions_layouts_and_repeat_with_the_seed(device: str) -> None:
    regions = _regions(device)
    assert regions
    where = torch.device(device, 0) if device == "cuda" else torch.device(device)
    for region in regions:
        first, again, other = (inputs_for(region, where, seed=s) for s in (0, 0, 1))
        assert len(first) == len(region.inputs)
        for spec, a, b, c in zip(region.inputs, first, again, other, strict=True):
            assert (a.dtype, tuple(a.shape), a.stride()) == (
                spec.dtype, tuple(spec.shape), tuple(spec.stride),
            )  # fmt: skip
            assert a.device.type == device
            assert torch.equal(a, b)
            if a.dtype.is_floating_point and a.numel() > 1:
                assert not torch.equal(a, c)
                assert a.isfinite().all() and a.std() > 0.1
            elif not a.dtype.is_floating_point and a.dtype != torch.bool:
                assert not a.any()  # integer inputs are zeros: a valid index anywhere


def test_a_max_pools_saved_offsets_are_samples_inside_the_input() -> None:
    """Inductor's low-memory max pool saves the argmax as an offset in its window; an
    offset of zero is in the padding for the windows along the edge, and the backward
    run on it scattered outside its output (heap corruption, ResNet under bf16 autocast
    on torch 2.11's CPU). Every sample offset names a position inside the input."""
    from fcache.frontend.samples import POOL_OFFSETS

    x = torch.randn(2, 3, 9, 10, requires_grad=True)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 3, 2, 1) * 2

    regions = capture_regions(lambda c: c(x).sum().backward(), f)
    pools = [(r, n) for r in regions for n in r.nodes if n.op == POOL_OFFSETS]
    assert pools, [n.op for r in regions for n in r.nodes]
    for region, node in pools:
        offsets = inputs_for(region, torch.device("cpu"))[node.args[0].index]
        kernel, size, stride, padding, dilation = node.args[1:6]
        indices = torch.ops.prims._low_memory_max_pool_offsets_to_indices(
            offsets, kernel, size, stride, padding, dilation
        )
        assert indices.min() >= 0 and indices.max() < size[0] * size[1], indices
