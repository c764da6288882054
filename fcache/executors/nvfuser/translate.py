"""CanonicalRegion -> nvFuser fusion definition: one translator per aten op family.

`translate(region, fd, dtypes)` records a region's computation into `fd`, an open
`nvfuser_direct.FusionDefinition` (or anything with its `define_tensor`, `define_scalar`,
`add_output` and `ops` interface: the unit tests use a torch-backed stand-in). `dtypes`
maps a torch dtype to the backend's DataType. `unsupported(region)` is the cheap check
behind `NvFuserExecutor.supports`: it needs neither nvFuser nor a GPU.

Semantics follow eager PyTorch op by op, so a fused region rounds where eager rounds:
  - aten broadcasts implicitly, nvFuser does not: every tensor operand is expanded to the
    op's output shape with `broadcast_in_dim` first;
  - arithmetic runs in the output dtype's "opmath" type (float32 for bf16/fp16), with
    operands cast to it and the result cast back, as ATen's TensorIterator does;
  - Python scalars become constants of that compute dtype, never float64;
  - shapes and dtypes come from running each op on meta tensors alongside the
    translation, so a translator never re-derives aten's shape rules.
Outputs get eager's memory layout where it is a permutation of a dense one (nvFuser would
otherwise infer its own), so what runs downstream sees the strides it was traced with.
Deterministic: the same region text gives the same definition, op by op, which is what
makes nvFuser's kernel names and kernel code repeat across processes.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fcache.frontend.canonicalize import CanonicalNode, CanonicalRegion, Ref, resolve_op

# torch dtype -> nvfuser_direct.DataType member name.
DTYPE_NAMES: Mapping[torch.dtype, str] = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Int",
    torch.int32: "Int32",
    torch.bool: "Bool",
}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


class Untranslatable(Exception):
    """A region holds something this module cannot express in nvFuser."""


@dataclass(frozen=True, slots=True)
class Value:
    """A translated value: the backend's tensor (or a tuple of them) and its meta twin."""

    nv: Any
    meta: Any


Translator = Callable[["Builder", CanonicalNode, Any], Any]
Check = Callable[[Mapping[str, Any]], "str | None"]


class Builder:
    """Translation state of one region: the definition, and a Value per region value."""

    def __init__(self, fd: Any, dtypes: Callable[[torch.dtype], Any]) -> None:
        self.fd = fd
        self.ops = fd.ops
        self._dtypes = dtypes
        self.values: dict[Ref, Value] = {}
        self.outputs: list[Any] = []  # the fusion's output tensors, in region output order

    def nvtype(self, dtype: torch.dtype) -> Any:
        if dtype not in DTYPE_NAMES:
            raise Untranslatable(f"dtype {dtype}")
        return self._dtypes(dtype)

    def meta(self, arg: Any) -> Any:
        """A region value's meta tensor; anything else as it is (a Python scalar)."""
        return self.values[arg].meta if isinstance(arg, Ref) else arg

    def tensor(
        self, arg: Any, dtype: torch.dtype | None = None, shape: Sequence[int] | None = None
    ) -> Any:
        """A region value as a backend tensor, cast to `dtype` and expanded to `shape`."""
        if not isinstance(arg, Ref):
            raise Untranslatable(f"expected a tensor, got {arg!r}")
        value = self.values[arg]
        tv, meta = value.nv, value.meta
        if dtype is not None:
            tv = self.cast(tv, meta.dtype, dtype)
        if shape is not None:
            tv = self.expand(tv, tuple(meta.shape), tuple(shape))
        return tv

    def operand(self, arg: Any, dtype: torch.dtype, shape: Sequence[int]) -> Any:
        """A tensor operand (cast, expanded) or a Python scalar as a constant of `dtype`."""
        if isinstance(arg, Ref):
            return self.tensor(arg, dtype, shape)
        return self.scalar(arg, dtype)

    def scalar(self, value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, (list, tuple)) or value is None:
            raise Untranslatable(f"expected a scalar, got {value!r}")
        return self.fd.define_scalar(_as_python(value, dtype), self.nvtype(dtype))

    def cast(self, tv: Any, src: torch.dtype, dst: torch.dtype) -> Any:
        return tv if src == dst else self.ops.cast(tv, self.nvtype(dst))

    def expand(self, tv: Any, src: tuple[int, ...], dst: tuple[int, ...]) -> Any:
        """aten's implicit broadcasting, made explicit (trailing dimensions align)."""
        if src == dst:
            return tv
        offset = len(dst) - len(src)
        return self.ops.broadcast_in_dim(tv, list(dst), list(range(offset, len(dst))))

    def reshape(self, tv: Any, src: Sequence[int], dst: Sequence[int]) -> Any:
        return tv if tuple(src) == tuple(dst) else self.ops.reshape(tv, list(dst))


