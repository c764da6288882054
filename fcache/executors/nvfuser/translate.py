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

This module is the driver: the op table (`TRANSLATORS`), the cheap check and the
whole-region translation. The translators live by op family in `elementwise`,
`reductions` and `shapes`, on the translation state and helpers of `builder`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fcache.executors.nvfuser.builder import (
    DTYPE_NAMES,
    Builder,
    Translator,
    Untranslatable,
    Value,
    bind,
)
from fcache.executors.nvfuser.elementwise import ELEMENTWISE, FACTORIES
from fcache.executors.nvfuser.reductions import REDUCTIONS
from fcache.executors.nvfuser.shapes import SHAPES
from fcache.frontend.canonicalize import CanonicalNode, CanonicalRegion, Ref, resolve_op

Check = Callable[[Mapping[str, Any]], "str | None"]


# --- meta twins -----------------------------------------------------------------------------------


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


# --- the table ------------------------------------------------------------------------------------


def _table() -> dict[str, Translator]:
    table = {**ELEMENTWISE, **REDUCTIONS, **SHAPES, **FACTORIES}
    # `elementwise` names some overloads aten lacks (maximum.Scalar): keep real ones only.
    return {name: fn for name, fn in table.items() if _exists(name)}


def _exists(op: str) -> bool:
    try:
        resolve_op(op)
    except (AttributeError, RuntimeError):
        return False
    return True


def _getitem(b: Builder, node: CanonicalNode, out: Any) -> Any:
    source, index = node.args[:2]
    return b.values[source].nv[index]


TRANSLATORS: Mapping[str, Translator] = {**_table(), "getitem": _getitem}

# --- the cheap check ------------------------------------------------------------------------------


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


# --- the whole region -----------------------------------------------------------------------------


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
