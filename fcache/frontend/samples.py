"""Sample inputs of a region: tensors of its exact input layouts, filled reproducibly, for
the runs that need real values (validation against eager, autotuning a compile).

Floating inputs are seeded normal values; booleans are random. An integer input that the
region only uses as an index (into a dimension of known size: `index`, `index_put`,
`gather`, `scatter`, `embedding`, `nll_loss`'s target and their kin, through views,
copies and comparisons) is drawn uniformly from that dimension's range, distinct where
it is the index of a write that does not accumulate and it fits (`_index_bounds`): all
zeros, the old sample, sends every update of an accumulating scatter to one element, a
contention no model has (Swin's position-bias backward in bfloat16 on an H200: Inductor's
bfloat16 atomic adds, 4096 of them into one element, were 6-16% off eager's sort-and-sum,
and five correct regions were refused), and it cannot tell a kernel that reads the right
row from one that always reads row 0. Every other integer input is zeros (a valid index
into anything; its values may feed arithmetic whose result indexes something).

One more exception: a max pool's window offsets (Inductor's
low-memory max pool saves the argmax as an offset inside the window) are turned into input
positions by `_low_memory_max_pool_offsets_to_indices`, and an offset of zero there is the
window's first element, in the padding for the windows along the input's edge: the pool's
backward then scatters outside its output (eager ResNet's region under bf16 autocast
corrupted the heap on torch 2.11's CPU). Those inputs get, for every window, the offset of
its first element inside the input (`_pool_offsets`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fcache.frontend.canonicalize import CanonicalNode, CanonicalRegion, Ref


def inputs_for(region: CanonicalRegion, device: torch.device, seed: int = 0) -> list[torch.Tensor]:
    """Tensors of the region's input layouts on `device`, filled reproducibly (the same
    seed, device type and torch give the same values).

    Values are drawn where they live: a generator on the CPU costs about 10 ns an element
    on one core, 0.1-0.5 s for a transformer region's inputs at batch 2 x 2048, and a
    cold start draws them twice per region (the compile's autotuning, then validation),
    partly on the path to the first step; a CUDA generator takes milliseconds."""
    # The pool options of each input that is a max pool's saved window offsets.
    pools = {
        node.args[0].index: node.args[1:6]
        for node in region.nodes
        if node.op == POOL_OFFSETS and isinstance(node.args[0], Ref) and node.args[0].kind == "in"
    }
    bounds = _index_bounds(region, device, exclude=set(pools))
    generators: dict[torch.device, torch.Generator] = {}
    tensors = []
    for i, spec in enumerate(region.inputs):
        where = spec.device_on(device)
        if (gen := generators.get(where)) is None:
            gen = generators[where] = torch.Generator(device=where).manual_seed(seed)
        if spec.dtype.is_complex:  # both parts drawn: a kernel that mixes them up shows
            value = torch.randn(spec.shape, generator=gen, dtype=torch.complex64, device=where)
        elif spec.dtype.is_floating_point:
            value = torch.randn(spec.shape, generator=gen, dtype=torch.float32, device=where)
        elif spec.dtype == torch.bool:
            value = torch.randint(0, 2, spec.shape, generator=gen, device=where).bool()
        elif i in pools:
            kernel, _, stride, padding, dilation = pools[i]
            value = _pool_offsets(spec.shape, kernel, stride, padding, dilation).to(where)
        elif i in bounds:
            value = _indices(spec.shape, *bounds[i], gen, where)
        else:
            value = torch.zeros(spec.shape, dtype=torch.int64, device=where)
        tensors.append(relaid(value.to(dtype=spec.dtype), spec.stride))
    return tensors


def _indices(
    shape: Sequence[int], bound: int, distinct: bool, gen: torch.Generator, where: torch.device
) -> torch.Tensor:
    """Indices in [0, bound) of `shape`: all different if `distinct` and there are at most
    `bound` of them, else uniform."""
    count = math.prod(shape)
    if distinct and count <= bound:
        return torch.randperm(bound, generator=gen, device=where)[:count].view(tuple(shape))
    return torch.randint(0, bound, tuple(shape), generator=gen, device=where)


# Ops whose result holds the values of their first argument, rearranged or cast: an index
# passed through them is still an index.
_CARRY = frozenset(
    f"aten.{name}" for name in (
        "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "permute",
        "transpose", "t", "clone", "alias", "slice", "select", "_to_copy", "flatten", "detach",
        "lift_fresh_copy", "repeat", "contiguous",
    )
) | {"prims.convert_element_type"}  # fmt: skip
# `where(condition, a, b)`: its result holds values of a and b (positions 1 and 2).
_CHOOSE = "aten.where"
# Ops that only compare an integer: any value is as valid as another there.
_COMPARE = frozenset(f"aten.{name}" for name in ("eq", "ne", "lt", "le", "gt", "ge"))
# Ops taking a list of indices (argument 1), one per dimension of argument 0.
_INDEX_LIST = frozenset(
    f"aten.{name}"
    for name in ("index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put",
                 "_index_put_impl_")
)  # fmt: skip
# The same with a mask first (argument 1; the list is argument 2), as Inductor decomposes an
# embedding's backward.
_MASKED_INDEX_LIST = frozenset(
    ("aten._unsafe_masked_index", "aten._unsafe_masked_index_put_accumulate")
)
# Ops (self, dim, index, ...) indexing argument 0 along `dim`, and whether they write
# without accumulating (a duplicate index there is a race between eager and the kernel).
_DIM_INDEX = {
    "aten.gather": False, "aten.index_select": False, "aten.index_add": False,
    "aten.scatter_add": False, "aten.scatter_reduce": False, "aten.index_fill": False,
    "aten.scatter": True, "aten.index_copy": True,
}  # fmt: skip


def _index_bounds(
    region: CanonicalRegion, device: torch.device, exclude: set[int]
) -> dict[int, tuple[int, bool]]:
    """For each integer input (not in `exclude`) that the region uses only as an index:
    (the smallest size of a dimension it indexes, whether it indexes a write that does not
    accumulate). Inputs used any other way, or whose indexed size cannot be told, are left
    out (and stay zeros)."""
    candidates = {
        i for i, spec in enumerate(region.inputs)
        if i not in exclude and not spec.dtype.is_floating_point and not spec.dtype.is_complex
        and spec.dtype != torch.bool and math.prod(spec.shape) > 0
    }  # fmt: skip
    if not candidates:
        return {}
    uses: dict[Ref, list[tuple[int, int | str, int | None]]] = {}
    for j, node in enumerate(region.nodes):
        items = [*enumerate(node.args), *node.kwargs.items()]
        for position, arg in items:
            if isinstance(arg, Ref):
                uses.setdefault(arg, []).append((j, position, None))
            elif isinstance(arg, (tuple, list)):
                for k, item in enumerate(arg):
                    if isinstance(item, Ref):
                        uses.setdefault(item, []).append((j, position, k))
    shapes = _Shapes(region, device)
    found: dict[int, tuple[int, bool]] = {}
    for i in sorted(candidates):
        bound, distinct, pending, seen = None, False, [Ref("in", i)], set()
        try:
            while pending:
                ref = pending.pop()
                if ref in seen:
                    continue
                seen.add(ref)
                for j, position, k in uses.get(ref, []):
                    node = region.nodes[j]
                    packet = ".".join(node.op.split(".")[:2])
                    if (packet in _CARRY and position == 0) or (
                        packet == _CHOOSE and position in (1, 2)
                    ):
                        pending.append(Ref("node", j))
                        continue
                    if packet in _COMPARE:
                        continue
                    size, writes = _indexed(node, packet, position, k, shapes)
                    bound = size if bound is None else min(bound, size)
                    distinct = distinct or writes
        except _NotAnIndex:
            continue
        if bound is not None and bound > 0:
            found[i] = (bound, distinct)
    return found


class _NotAnIndex(Exception):
    """An integer input is used other than as an index of known range."""


def _indexed(
    node: CanonicalNode, packet: str, position: int | str, k: int | None, shapes: _Shapes
) -> tuple[int, bool]:
    """The size of the dimension that `node` indexes with its argument at `position` (item
    `k` of a list), and whether the op writes there without accumulating."""
    args = node.args
    if packet in _INDEX_LIST and position == 1 and k is not None:
        accumulate = args[3] if len(args) > 3 else node.kwargs.get("accumulate", False)
        writes = "put" in packet and not accumulate
        return _dim(shapes.of(args[0]), k), writes
    if packet in _MASKED_INDEX_LIST and position == 2 and k is not None:
        return _dim(shapes.of(args[0]), k), False
    if packet in _DIM_INDEX and position == 2 and k is None and isinstance(args[1], int):
        return _dim(shapes.of(args[0]), args[1]), _DIM_INDEX[packet]
    if packet == "aten.embedding" and position == 1 and k is None:
        return _dim(shapes.of(args[0]), 0), False
    if packet == "aten.embedding_dense_backward" and position == 1 and isinstance(args[2], int):
        return args[2], False
    if packet in ("aten.nll_loss_forward", "aten.nll_loss2d_forward") and position == 1:
        logits = shapes.of(args[0])
        return _dim(logits, 1 if len(logits) > 1 else 0), False
    if packet in ("aten.nll_loss_backward", "aten.nll_loss2d_backward") and position == 2:
        logits = shapes.of(args[1])
        return _dim(logits, 1 if len(logits) > 1 else 0), False
    raise _NotAnIndex


def _dim(shape: Sequence[int], dim: int) -> int:
    if not -len(shape) <= dim < len(shape):
        raise _NotAnIndex
    return int(shape[dim])


class _Shapes:
    """The shapes of a region's inputs and, computed once on fake tensors when first asked,
    of its nodes' results."""

    def __init__(self, region: CanonicalRegion, device: torch.device) -> None:
        self.region, self.device = region, device
        self.nodes: list[tuple[int, ...] | None] | None = None

    def of(self, value: Any) -> tuple[int, ...]:
        if not isinstance(value, Ref):
            raise _NotAnIndex
        if value.kind == "in":
            return tuple(self.region.inputs[value.index].shape)
        if self.nodes is None:
            self.nodes = _node_shapes(self.region, self.device)
        shape = self.nodes[value.index] if value.index < len(self.nodes) else None
        if shape is None:
            raise _NotAnIndex
        return shape


def _node_shapes(region: CanonicalRegion, device: torch.device) -> list[tuple[int, ...] | None]:
    """Each node's result shape (None where it is not one tensor), from a run on fake
    tensors (no memory, no kernels); all None if the region does not run there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    unknown: list[tuple[int, ...] | None] = [None] * len(region.nodes)
    try:
        module = region.materialize(device)
        calls = [n for n in module.graph.nodes if n.op == "call_function"]
        if len(calls) != len(region.nodes):
            return unknown
        shapes: dict[str, tuple[int, ...]] = {}

        class _Recorder(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> Any:
                value = super().run_node(n)
                if isinstance(value, torch.Tensor):
                    shapes[n.name] = tuple(value.shape)
                return value

        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
            _Recorder(module).run(*[s.empty(device) for s in region.inputs])
    except Exception:  # an op fake tensors cannot run: no shapes, no index bounds from them
        return unknown
    return [shapes.get(call.name) for call in calls]


# Inductor's prim that turns a max pool's saved window offsets into input positions.
POOL_OFFSETS = "prims._low_memory_max_pool_offsets_to_indices.default"


def _pool_offsets(
    shape: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> torch.Tensor:
    """Window offsets of `shape` (leading dims, then one per pooled dim) that each name
    the window's first element inside the input: per pooled dim, the first step j with
    out * stride - padding + j * dilation >= 0 (torch's pools keep every window's last
    element inside the input, so that one is too), flattened in row-major order."""
    dims = len(kernel)
    flat = torch.zeros((), dtype=torch.int64)
    for d in range(dims):
        out = torch.arange(shape[len(shape) - dims + d], dtype=torch.int64)
        start = out * stride[d] - padding[d]
        step = torch.clamp((-start + dilation[d] - 1) // dilation[d], 0, kernel[d] - 1)
        view = [1] * dims
        view[d] = -1
        flat = flat * kernel[d] + step.view(view)
    return flat.expand(tuple(shape))


def relaid(tensor: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """A copy of `tensor` with these strides. A stride of 0 (an expanded dim) is kept as a
    broadcast of the first slice, since no memory holds distinct values there."""
    broadcast = [
        d for d, (s, n) in enumerate(zip(stride, tensor.shape, strict=True)) if s == 0 and n > 1
    ]
    base = tensor
    for d in broadcast:
        base = base.narrow(d, 0, 1)
    out = torch.empty_strided(base.shape, stride, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(base).expand(tensor.shape)


def probe_region(device: torch.device) -> CanonicalRegion:
    """A tiny region (two vectors scaled and added): compiling it once in a fresh process
    pays an executor's one-time costs (imports, the device's context, its compiler's own
    start-up) before real regions arrive."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fcache.frontend.canonicalize import canonicalize
    from fcache.frontend.partition import partition

    def probe(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    x, y = (torch.empty(1024, device=device) for _ in range(2))
    graph = make_fx(probe, tracing_mode="fake")(x, y)
    (region,) = partition(graph.graph).regions
    return canonicalize(region)
