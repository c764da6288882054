"""Partition: regions are maximal fusible runs, opaque ops stay eager, runs move past
opaque ops that do not depend on them to join (never past a mutation), the order stays
valid."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fcache.engine.rewrite.stitch import stitch
from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.executors.eager import EagerExecutor
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.ops import is_fusible, is_view
from fcache.frontend.partition import Region, order, partition
from tests.graphs import capture

aten = torch.ops.aten


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = F.gelu(x @ w1) * 2.0
    return torch.softmax(h @ w2, dim=-1) + 1.0


def _args(requires_grad: bool = True) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=gen)
    w1 = torch.randn(16, 32, generator=gen, requires_grad=requires_grad)
    w2 = torch.randn(32, 16, generator=gen, requires_grad=requires_grad)
    return x, w1, w2


def test_opaque_ops_never_join_a_region() -> None:
    for gm in capture(_mlp, *_args()):
        for region in partition(gm.graph).regions:
            for node in region.nodes:
                assert is_fusible(node), node.format_node()
                assert node.target not in (aten.mm.default, aten.addmm.default)


def test_regions_are_cut_at_matmuls_and_hold_compute() -> None:
    (forward, backward) = capture(_mlp, *_args())
    regions = partition(forward.graph).regions
    # gelu * 2 between the matmuls, softmax + 1 after the second one.
    assert len(regions) == 2
    for region in regions:
        assert any(not is_view(n) for n in region.nodes)
        assert region.outputs, "a region must produce something"
    assert partition(backward.graph).regions


def test_view_only_runs_stay_in_eager() -> None:
    def views(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.t().reshape(16, 8) @ w).transpose(0, 1)

    gen = torch.Generator().manual_seed(0)
    (gm,) = capture(
        views, torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen), backward=False
    )
    assert partition(gm.graph).regions == ()


def test_partition_is_deterministic() -> None:
    (gm, _) = capture(_mlp, *_args())
    first = [canonicalize(r).text for r in partition(gm.graph).regions]
    second = [canonicalize(r).text for r in partition(gm.graph).regions]
    assert first == second


def test_steps_cover_every_node_once_in_a_valid_order() -> None:
    for gm in capture(_mlp, *_args()):
        seen: set[torch.fx.Node] = set()
        for step in partition(gm.graph).steps:
            nodes = step.nodes if isinstance(step, Region) else (step,)
            inputs = step.inputs if isinstance(step, Region) else step.all_input_nodes
            assert all(i in seen for i in inputs), "a step reads a value not yet computed"
            assert not seen.intersection(nodes)
            seen.update(nodes)
        assert seen == set(gm.graph.nodes)


def test_stitched_graph_with_eager_regions_matches_the_original() -> None:
    executor = EagerExecutor()
    for gm in capture(_mlp, *_args()):
        parts = partition(gm.graph)
        compiled = {}
        for region in parts.regions:
            canon = canonicalize(region)
            compiled[region] = executor.load(executor.compile(canon, torch.device("cpu")), None)
        stitched = stitch(parts, compiled, gm)
        inputs = [torch.randn(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"]
        expected = gm(*inputs)
        got = stitched(list(inputs))
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e)


def test_identical_layers_give_the_same_regions_at_any_depth() -> None:
    def unique(layers: int) -> tuple[int, int]:
        cfg = ModelConfig(layers=layers, dim=32, heads=2, vocab=64, max_seq=16)
        graphs = capture(build(cfg), sample_tokens(cfg, 2, 8))
        counts = []
        for gm in graphs:
            counts.append(len({canonicalize(r).text for r in partition(gm.graph).regions}))
        return tuple(counts)  # type: ignore[return-value]

    assert unique(2) == unique(5)


def _swiglu(x: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    # As Hugging Face's Llama writes it: the up projection's matmul sits between the
    # activation and the product.
    return (F.silu(x @ wg) * (x @ wu)) @ wd


def _swiglu_args() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    shapes = ((8, 16), (16, 32), (16, 32), (32, 16))
    return tuple(torch.randn(*s, generator=gen, requires_grad=i > 0) for i, s in enumerate(shapes))


def _ops(region: Region) -> set[str]:
    return {str(n.target.overloadpacket) for n in region.nodes if not is_view(n)}  # type: ignore[union-attr]


def test_a_run_joins_the_next_past_a_matmul_that_does_not_read_it() -> None:
    forward, _ = capture(_swiglu, *_swiglu_args())
    (region,) = partition(forward.graph).regions  # silu (decomposed) and the product
    assert {"aten.exp", "aten.mul"} <= _ops(region)
    assert [i.target for i in region.inputs] == [aten.mm.default, aten.mm.default]


def test_a_run_joins_the_previous_past_matmuls_it_does_not_read() -> None:
    # The backward: the up projection's gradient, its two matmuls, then the gate's
    # gradient, which reads neither matmul: one region for both gradients.
    _, backward = capture(_swiglu, *_swiglu_args())
    regions = partition(backward.graph).regions
    assert len(regions) == 1, [sorted(_ops(r)) for r in regions]


def test_moved_runs_keep_a_valid_order_and_match_eager() -> None:
    executor = EagerExecutor()
    for gm in capture(_swiglu, *_swiglu_args()):
        nodes = order(gm.graph)
        assert sorted(nodes, key=id) == sorted(gm.graph.nodes, key=id)
        position = {n: i for i, n in enumerate(nodes)}
        assert all(position[a] < position[n] for n in nodes for a in n.all_input_nodes)
        parts = partition(gm.graph)
        compiled = {
            r: executor.load(executor.compile(canonicalize(r), torch.device("cpu")), None)
            for r in parts.regions
        }
        inputs = [torch.randn(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"]
        for e, g in zip(gm(*inputs), stitch(parts, compiled, gm)(list(inputs)), strict=True):
            torch.testing.assert_close(g, e)


def test_no_run_moves_past_a_mutation() -> None:
    # a + 1 reads `a` before an in-place op writes it: moved past it (to join the product
    # that reads the write's result), it would read the new value. The matmul alone lets
    # it move.
    graph = torch.fx.Graph()
    a, w = graph.placeholder("a"), graph.placeholder("w")
    read = graph.call_function(aten.add.Tensor, (a, 1))
    mm = graph.call_function(aten.mm.default, (w, w))
    write = graph.call_function(aten.add_.Tensor, (a, mm))
    out = graph.call_function(aten.mul.Tensor, (read, write))
    graph.output((out,))
    for node in (a, w, read, mm, write, out):
        node.meta["val"] = torch.empty(4, 4)
    assert order(graph).index(read) < order(graph).index(write)
    plain = torch.fx.Graph()
    a, w = plain.placeholder("a"), plain.placeholder("w")
    read = plain.call_function(aten.add.Tensor, (a, 1))
    mm = plain.call_function(aten.mm.default, (w, w))
    out = plain.call_function(aten.mul.Tensor, (read, mm))
    plain.output((out,))
    for node in (a, w, read, mm, out):
        node.meta["val"] = torch.empty(4, 4)
    assert order(plain).index(read) > order(plain).index(mm)
    assert len(partition(plain).regions) == 1


def _peak_bytes(nodes: list[torch.fx.Node]) -> int:
    """The most bytes of computed values alive at once when `nodes` run in this order (a
    value lives from its node to its last reader; views own no memory)."""
    position = {n: i for i, n in enumerate(nodes)}
    change = [0] * (len(nodes) + 1)
    for node in nodes:
        value = node.meta.get("val")
        if node.op != "call_function" or is_view(node) or not isinstance(value, torch.Tensor):
            continue
        size = value.numel() * value.element_size()
        change[position[node]] += size
        change[max([position[u] for u in node.users] + [position[node]]) + 1] -= size
    alive = peak = 0
    for delta in change:
        alive += delta
        peak = max(peak, alive)
    return peak


def test_moving_runs_keeps_peak_memory_and_joins_regions_of_real_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    from fcache.frontend import partition as partition_module
    from tests.graphs import capture_with
    from tests.models.zoo import BY_NAME, loss

    def in_graph_order(graph: torch.fx.Graph) -> int:
        with monkeypatch.context() as m:
            m.setattr(partition_module, "order", lambda g: list(g.nodes))
            return len(partition(graph).regions)

    for name in ("llama", "gpt2"):
        entry = BY_NAME[name]
        graphs = capture_with(
            lambda f, e=entry: loss(f(**e.inputs(torch.device("cpu")))).backward(),
            entry.build(3),
        )
        joined = 0
        for gm in graphs:
            assert _peak_bytes(order(gm.graph)) <= _peak_bytes(list(gm.graph.nodes)), name
            joined += in_graph_order(gm.graph) - len(partition(gm.graph).regions)
        assert joined >= 3, (name, joined)  # one join per layer at least


@pytest.mark.parametrize(
    ("rows", "indices", "joins"), [(32, (256, 128), False), (1000, (64,), True)]
)
def test_a_contended_embedding_backward_stays_whole_and_out_of_every_region(
    rows: int, indices: tuple[int, ...], joins: bool
) -> None:
    """Many indices into few rows (T5's relative-position bias: 1024 x 1024 into 32)
    would be Inductor's atomic adds on a few addresses, and decomposed (an accumulating
    `index_put` on torch 2.11, `_unsafe_masked_index_put_accumulate` on 2.13) and left to
    eager, a kernel that adds each row's duplicates one after another (T5's step 136 ms
    against 29 on an H200). Traced as fcache captures, it stays `embedding_dense_backward`
    (eager's sort-and-sum kernel) outside every region; a token embedding's backward (a
    few indices per row) is decomposed and joins its layer as before."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fcache.frontend.capture import decompositions
    from fcache.frontend.ops import CONTENDED_INDICES, is_fusible, is_layer_op

    def backward(grad: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return aten.embedding_dense_backward(grad, index, rows, -1, False)

    grad, index = torch.randn(*indices, 8), torch.zeros(indices, dtype=torch.long)
    gm = make_fx(backward, decomposition_table=decompositions(), tracing_mode="fake")(grad, index)
    assert (index.numel() >= CONTENDED_INDICES * rows) is not joins
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    whole = [n for n in calls if n.target is aten.embedding_dense_backward.default]
    puts = [n for n in calls if "index_put" in str(n.target)]
    assert (len(whole), len(puts)) == ((0, 1) if joins else (1, 0)), gm.graph
    (node,) = puts or whole
    assert is_layer_op(node) is joins
    assert is_fusible(node) is joins
    for layers in (False, True):
        regions = partition(gm.graph, layers=layers).regions
        assert any(node in r.nodes for r in regions) is joins
    grad, index = torch.randn(*indices, 8), torch.randint(0, rows, indices)
    torch.testing.assert_close(gm(grad, index), backward(grad, index))


def test_other_accumulating_scatters_stay_in_their_regions() -> None:
    """An index put, index_add or scatter_add with many updates per element joins its
    region (Inductor's atomic adds): only the embedding's backward has a faster eager
    kernel, and left to eager the accumulating index put is the slow one."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fcache.frontend.ops import is_fusible

    n = 4096 * 4  # updates: 4096 per row of a 4-row destination
    put, add, scatter = aten.index_put, aten.index_add, aten.scatter_add
    ops = {
        "index_put": (lambda d, i, v: put(d, [i], v, True), (n,), (n, 8)),
        "index_add": (lambda d, i, v: add(d, 0, i, v), (n,), (n, 8)),
        "scatter_add": (lambda d, i, v: scatter(d, 0, i, v), (n, 8), (n, 8)),
    }
    for name, (fn, index, values) in ops.items():
        inputs = (torch.zeros(4, 8), torch.zeros(index, dtype=torch.long), torch.ones(values))
        gm = make_fx(fn, tracing_mode="fake")(*inputs)
        (node,) = [m for m in gm.graph.nodes if getattr(m.target, "_opname", "") == name]
        assert is_fusible(node), name
