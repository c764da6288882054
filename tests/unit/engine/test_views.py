"""Folded views (fcache.engine.views): the same values as the traced ops, fewer calls, and
no fold where a layout at run time is not the trace's."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.fx as fx

from fcache.engine.stitch import stitch, stitched_graph
from fcache.engine.views import REINTERPRET, VIEWS, fold_views
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
    with caplog.at_level(logging.INFO, logger="fcache.engine.views"):
        for _ in range(3):
            (got,) = fn([x])
            torch.testing.assert_close(got, (x * 2).t() + 1, rtol=0, atol=0)
    assert "views stay unfolded" in caplog.text


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