# --- helpers ----------------------------------------------------------------------------------


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen computes an elementwise op in, for results of `dtype`."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _as_python(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def _dims(dims: Any, rank: int) -> list[int]:
    """aten dim argument(s) -> sorted non-negative dims; None or [] means every dim."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank if rank else 0 for d in dims})


def _dim(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


@functools.cache
def _schema_args(op: str) -> tuple[tuple[str, bool, Any], ...]:
    """(name, kwarg_only, default) of each schema argument of an aten/prims op."""
    schema = resolve_op(op)._schema
    return tuple(
        (a.name, a.kwarg_only, a.default_value if a.has_default_value() else None)
        for a in schema.arguments
    )


def bind(node: CanonicalNode) -> dict[str, Any]:
    """A node's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, (name, kwarg_only, default) in enumerate(_schema_args(node.op)):
        if not kwarg_only and i < len(node.args):
            bound[name] = node.args[i]
        else:
            bound[name] = node.kwargs.get(name, default)
    return bound


def _to_meta(value: Any, values: Mapping[Ref, Value]) -> Any:
    if isinstance(value, Ref):
        return values[value].meta
    if isinstance(value, tuple):
        return [_to_meta(v, values) for v in value]
    if isinstance(value, torch.device):
        return torch.device("meta")
    return value


def run_meta(node: CanonicalNode, values: Mapping[Ref, Value]) -> Any:
    """The node's result on meta tensors: eager's shapes and dtypes, computed by aten."""
    args = [_to_meta(a, values) for a in node.args]
    kwargs = {k: _to_meta(v, values) for k, v in node.kwargs.items()}
    if node.op == "getitem":
        return operator.getitem(*args)
    result = resolve_op(node.op)(*args, **kwargs)
    return tuple(result) if isinstance(result, (list, tuple)) else result


# --- elementwise ------------------------------------------------------------------------------


def _unary(nvop: str, *, compute_from_input: bool = False) -> Translator:
    """`nvop` on the operand in opmath; predicates (isnan) compute in the input's dtype."""

    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        (x,) = node.args[:1]
        compute = opmath(b.meta(x).dtype if compute_from_input else out.dtype)
        result = getattr(b.ops, nvop)(b.tensor(x, compute))
        return b.cast(result, compute, out.dtype)

    return translate


def _binary(
    nvop: str, *, compare: bool = False, alpha: bool = False, swap: bool = False
) -> Translator:
    """`nvop(a, b)` with aten's promotion; `alpha` scales b (add/sub), `swap` for rsub."""

    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        lhs, rhs = node.args[:2]
        if swap:
            lhs, rhs = rhs, lhs
        shape = tuple(out.shape)
        compute = opmath(torch.result_type(b.meta(lhs), b.meta(rhs)) if compare else out.dtype)
        a, c = b.operand(lhs, compute, shape), b.operand(rhs, compute, shape)
        scale = bind(node)["alpha"] if alpha else 1
        if scale != 1:
            c = b.ops.mul(c, b.scalar(scale, compute))
        return b.cast(getattr(b.ops, nvop)(a, c), compute, out.dtype)

    return translate


