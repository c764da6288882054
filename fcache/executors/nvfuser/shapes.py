"""Op translators: views, slices, splits, cat, padding and scatters (`SHAPES`).

nvFuser slices with unit steps only, so a strided slice is a unit-step slice reshaped to
(count, step) with column 0 kept; slice_scatter / select_scatter pad the source out to the
base's shape and pick it with a `where` on an iota mask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fcache.executors.nvfuser.builder import Builder, Translator, bind, wrap_dim
from fcache.frontend.canonicalize import CanonicalNode, Ref


def _reshape(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    return b.reshape(b.tensor(x), b.meta(x).shape, out.shape)


def _expand(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    return b.expand(b.tensor(x), tuple(b.meta(x).shape), tuple(out.shape))


def _unsqueeze(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dim = node.args[:2]
    dim = wrap_dim(dim, out.dim())
    kept = [i for i in range(out.dim()) if i != dim]
    return b.ops.broadcast_in_dim(b.tensor(x), list(out.shape), kept)


def _permute(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dims = node.args[:2]
    rank = b.meta(x).dim()
    return b.ops.permute(b.tensor(x), [wrap_dim(d, rank) for d in dims])


def _transpose(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    rank = b.meta(x).dim()
    if rank < 2:
        return b.tensor(x)
    swapped = (0, 1) if node.op == "aten.t.default" else node.args[1:3]
    d0, d1 = (wrap_dim(d, rank) for d in swapped)
    order = list(range(rank))
    order[d0], order[d1] = order[d1], order[d0]
    return b.ops.permute(b.tensor(x), order)


def _slice_dim(b: Builder, tv: Any, shape: tuple[int, ...], dim: int, start: int, stop: int) -> Any:
    """A unit-step slice of one dimension (nvFuser's slice takes every dimension's range)."""
    if (start, stop) == (0, shape[dim]):
        return tv
    starts = [start if i == dim else 0 for i in range(len(shape))]
    stops = [stop if i == dim else s for i, s in enumerate(shape)]
    return b.ops.slice(tv, starts, stops)


def _pad_dim(
    b: Builder, tv: Any, rank: int, dim: int, low: int, high: int, value: Any = None
) -> Any:
    """Pad one dimension; nvFuser's widths run from the last dimension backwards."""
    if low == 0 and high == 0:
        return tv
    widths = [0] * (2 * (rank - dim))
    widths[-2:] = [low, high]
    return b.ops.pad(tv, widths, value)


def _strided_slice(
    b: Builder, tv: Any, shape: tuple[int, ...], dim: int, start: int, count: int, step: int
) -> Any:
    """Elements start, start+step, ... (count of them) of one dimension.

    nvFuser slices with unit steps only, so: take (or zero-pad to) count*step elements,
    split the dimension into (count, step), keep column 0, and merge back."""
    span = count * step
    tv = _slice_dim(b, tv, shape, dim, start, min(start + span, shape[dim]))
    overhang = start + span - shape[dim]
    if overhang > 0:
        tv = _pad_dim(b, tv, len(shape), dim, 0, overhang)
    spanned = (*shape[:dim], span, *shape[dim + 1 :])
    split = (*shape[:dim], count, step, *shape[dim + 1 :])
    tv = b.reshape(tv, spanned, split)
    tv = _slice_dim(b, tv, split, dim + 1, 0, 1)
    kept = (*shape[:dim], count, 1, *shape[dim + 1 :])
    return b.reshape(tv, kept, (*shape[:dim], count, *shape[dim + 1 :]))


def _slice_range(size: int, start: int | None, stop: int | None) -> tuple[int, int]:
    """Python slicing's clamping of start/stop to [0, size]."""
    start, stop = 0 if start is None else start, size if stop is None else stop
    start = max(0, min(size, start + size if start < 0 else start))
    stop = max(start, min(size, stop + size if stop < 0 else stop))
    return start, stop


