"""Collectives in captured graphs: partitioning never puts one in a region, and never moves
one: a collective starts no later, and its wait comes no earlier, than where the graph has
them (issue #44; Thunder's `sort_waits` places each wait just before its first consumer).

The graphs are real: a model that shards its weights as torch's traced FSDP does
(SimpleFSDP, tests/distributed/models.py: each weight all-gathered in the forward, its
gradient reduce-scattered in the backward, `_c10d_functional` ops and `wait_tensor`s in
both graphs), captured through fcache's capture backend on a one-rank gloo process group
(tests/distributed runs it on two ranks through fcache.jit). FSDP2's own `fully_shard` puts
no collective in a graph: its hooks run outside Dynamo, between the graphs of its modules
(skipped by default; on torch 2.13 always, wrapped in `torch._dynamo.disable`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx

from fcache.frontend.ops import is_collective
from fcache.frontend.partition import Region, partition
from tests.distributed.models import Sharded
from tests.graphs import capture_with

# Checked by name here, not with fcache's own `is_collective`, so that a wrong answer there
# cannot hide a collective.
_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d")


def _namespace(node: fx.Node) -> str:
    return getattr(node.target, "namespace", "")


def _is_wait(node: fx.Node) -> bool:
    return _namespace(node) in _NAMESPACES and "wait" in str(node.target)


def _is_start(node: fx.Node) -> bool:
    return _namespace(node) in _NAMESPACES and not _is_wait(node)


@pytest.fixture(scope="module")
def graphs() -> Iterator[list[fx.GraphModule]]:
    """The forward and backward aten graphs of one training step of `Sharded`, captured on a
    real (one-rank) gloo process group."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
        yield capture_with(lambda compiled: compiled(x).sum().backward(), Sharded())
    finally:
        dist.destroy_process_group()


def _steps_as_sets(steps: tuple[fx.Node | Region, ...]) -> list[set[fx.Node]]:
    """The stitched order: each step's nodes run together, a region's where it stands."""
    return [set(s.nodes) if isinstance(s, Region) else {s} for s in steps]


def _misplaced(graph: fx.Graph, layers: bool) -> list[str]:
    """Each collective that starts later, and each wait that comes earlier (and not just
    before its first consumer), in the partition's order than in the graph's."""
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    groups = _steps_as_sets(partition(graph, layers=layers).steps)
    step_of = {n: i for i, group in enumerate(groups) for n in group}
    wrong = []
    for i, node in enumerate(nodes):
        at = step_of[node]
        if _is_start(node):
            later = set(nodes[i + 1 :])
            now_before = {n for group in groups[:at] for n in group} & later
            if now_before:
                wrong.append(f"{node.name} starts after {sorted(n.name for n in now_before)}")
        elif _is_wait(node):
            earlier = set(nodes[:i])
            now_after = {n for group in groups[at + 1 :] for n in group} & earlier
            consumers = [u for u in node.users if u.op == "call_function"]
            just_before = at + 1 < len(groups) and any(u in groups[at + 1] for u in consumers)
            if now_after and not just_before:
                wrong.append(f"{node.name} waits before {sorted(n.name for n in now_after)}")
    return wrong


def test_the_graphs_hold_collectives_and_waits(graphs: list[fx.GraphModule]) -> None:
    forward, backward = graphs
    for gm, start in ((forward, "all_gather_into_tensor"), (backward, "reduce_scatter_tensor")):
        nodes = list(gm.graph.nodes)
        assert sum(start in str(n.target) for n in nodes) == 6  # two weights, three layers
        assert sum(_is_wait(n) for n in nodes) == 6
        assert all(is_collective(n) for n in nodes if _is_start(n) or _is_wait(n))


@pytest.mark.parametrize("layers", [True, False], ids=["layers", "ops"])
def test_no_region_holds_a_collective_or_a_wait(graphs: list[fx.GraphModule], layers: bool) -> None:
    for gm in graphs:
        cut = partition(gm.graph, layers=layers)
        assert cut.regions
        for region in cut.regions:
            held = [n.name for n in region.nodes if _namespace(n) in _NAMESPACES]
            assert not held, f"region {region.index} holds {held}"


@pytest.mark.parametrize("layers", [True, False], ids=["layers", "ops"])
def test_collectives_start_no_later_and_waits_come_no_earlier(
    graphs: list[fx.GraphModule], layers: bool
) -> None:
    """Before this was checked, both happened: a layer's norm moved up past its weights'
    all-gathers (`order` let runs pass any functional op, collectives too), and the
    residual gradient the next layer needs moved down past a layer's reduce-scatter waits
    (`gather` moved it out of the layer's stretch)."""
    wrong = [f"{kind}: {w}" for kind, gm in zip(("forward", "backward"), graphs, strict=True)
             for w in _misplaced(gm.graph, layers)]  # fmt: skip
    assert wrong == []