def _logical(nvop: str) -> Translator:
    """Logical ops: operands as bool; bitwise ops on bool results are the same thing."""

    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        shape = tuple(out.shape)
        args = [b.operand(a, torch.bool, shape) for a in node.args[:2]]
        return b.cast(getattr(b.ops, nvop)(*args), torch.bool, out.dtype)

    return translate


def _bitwise(nvop: str, logical: str) -> Translator:
    as_logical = _logical(logical)
    as_bitwise = _binary(nvop)

    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        return (as_logical if out.dtype == torch.bool else as_bitwise)(b, node, out)

    return translate


def _pow(b: Builder, node: CanonicalNode, out: Any) -> Any:
    """pow with ATen's fast paths for common scalar exponents (x*x for 2, rsqrt for -0.5)."""
    base, exponent = node.args[:2]
    compute, shape = opmath(out.dtype), tuple(out.shape)
    if isinstance(base, Ref) and not isinstance(exponent, Ref) and compute.is_floating_point:
        x, ops = b.tensor(base, compute, shape), b.ops
        fast: dict[float, Callable[[], Any]] = {
            1.0: lambda: x,
            2.0: lambda: ops.mul(x, x),
            3.0: lambda: ops.mul(ops.mul(x, x), x),
            0.5: lambda: ops.sqrt(x),
            -0.5: lambda: ops.rsqrt(x),
            -1.0: lambda: ops.reciprocal(x),
            -2.0: lambda: ops.reciprocal(ops.mul(x, x)),
        }
        if float(exponent) in fast:
            return b.cast(fast[float(exponent)](), compute, out.dtype)
    args = [b.operand(a, compute, shape) for a in (base, exponent)]
    return b.cast(b.ops.pow(*args), compute, out.dtype)


def _div_mode(b: Builder, node: CanonicalNode, out: Any) -> Any:
    mode = bind(node)["rounding_mode"]
    if mode is None:
        return _binary("div")(b, node, out)
    compute, shape = opmath(out.dtype), tuple(out.shape)
    num, den = (b.operand(a, compute, shape) for a in node.args[:2])
    quotient = b.ops.div(num, den)  # integers: C++ division, which truncates
    if compute.is_floating_point:
        quotient = getattr(b.ops, "trunc" if mode == "trunc" else "floor")(quotient)
    elif mode == "floor":
        # Truncation rounds up where the remainder's sign differs from the divisor's.
        rem, zero = b.ops.fmod(num, den), b.scalar(0, compute)
        differ = b.ops.ne(b.ops.lt(rem, zero), b.ops.lt(den, zero))
        adjust = b.ops.logical_and(b.ops.ne(rem, zero), differ)
        quotient = b.ops.sub(quotient, b.ops.cast(adjust, b.nvtype(compute)))
    return b.cast(quotient, compute, out.dtype)


def _where(b: Builder, node: CanonicalNode, out: Any) -> Any:
    cond, x, y = node.args[:3]
    shape = tuple(out.shape)
    result = b.ops.where(
        b.operand(cond, torch.bool, shape),
        b.operand(x, out.dtype, shape),
        b.operand(y, out.dtype, shape),
    )
    return result


