"""Graph -> Partition: cut an aten graph into fused regions between opaque ops.

A region is a connected piece of a maximal run of consecutive fusible nodes. Opaque ops
(matmuls, attention, embedding, convolutions, collectives, RNG, mutation, data-dependent
shapes) run in eager between regions.

Runs are read in the graph's order with one change (`order`): a run of fusible compute
moves past the opaque ops next to it that do not read it (down) or that it does not read
(up), a few at most, so that two runs split only by such ops become one. A SwiGLU's
activation and its product sit on either side of the up projection's matmul; a norm's
backward and the next gradient's rescaling on either side of a weight gradient's. Each
such join is one region call and one kernel fewer per layer. A run moves whole or not at
all, never past an op that mutates or that is not an aten op, and the moves depend only
on the graph's edges: the regions of layer 3 still look exactly like those of layer 30,
which is what lets them share one kernel, and a value lives at most a few opaque ops
longer than in eager.

Splitting a run into its connected components keeps unrelated computations that happen
to sit side by side (one per layer, say) from making a region whose size depends on the
depth.

View-only nodes at the edges of a run are left to eager: those that feed the run's compute
but compute nothing themselves (a weight's transpose before a matmul) run just before the
region, those that only reshape its results for an opaque consumer run just after. A run
with no compute at all stays entirely in eager.

Deterministic: the result depends only on the graph's node order and ops.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fcache.frontend.layers import gather
from fcache.frontend.layers import layers as layer_labels
from fcache.frontend.ops import (
    FUSIBLE_NAMESPACES,
    LIBRARY_PACKETS,
    is_fusible,
    is_layer_op,
    is_view,
)

# How many opaque ops a run may move past to join the next or the previous run (`order`):
# enough for the matmuls of one projection's forward or backward (Llama's backward needs
# three), few enough that a value's lifetime grows by no more than a few ops.
MOVE_LIMIT = 4


@dataclass(frozen=True, eq=False, slots=True)
class Region:
    """A run of fusible nodes that will become one compiled callable.

    `inputs` are the values it reads from outside, in order of first use; `outputs` the
    values of its nodes that something outside reads, in graph order. `device` is the one
    device it computes on (CPU scalars may join a GPU region). `index` is its position
    among the graph's regions, for messages only: it is not part of any key.
    """

    index: int
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]
    device: torch.device


@dataclass(frozen=True, slots=True)
class Partition:
    """A graph as a sequence of steps: eager nodes and regions, in an order valid to run.
    `declined` says, per run of fusible nodes left to eager as a whole, why."""

    steps: tuple[fx.Node | Region, ...]
    declined: tuple[str, ...] = ()

    @property
    def regions(self) -> tuple[Region, ...]:
        return tuple(s for s in self.steps if isinstance(s, Region))


def partition(graph: fx.Graph, layers: bool = False) -> Partition:
    """Cut `graph` into regions (module docstring). With `layers`, each repeated layer of
    the model (fcache.frontend.layers) is one region, matmuls and attention included,
    wherever its ops allow: what Inductor compiles of a layer in torch.compile, once for
    all the layers alike. Nodes outside the layers are cut by op."""
    nodes = order(graph)
    found, streams = layer_labels(graph) if layers else ({}, set())
    if found:
        nodes = gather(nodes, found)
        streams = {n for n in streams if n not in found}  # those a layer took in
    return _cut(nodes, found, 0, streams)


def cut_by_op(region: Region, first_index: int) -> Partition:
    """A layer's region cut again by op (as `partition` cuts outside the layers): what
    runs when no compiler took the layer whole. Regions are numbered from `first_index`."""
    return _cut(list(region.nodes), {}, first_index)


def _cut(
    nodes: Sequence[fx.Node],
    found: dict[fx.Node, str],
    count: int,
    streams: Collection[fx.Node] = (),
) -> Partition:
    """Runs of `nodes` into regions: a layer's nodes by `is_layer_op`, the others by
    `is_fusible`; stream nodes (fcache.frontend.layers) run in eager, one op each, so
    that no region grows with depth."""
    steps: list[fx.Node | Region] = []
    declined: list[str] = []
    run: list[fx.Node] = []
    run_layer: str | None = None
    for node in nodes:
        layer = found.get(node)
        joins = is_layer_op(node) if layer is not None else is_fusible(node)
        joins = joins and node not in streams
        if node.op == "call_function" and joins and (not run or layer == run_layer):
            run.append(node)
            run_layer = layer
            continue
        count = _flush(run, steps, count, declined, whole=run_layer is not None)
        run, run_layer = [], None
        if node.op == "call_function" and joins:  # the first node of another layer's run
            run, run_layer = [node], layer
            continue
        steps.append(node)
    _flush(run, steps, count, declined, whole=run_layer is not None)
    return Partition(tuple(steps), tuple(declined))


def has_library_op(region: Region) -> bool:
    """Whether a region holds a matmul, attention or another library op: a layer's region
    (regions cut by op never do)."""
    return any(
        isinstance(n.target, torch._ops.OpOverload) and n.target.overloadpacket in LIBRARY_PACKETS
        for n in region.nodes
    )


def order(graph: fx.Graph) -> list[fx.Node]:
    """The graph's nodes in the order partitioning reads them: the graph's own, with runs
    moved down, then up, past opaque ops that do not depend on them (module docstring)."""
    fusible = {n for n in graph.nodes if n.op == "call_function" and is_fusible(n)}
    down = _sink(list(graph.nodes), fusible, lambda n: n.all_input_nodes)
    return _sink(down[::-1], fusible, lambda n: list(n.users))[::-1]


def _sink(
    nodes: list[fx.Node], fusible: set[fx.Node], inputs_of: Callable[[fx.Node], list[fx.Node]]
) -> list[fx.Node]:
    """`nodes` (a valid order for the edges `inputs_of`) with `fusible` nodes held back
    until a later node needs them, as long as they have passed fewer than MOVE_LIMIT opaque
    ops and only functional ones. When a node needs held compute, everything held goes
    first, in its order: runs move whole. Views of values from outside the held nodes
    (a weight's transpose) go alone, just before the op that reads them. Run on the
    reversed order with users as inputs, it moves runs up."""
    out: list[fx.Node] = []
    held: dict[fx.Node, int] = {}  # held node -> opaque ops passed when it was held
    computed: set[fx.Node] = set()  # held nodes that compute, or view what a held node computes
    passed = 0
    for node in nodes:
        if node in fusible:
            held[node] = passed
            if not is_view(node) or any(a in computed for a in inputs_of(node)):
                computed.add(node)
            continue
        needed = _needed(node, held, inputs_of)
        oldest = next(iter(held.values()), passed)
        if needed & computed or not _passable(node) or passed - oldest >= MOVE_LIMIT:
            needed = set(held)
        if needed:
            released = [n for n in held if n in needed]
            for n in released:
                del held[n]
            computed.difference_update(released)
            out.extend(released)
        out.append(node)
        passed += node.op == "call_function"
    out.extend(held)
    return out


def _needed(
    node: fx.Node, held: dict[fx.Node, int], inputs_of: Callable[[fx.Node], list[fx.Node]]
) -> set[fx.Node]:
    """The held nodes `node` depends on."""
    needed: set[fx.Node] = set()
    stack = [node]
    while stack:
        for a in inputs_of(stack.pop()):
            if a in held and a not in needed:
                needed.add(a)
                stack.append(a)
    return needed


def _passable(node: fx.Node) -> bool:
    """Whether fusible nodes may move past `node`: a functional aten or prims op (no
    mutation, no Python function or other namespace's op whose effects are unknown: a
    collective, whose start a run moved up would delay, or whose wait a run moved down
    would hasten), or a read of a module attribute."""
    if node.op == "get_attr":
        return True
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace in FUSIBLE_NAMESPACES
        and not target._schema.is_mutable
    )


def _flush(
    run: Sequence[fx.Node],
    steps: list[fx.Node | Region],
    count: int,
    declined: list[str],
    whole: bool = False,
) -> int:
    """Append a run's steps: leading eager views, one region per connected component of
    the run's compute (one region for all of it if `whole`: a layer's run, which does not
    grow with depth), trailing eager views."""
    if not run:
        return count
    members = _members(run)
    if not members:
        steps.extend(run)
        return count
    member_set = set(members)
    # Leading: reads nothing the regions compute; trailing: everything else left out.
    trailing = _downstream(run, member_set)
    steps.extend(n for n in run if n not in member_set and n not in trailing)
    for component in [list(members)] if whole else _split_repeats(members):
        device = _device(component)
        if isinstance(device, str):
            declined.append(device)
            steps.extend(component)
        else:
            steps.append(make_region(count, component, device))
            count += 1
    steps.extend(n for n in run if n in trailing)
    return count


def _components(members: Sequence[fx.Node]) -> list[list[fx.Node]]:
    """The members grouped by data flow, each group in run order, groups in order of their
    first node. Two members are together when one reads the other, or when both read the
    same outside value (seen through views, so two reshapes of one gradient count as one
    value): a multi-output kernel then reads it once (a norm's input, weight and bias
    gradients). Computations of a run that share nothing (say, the same rescaling of each
    layer's saved tensor, which AOTAutograd's partitioner may place side by side at the top
    of a backward graph) become separate regions: one region holding all of them would grow
    with the depth of the model and be compiled anew for each depth."""
    parent: dict[fx.Node, fx.Node] = {n: n for n in members}

    def root(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a: fx.Node, b: fx.Node) -> None:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        parent[root(a)] = root(b)

    member_set = set(members)
    for node in members:
        for arg in node.all_input_nodes:
            union(arg if arg in member_set else _source(arg), node)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in members:
        groups.setdefault(root(node), []).append(node)
    return list(groups.values())


def _split_repeats(members: Sequence[fx.Node]) -> list[list[fx.Node]]:
    """The run's members as one region, or as its components when some of them repeat one
    computation. Repeats are what grows with depth (one copy per layer); a run without
    them stays whole, so that its computations still fuse into one callable (fewer calls
    per step, one read of values they share)."""
    components = _components(members)
    shapes = [_shape(c) for c in components]
    return components if len(set(shapes)) < len(shapes) else [list(members)]


def _shape(component: Sequence[fx.Node]) -> tuple[object, ...]:
    """What a component computes, up to naming: ops, and arguments with values numbered
    by position (inside) or first use (outside, with their dtype and shape). Only used
    to spot repeats, so it need not be the canonical form."""
    number: dict[fx.Node, tuple[str, int]] = {}

    def arg(value: object) -> object:
        if isinstance(value, fx.Node):
            if value not in number:
                meta = value.meta.get("val")
                number[value] = ("in", len(number))
                return (
                    *number[value],
                    str(getattr(meta, "dtype", "")),
                    str(getattr(meta, "shape", "")),
                )
            return number[value]
        if isinstance(value, (list, tuple)):
            return tuple(arg(v) for v in value)
        return repr(value)

    out = []
    for node in component:
        out.append((str(node.target), arg(node.args), arg(tuple(sorted(node.kwargs.items())))))
        number[node] = ("node", len(number))
    return tuple(out)


def _source(node: fx.Node) -> fx.Node:
    """The value a chain of views reads from (the node itself when it is no view)."""
    while is_view(node) and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def _members(run: Sequence[fx.Node]) -> list[fx.Node]:
    """Compute nodes, plus the views that sit between two of them."""
    in_run = set(run)
    computed: set[fx.Node] = set()  # depends on a compute node of the run
    for node in run:
        if not is_view(node) or any(a in computed for a in node.all_input_nodes):
            computed.add(node)
    feeds: set[fx.Node] = set()  # a compute node of the run depends on it
    for node in reversed(run):
        if not is_view(node) or any(u in feeds for u in node.users if u in in_run):
            feeds.add(node)
    members = [n for n in run if n in computed and n in feeds]
    # A getitem of a member (var_mean, split) must stay with it: outputs are tensors.
    member_set = set(members)
    member_set.update(n for n in run if n.target is operator.getitem and n.args[0] in member_set)
    if not any(not is_view(n) for n in member_set):
        return []
    return [n for n in run if n in member_set]


def _downstream(run: Sequence[fx.Node], members: set[fx.Node]) -> set[fx.Node]:
    reached: set[fx.Node] = set()
    for node in run:
        if node not in members and any(a in members or a in reached for a in node.all_input_nodes):
            reached.add(node)
    return reached


def make_region(index: int, members: Sequence[fx.Node], device: torch.device) -> Region:
    """The region of these member nodes (in graph order), its inputs and outputs found."""
    member_set = set(members)
    inputs = _first_use_order(members, member_set)
    outputs = tuple(n for n in members if any(u not in member_set for u in n.users))
    return Region(index, tuple(members), inputs, outputs, device)


def _device(members: Sequence[fx.Node]) -> torch.device | str:
    """The one device a run computes on, or why it has none (it spans accelerators)."""
    member_set = set(members)
    nodes = [*members, *_first_use_order(members, member_set)]
    devices = {v.device for node in nodes for v in _tensors(node.meta.get("val"))}
    accelerators = {d for d in devices if d.type != "cpu"}
    if len(accelerators) > 1:
        return f"spans devices {', '.join(sorted(map(str, accelerators)))}"
    return accelerators.pop() if accelerators else torch.device("cpu")


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _first_use_order(members: Iterable[fx.Node], member_set: set[fx.Node]) -> tuple[fx.Node, ...]:
    seen: dict[fx.Node, None] = {}  # dict as an ordered set: deterministic order
    for node in members:
        for arg in node.all_input_nodes:
            if arg not in member_set:
                seen.setdefault(arg, None)
    return tuple(seen)
