"""The nvFuser translation, checked on CPU against eager through a torch-backed stand-in.

Every region of the example models (Llama and GPT, forward and backward, float32 and
bfloat16) that `unsupported` accepts is translated op by op and run with torch as nvFuser
defines each op; results, dtypes and strides must match eager's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from nvfuser_reference import ReferenceFusion, reference_dtypes

from fcache.executors.nvfuser import translate as tr
from fcache.frontend.canonicalize import CanonicalRegion
from tests.graphs import capture_regions, model_regions, random_inputs, same_layout


def run_reference(region: CanonicalRegion, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    fd = ReferenceFusion(inputs)
    tr.translate(region, fd, reference_dtypes)
    return fd.outputs


def assert_matches_eager(region: CanonicalRegion, seed: int = 0) -> None:
    inputs = random_inputs(region, seed)
    expected = region.materialize(torch.device("cpu"))(*inputs)
    actual = run_reference(region, inputs)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        if tr.stride_order(want) is not None:  # a dense layout: eager's, size-1 dims aside
            assert same_layout(got, want), (got.stride(), want.stride())
        tol = 2e-2 if want.dtype in (torch.bfloat16, torch.float16) else 1e-5
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_regions_translate_like_eager(family: str, dtype: torch.dtype) -> None:
    regions = model_regions(family, dtype)
    covered = [r for r in regions if not tr.unsupported(r)]
    # Only the embedding's backward (a masked index_put) is left to another executor.
    assert len(regions) - len(covered) <= 1, [tr.unsupported(r) for r in regions]
    for region in covered:
        assert_matches_eager(region)


def _op_cases() -> dict[str, Callable[..., torch.Tensor]]:
    return {
        "step_slice": lambda x: (x * 2)[..., 1::3] + 1,
        # One lane of every group (RoPE's backward), then scatters that leave groups out.
        "slice_scatter": lambda x: torch.zeros_like(x).slice_scatter(x[:, ::2] * 2, 1, 0, None, 2),
        "slice_scatter_lane": lambda x: (x + 1).slice_scatter(x[:, 1:5:3] * 2, 1, 1, 5, 3),
        "slice_scatter_partial": lambda x: (
            (x + 1).slice_scatter(x[:, 2::2] * 2, 1, 2, None, 2)
            + (x * 3).slice_scatter(x[:, :3:2] * 2, 1, 0, 3, 2)
        ),
        "select_scatter": lambda x: (x + 1).select_scatter((x * 3)[:, 0], 1, 2),
        "cat_where": lambda x: torch.where(x > 0, torch.cat([x * 2, x], 0)[:4], -x),
        "amax_softmax": lambda x: torch.softmax(x * 2, -1) + (x * 1).amax(0, keepdim=True),
        "log_softmax": lambda x: torch.log_softmax(x * 2, 0),
        "var_mean": lambda x: sum(torch.var_mean(x * 2, dim=1, correction=1)),
        "permute_out": lambda x: (x * 2).t() + 1,
        "split": lambda x: sum(p * i for i, p in enumerate((x * 2).split(2, 1))),
        "unbind_select": lambda x: (x * 2).unbind(0)[1] + (x * 3).select(1, -1)[:, None],
        "pad": lambda x: torch.nn.functional.pad(x * 2, (1, 2, 0, 1), value=3.0),
        "iota_compare": lambda x: (x * 2) + (torch.arange(x.shape[1]) < 3).float(),
        "int_math": lambda x: ((x * 10).long() // 3 + (x * 10).long() % 4).float(),
        "clamp_gelu": lambda x: torch.nn.functional.gelu(x.clamp(-1, 0.5)) + x.sigmoid(),
        "pow_rsqrt": lambda x: (x * 2).pow(2) + (x.abs() + 1).pow(-0.5) + (x.abs() + 1) ** 1.7,
        "casts": lambda x: (x.to(torch.bfloat16) * 3).to(torch.float32) + x.double().float(),
        "mean_sum_dtype": lambda x: (x * 2).mean((0, 1)) + (x > 0).sum(),
        "expand_unsqueeze": lambda x: (x * 2).unsqueeze(1).expand(4, 3, 6) + x[:, None, :],
    }


@pytest.mark.parametrize("case", sorted(_op_cases()))
def test_op_families_translate_like_eager(case: str) -> None:
    fn = _op_cases()[case]
    x = torch.randn(4, 6)
    regions = capture_regions(lambda compiled: compiled(x), fn)
    assert regions
    for region in regions:
        assert tr.unsupported(region) == [], region.text
        assert_matches_eager(region)


class _CountingFusion(ReferenceFusion):
    """The stand-in, counting the outputs that get an explicit layout (`stride_order`)."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        super().__init__(inputs)
        self.relaid = 0
        stride_order = self.ops.stride_order

        def counted(x: torch.Tensor, order: list[int]) -> torch.Tensor:
            self.relaid += 1
            return stride_order(x, order)

        self.ops.stride_order = counted  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("case", "relaid"),
    [
        # Row-major throughout: nvFuser's own layout is eager's, and an explicit one
        # would only cut the output into an alias segment of its own.
        ("row_major", lambda n: n == 0),
        # A transposed value inside: every output is given eager's layout.
        ("permute_out", lambda n: n >= 1),
    ],
)
def test_outputs_get_an_explicit_layout_only_where_layouts_differ(
    case: str, relaid: Callable[[int], bool]
) -> None:
    fn = {"row_major": lambda x: (x * 2).sum(1, keepdim=True) + x, **_op_cases()}[case]
    x = torch.randn(4, 6)
    regions = capture_regions(lambda compiled: compiled(x), fn)
    for region in regions:
        fd = _CountingFusion(random_inputs(region, 0))
        tr.translate(region, fd, reference_dtypes)
        assert relaid(fd.relaid), (case, fd.relaid, region.text)
