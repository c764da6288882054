"""Which aten ops a region may hold: what partitioning (fcache.frontend.partition) asks of
each node.

Regions cut by op hold fusible ops only (`is_fusible`): elementwise ops, reductions, views,
everything a fused kernel computes. Matmuls, attention, convolutions and embeddings are
left to their libraries between such regions (LIBRARY_PACKETS). A layer's region
(`is_layer_op`) holds those too, as Inductor's extern calls, as torch.compile's graph of the
layer does. No region holds what fusing would change or could not judge (NEVER_PACKETS,
RNG, mutation, collectives and other namespaces, data-dependent or symbolic sizes), nor an
embedding backward with many indices per row (CONTENDED_INDICES).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

aten = torch.ops.aten

# Ops left to libraries between regions cut by op (matmul, attention, convolution,
# embedding). Inside a layer's region (`partition(graph, layers=True)`) they are Inductor's
# extern calls, as in torch.compile's graphs.
LIBRARY_PACKETS = frozenset(
    {
        aten.mm,
        aten.bmm,
        aten.addmm,
        aten.baddbmm,
        aten.matmul,
        aten.convolution,
        aten.convolution_backward,
        aten.embedding,
        aten.embedding_dense_backward,
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention,
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._flash_attention_forward,
        aten._flash_attention_backward,
        aten._efficient_attention_forward,
        aten._efficient_attention_backward,
    }
)
# Ops no region holds: fusing them would change results or semantics (RNG, collectives and
# mutation are excluded by tag and namespace below), or make them unjudgeable
# (data-dependent sizes, uninitialized memory).
NEVER_PACKETS = frozenset(
    {
        aten._local_scalar_dense,
        aten.nonzero,
        aten.masked_select,
        aten.unique_consecutive,
        aten._unique2,
        # Uninitialized memory: what a region holding one computes depends on what the
        # memory held (a mixture of experts' `empty` filled by index_put, relying on the
        # indices being a permutation), so validation against eager could not judge it.
        aten.empty,
        aten.empty_like,
        aten.empty_strided,
        aten.new_empty,
        aten.new_empty_strided,
    }
)
OPAQUE_PACKETS = LIBRARY_PACKETS | NEVER_PACKETS
# An embedding's backward with this many indices per row of the weight or more stays out of
# every region, as `embedding_dense_backward` itself (fcache.frontend.capture keeps it from
# being decomposed), for eager's CUDA kernel (it sorts the indices and sums each row's
# segment). T5's relative-position bias (1024 x 1024 indices into 32 rows) on an H200:
# fused into a layer's region by Inductor, 8.2-10.6 ms of a 12-15 ms step's GPU time
# (gpu-2026-11-28-7; Inductor's kernel for the op alone takes 0.24 ms, so the fusion is what
# is slow, not taken further); decomposed and left to eager, an accumulating `index_put`
# that adds each row's duplicates one after another (8.1 ms alone; the step 136 ms against
# 29); as itself, outside, 0.55 ms, and the step 18.8 ms against torch.compile's 19.8
# (gpu-2026-11-29). Other accumulating scatters stay in their regions: nothing measured
# says eager's kernels for them beat Inductor's. A token embedding's backward (a few
# indices per row) stays in its region too.
CONTENDED_INDICES = 1024
# Tags come and go between torch releases (2.11 has no Tag.inplace): take those present.
_OPAQUE_TAGS = tuple(
    getattr(torch.Tag, name)
    for name in ("nondeterministic_seeded", "data_dependent_output", "inplace", "inplace_view")
    if hasattr(torch.Tag, name)
)
# Ops that only reinterpret memory: no kernel of their own.
VIEW_PACKETS = frozenset(
    {
        aten.view,
        aten._unsafe_view,
        aten.reshape,
        aten.permute,
        aten.t,
        aten.transpose,
        aten.expand,
        aten.squeeze,
        aten.unsqueeze,
        aten.slice,
        aten.select,
        aten.split,
        aten.split_with_sizes,
        aten.unbind,
        aten.alias,
        aten.as_strided,
        aten.diagonal,
        aten.narrow,
        aten.detach,
        aten.view_as_real,
        aten.view_as_complex,
        aten.unfold,
    }
)
FUSIBLE_NAMESPACES = ("aten", "prims")
# Collectives and their waits (functional collectives, as DTensor, tensor parallelism and
# compiled autograd's DDP put them in graphs; the in-place c10d ops; symmetric memory's).
COLLECTIVE_NAMESPACES = frozenset(
    {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "symm_mem"}
)


def is_fusible(node: fx.Node) -> bool:
    """Whether a call_function node may join a region (see the module docstring)."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False  # higher-order ops, Python functions
    if target.namespace not in FUSIBLE_NAMESPACES or target.overloadpacket in OPAQUE_PACKETS:
        return False
    if target._schema.is_mutable or any(tag in target.tags for tag in _OPAQUE_TAGS):
        return False
    if _contended(node):
        return False
    return _has_static_tensor_value(node)


def is_layer_op(node: fx.Node) -> bool:
    """Whether a call_function node may join its layer's region: what `is_fusible` allows,
    and the libraries' ops (matmuls, attention, convolution, embedding) too."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target.namespace not in FUSIBLE_NAMESPACES or target.overloadpacket in NEVER_PACKETS:
        return False
    tags = [tag for tag in _OPAQUE_TAGS if tag in target.tags]
    if target.overloadpacket in LIBRARY_PACKETS and tags == [_SEEDED]:
        tags = [] if _argument(node, "dropout_p") == 0.0 else tags  # attention without dropout
    if target._schema.is_mutable or tags or _contended(node):
        return False
    return _has_static_tensor_value(node)


def _contended(node: fx.Node) -> bool:
    """Whether a node is an embedding's backward with CONTENDED_INDICES indices per row or
    more, with static sizes. Other nodes: False."""
    if getattr(node.target, "overloadpacket", None) is not aten.embedding_dense_backward:
        return False
    return contended_rows(_numel(_argument(node, "indices")), _argument(node, "num_weights"))


def contended_rows(indices: object, rows: object) -> bool:
    """Whether `indices` updates into `rows` rows are CONTENDED_INDICES or more per row; False
    where either is unknown or symbolic."""
    if not isinstance(indices, int) or not isinstance(rows, int) or rows <= 0:
        return False
    return indices >= CONTENDED_INDICES * rows


def _value(arg: object) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _numel(arg: object) -> int | None:
    """A tensor argument's element count, None if unknown or symbolic."""
    value = _value(arg)
    count = value.numel() if value is not None else None
    return count if isinstance(count, int) else None


_SEEDED = getattr(torch.Tag, "nondeterministic_seeded", None)


def _argument(node: fx.Node, name: str) -> object:
    """The value of a call's argument `name` (its default where the call leaves it out),
    None if the op has no such argument."""
    arguments = node.target._schema.arguments  # type: ignore[union-attr]
    for i, argument in enumerate(arguments):
        if argument.name == name:
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, argument.default_value)
    return None


def is_collective(node: fx.Node) -> bool:
    """Whether a node starts a collective or waits for one. No region holds one (it is
    outside aten and prims), and partitioning moves nothing past one (`order`, `gather`):
    a collective starts, and its wait comes, where the graph has them."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.namespace in COLLECTIVE_NAMESPACES


def is_view(node: fx.Node) -> bool:
    target = node.target
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and target.overloadpacket in VIEW_PACKETS


def _has_static_tensor_value(node: fx.Node) -> bool:
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else (value,)
    return bool(values) and all(
        isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in (*v.shape, *v.stride()))
        for v in values
    )
