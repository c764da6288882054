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
