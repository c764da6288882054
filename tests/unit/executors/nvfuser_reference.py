"""A torch-backed stand-in for an nvfuser_direct FusionDefinition, for tests without a GPU.

`ReferenceFusion(inputs)` hands out the given tensors from `define_tensor` and runs every
`ops.*` call at once with torch, with the argument conventions of nvfuser_direct 0.2.36
(python/python_direct/ops.cpp). It is stricter than nvFuser where that catches translation
mistakes: tensor operands of an elementwise op must already have one shape and one dtype
(aten's implicit broadcasting and promotion must have been made explicit), slices take
unit steps only, and squeeze only size-1 dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _same(*values: Any) -> None:
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0]
    shapes = {tuple(t.shape) for t in tensors}
    dtypes = {t.dtype for t in tensors}
    assert len(shapes) <= 1, f"operand shapes differ: {shapes}"
    assert len(dtypes) <= 1, f"operand dtypes differ: {dtypes}"


class ReferenceOps:
    """nvfuser_direct.ops, run eagerly with torch."""

    def __getattr__(self, name: str) -> Any:
        unary = {
            "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt",
            "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos",
            "atan", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sigmoid", "relu",
            "floor", "ceil", "round", "trunc", "sign", "lgamma", "bitwise_not", "isnan",
            "isinf", "isfinite", "logical_not",
        }  # fmt: skip
        binary = {
            "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
            "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
            "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow,
            "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
            "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
            "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
            "bitwise_xor": torch.bitwise_xor,
        }  # fmt: skip
        if name in unary:
            return getattr(torch, name)
        if name in binary:
            fn = binary[name]

            def apply(a: Any, b: Any) -> torch.Tensor:
                _same(a, b)
                if name == "div" and not _floating(a, b):
                    return torch.div(a, b, rounding_mode="trunc")
                return fn(a, b)

            return apply
        raise AttributeError(f"nvfuser_direct.ops has no {name!r} in this stand-in")

    @staticmethod
    def silu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x)

    @staticmethod
    def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    @staticmethod
    def set(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def where(c: Any, a: Any, b: Any) -> torch.Tensor:
        _same(a, b)
        assert c.dtype == torch.bool
        return torch.where(c, a, b)

    @staticmethod
    def sum(x: torch.Tensor, dims: Sequence[int], keepdim: bool = False) -> torch.Tensor:
        return x.sum(list(dims), keepdim=keepdim)

    @staticmethod
    def max(x: torch.Tensor, dims: Sequence[int], keepdim: bool = False) -> torch.Tensor:
        return x.amax(list(dims), keepdim=keepdim)

    @staticmethod
    def min(x: torch.Tensor, dims: Sequence[int], keepdim: bool = False) -> torch.Tensor:
        return x.amin(list(dims), keepdim=keepdim)

    @staticmethod
    def var_mean(
        x: torch.Tensor, dims: Sequence[int], correction: int = 1, keepdim: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert x.dtype == torch.float32 or x.dtype == torch.float64
        return torch.var_mean(x, list(dims), correction=correction, keepdim=keepdim)

    @staticmethod
    def var(
        x: torch.Tensor, dims: Sequence[int], correction: int = 1, keepdim: bool = False
    ) -> torch.Tensor:
        return torch.var(x, list(dims), correction=correction, keepdim=keepdim)

    @staticmethod
    def broadcast_in_dim(
        x: torch.Tensor, shape: Sequence[int], dims: Sequence[int]
    ) -> torch.Tensor:
        assert x.dim() == len(dims), (x.shape, shape, dims)
        view = [1] * len(shape)
        for i, d in enumerate(dims):
            assert x.shape[i] in (1, shape[d]), (x.shape, shape, dims)
            view[d] = x.shape[i]
        return x.reshape(view).expand(list(shape))

    @staticmethod
    def reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        assert all(s >= 0 for s in shape), shape
        return x.reshape(list(shape))

    @staticmethod
    def permute(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        assert sorted(dims) == list(range(x.dim()))
        return x.permute(list(dims))

    @staticmethod
    def squeeze(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        assert all(x.shape[d] == 1 for d in dims)
        return x.squeeze(tuple(dims))

    @staticmethod
    def slice(
        x: torch.Tensor,
        starts: Sequence[int],
        ends: Sequence[int],
        strides: Sequence[int] | None = None,
    ) -> torch.Tensor:
        assert strides is None or all(s == 1 for s in strides), "nvFuser slices with unit steps"
        assert len(starts) == len(ends) == x.dim()
        index = tuple(slice(a, b) for a, b in zip(starts, ends, strict=True))
        return x[index]

    @staticmethod
    def pad(x: torch.Tensor, widths: Sequence[int], value: Any = None) -> torch.Tensor:
        assert all(w >= 0 for w in widths)
        fill = 0 if value is None else value.item()
        return torch.nn.functional.pad(x, list(widths), value=fill)

    @staticmethod
    def cat(
        tensors: Sequence[torch.Tensor], dim: int, manual_padding: bool = False
    ) -> torch.Tensor:
        assert len({t.dtype for t in tensors}) == 1
        return torch.cat(list(tensors), dim)

    @staticmethod
    def full(shape: Sequence[int], value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(list(shape), value.item(), dtype=dtype)

    @staticmethod
    def iota(
        length: int, start: torch.Tensor, step: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        return (torch.arange(length) * step.item() + start.item()).to(dtype)

    @staticmethod
    def stride_order(x: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
        outer_first = sorted(range(x.dim()), key=lambda d: -order[d])
        inverse = [outer_first.index(d) for d in range(x.dim())]
        return x.permute(outer_first).contiguous().permute(inverse)


def _floating(*values: Any) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values)


class ReferenceFusion:
    """A FusionDefinition stand-in that computes as it is defined, on the given inputs."""

    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        self._inputs = list(inputs)
        self.outputs: list[torch.Tensor] = []
        self.ops = ReferenceOps()

    def define_tensor(
        self,
        sizes: Sequence[int],
        strides: Sequence[int],
        dtype: torch.dtype,
        static_sizes: bool = False,
        is_cpu: bool = False,
    ) -> torch.Tensor:
        tensor = self._inputs.pop(0)
        assert list(tensor.shape) == list(sizes) and tensor.dtype == dtype
        return tensor

    def define_scalar(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        # A 0-dim tensor of that dtype: like an nvFuser scalar, it never promotes a tensor.
        return torch.tensor(value, dtype=dtype)

    def add_output(self, value: torch.Tensor) -> None:
        self.outputs.append(value)


def reference_dtypes(dtype: torch.dtype) -> torch.dtype:
    """The stand-in's DataType for a torch dtype is the torch dtype itself."""
    return dtype
