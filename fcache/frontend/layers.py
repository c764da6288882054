"""Which repeated layer of the model each node of an aten graph computes.

A transformer's layers are the instances of one `nn.ModuleList` (`model.layers.0`,
`model.layers.1`, ...). Dynamo records on every node the modules it was traced in
(`nn_module_stack`), and AOTAutograd copies that onto the backward nodes it derives from a
forward node (`fwd_nn_module_stack`). `layers(graph)` reads them: a node computes layer
`P.i` when its stack holds `P.i`, `P` being the module list of the graph whose instances
are alike in size and most numerous (experts inside a layer do not count apart, nor a
ResNet's stages of unequal depth; one instance counts, for graphs cut between layers).

Some nodes carry no module: the gradient sums AOTAutograd adds (a value read twice in the
forward has its two gradients added). Such a node joins a layer when every node it
reads or feeds lies in that one layer, looking through other such nodes (`_absorb`): the
sum of a projection's three input gradients joins its layer; the residual stream's running
gradient, which one layer hands to the next, joins none. Shared computations labelled with
the first layer that used them (RoPE's tables, read by every layer) are taken out of it.

Deterministic: depends only on the graph's nodes, their order, edges and metadata. Every
layer of a model gets the same treatment, which is what lets partitioning cut them into
regions that are alike and share one kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch.fx as fx

from fcache.frontend.ops import is_collective

_INDEXED = re.compile(r"^(.*)\.(\d+)$")
WHOLE = "(the whole graph)"  # the layer of a graph traced in modules but in no module list
_STACKS = ("nn_module_stack", "fwd_nn_module_stack")


def layers(graph: fx.Graph) -> tuple[dict[fx.Node, str], set[fx.Node]]:
    """(each call_function node of a repeated layer -> that layer's module path, the
    stream nodes). Stream nodes are traced in no module and reach two layers or more (the
    sums that carry a gradient from layer to layer, or gather one value's gradients from
    every layer): a region of them would grow with depth. Both empty when the graph was
    traced in no module list."""
    calls = [n for n in graph.nodes if n.op == "call_function"]
    paths = {n: _paths(n) for n in calls}
    parent = _layer_list(paths.values())
    if parent is None:
        # Traced in modules but in no module list: a graph of one layer (Dynamo compiles a
        # layer's forward as a frame of its own when the loop over the layers breaks, as
        # OPT's LayerDrop check does, one graph serving every layer), or a model without
        # repeated layers. The whole graph is one layer, as torch.compile compiles it.
        if any(paths.values()):  # a plain function's graph stays cut by op
            return dict.fromkeys(calls, WHOLE), set()
        return {}, set()
    found: dict[fx.Node, str] = {}
    for node, stack in paths.items():
        layer = next((p for p in stack if _parent(p) == parent), None)
        if layer is not None:
            found[node] = layer
    _unshare(found)
    return found, _absorb(calls, found)


def _paths(node: fx.Node) -> list[str]:
    """The module paths a node was traced in, outermost first."""
    for key in _STACKS:
        stack = node.meta.get(key)
        if stack:
            return [str(entry[0]) for entry in stack.values()]
    return []


def _parent(path: str) -> str:
    match = _INDEXED.match(path)
    return match.group(1) if match else ""


def _layer_list(stacks: Iterable[list[str]]) -> str | None:
    """The module list whose instances are the layers: of the lists whose instances are
    alike in size (`_alike`: a transformer's layers; not a ResNet's stages, one of which
    holds more blocks than another), the one with the most instances, the outermost on a
    tie (a decoder's layers, not the experts inside each)."""
    sizes: dict[str, dict[str, int]] = {}  # list -> instance -> nodes traced in it
    for stack in stacks:
        for path in stack:
            if _INDEXED.match(path):
                instances = sizes.setdefault(_parent(path), {})
                instances[path] = instances.get(path, 0) + 1
    lists = [(len(i), -len(p), p) for p, i in sizes.items() if _alike(list(i.values()))]
    return max(lists)[2] if lists else None


def _alike(counts: list[int]) -> bool:
    """At least two thirds of the instances within a quarter of the median size (a model's
    first layer may differ by a few nodes). One instance is alike: a graph that holds one
    layer (a graph break between layers, as OPT's LayerDrop check makes) is cut like the
    graphs of the other layers, each its one layer's region."""
    if len(counts) == 1:
        return True
    median = sorted(counts)[len(counts) // 2]
    close = sum(abs(c - median) <= median / 4 for c in counts)
    return close >= max(2, -(-2 * len(counts) // 3))


def _unshare(found: dict[fx.Node, str]) -> None:
    """Take out of its layer a node that reads nothing of that layer but is read by
    another one: a shared computation placed in the first layer that used it."""
    for node in list(found):
        layer = found[node]
        reads_own = any(found.get(a) == layer for a in node.all_input_nodes)
        read_by_others = any(found.get(u, layer) != layer for u in node.users)
        if not reads_own and read_by_others:
            del found[node]


def _absorb(calls: list[fx.Node], found: dict[fx.Node, str]) -> set[fx.Node]:
    """Give a node traced in no module at all (AOTAutograd's gradient sums) the layer of
    every node it reaches, through its inputs and its users, across other such nodes;
    nothing if it reaches two layers, or a node of a module outside the layers (the
    embedding beside the first layer, the last norm beside the last: absorbing those
    would make the first and last layers unlike the others). Returns the stream nodes:
    those that reach two layers."""
    bare = [n for n in calls if n not in found and not _paths(n)]
    reached = {n: _reach(n, found) for n in bare}
    for node, seen in reached.items():
        if len(seen) == 1 and "" not in seen:
            found[node] = next(iter(seen))
    return {n for n, seen in reached.items() if len(seen - {""}) >= 2}


def _reach(node: fx.Node, found: dict[fx.Node, str]) -> set[str]:
    """The layers (and "" for modules outside them) of the nodes `node` reaches through
    its inputs and users, looking through nodes traced in no module."""
    labels: set[str] = set()
    seen = {node}
    stack = [node]
    while stack:
        current = stack.pop()
        for nxt in (*current.all_input_nodes, *current.users):
            if nxt in seen or nxt.op != "call_function":
                continue  # placeholders and the output: every layer reads or feeds them
            seen.add(nxt)
            if nxt in found:
                labels.add(found[nxt])
            elif _paths(nxt):
                labels.add("")
            else:
                stack.append(nxt)
    return labels


def gather(nodes: list[fx.Node], found: dict[fx.Node, str]) -> list[fx.Node]:
    """`nodes` (a valid order) with each layer's nodes brought together where the edges
    allow: within the stretch from a layer's first node to its last, a node of elsewhere
    that does not depend on the layer moves before it, one the layer does not depend on
    moves after it (and is gathered in turn there, if another layer's), and a node traced
    in no module that the layer both feeds and reads (the residual stream's running
    gradient) joins the layer (`found` is updated). Still a valid order. Nothing moves
    past a collective or its wait (`is_collective`): a stretch ends before one, so that a
    gradient the next layer needs is not held back behind a reduce-scatter's wait, nor a
    wait brought forward. No region holds a collective, so no layer's region is lost."""
    out: list[fx.Node] = []
    pending = list(nodes)
    start = 0
    while start < len(pending):
        last = {found[n]: i for i, n in enumerate(pending) if n in found}
        while start < len(pending):
            layer = found.get(pending[start])
            if layer is not None and last[layer] > start and not is_collective(pending[start]):
                break
            out.append(pending[start])
            start += 1
        else:
            break
        stop = last[layer] + 1
        end = next((i for i in range(start + 1, stop) if is_collective(pending[i])), stop)
        hoisted, middle, sunk = _gathered(pending[start:end], layer, found)
        out += hoisted + middle
        pending = sunk + pending[end:]
        start = 0
    return out


def _gathered(
    span: list[fx.Node], layer: str, found: dict[fx.Node, str]
) -> tuple[list[fx.Node], list[fx.Node], list[fx.Node]]:
    """The span's nodes before the layer, the layer's (with what stays between them), and
    those after it, each in the span's order."""
    in_span = set(span)
    after: set[fx.Node] = set()  # depends on a node of the layer
    for node in span:
        if found.get(node) == layer or any(a in after for a in node.all_input_nodes):
            after.add(node)
    before: set[fx.Node] = set()  # a node of the layer depends on it
    for node in reversed(span):
        if found.get(node) == layer or any(u in before for u in node.users if u in in_span):
            before.add(node)
    hoisted, middle, sunk = [], [], []
    for node in span:
        own = found.get(node)
        if own == layer:
            middle.append(node)
        elif own is not None and node not in before:
            sunk.append(node)  # another layer's: on to where that layer is gathered
        elif node not in after:
            hoisted.append(node)  # shared work (RoPE's tables): before the layer
        elif node not in before:
            sunk.append(node)
        else:  # between two of the layer's nodes for good
            if node not in found and not _paths(node) and node.op == "call_function":
                found[node] = layer
            middle.append(node)
    return hoisted, middle, sunk
