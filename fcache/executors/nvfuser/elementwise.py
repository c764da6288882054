"""Op translators: elementwise ops (unary, binary, logical, casts, composites) and factories.

Each translator is `fn(builder, node, out) -> backend value`, `out` being the node's result
on meta tensors (see `translate`). `ELEMENTWISE` and `FACTORIES` map aten op names to them;
`translate.TRANSLATORS` keeps those aten has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fcache.executors.nvfuser.builder import Builder, Translator, bind, opmath
from fcache.frontend.canonicalize import CanonicalNode, Ref

# --- elementwise ----------------------------------------------------------------------------------


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


def _unary_logical_not(b: Builder, node: CanonicalNode, out: Any) -> Any:
    return b.cast(b.ops.logical_not(b.tensor(node.args[0], torch.bool)), torch.bool, out.dtype)


# --- factories ------------------------------------------------------------------------------------


def _full(value_of: Callable[[Mapping[str, Any]], Any]) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        value = b.scalar(value_of(bind(node)), out.dtype)
        return b.ops.full(list(out.shape), value, b.nvtype(out.dtype))

    return translate


def _iota(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    start, step = (b.scalar(args[k], out.dtype) for k in ("start", "step"))
    return b.ops.iota(args["length"], start, step, b.nvtype(out.dtype))


# --- the table ------------------------------------------------------------------------------------

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
    return table


ELEMENTWISE: Mapping[str, Translator] = _table()

FACTORIES: Mapping[str, Translator] = {
    "aten.full.default": _full(lambda a: a["fill_value"]),
    "aten.full_like.default": _full(lambda a: a["fill_value"]),
    "aten.zeros_like.default": _full(lambda a: 0),
    "aten.ones_like.default": _full(lambda a: 1),
    "aten.fill.Scalar": _full(lambda a: a["value"]),
    "aten.scalar_tensor.default": _full(lambda a: a["s"]),
    "prims.iota.default": _iota,
}
