"""Matmuls between regions, padded where cuBLAS would run them slowly.

cuBLAS's fast 16-bit kernels need each matrix's leading dimension to be a multiple of 8
elements (16 bytes). A matmul with a dimension that is not (GPT-2's vocabulary of 50,257,
say) gets kernels of an older generation instead: on an H100, the three matmuls of GPT-2's
output layer took 10.3 ms of a 17 ms training step at 2 layers, where torch.compile's
took 1.6 ms. torch.compile pads such matmuls (Inductor's pad_mm pass); fcache runs matmuls
in eager, between its regions, so it pads them itself, as Inductor does: the misaligned
dimensions of the operands are padded with zeros to the next multiple of 8 (zeros add
nothing to a dot product), and the result is sliced back and made contiguous, the layout
the trace gave it. A matrix that two matmuls read (a backward's incoming gradient: as it is
for the input's gradient, transposed for the weight's) is padded once for both.

A product the graph returns to the model's caller as it is (GPT-2's logits, reshaped on
their way out) is not copied back to a dense layout: it is the padded result's memory,
its rows `n + pn` apart, as torch.compile returns it (on an H100, for GPT-2's output
layer, the copy took 0.49 ms of a 10.5 ms step). Only for a graph's own results: a value
the backward reads, or a region, was traced dense and gets the dense copy.

Padding copies the operands and the result: memory-bound work that pays only where the
matmul is large. Inductor decides by benchmarking both; fcache pads when every dimension
is at least `MIN_DIM`, where the multiply is long against the copies (at 512 x 512 x 512,
64 times the bytes copied), so the choice is the same in every process.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for

from fcache.engine.rewrite.views import REINTERPRET, base_of, layout

log = logging.getLogger(__name__)

aten = torch.ops.aten
ALIGN = {"float16": 8, "bfloat16": 8}  # elements: 16 bytes
MIN_DIM = 512
DEVICES = ("cuda",)  # cuBLAS's; a test may add "cpu" to run the padded forms end to end


def pad2d(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """`x` with `rows` rows and `cols` columns of zeros appended to its matrices (the last
    two dimensions): a contiguous copy. Only the appended strips are zeroed (F.pad fills
    the whole copy first: for GPT-2's output gradient, 412 MB written twice)."""
    *batch, r, c = x.shape
    out = x.new_empty((*batch, r + rows, c + cols))
    out[..., :r, :c].copy_(x)
    if cols:
        out[..., :r, c:].zero_()
    if rows:
        out[..., r:, :].zero_()
    return out


def unpadded_mm(
    a: torch.Tensor, b: torch.Tensor, pm: int, pn: int, shape: Sequence[int] | None = None
) -> torch.Tensor:
    """The product of operands padded already (`pad2d`), without its `pm` padded rows and
    `pn` padded columns, contiguous. Also batched (bmm). With `shape` (no padded rows):
    the padded result re-strided to `shape` (row stride n + pn), no copy."""
    return _unpad(torch.matmul(a, b), pm, pn, shape)


def unpadded_addmm(
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    pm: int,
    pn: int,
    shape: Sequence[int] | None = None,
) -> torch.Tensor:
    """bias + a @ b as `unpadded_mm` computes a @ b (the bias padded where not broadcast)."""
    if pn and bias.shape[-1] != 1:
        bias = F.pad(bias, (0, pn))
    if pm and bias.dim() == 2 and bias.shape[0] != 1:
        bias = F.pad(bias, (0, 0, 0, pm))
    return _unpad(torch.addmm(bias, a, b), pm, pn, shape)


def _unpad(out: torch.Tensor, pm: int, pn: int, shape: Sequence[int] | None) -> torch.Tensor:
    if shape is not None:
        # Returned as it is: `out`'s memory re-strided, rows n + pn apart, as Inductor's
        # wrapper returns it (reinterpret_tensor). Not `view` and slicing: that makes an
        # autograd view of `out`, and a view returned by AOTAutograd's Function cannot be
        # modified in place (`logits.mul_(2)` would fail where eager's works).
        padded = (*shape[:-1], shape[-1] + pn)
        return REINTERPRET(out, list(shape), list(make_contiguous_strides_for(padded)), 0)
    if not (pm or pn):
        return out
    return out[..., : out.shape[-2] - pm, : out.shape[-1] - pn].contiguous()


def pad_matmuls(graph: fx.Graph, returned: Collection[int] = ()) -> int:
    """Rewrite, in place, the graph's large 16-bit CUDA matmuls with a misaligned dimension
    into their padded form; returns how many. A matrix two matmuls read (a backward's
    incoming gradient: once as it is, once transposed) is padded once, for both.
    `returned`: positions in the graph's output whose values go to the model's caller as
    they are (fcache.engine.programs.graph.returned_outputs); a product that only they read,
    through reshapes, is returned as the padded result re-strided (no copy)."""
    padded = 0
    copies: dict[tuple[fx.Node, int, int], fx.Node] = {}
    own = _returned_nodes(graph, returned)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target in (aten.mm.default, aten.bmm.default) and len(node.args) == 2:
            a, b = node.args
            bias = None
        elif node.target is aten.addmm.default and len(node.args) == 3:
            bias, a, b = node.args
        else:
            continue
        pads = _pads(node, a, b)
        if pads is None:
            continue
        pm, pk, pn = pads
        assert isinstance(a, fx.Node) and isinstance(b, fx.Node)
        a = _padded(graph, node, a, pm, pk, copies)
        b = _padded(graph, node, b, pk, pn, copies)
        if bias is None:
            node.target, node.args = unpadded_mm, (a, b, pm, pn)
        else:
            node.target, node.args = unpadded_addmm, (bias, a, b, pm, pn)
        if not pm and pn:
            _return_padded(node, own)
        padded += 1
    if padded:
        log.debug("fcache: %d matmuls padded to aligned shapes", padded)
    return padded


_TRANSPOSES = frozenset({aten.t.default, aten.permute.default, aten.transpose.int})
_RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def _returned_nodes(graph: fx.Graph, returned: Collection[int]) -> set[fx.Node]:
    """The nodes at the `returned` positions of the graph's output that no other position
    holds (a value also saved for the backward must keep its traced layout)."""
    if not returned:
        return set()
    (output,) = graph.find_nodes(op="output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    own = {v for i, v in enumerate(values) if i in returned and isinstance(v, fx.Node)}
    return own - {v for i, v in enumerate(values) if i not in returned}


def _return_padded(node: fx.Node, own: set[fx.Node]) -> None:
    """Where the padded product `node` reaches only the graph's output, through reshapes
    to a shape whose last dimension is still the product's (any such chain reads the
    padded rows in order), and is one of the caller's own values (`own`): the reshapes
    folded into it, and its result the padded product re-strided to that shape."""
    chain, last = [], node
    while len(last.users) == 1:
        (user,) = last.users
        if user.op == "output":
            break
        if user.op != "call_function" or user.target not in _RESHAPES:
            return
        chain.append(user)
        last = user
    if last not in own or len(last.users) != 1:
        return
    found = layout(last)
    if found is None or found.shape[-1] != layout(node).shape[-1]:  # type: ignore[union-attr]
        return
    node.args = (*node.args, tuple(found.shape))
    if chain:
        last.replace_all_uses_with(node)
        node.meta.update((m, last.meta[m]) for m in ("val", "fcache_val") if m in last.meta)
        for view in reversed(chain):
            node.graph.erase_node(view)


def _padded(
    graph: fx.Graph,
    user: fx.Node,
    x: fx.Node,
    rows: int,
    cols: int,
    copies: dict[tuple[fx.Node, int, int], fx.Node],
) -> fx.Node:
    """A node, placed before `user`, for matrix `x` padded by `rows` and `cols`: a padded
    copy of `x`, or, where `x` is a transposed matrix, the transpose of its matrix's
    padded copy (one copy for both uses of a matrix read both ways)."""
    if not (rows or cols):
        return x
    # Through a transpose, the copy is of the matrix beneath (one copy for both ways it
    # is read), unless only the transposed view is laid out row by row: a copy that reads
    # its source across rows is several times slower (the backward's output-layer weight,
    # saved transposed by the forward).
    transposed = (
        x.target in _TRANSPOSES and _is_transpose(x) and not (_dense(x) and not _dense(x.args[0]))
    )
    base = x.args[0] if transposed else x
    assert isinstance(base, fx.Node)
    pad = (cols, rows) if transposed else (rows, cols)
    key = (*_matrix(base), *pad)
    with graph.inserting_before(user):
        if key not in copies:
            copies[key] = graph.call_function(pad2d, (base, *pad))
        copy = copies[key]
        return graph.call_function(aten.t.default, (copy,)) if transposed else copy


def _matrix(node: fx.Node) -> tuple[object, ...]:
    """What identifies the matrix `node` holds: the tensor its chain of views starts from
    and its layout in that tensor's storage. Two matmuls may read one gradient through
    views of their own (GPT-2's output layer, as AOTAutograd writes it, reads its gradient
    through one shared view), and two views of one tensor with one layout hold the same
    values."""
    found = layout(node)
    return (node,) if found is None else (base_of(node), found)


def _dense(node: object) -> bool:
    """Whether the node's traced layout is row-major and dense."""
    found = layout(node)
    return found is not None and found.stride == tuple(make_contiguous_strides_for(found.shape))


def _is_transpose(node: fx.Node) -> bool:
    """Whether `node` is the transpose of a matrix (2-D) node."""
    base = layout(node.args[0]) if node.args else None
    if base is None or len(base.shape) != 2:
        return False
    if node.target is aten.permute.default:
        return list(node.args[1]) == [1, 0]
    if node.target is aten.transpose.int:
        return {d % 2 for d in node.args[1:3]} == {0, 1}
    return True  # t


def _pads(node: fx.Node, a: object, b: object) -> tuple[int, int, int] | None:
    """(pm, pk, pn) for a matmul worth padding, else None."""
    out, left, right = layout(node), layout(a), layout(b)
    if out is None or left is None or right is None:
        return None
    align = ALIGN.get(out.dtype)
    if align is None or not out.device.startswith(DEVICES):
        return None
    if left.dtype != out.dtype or right.dtype != out.dtype:
        return None
    *_, m, k = left.shape
    n = right.shape[-1]
    if min(m, k, n) < MIN_DIM or out.stride != make_contiguous_strides_for(out.shape):
        return None
    pads = tuple(-d % align for d in (m, k, n))
    return pads if any(pads) else None  # type: ignore[return-value]
