"""The eager executor and stitched graphs: regions run op by op, with Inductor's dtype
casts (prims.convert_element_type, a Python implementation in eager) made cheap."""

from __future__ import annotations

import torch

from fcache.engine.rewrite.stitch import stitch, stitched_graph
from fcache.executors.eager import EagerExecutor, eager_module, fast_eager
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.partition import partition
from fcache.target import Target
from tests.graphs import capture

PRIMS_CAST = torch.ops.prims.convert_element_type.default


def _cast_region(x: torch.Tensor):
    def f(t: torch.Tensor) -> torch.Tensor:
        return (t.float() * 2).to(torch.bfloat16) + 1

    (gm,) = capture(f, x, backward=False)
    (region,) = partition(gm.graph).regions
    assert any(n.target is PRIMS_CAST for n in region.nodes)  # what Inductor's decomps make
    return f, gm, region


def _targets(module: torch.fx.GraphModule) -> set[object]:
    return {n.target for n in module.graph.nodes if n.op == "call_function"}


def test_eager_regions_cast_with_aten_and_compute_the_same() -> None:
    x = torch.randn(6, 4, dtype=torch.bfloat16).t()  # strided: casts must keep the layout
    f, _, region = _cast_region(x)
    canon = canonicalize(region)
    module = eager_module(canon, torch.device("cpu"))
    assert PRIMS_CAST not in _targets(module)
    assert torch.ops.aten._to_copy.default in _targets(module)
    executor = EagerExecutor()
    run = executor.load(executor.compile(canon, torch.device("cpu")), torch.device("cpu"))
    (got,) = run([x])
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    (expected,) = canon.materialize(torch.device("cpu"))(x)  # the prims graph, unrewritten
    assert got.stride() == expected.stride() and got.dtype == expected.dtype
    assert executor.supports(canon, Target.of(torch.device("cpu")))


def test_a_cast_to_the_same_dtype_still_copies() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(PRIMS_CAST, (x, torch.float32)))
    module = torch.fx.GraphModule(torch.nn.Module(), fast_eager(graph))
    t = torch.randn(3, 5).t()
    got = module(t)
    assert got.data_ptr() != t.data_ptr()  # prims never aliases its input; nor may we
    assert got.stride() == t.stride()
    torch.testing.assert_close(got, t, rtol=0, atol=0)


def test_stitched_graph_runs_uncompiled_regions_with_aten_casts() -> None:
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    f, gm, _ = _cast_region(x)
    parts = partition(gm.graph)  # no compiled regions: all op by op
    targets = {n.target for n in stitched_graph(parts, {}).nodes if n.op == "call_function"}
    assert PRIMS_CAST not in targets
    torch.testing.assert_close(stitch(parts, {}, gm)([x])[0], f(x), rtol=0, atol=0)
