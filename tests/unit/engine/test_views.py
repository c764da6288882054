"""Folded views (fcache.engine.rewrite.views): the same values as the traced ops, fewer calls, and
no fold where a layout at run time is not the trace's."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx as fx

from fcache.engine.rewrite.stitch import stitch, stitched_graph
from fcache.engine.rewrite.views import REINTERPRET, VIEWS, fold_views
from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.frontend.partition import partition
from tests.graphs import capture

aten = torch.ops.aten


def _calls(graph: fx.Graph) -> list[object]:
    return [n.target for n in graph.nodes if n.op == "call_function"]


def _llama_graphs() -> tuple[list[fx.GraphModule], list[list[torch.Tensor]]]:
    cfg = ModelConfig(layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    graphs = capture(build(cfg), sample_tokens(cfg, 2, 8))
    inputs = []
    for gm in graphs:
        values = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
        inputs.append([_like(v) for v in values])
    return graphs, inputs


def _like(v: torch.Tensor) -> torch.Tensor:
    """Random values in exactly `v`'s layout (a view into a larger storage, say)."""
    reach = sum((n - 1) * s for n, s in zip(v.shape, v.stride(), strict=True))
    size = v.storage_offset() + reach + 1
    if v.is_floating_point():
        storage = torch.randn(size, dtype=v.dtype)
    else:
        storage = torch.randint(0, 16, (size,), dtype=v.dtype)
    return storage.as_strided(v.shape, v.stride(), v.storage_offset())


def test_a_decoders_views_fold_into_one_call_each_and_compute_the_same() -> None:
    graphs, inputs = _llama_graphs()
    assert len(graphs) == 2  # forward and backward
    for gm, args in zip(graphs, inputs, strict=True):
        parts = partition(gm.graph)
        graph = stitched_graph(parts, {})
        views_before = sum(t in VIEWS for t in _calls(graph))
        fold_views(graph)
        calls = _calls(graph)
        assert not any(t in VIEWS for t in calls), "a view left unfolded"
        assert 0 < calls.count(REINTERPRET) < views_before
        expected = gm(*args)
        fn = stitch(parts, {}, gm)
        for _ in range(3):  # the first call runs the views as traced, later ones folded
            got = fn(list(args))
            for e, g in zip(expected, got, strict=True):
                if isinstance(e, torch.Tensor):
                    assert g.shape == e.shape and g.stride() == e.stride()
                    torch.testing.assert_close(g, e, rtol=0, atol=0)


def _graph(f, *example: torch.Tensor) -> fx.GraphModule:  # type: ignore[no-untyped-def]
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f, tracing_mode="fake")(*example)


def test_a_value_laid_out_unlike_its_trace_keeps_the_views_unfolded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A meta function that disagrees with its kernel: the trace says `y` is transposed.
    gm = _graph(lambda x: (torch.ops.aten.mul(x, 2).permute(1, 0) + 1,), torch.randn(4, 6))
    mul = next(n for n in gm.graph.nodes if n.target == aten.mul.Tensor)
    mul.meta["val"] = torch.empty_strided((4, 6), (1, 4), device="meta")
    x = torch.randn(4, 6)
    fn = stitch(partition(gm.graph), {}, gm)
    with caplog.at_level(logging.INFO, logger="fcache.engine.rewrite.views"):
        for _ in range(3):
            (got,) = fn([x])
            torch.testing.assert_close(got, (x * 2).t() + 1, rtol=0, atol=0)
    assert "views stay unfolded" in caplog.text


def test_a_value_unlike_its_trace_only_in_a_one_element_dimension_folds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Attention's meta functions give a dimension of one element another stride than the
    # kernel does (Falcon's multi-query key): no address depends on it, so views fold.
    gm = _graph(lambda x: (torch.ops.aten.mul(x, 2).permute(1, 0, 2) + 1,), torch.randn(4, 1, 6))
    mul = next(n for n in gm.graph.nodes if n.target == aten.mul.Tensor)
    mul.meta["val"] = torch.empty_strided((4, 1, 6), (6, 99, 1), device="meta")
    x = torch.randn(4, 1, 6)
    fn = stitch(partition(gm.graph), {}, gm)
    with caplog.at_level(logging.INFO, logger="fcache.engine.rewrite.views"):
        for _ in range(3):
            (got,) = fn([x])
            torch.testing.assert_close(got, (x * 2).permute(1, 0, 2) + 1, rtol=0, atol=0)
    assert "views stay unfolded" not in caplog.text