def _slice(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    shape = tuple(b.meta(x).shape)
    dim = wrap_dim(args["dim"], len(shape))
    start, stop = _slice_range(shape[dim], args["start"], args["end"])
    if args["step"] == 1:
        return _slice_dim(b, b.tensor(x), shape, dim, start, stop)
    return _strided_slice(b, b.tensor(x), shape, dim, start, out.shape[dim], args["step"])


def _select(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dim, index = node.args[:3]
    shape = tuple(b.meta(x).shape)
    dim = wrap_dim(dim, len(shape))
    index = index % shape[dim]
    tv = _slice_dim(b, b.tensor(x), shape, dim, index, index + 1)
    return b.reshape(tv, (*shape[:dim], 1, *shape[dim + 1 :]), out.shape)


def _pieces(b: Builder, node: CanonicalNode, out: Any) -> Any:
    """split / split_with_sizes / unbind: one unit-step slice per piece."""
    x = node.args[0]
    shape = tuple(b.meta(x).shape)
    dim = wrap_dim(bind(node).get("dim", 0), len(shape))
    tv, start, pieces = b.tensor(x), 0, []
    for piece in out:
        size = 1 if node.op == "aten.unbind.int" else piece.shape[dim]
        sliced = _slice_dim(b, tv, shape, dim, start, start + size)
        kept = (*shape[:dim], size, *shape[dim + 1 :])
        pieces.append(b.reshape(sliced, kept, piece.shape))
        start += size
    return tuple(pieces)


def _cat(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    tensors = [t for t in args["tensors"] if b.meta(t).numel() or b.meta(t).dim() == out.dim()]
    dim = wrap_dim(args["dim"], out.dim())
    return b.ops.cat([b.tensor(t, out.dtype) for t in tensors], dim)


def _constant_pad(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    value = b.scalar(args["value"], out.dtype)
    return b.ops.pad(b.tensor(args["self"]), list(args["pad"]), value)


def _scatter_mask(
    b: Builder, shape: tuple[int, ...], dim: int, start: int, stop: int, step: int
) -> Any:
    """Bool tensor of `shape`: true where index[dim] is start, start+step, ... < stop."""
    ops = b.ops
    index = ops.iota(
        shape[dim], b.scalar(0, torch.int64), b.scalar(1, torch.int64), b.nvtype(torch.int64)
    )
    offset = ops.sub(index, b.scalar(start, torch.int64))
    inside = ops.logical_and(
        ops.ge(offset, b.scalar(0, torch.int64)), ops.lt(index, b.scalar(stop, torch.int64))
    )
    if step != 1:
        on_step = ops.eq(
            ops.remainder(offset, b.scalar(step, torch.int64)), b.scalar(0, torch.int64)
        )
        inside = ops.logical_and(inside, on_step)
    return ops.broadcast_in_dim(inside, list(shape), [dim])


def _scatter_into(
    b: Builder,
    base: Ref,
    src: Any,
    src_shape: tuple[int, ...],
    dim: int,
    start: int,
    step: int,
    out: Any,
) -> Any:
    """base with src written at index start, start+step, ... of `dim` (slice_scatter)."""
    shape = tuple(out.shape)
    count = src_shape[dim]
    span = count * step if count else 0
    if step != 1 and count:
        split = (*src_shape[:dim], count, 1, *src_shape[dim + 1 :])
        src = b.reshape(src, src_shape, split)
        src = _pad_dim(b, src, len(split), dim + 1, 0, step - 1)
        src = b.reshape(
            src,
            (*src_shape[:dim], count, step, *src_shape[dim + 1 :]),
            (*src_shape[:dim], span, *src_shape[dim + 1 :]),
        )
    stop = min(start + span, shape[dim])
    if start + span > shape[dim]:
        src = _slice_dim(
            b, src, (*src_shape[:dim], span, *src_shape[dim + 1 :]), dim, 0, stop - start
        )
    spread = _pad_dim(b, src, len(shape), dim, start, shape[dim] - stop)
    mask = _scatter_mask(b, shape, dim, start, stop, step)
    return b.ops.where(mask, spread, b.tensor(base, out.dtype, shape))


def _slice_scatter(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    base, src = args["self"], args["src"]
    dim = wrap_dim(args["dim"], out.dim())
    start, _ = _slice_range(out.shape[dim], args["start"], args["end"])
    src_meta = b.meta(src)
    return _scatter_into(
        b, base, b.tensor(src, out.dtype), tuple(src_meta.shape), dim, start, args["step"], out
    )


def _select_scatter(b: Builder, node: CanonicalNode, out: Any) -> Any:
    base, src, dim, index = node.args[:4]
    dim = wrap_dim(dim, out.dim())
    index = index % out.shape[dim]
    src_meta = b.meta(src)
    shape = (*src_meta.shape[:dim], 1, *src_meta.shape[dim:])
    tv = b.reshape(b.tensor(src, out.dtype), src_meta.shape, shape)
    return _scatter_into(b, base, tv, shape, dim, index, 1, out)


# --- the table ------------------------------------------------------------------------------------

SHAPES: Mapping[str, Translator] = {
    "aten.view.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten.squeeze.default": _reshape,
    "aten.squeeze.dim": _reshape,
    "aten.squeeze.dims": _reshape,
    "aten.unsqueeze.default": _unsqueeze,
    "aten.expand.default": _expand,
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose,
    "aten.t.default": _transpose,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.split.Tensor": _pieces,
    "aten.split_with_sizes.default": _pieces,
    "aten.unbind.int": _pieces,
    "aten.cat.default": _cat,
    "aten.constant_pad_nd.default": _constant_pad,
    "aten.slice_scatter.default": _slice_scatter,
    "aten.select_scatter.default": _select_scatter,
}
