"""Views in a stitched graph, folded: every chain of view ops becomes at most one call.

Between its regions a stitched graph runs the ops no region holds, and most of them are
views: the reshapes and transposes around each matmul and attention call, the permutes
of weights (about 100 per layer of a Llama training step). Each is a trip through the
dispatcher, 2.5 us of host time on a 2-core CPU host, while the GPU waits for the next
launch. Inductor's own wrapper dispatches no view: it re-strides the tensor it has
(`reinterpret_tensor`) with the sizes and strides it knew when it compiled.

So does fcache. The trace gives every value's layout (shape, stride, storage offset); a
chain of views from a tensor `base` is one reinterpretation of `base` with the last
view's layout, at the same distance from `base`'s storage offset. A view with its
base's layout (an alias, a transpose undone, a reshape to the same shape) disappears
unless the graph returns it.

That is only right while every base has, at run time, the layout it had in the trace,
and fcache does not take the trace's word for it:

- tensors the graph computes (a region's outputs, an eager op's) have one layout for
  given input layouts, but a meta function may disagree with its kernel (attention's
  have): the first call runs the views as traced and checks the layout of every base;
  only if all agree do later calls run folded (`folding`);
- the graph's inputs have their traced layout in every case torch knows of (Dynamo
  guards sizes and strides, AOTAutograd coerces tangents to their traced layout); still,
  each call checks the inputs a fold starts from (0.2 us each) and runs the views as
  traced if one differs.

Region inputs ride on the same checks. A compiled region assumes its inputs' traced
sizes and strides, and Inductor's wrapper asserts them at every call (about 0.4-1.5 us an
input on an H100 host, a few thousand a step). The first call checks the layout of every
region input here as well; from the second on, regions run the variant without those
asserts (fcache.executors.base.unchecked), and a call whose graph inputs differ from the
trace runs the checked, unfolded graph.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._C._dynamo.guards import _reinterpret_tensor

from fcache.frontend import graph_text

log = logging.getLogger(__name__)

Boxed = Callable[[list[Any]], Any]

aten = torch.ops.aten
# Ops whose result is their first argument re-strided: same storage and dtype, a layout
# computed from the arguments alone. (Not as_strided: its storage offset is absolute.
# Not reshape: it copies when it cannot view.)
VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.alias.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.expand.default,
    aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.slice.Tensor, aten.select.int, aten.diagonal.default, aten.unfold.default,
})  # fmt: skip
REINTERPRET = _reinterpret_tensor  # (base, size, stride, offset from base's offset)
# Marks a stitched graph's region calls (fcache.engine.rewrite.stitch) in node meta: their inputs'
# layouts are checked here, as fold bases are, so that regions may skip their own checks.
REGION_INPUTS = "fcache_region_call"


@dataclass(frozen=True)
class Layout:
    """A tensor value's traced facts: what a view of it, or a kernel reading it, depends on."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str  # "bfloat16"
    device: str  # "cuda:0"


def layout(node: object) -> Layout | None:
    """The node's traced layout: from its FakeTensor, or from the facts a stored graph
    keeps (fcache.frontend.graph_text); None if it is no tensor or has symbolic sizes."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        shape, stride, offset = tuple(val.shape), tuple(val.stride()), val.storage_offset()
        dtype, device = str(val.dtype).removeprefix("torch."), str(val.device)
    elif (stored := graph_text.stored_facts(node)) is not None:
        shape, stride, dtype, device, offset = stored
        shape, stride = tuple(shape), tuple(stride)
    else:
        return None
    if not all(type(d) is int for d in (*shape, *stride, offset)):
        return None
    return Layout(shape, stride, offset, dtype, device)


def folds(graph: fx.Graph) -> dict[fx.Node, fx.Node]:
    """Each view that can be folded -> the base its chain starts from (not a view)."""
    found = {}
    for node in graph.nodes:
        if not _is_view(node):
            continue
        base = base_of(node)
        if layout(node) is not None and layout(base) is not None:
            found[node] = base
    return found


def base_of(node: fx.Node) -> fx.Node:
    """The node a chain of views ending at `node` starts from (`node` if it is no view)."""
    while _is_view(node):
        node = node.args[0]
    return node


def fold_views(graph: fx.Graph) -> dict[int, Layout]:
    """Fold the graph's view chains in place (see the module docstring). Returns, by
    position, the inputs whose traced layout the folded graph assumes."""
    placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
    returned = set(graph.output_node().all_input_nodes)
    assumed = {}
    for node, base in folds(graph).items():
        mine, theirs = layout(node), layout(base)
        assert mine is not None and theirs is not None
        if base in placeholders:
            assumed[placeholders[base]] = theirs
        if mine == theirs and node not in returned:
            node.replace_all_uses_with(base)
            graph.erase_node(node)
            continue
        node.target = REINTERPRET
        node.args = (base, list(mine.shape), list(mine.stride), mine.offset - theirs.offset)
        node.kwargs = {}
    for node in reversed(graph.nodes):  # views that only other views read: folded away
        if _is_view(node) and not node.users:
            graph.erase_node(node)
    return assumed


class Audit:
    """Layouts seen on a call of the unfolded graph that differ from the trace's (the first
    few: the unfolded graph keeps its checks, and may run at every step)."""

    KEEP = 3

    def __init__(self) -> None:
        self.differs: list[str] = []

    def check(self, x: Any, shape: tuple[int, ...], stride: tuple[int, ...], name: str) -> None:
        if len(self.differs) >= self.KEEP:
            return
        if not isinstance(x, torch.Tensor) or not laid_out(x, shape, stride):
            seen = (tuple(x.shape), x.stride()) if isinstance(x, torch.Tensor) else type(x)
            self.differs.append(f"{name}: {seen}, traced {(shape, stride)}")


def audited(graph: fx.Graph, bases: Iterable[fx.Node], audit: Audit) -> fx.Graph:
    """`graph`, in place, with a layout check after each of the bases folds start from
    (inputs are checked at every call instead)."""
    for base in {b for b in bases if b.op != "placeholder"}:
        known = layout(base)
        assert known is not None
        with graph.inserting_after(base):
            graph.call_function(audit.check, (base, known.shape, known.stride, base.name))
    return graph


def region_inputs(graph: fx.Graph) -> set[fx.Node]:
    """The inputs, with a traced layout, of the graph's region calls (REGION_INPUTS)."""
    return {
        n
        for call in graph.nodes
        if call.meta.get(REGION_INPUTS)
        for n in call.args[0]
        if layout(n) is not None
    }


