"""Op translators: reductions (sum, mean, amax/amin, var, var_mean, softmax, log_softmax).

Each computes in opmath (float32 for bf16/fp16) and casts back, as ATen does. `REDUCTIONS`
maps aten op names to them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fcache.executors.nvfuser.builder import (
    Builder,
    Translator,
    bind,
    opmath,
    wrap_dim,
    wrap_dims,
)
from fcache.frontend.canonicalize import CanonicalNode


def _sum(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = wrap_dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    result = b.ops.sum(b.tensor(x, compute), dims=dims, keepdim=keepdim)
    return b.cast(result, compute, out.dtype)


def _mean(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    meta = b.meta(x)
    dims, keepdim = wrap_dims(args.get("dim"), meta.dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    count = math.prod(meta.shape[d] for d in dims)
    total = b.ops.sum(b.tensor(x, compute), dims=dims, keepdim=keepdim)
    return b.cast(b.ops.div(total, b.scalar(count, compute)), compute, out.dtype)


def _extremum(nvop: str) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        args = bind(node)
        x = args["self"]
        dims, keepdim = wrap_dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
        return getattr(b.ops, nvop)(b.tensor(x), dims=dims, keepdim=keepdim)

    return translate


def _correction(args: Mapping[str, Any]) -> int:
    correction = args.get("correction")
    return 1 if correction is None else int(correction)


def _var_mean(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = wrap_dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out[0].dtype)
    var, mean = b.ops.var_mean(b.tensor(x, compute), dims, _correction(args), keepdim)
    return (b.cast(var, compute, out[0].dtype), b.cast(mean, compute, out[1].dtype))


def _var(b: Builder, node: CanonicalNode, out: Any) -> Any:
    args = bind(node)
    x = args["self"]
    dims, keepdim = wrap_dims(args.get("dim"), b.meta(x).dim()), bool(args.get("keepdim"))
    compute = opmath(out.dtype)
    var = b.ops.var(b.tensor(x, compute), dims, _correction(args), keepdim)
    return b.cast(var, compute, out.dtype)


def _softmax(log: bool) -> Translator:
    def translate(b: Builder, node: CanonicalNode, out: Any) -> Any:
        x, dim = node.args[:2]
        compute = opmath(out.dtype)
        meta = b.meta(x)
        dims, shape = [wrap_dim(dim, meta.dim())], tuple(meta.shape)
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


# --- the table ------------------------------------------------------------------------------------

REDUCTIONS: Mapping[str, Translator] = {
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
