"""Sample inputs of a region (fcache.frontend.samples): its exact layouts, the same values
for the same seed, drawn on the region's device; an integer input used only as an index
spread over the range it indexes, any other integer input zeros."""

from __future__ import annotations

import pytest
import torch

from fcache.engine.compile.validate import validate
from fcache.executors.eager import eager_module
from fcache.frontend.canonicalize import CanonicalRegion, TensorSpec
from fcache.frontend.samples import inputs_for
from tests.graphs import capture_regions

CPU = torch.device("cpu")

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
                # the only integer input is `i`, which indexes x's 8 rows
                assert a.min() >= 0 and a.max() < 8, a


def test_a_cpu_input_of_a_region_on_another_device_stays_on_the_cpu() -> None:
    """Tracing, compiling and sampling place each input alike: on the region's device if
    it is of that type, else where it was (a static cache's CPU length in a CUDA region).
    `meta` stands in for the GPU here."""
    region = CanonicalRegion(
        inputs=(
            TensorSpec(torch.float32, (2, 3), (3, 1), "meta"),
            TensorSpec(torch.int64, (), (), "cpu"),
        ),
        nodes=(),
        outputs=(),
        text=b"",
    )
    meta = torch.device("meta")
    assert [s.device_on(meta) for s in region.inputs] == [meta, CPU]
    assert [t.device for t in region.example_inputs(meta)] == [meta, CPU]
    assert [t.device for t in region.example_inputs(CPU)] == [meta, CPU]


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


def _only_region(run, target) -> CanonicalRegion:  # type: ignore[no-untyped-def]
    regions = [r for r in capture_regions(run, target) if any(
        not s.dtype.is_floating_point and s.dtype != torch.bool for s in r.inputs)]  # fmt: skip
    assert len(regions) == 1, regions
    return regions[0]


def _integer_inputs(region: CanonicalRegion, seed: int = 0) -> list[torch.Tensor]:
    inputs = inputs_for(region, CPU, seed=seed)
    return [t for t in inputs if not t.dtype.is_floating_point and t.dtype != torch.bool]


def test_an_index_is_drawn_from_the_range_it_indexes() -> None:
    table, idx = torch.randn(50, 16), torch.randint(0, 50, (64,))
    region = _only_region(lambda c: c(table, idx), lambda t, i: t[i] * 2)
    (sample,) = _integer_inputs(region)
    assert sample.min() >= 0 and sample.max() < 50
    assert sample.unique().numel() > 20  # spread, not one row


def test_a_kernel_that_ignores_its_index_fails_validation() -> None:
    """With every index zero (the old samples), a kernel that always reads row 0 gave
    eager's values and was stored."""
    table, idx = torch.randn(50, 16), torch.randint(0, 50, (64,))
    region = _only_region(lambda c: c(table, idx), lambda t, i: t[i] * 2)
    module = eager_module(region, CPU)

    def row_zero(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(module(*[t if t.is_floating_point() else torch.zeros_like(t) for t in inputs]))

    verdict = validate(region, row_zero, CPU)
    assert not verdict.ok and "output 0" in verdict.reason, verdict
    assert validate(region, lambda inputs: list(module(*inputs)), CPU).ok


def test_an_integer_that_feeds_arithmetic_stays_zero() -> None:
    """An index computed from the input (here +1) could leave the range: zeros are safe."""
    table, idx = torch.randn(50, 16), torch.randint(0, 49, (64,))
    region = _only_region(lambda c: c(table, idx), lambda t, i: t[i + 1] * 2)
    (sample,) = _integer_inputs(region)
    assert not sample.any()


def test_an_accumulating_scatter_spreads_its_updates() -> None:
    """An embedding's backward adds each row's gradients; all indices zero sent every
    update to one row (Swin's position bias: 4096 bfloat16 atomic adds into one element,
    6-16% off eager on an H200, so correct regions were refused)."""
    weight = torch.randn(40, 8, requires_grad=True)
    ids = torch.randint(0, 40, (4, 32))
    regions = capture_regions(
        lambda c: c(weight, ids).sum().backward(),
        lambda w, i: torch.nn.functional.embedding(i, w).tanh(),
    )
    scatters = [r for r in regions if any("index_put" in n.op or "embedding_dense" in n.op
                                          for n in r.nodes)]  # fmt: skip
    assert scatters, [[n.op for n in r.nodes] for r in regions]
    for region in scatters:
        (sample,) = _integer_inputs(region)
        assert sample.min() >= 0 and sample.max() < 40
        assert sample.unique().numel() > 20


def test_a_write_without_accumulation_gets_distinct_indices() -> None:
    """Two writes to one place race (eager's order against the kernel's): where the
    indices fit, every one is different."""
    x, idx, v = torch.randn(100, 4), torch.randperm(100)[:30], torch.randn(30, 4)
    region = _only_region(lambda c: c(x, idx, v), lambda x, i, v: x.index_put((i,), v) * 2)
    for seed in range(3):
        (sample,) = _integer_inputs(region, seed)
        assert sample.unique().numel() == 30 and sample.max() < 100


def test_a_loss_target_is_a_class() -> None:
    logits = torch.randn(16, 10, requires_grad=True)
    target = torch.randint(0, 10, (16,))
    regions = capture_regions(
        lambda c: c(logits, target).backward(),
        lambda x, t: torch.nn.functional.cross_entropy(x, t),
    )
    samples = [s for r in regions for s in _integer_inputs(r)]
    assert samples
    for sample in samples:
        assert sample.min() >= 0 and sample.max() < 10 and sample.any()