def test_an_input_laid_out_unlike_its_trace_runs_the_views_as_traced() -> None:
    gm = _graph(lambda x: (x.permute(1, 0).reshape(24) * 3,), torch.randn(4, 6))
    fn = stitch(partition(gm.graph), {}, gm)
    contiguous = torch.randn(4, 6)
    for _ in range(2):
        torch.testing.assert_close(fn([contiguous])[0], contiguous.t().reshape(24) * 3)
    transposed = torch.randn(6, 4).t()  # the same shape, other strides
    torch.testing.assert_close(fn([transposed])[0], transposed.t().reshape(24) * 3)
    torch.testing.assert_close(fn([contiguous])[0], contiguous.t().reshape(24) * 3)


def test_a_returned_alias_stays_a_distinct_tensor_object_of_the_same_storage() -> None:
    gm = _graph(lambda x: (torch.ops.aten.alias(x.exp()), x.view(2, 12)), torch.randn(4, 6))
    graph = stitched_graph(partition(gm.graph), {})
    fold_views(graph)
    assert _calls(graph).count(REINTERPRET) == 2  # both are returned: neither is dropped
    x = torch.randn(4, 6)
    fn = stitch(partition(gm.graph), {}, gm)
    for _ in range(2):
        alias, view = fn([x])
        torch.testing.assert_close(alias, x.exp())
        assert view.data_ptr() == x.data_ptr() and view.shape == (2, 12)


# -- regions skip their own input checks once their inputs' layouts are checked here ------


def _regions(parts: object, calls: list[str]) -> dict[object, object]:
    """Each region of `parts` run in eager, its checked and unchecked calls recorded."""
    from fcache.executors.eager import EagerExecutor
    from fcache.frontend.canonicalize import canonicalize

    eager, cpu = EagerExecutor(), torch.device("cpu")
    compiled = {}
    for region in parts.regions:  # type: ignore[attr-defined]
        run = eager.load(eager.compile(canonicalize(region), cpu), cpu)

        def checked(inputs: list[torch.Tensor], run: object = run) -> object:
            calls.append("checked")
            return run(inputs)  # type: ignore[operator]

        def lean(inputs: list[torch.Tensor], run: object = run) -> object:
            calls.append("unchecked")
            return run(inputs)  # type: ignore[operator]

        checked.unchecked = lean  # type: ignore[attr-defined]
        compiled[region] = checked
    return compiled


def test_regions_run_unchecked_from_the_second_call_with_the_same_values() -> None:
    graphs, inputs = _llama_graphs()
    for gm, args in zip(graphs, inputs, strict=True):
        parts = partition(gm.graph)
        calls: list[str] = []
        fn = stitch(parts, _regions(parts, calls), gm)
        expected = gm(*args)
        regions = len(parts.regions)
        for step in range(3):
            calls.clear()
            got = fn(list(args))
            kind = "checked" if step == 0 else "unchecked"
            assert calls == [kind] * regions, (step, calls)
            for e, g in zip(expected, got, strict=True):
                if isinstance(e, torch.Tensor):
                    torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_a_region_input_laid_out_unlike_its_trace_keeps_regions_checked() -> None:
    # The trace says `mul` (a region's input, through an eager op) is transposed; it is not.
    gm = _graph(lambda x: (torch.ops.aten.mm(x.exp(), x.t()).exp() + 1,), torch.randn(4, 4))
    mm = next(n for n in gm.graph.nodes if n.target == aten.mm.default)
    mm.meta["val"] = torch.empty_strided((4, 4), (1, 4), device="meta")
    parts = partition(gm.graph)
    assert parts.regions
    calls: list[str] = []
    fn = stitch(parts, _regions(parts, calls), gm)
    x = torch.randn(4, 4)
    for _ in range(3):
        (got,) = fn([x])
        torch.testing.assert_close(got, (x.exp() @ x.t()).exp() + 1)
    assert "unchecked" not in calls and calls


def test_a_graph_input_laid_out_unlike_its_trace_runs_the_checked_regions() -> None:
    gm = _graph(lambda x, y: ((x * y).exp(),), torch.randn(4, 6), torch.randn(4, 6))
    parts = partition(gm.graph)
    calls: list[str] = []
    fn = stitch(parts, _regions(parts, calls), gm)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    for _ in range(2):
        torch.testing.assert_close(fn([x, y])[0], (x * y).exp())
    calls.clear()
    torch.testing.assert_close(fn([x, y])[0], (x * y).exp())
    assert calls == ["unchecked"] * len(parts.regions)
    calls.clear()
    other = torch.randn(6, 4).t()  # the same shape, other strides
    torch.testing.assert_close(fn([other, y])[0], (other * y).exp())
    assert calls == ["checked"] * len(parts.regions)