def _masked_fill(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, mask, value = node.args[:3]
    shape = tuple(out.shape)
    return b.ops.where(
        b.operand(mask, torch.bool, shape),
        b.operand(value, out.dtype, shape),
        b.operand(x, out.dtype, shape),
    )


def _clamp(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    low, high = args.get("min"), args.get("max")
    compute, shape = opmath(out.dtype), tuple(out.shape)
    x = b.tensor(args["self"], compute, shape)
    if low is not None:
        x = b.ops.maximum(x, b.operand(low, compute, shape))
    if high is not None:
        x = b.ops.minimum(x, b.operand(high, compute, shape))
    return b.cast(x, compute, out.dtype)


def _composite(
    fn: Callable[[Any, list[Any], Callable[[float], Any]], Any], arity: int
) -> Translator:
    """An op written with nvFuser primitives on opmath operands: fn(ops, operands, const)."""

    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        compute, shape = opmath(out.dtype), tuple(out.shape)
        operands = [b.operand(a, compute, shape) for a in node.args[:arity]]
        result = fn(b.ops, operands, lambda v: b.scalar(v, compute))
        return b.cast(result, compute, out.dtype)

    return translate


def _gelu(b: Builder, node: CanonicalNode, out: Any) -> Any:
    tanh = bind(node)["approximate"] == "tanh"

    def fn(ops: Any, xs: list[Any], const: Callable[[float], Any]) -> Any:
        x = xs[0]
        if tanh:
            inner = ops.mul(
                const(math.sqrt(2 / math.pi)),
                ops.add(x, ops.mul(const(0.044715), ops.mul(ops.mul(x, x), x))),
            )
            return ops.mul(ops.mul(const(0.5), x), ops.add(const(1.0), ops.tanh(inner)))
        erf = ops.erf(ops.mul(x, const(1 / math.sqrt(2))))
        return ops.mul(ops.mul(const(0.5), x), ops.add(const(1.0), erf))

    return _composite(fn, 1)(b, node, out)


def _threshold_backward(b: Builder, node: CanonicalNode, out: Any) -> Any:
    grad, x, threshold = node.args[:3]
    compute, shape = opmath(out.dtype), tuple(out.shape)
    below = b.ops.le(b.tensor(x, compute, shape), b.scalar(threshold, compute))
    result = b.ops.where(below, b.scalar(0, compute), b.tensor(grad, compute, shape))
    return b.cast(result, compute, out.dtype)


def _cast(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    return b.cast(b.tensor(x), b.meta(x).dtype, out.dtype)


def _identity(b: Builder, node: CanonicalNode, out: Any) -> Any:
    return b.tensor(node.args[0])


def _copy(b: Builder, node: CanonicalNode, out: Any) -> Any:
    return b.tensor(node.args[1], out.dtype, tuple(out.shape))


# --- reductions -------------------------------------------------------------------------------


def _sum(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = _dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    result = b.ops.sum(b.tensor(x, compute), dims=dims, keepdim=keepdim)
    return b.cast(result, compute, out.dtype)


def _mean(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    meta = b.meta(x)
    dims, keepdim = _dims(args.get("dim"), meta.dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    count = math.prod(meta.shape[d] for d in dims)
    total = b.ops.sum(b.tensor(x, compute), dims=dims, keepdim=keepdim)
    return b.cast(b.ops.div(total, b.scalar(count, compute)), compute, out.dtype)


def _extremum(nvop: str) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        args = bind(node)
        x = args["self"]
        dims, keepdim = _dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
        return getattr(b.ops, nvop)(b.tensor(x), dims=dims, keepdim=keepdim)

    return translate


def _correction(args: Mapping[str, Any]) -> int:
    correction = args.get("correction")
    return 1 if correction is None else int(correction)


def _var_mean(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = _dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out[0].dtype)
    var, mean = b.ops.var_mean(b.tensor(x, compute), dims, _correction(args), keepdim)
    return (b.cast(var, compute, out[0].dtype), b.cast(mean, compute, out[1].dtype))


def _var(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = _dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    var = b.ops.var(b.tensor(x, compute), dims, _correction(args), keepdim)
    return b.cast(var, compute, out.dtype)


def _softmax(log: bool) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        x, dim = node.args[:2]
        compute = opmath(out.dtype)
        meta = b.meta(x)
        dims, shape = [_dim(dim, meta.dim())], tuple(meta.shape)
        xf, ops = b.tensor(x, compute), b.ops
        peak = ops.max(xf, dims=dims, keepdim=True)
        shifted = ops.sub(xf, b.expand(peak, _kept(shape, dims), shape))
        exp = ops.exp(shifted)
        total = b.expand(ops.sum(exp, dims=dims, keepdim=True), _kept(shape, dims), shape)
        result = ops.sub(shifted, ops.log(total)) if log else ops.div(exp, total)
        return b.cast(result, compute, out.dtype)

    return translate


def _kept(shape: tuple[int, ...], dims: Sequence[int]) -> tuple[int, ...]:
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


# --- shapes -----------------------------------------------------------------------------------


def _reshape(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    return b.reshape(b.tensor(x), b.meta(x).shape, out.shape)


def _expand(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    return b.expand(b.tensor(x), tuple(b.meta(x).shape), tuple(out.shape))


def _unsqueeze(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dim = node.args[:2]
    dim = _dim(dim, out.dim())
    kept = [i for i in range(out.dim()) if i != dim]
    return b.ops.broadcast_in_dim(b.tensor(x), list(out.shape), kept)


def _permute(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dims = node.args[:2]
    rank = b.meta(x).dim()
    return b.ops.permute(b.tensor(x), [_dim(d, rank) for d in dims])


def _transpose(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x = node.args[0]
    rank = b.meta(x).dim()
    if rank < 2:
        return b.tensor(x)
    swapped = (0, 1) if node.op == "aten.t.default" else node.args[1:3]
    d0, d1 = (_dim(d, rank) for d in swapped)
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
    dim = _dim(args["dim"], len(shape))
    start, stop = _slice_range(shape[dim], args["start"], args["end"])
    if args["step"] == 1:
        return _slice_dim(b, b.tensor(x), shape, dim, start, stop)
    return _strided_slice(b, b.tensor(x), shape, dim, start, out.shape[dim], args["step"])


def _select(b: Builder, node: CanonicalNode, out: Any) -> Any:
    x, dim, index = node.args[:3]
    shape = tuple(b.meta(x).shape)
    dim = _dim(dim, len(shape))
    index = index % shape[dim]
    tv = _slice_dim(b, b.tensor(x), shape, dim, index, index + 1)
    return b.reshape(tv, (*shape[:dim], 1, *shape[dim + 1 :]), out.shape)


def _pieces(b: Builder, node: CanonicalNode, out: Any) -> Any:
    """split / split_with_sizes / unbind: one unit-step slice per piece."""
    x = node.args[0]
    shape = tuple(b.meta(x).shape)
    dim = _dim(bind(node).get("dim", 0), len(shape))
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
    dim = _dim(args["dim"], out.dim())
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
    dim = _dim(args["dim"], out.dim())
    start, _ = _slice_range(out.shape[dim], args["start"], args["end"])
    src_meta = b.meta(src)
    return _scatter_into(
        b, base, b.tensor(src, out.dtype), tuple(src_meta.shape), dim, start, args["step"], out
    )


def _select_scatter(b: Builder, node: CanonicalNode, out: Any) -> Any:
    base, src, dim, index = node.args[:4]
    dim = _dim(dim, out.dim())
    index = index % out.shape[dim]
    src_meta = b.meta(src)
    shape = (*src_meta.shape[:dim], 1, *src_meta.shape[dim:])
    tv = b.reshape(b.tensor(src, out.dtype), src_meta.shape, shape)
    return _scatter_into(b, base, tv, shape, dim, index, 1, out)


# --- factories --------------------------------------------------------------------------------


def _full(value_of: Callable[[Mapping[str, Any]], Any]) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        value = b.scalar(value_of(bind(node)), out.dtype)
        return b.ops.full(list(out.shape), value, b.nvtype(out.dtype))

    return translate


def _iota(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    start, step = (b.scalar(args[k], out.dtype) for k in ("start", "step"))
    return b.ops.iota(args["length"], start, step, b.nvtype(out.dtype))


# --- the table --------------------------------------------------------------------------------

_UNARY = {
    "abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log1p": "log1p", "log2": "log2", "log10": "log10", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
    "sinh": "sinh", "cosh": "cosh", "asin": "asin", "acos": "acos", "atan": "atan",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf", "erfc": "erfc",
    "erfinv": "erfinv", "sigmoid": "sigmoid", "relu": "relu", "silu": "silu", "floor": "floor",
    "ceil": "ceil", "round": "round", "trunc": "trunc", "sign": "sign", "lgamma": "lgamma",
    "bitwise_not": "bitwise_not",
}  # fmt: skip
_PREDICATES = {"isnan": "isnan", "isinf": "isinf", "isfinite": "isfinite"}
_ARITHMETIC = {
    "mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum", "atan2": "atan2",
    "remainder": "remainder", "fmod": "fmod",
}  # fmt: skip
_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def _table() -> dict[str, Translator]:
    table: dict[str, Translator] = {}
    for name, nvop in _UNARY.items():
        table[f"aten.{name}.default"] = _unary(nvop)
    for name, nvop in _PREDICATES.items():
        table[f"aten.{name}.default"] = _unary(nvop, compute_from_input=True)
    table["aten.logical_not.default"] = _unary_logical_not
    for name, nvop in _ARITHMETIC.items():
        for overload in ("Tensor", "Scalar"):
            table[f"aten.{name}.{overload}"] = _binary(nvop)
    table["aten.maximum.default"] = _binary("maximum")
    table["aten.minimum.default"] = _binary("minimum")
    table["aten.atan2.default"] = _binary("atan2")
    for name in ("add", "sub"):
        for overload in ("Tensor", "Scalar"):
            table[f"aten.{name}.{overload}"] = _binary(name, alpha=True)
    for overload in ("Tensor", "Scalar"):
        table[f"aten.rsub.{overload}"] = _binary("sub", alpha=True, swap=True)
    for name, nvop in _COMPARE.items():
        for overload in ("Tensor", "Scalar"):
            table[f"aten.{name}.{overload}"] = _binary(nvop, compare=True)
    for name in ("and", "or", "xor"):
        table[f"aten.logical_{name}.default"] = _logical(
            f"logical_{name}" if name != "xor" else "ne"
        )
        for overload in ("Tensor", "Scalar"):
            logical = f"logical_{name}" if name != "xor" else "ne"
            table[f"aten.bitwise_{name}.{overload}"] = _bitwise(f"bitwise_{name}", logical)
    for overload in ("Tensor_Scalar", "Tensor_Tensor", "Scalar"):
        table[f"aten.pow.{overload}"] = _pow
    table["aten.div.Tensor_mode"] = _div_mode
    table["aten.div.Scalar_mode"] = _div_mode
    table["aten.where.self"] = _where
    table["aten.masked_fill.Scalar"] = _masked_fill
    table["aten.masked_fill.Tensor"] = _masked_fill
    for name in ("clamp.default", "clamp_min.default", "clamp_max.default"):
        table[f"aten.{name}"] = _clamp
    table["aten.gelu.default"] = _gelu
    table["aten.sigmoid_backward.default"] = _composite(
        lambda ops, xs, c: ops.mul(ops.mul(xs[0], xs[1]), ops.sub(c(1.0), xs[1])), 2
    )
    table["aten.tanh_backward.default"] = _composite(
        lambda ops, xs, c: ops.mul(xs[0], ops.sub(c(1.0), ops.mul(xs[1], xs[1]))), 2
    )
    table["aten.threshold_backward.default"] = _threshold_backward
    table["aten.lerp.Scalar"] = _composite(
        lambda ops, xs, c: ops.add(xs[0], ops.mul(xs[2], ops.sub(xs[1], xs[0]))), 3
    )
    table["aten.lerp.Tensor"] = table["aten.lerp.Scalar"]
    table["prims.convert_element_type.default"] = _cast
    table["aten._to_copy.default"] = _cast
    table["aten.copy.default"] = _copy
    for name in ("clone", "alias", "detach", "lift_fresh_copy"):
        table[f"aten.{name}.default"] = _identity
    table.update(_REDUCTIONS)
    table.update(_SHAPES)
    table.update(_FACTORIES)
    # The loops above name some overloads aten lacks (maximum.Scalar): keep real ones only.
    return {name: fn for name, fn in table.items() if _exists(name)}


def _exists(op: str) -> bool:
    try:
        resolve_op(op)
    except (AttributeError, RuntimeError):
        return False
    return True


def _unary_logical_not(b: Builder, node: CanonicalNode, out: Any) -> Any:
    return b.cast(b.ops.logical_not(b.tensor(node.args[0], torch.bool)), torch.bool, out.dtype)


_REDUCTIONS: dict[str, Translator] = {
    "aten.sum.dim_IntList": _sum,
    "aten.sum.default": _sum,
    "aten.mean.dim": _mean,
    "aten.mean.default": _mean,
    "aten.amax.default": _extremum("max"),
    "aten.amin.default": _extremum("min"),
    "aten.var_mean.correction": _var_mean,
    "aten.var.correction": _var,
    "aten._softmax.default": _softmax(log=False),
    "aten._log_softmax.default": _softmax(log=True),
}
_SHAPES: dict[str, Translator] = {
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
_FACTORIES: dict[str, Translator] = {
    "aten.full.default": _full(lambda a: a["fill_value"]),
    "aten.full_like.default": _full(lambda a: a["fill_value"]),
    "aten.zeros_like.default": _full(lambda a: 0),
    "aten.ones_like.default": _full(lambda a: 1),
    "aten.fill.Scalar": _full(lambda a: a["value"]),
    "aten.scalar_tensor.default": _full(lambda a: a["s"]),
    "prims.iota.default": _iota,
}


def _getitem(b: Builder, node: CanonicalNode, out: Any) -> Any:
    source, index = node.args[:2]
    return b.values[source].nv[index]


TRANSLATORS: Mapping[str, Translator] = {**_table(), "getitem": _getitem}

# --- the cheap check --------------------------------------------------------------------------


def _no_negative_pad(args: Mapping[str, Any]) -> str | None:
    return "negative padding" if any(p < 0 for p in args["pad"]) else None


def _same_device(args: Mapping[str, Any]) -> str | None:
    device = args.get("device")
    return f"copy to {device}" if device is not None and device.type != "cuda" else None


def _integral_correction(args: Mapping[str, Any]) -> str | None:
    correction = args.get("correction")
    if correction is not None and float(correction) != int(correction):
        return f"correction={correction}"
    return None


def _positive_step(args: Mapping[str, Any]) -> str | None:
    return f"step={args['step']}" if not isinstance(args["step"], int) or args["step"] < 1 else None


CHECKS: Mapping[str, Check] = {
    "aten.constant_pad_nd.default": _no_negative_pad,
    "aten._to_copy.default": _same_device,
    "aten.var_mean.correction": _integral_correction,
    "aten.var.correction": _integral_correction,
    "aten.slice.Tensor": _positive_step,
    "aten.slice_scatter.default": _positive_step,
}


def unsupported(region: CanonicalRegion) -> list[str]:
    """Why nvFuser cannot take this region (empty: it can). Pure Python, no nvFuser import.

    Device placement is judged relative to the region: a CPU region (as the unit tests
    build) is checked as if it ran on the GPU; in a GPU region, CPU inputs may only be
    0-dim scalars, which nvFuser reads from the host."""
    reasons = []
    on_gpu = any(spec.device_type == "cuda" for spec in region.inputs)
    for i, spec in enumerate(region.inputs):
        if spec.dtype not in DTYPE_NAMES:
            reasons.append(f"input {i} dtype {spec.dtype}")
        if on_gpu and spec.device_type == "cpu" and spec.shape:
            reasons.append(f"input {i} is a CPU tensor of shape {spec.shape}")
        if spec.device_type not in ("cpu", "cuda"):
            reasons.append(f"input {i} on {spec.device_type}")
    for node in region.nodes:
        reason = _node_reason(node)
        if reason:
            reasons.append(f"{node.op}: {reason}" if node.op in TRANSLATORS else node.op)
    return reasons


def _node_reason(node: CanonicalNode) -> str | None:
    if node.op not in TRANSLATORS:
        return "no translation"
    for value in (*node.args, *node.kwargs.values()):
        if isinstance(value, torch.dtype) and value not in DTYPE_NAMES:
            return f"dtype {value}"
    check = CHECKS.get(node.op)
    return check(bind(node)) if check else None


# --- the whole region -------------------------------------------------------------------------


def translate(region: CanonicalRegion, fd: Any, dtypes: Callable[[torch.dtype], Any]) -> Builder:
    """Record `region` into the open definition `fd`; raises Untranslatable.

    Inputs are defined with their static sizes and strides (fcache keys by exact shapes,
    and static extents spare nvFuser the concretization of reshapes)."""
    b = Builder(fd, dtypes)
    for i, spec in enumerate(region.inputs):
        tv = fd.define_tensor(
            sizes=list(spec.shape),
            strides=list(spec.stride),
            dtype=b.nvtype(spec.dtype),
            static_sizes=True,
            is_cpu=spec.device_type == "cpu" and not spec.shape,
        )
        meta = torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype, device="meta")
        b.values[Ref("in", i)] = Value(tv, meta)
    for j, node in enumerate(region.nodes):
        translator = TRANSLATORS.get(node.op)
        if translator is None:
            raise Untranslatable(node.op)
        out = run_meta(node, b.values)
        try:
            b.values[Ref("node", j)] = Value(translator(b, node, out), out)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise Untranslatable(f"{node.op}: {type(exc).__name__}: {exc}") from exc
    _add_outputs(b, region)
    return b


def _add_outputs(b: Builder, region: CanonicalRegion) -> None:
    """Register the region's outputs, each with eager's layout.

    Where every value of the region has its dims in row-major order, nvFuser's layout
    inference already gives row-major outputs, so those are not re-laid out. That is not
    only tidier: nvFuser treats a `stride_order` output as an alias of its producer and
    cuts it into a segment of its own, and a fusion with such cuts always runs the full
    segmentation search (about half of a warm load) instead of proposing one kernel for
    the whole fusion."""
    inputs = {id(b.values[Ref("in", i)].nv) for i in range(len(region.inputs))}
    natural = all(_outer_first(value.meta) for value in b.values.values())
    seen: set[int] = set()
    for ref in region.outputs:
        value = b.values[ref]
        tv, meta = value.nv, value.meta
        if id(tv) in inputs or id(tv) in seen:
            tv = b.ops.set(tv)  # a fusion output must be a value of its own
        order = stride_order(meta)
        if order is not None and not (natural and order == sorted(order, reverse=True)):
            tv = b.ops.stride_order(tv, order)
        seen.add(id(tv))
        b.fd.add_output(tv)
        b.outputs.append(tv)


def _outer_first(meta: Any) -> bool:
    """Whether a meta tensor (each of a tuple) has its dims in row-major order: strides
    never grow from one dim to the next, size-1 and broadcast (stride-0) dims aside. Gaps
    (a slice's strides) are fine: nvFuser's layout inference only ever permutes."""
    if isinstance(meta, (tuple, list)):
        return all(_outer_first(m) for m in meta)
    if not isinstance(meta, torch.Tensor):
        return True
    strides = [st for size, st in zip(meta.shape, meta.stride(), strict=True) if size != 1 and st]
    return all(a >= b for a, b in itertools.pairwise(strides))


def stride_order(meta: torch.Tensor) -> list[int] | None:
    """nvFuser's stride order for eager's layout of an output, when that layout is dense.

    Needed even for contiguous outputs of a region with other layouts inside: nvFuser infers
    output layouts from its inputs' (a cat of transposed inputs comes out transposed),
    where eager's rules differ, and an eager `view` downstream then fails. None for
    layouts that are not a permutation of a dense one (expanded, overlapping, gapped).
    stride_order[i] is the rank of dim i from the innermost (0) outwards, as in nvFuser."""
    if meta.dim() < 2:
        return None
    dims = sorted(range(meta.dim()), key=lambda d: -meta.stride(d))  # stable: outer first
    expected = 1
    for d in reversed(dims):
        if meta.shape[d] != 1 and meta.stride(d) != expected:
            return None
        expected *= meta.shape[d]
    order = [0] * meta.dim()
    for rank, d in enumerate(dims):
        order[d] = meta.dim() - 1 - rank
    return order