def folding(make_graph: Callable[[bool], fx.Graph], module: Callable[[fx.Graph], Boxed]) -> Boxed:
    """A boxed callable for the graph `make_graph(checked)` builds (each call a fresh copy),
    `module(graph)` its code: views run as traced, layouts checked, regions checking
    their inputs, on the first call; from then on, if every layout matched the trace,
    views folded and regions unchecked (see the module docstring)."""
    audit = Audit()
    graph = make_graph(True)
    found = folds(graph)
    checked = region_inputs(graph)
    if not found and not checked:
        return module(graph)
    unfolded = module(audited(graph, {*found.values(), *checked}, audit))
    lock = threading.Lock()
    audited_once = False  # a first call has returned: `audit` is complete
    chosen: Boxed | None = None

    def choose() -> Boxed:
        if audit.differs:
            log.info("fcache: views stay unfolded, regions checked: %s", "; ".join(audit.differs))
            return unfolded
        graph = make_graph(False)
        before = len(graph.nodes)
        assumed = fold_views(graph)
        log.debug("fcache: views folded: %d nodes -> %d", before, len(graph.nodes))
        placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
        for node in region_inputs(graph) & placeholders.keys():
            assumed[placeholders[node]] = layout(node)  # type: ignore[assignment]
        return _guarded(module(graph), assumed, unfolded)

    def run(args: list[Any]) -> Any:
        nonlocal audited_once, chosen
        if chosen is not None:
            return chosen(args)
        if not audited_once:
            out = unfolded(args)
            audited_once = True
            return out
        with lock:  # the second call folds (off the first step, which a start waits for)
            if chosen is None:
                chosen = choose()
        return chosen(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _guarded(folded: Boxed, assumed: dict[int, Layout], unfolded: Boxed) -> Boxed:
    """`folded` while the inputs it assumes have their traced layout; else `unfolded`."""
    if not assumed:
        return folded
    checks = [(position, known.shape, known.stride) for position, known in assumed.items()]

    def run(args: list[Any]) -> Any:
        for position, shape, stride in checks:
            x = args[position]
            # Equal tuples first (one C comparison each, the steady case); laid_out's
            # per-dimension walk only where they differ (a free stride of size-1 dims).
            if (x.stride() != stride or x.shape != shape) and not laid_out(x, shape, stride):
                log.debug("fcache: input %d is laid out unlike its trace: views unfolded", position)
                return unfolded(args)
        return folded(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def laid_out(x: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether `x` has this layout where it matters: its shape, and the strides of the
    dimensions longer than 1 (a dimension of one element is never stepped along, so its
    stride is free: attention's meta functions give such dimensions other strides than
    their kernels do, and Falcon's steps ran unfolded and checked for that alone)."""
    return x.shape == shape and all(
        a == b for a, b, n in zip(x.stride(), stride, shape, strict=True) if n > 1
    )


def _is_view(node: object) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and (node.target in VIEWS or node.target is REINTERPRET)
        and bool(node.args)
        and isinstance(node.args[0], fx.Node)
    )
