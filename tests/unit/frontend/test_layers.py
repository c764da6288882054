"""Regions by layer (fcache.frontend.layers, `partition(graph, layers=True)`): each repeated
layer of a model is one region with its matmuls and attention, every layer alike (one
kernel for all); a layer no compiler takes whole runs cut by op, compiled
(fcache.engine.compile.session). That no region grows with depth is checked end to end on
every model of the matrix (tests/models/test_matrix.py: a deeper model compiles nothing).

Graphs of models nobody here wrote (`transformers`, tiny configs), captured on the CPU.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import fcache
from fcache import process
from fcache.cache.artifact import Artifact
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion, canonicalize
from fcache.frontend.layers import gather, layers
from fcache.frontend.partition import cut_by_op, has_library_op, order, partition
from tests.graphs import capture_with
from tests.models.zoo import BY_NAME, loss
from tests.text_executor import TextExecutor

pytest.importorskip("transformers")
CPU = torch.device("cpu")


@functools.cache
def _graphs(name: str, depth: int) -> tuple[torch.fx.GraphModule, ...]:
    """The forward and backward graphs of the entry at `depth`, captured once per module (the
    tests only read them: Llama at 4 layers serves two tests)."""
    entry = BY_NAME[name]
    model = entry.build(depth)
    inputs = entry.inputs(CPU)
    return tuple(capture_with(lambda compiled: loss(compiled(**inputs)).backward(), model))


def test_a_layer_is_one_region_with_its_matmuls_and_attention() -> None:
    forward, backward = _graphs("llama", 4)
    for gm, kind in ((forward, "forward"), (backward, "backward")):
        regions = partition(gm.graph, layers=True).regions
        whole = [r for r in regions if has_library_op(r)]
        assert len(whole) == 4, kind  # one per layer
        ops = {str(n.target) for n in whole[1].nodes}
        assert "aten.mm.default" in ops
        assert any("scaled_dot_product" in op for op in ops), kind
        # The layers are alike: one kernel for all of them, but for the first layer,
        # which AOTAutograd's partitioner may give other values to save.
        forms = Counter(canonicalize(r).text for r in whole)
        assert forms.most_common(1)[0][1] >= len(whole) - 1, kind
    # Cut by op, there are many more regions, none with a matmul.
    by_op = partition(forward.graph).regions
    assert len(by_op) > 2 * len(partition(forward.graph, layers=True).regions)
    assert not any(has_library_op(r) for r in by_op)


def test_layers_are_the_repeated_blocks_not_unequal_stages() -> None:
    (forward, _) = _graphs("resnet", 3)  # stages.0 holds 3 blocks, stages.1 one
    labels, _ = layers(forward.graph)
    assert {label.rsplit(".", 1)[0] for label in labels.values()} == {
        "L['self'].resnet.encoder.stages.0.layers"
    }


def test_gathering_keeps_a_valid_order_and_sums_across_layers_stay_outside() -> None:
    found_across = False
    for gm in _graphs("t5", 3):
        labels, streams = layers(gm.graph)
        nodes = gather(order(gm.graph), labels)
        assert sorted(nodes, key=id) == sorted(gm.graph.nodes, key=id)
        seen: set[torch.fx.Node] = set()
        for node in nodes:
            assert all(a in seen for a in node.all_input_nodes), node
            seen.add(node)
        # Sums across layers (the encoder output's gradient, gathered from every decoder
        # layer's cross-attention) run in eager: a region of them would grow with depth.
        across = streams - set(labels)  # those no layer took in while gathering
        regions = partition(gm.graph, layers=True).regions
        assert not any(n in across for r in regions for n in r.nodes)
        found_across = found_across or bool(across)
    assert found_across


def test_a_layer_cut_by_op_has_the_regions_cutting_by_op_gives() -> None:
    forward, _ = _graphs("llama", 4)  # as the test above captured it: its first layer
    layer = next(r for r in partition(forward.graph, layers=True).regions if has_library_op(r))
    cut = cut_by_op(layer, 10)
    assert cut.regions and not any(has_library_op(r) for r in cut.regions)
    assert [r.index for r in cut.regions] == list(range(10, 10 + len(cut.regions)))
    covered = [n for s in cut.steps for n in (s.nodes if hasattr(s, "nodes") else (s,))]
    assert sorted(covered, key=id) == sorted(layer.nodes, key=id)  # each node once


class _NoMatmuls(TextExecutor):
    """A compiler that fails on any region holding a matmul, as Inductor might on a layer."""

    name = "nomatmul"

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        if any(node.op == "aten.mm.default" for node in region.nodes):
            raise RuntimeError("no matmuls here")
        return Artifact(self.name, self.version, region.text)


@pytest.fixture
def _no_matmuls() -> Iterator[None]:
    torch._dynamo.reset()
    process.reset()
    registry.register("nomatmul", _NoMatmuls)
    yield
    process.reset()


def _step(cache: Path) -> dict[str, Any]:
    entry = BY_NAME["llama"]
    model, reference = entry.build(3), entry.build(3)
    inputs = entry.inputs(CPU)
    settings = fcache.Settings(cache_dir=cache, progress=False, executors=("nomatmul", "eager"))
    compiled = fcache.jit(model, settings=settings)
    loss(compiled(**inputs)).backward()
    loss(reference(**inputs)).backward()
    error = max(
        (p.grad - q.grad).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    return {"stats": fcache.stats(compiled), "error": error}


@pytest.mark.usefixtures("_no_matmuls")
def test_a_layer_no_compiler_takes_runs_cut_by_op_compiled(tmp_path: Path) -> None:
    cold = _step(tmp_path)
    stats = cold["stats"]
    assert cold["error"] < 1e-5
    # The layers' pieces compiled, none left to eager although the layers failed whole.
    assert stats.fallbacks == 0 and stats.executors.get("nomatmul", 0) > 0
    assert "eager" not in stats.executors  # the layers cut by op count as their pieces
    assert stats.compiles > 0

    process.reset()  # a new session on the same cache: the refusals and pieces are stored
    registry.register("nomatmul", _NoMatmuls)
    torch._dynamo.reset()
    warm = _step(tmp_path)
    assert warm["error"] < 1e-5
    assert warm["stats"].compiles == 0 and warm["stats"].fallbacks == 0


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class _Broken(torch.nn.Module):
    """Layers with a graph break between them (as OPT's LayerDrop check makes one)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            torch._dynamo.graph_break()
            x = layer(x)
        return x


@pytest.mark.parametrize("model", [_Block, _Broken])
def test_a_graph_of_one_layer_is_one_region(model: type[torch.nn.Module]) -> None:
    # One block traced alone (no module list: the whole graph is its layer), or one layer a
    # graph between graph breaks: each graph's computation is one region with its matmuls.
    x = torch.randn(4, 16, requires_grad=True)
    graphs = capture_with(lambda compiled: compiled(x).sum().backward(), model())
    computing = [gm for gm in graphs if partition(gm.graph).regions]
    assert computing
    for gm in computing:
        regions = partition(gm.graph, layers=True).regions
        assert len(regions) == 1 and has_library_op(regions[0])
        assert len(partition(gm.graph).regions) > 1  # cut by op: split at the matmuls


class _ByOp(TextExecutor):
    """Takes no layer whole (as nvFuser, which fuses no matmul): records what it compiles."""

    name, whole_layers = "byop", False
    compiled: ClassVar[list[CanonicalRegion]] = []

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        self.compiled.append(region)
        return super().compile(region, device)


class _Layered(TextExecutor):
    """Takes layers whole (as Inductor): the text executor under its own name."""

    name = "layered"


@pytest.mark.usefixtures("_no_matmuls")
def test_graphs_are_cut_by_op_for_an_executor_that_takes_no_layer_whole(tmp_path: Path) -> None:
    registry.register("layered", _Layered)
    entry = BY_NAME["llama"]
    inputs = entry.inputs(CPU)
    # The same model cut by layer first, into the same caches: the programs it stores (a
    # plan of layer regions each) must not serve a process that cuts by op.
    layered = fcache.Settings(cache_dir=tmp_path, progress=False, executors=("layered", "eager"))
    loss(fcache.jit(entry.build(3), settings=layered)(**inputs)).backward()
    torch._dynamo.reset()
    process.reset()
    registry.register("byop", _ByOp)
    _ByOp.compiled = []
    model = entry.build(3)
    settings = fcache.Settings(cache_dir=tmp_path, progress=False, executors=("byop", "eager"))
    loss(fcache.jit(model, settings=settings)(**inputs)).backward()
    assert _ByOp.compiled
    assert not any(n.op == "aten.mm.default" for r in _ByOp.compiled for n in r.nodes)
