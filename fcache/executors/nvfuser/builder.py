"""The translation's state and the helpers every op translator uses.

`Builder` holds one region's translation: the open definition, and a `Value` (the
backend's tensor and its meta twin) per region value. Its methods make aten's implicit
rules explicit for nvFuser: casts to a compute dtype, broadcasts to an output shape,
Python scalars as constants of a dtype. `bind` reads a node's arguments by schema name.
Pure Python over torch's meta tensors: no nvFuser import, no GPU. Not thread-safe (one
Builder per translation).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fcache.frontend.canonicalize import CanonicalNode, Ref, resolve_op

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
    """A region holds something the translation cannot express in nvFuser."""


@dataclass(frozen=True, slots=True)
class Value:
    """A translated value: the backend's tensor (or a tuple of them) and its meta twin."""

    nv: Any
    meta: Any


Translator = Callable[["Builder", CanonicalNode, Any], Any]


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


# --- helpers --------------------------------------------------------------------------------------


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen computes an elementwise op in, for results of `dtype`."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _as_python(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def wrap_dims(dims: Any, rank: int) -> list[int]:
    """aten dim argument(s) -> sorted non-negative dims; None or [] means every dim."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % rank if rank else 0 for d in dims})


def wrap_dim(dim: int, rank: int) -> int:
    """An aten dim argument -> a non-negative dim (0 for a 0-dim tensor)."""
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
