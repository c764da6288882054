"""Region -> CanonicalRegion: a name-free, position-based form that isomorphic regions share.

Two regions that compute the same thing on inputs of the same kind get byte-identical
canonical text, whatever their node names, parameter names, layer indices, stack traces or
device index. The text is both what the key hashes and what executors compile: an executor
never sees the original FX nodes, so nothing outside the key can leak into a kernel.

The text is compact JSON with sorted keys:

    {"inputs":  [{"device": "cpu", "dtype": "float32", "shape": [2, 16], "stride": [16, 1]}, ...],
     "nodes":   [{"op": "aten.mul.Tensor", "args": [{"in": 0}, {"node": 3}], "kwargs": {}}, ...],
     "outputs": [{"node": 7}, ...],
     "version": 1}

Inputs are numbered by first use, nodes by position, outputs in graph order. Values are
JSON scalars and lists, plus tagged objects for references ({"in": i}, {"node": j}) and
torch values ({"dtype": ...}, {"device": type}, {"layout": ...}, {"memory_format": ...},
{"float": "inf"|"-inf"|"nan"}, {"complex": [re, im]}). Devices keep only their type: the
index is bound when the region is materialized, so ranks on different GPUs share one key.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fcache.frontend.partition import Region

CANONICAL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Ref:
    """A value inside a canonical region: region input `index` or the result of node `index`."""

    kind: str  # "in" or "node"
    index: int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What of a tensor input changes the kernel: dtype, shape, strides, device type."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device_type: str

    @classmethod
    def of(cls, value: torch.Tensor) -> TensorSpec:
        return cls(value.dtype, tuple(value.shape), tuple(value.stride()), value.device.type)

    def device_on(self, device: torch.device) -> torch.device:
        """Where this input lives when its region runs on `device`: there, for an input of
        that device type; else on its own (a CPU scalar of a CUDA region, such as a static
        cache's length before its first update, stays a CPU scalar, and Inductor compiles
        a kernel that reads it as one)."""
        return device if self.device_type == device.type else torch.device(self.device_type)

    def empty(self, device: torch.device) -> torch.Tensor:
        """An uninitialized tensor with exactly these strides, for the region run on
        `device` (for tracing and compiling)."""
        return torch.empty_strided(
            self.shape, self.stride, dtype=self.dtype, device=self.device_on(device)
        )


@dataclass(frozen=True, slots=True)
class CanonicalNode:
    """One op. `op` is an aten overload name ("aten.mul.Tensor") or "getitem"."""

    op: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    def refs(self) -> list[Ref]:
        """The values this op reads (Refs among its arguments, in nested tuples too)."""
        found: list[Ref] = []

        def walk(value: Any) -> None:
            if isinstance(value, Ref):
                found.append(value)
            elif isinstance(value, (tuple, list)):
                for v in value:
                    walk(v)

        walk(self.args)
        walk(tuple(self.kwargs.values()))
        return found


@dataclass(frozen=True, slots=True, eq=False)
class CanonicalRegion:
    """A region in canonical form. `text` determines every other field (see `parse`), so
    equality and hashing go by the text alone."""

    inputs: tuple[TensorSpec, ...]
    nodes: tuple[CanonicalNode, ...]
    outputs: tuple[Ref, ...]
    text: bytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CanonicalRegion) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def materialize(self, device: torch.device) -> fx.GraphModule:
        """The region as a runnable GraphModule, its device-typed constants bound to `device`."""
        return materialize(self, device)

    def example_inputs(self, device: torch.device) -> list[torch.Tensor]:
        return [spec.empty(device) for spec in self.inputs]


class NotCanonicalizable(Exception):
    """The region holds a value canonical text cannot express (it then runs in eager)."""


def canonicalize(region: Region) -> CanonicalRegion:
    """Rename a region's values by position and strip everything but what changes kernels.

    Deterministic: depends only on the region's ops, constants and input metadata.
    Raises NotCanonicalizable for values with no canonical form (e.g. symbolic shapes).
    """
    number: dict[fx.Node, Ref] = {}
    for i, node in enumerate(region.inputs):
        number[node] = Ref("in", i)
    inputs = tuple(_input_spec(node) for node in region.inputs)
    nodes = []
    for j, node in enumerate(region.nodes):
        nodes.append(
            CanonicalNode(
                op=op_name(node.target),
                args=tuple(_canon(a, number) for a in node.args),
                kwargs={k: _canon(v, number) for k, v in sorted(node.kwargs.items())},
            )
        )
        number[node] = Ref("node", j)
    outputs = tuple(number[node] for node in region.outputs)
    text = _dumps(inputs, nodes, outputs)
    return CanonicalRegion(inputs, tuple(nodes), outputs, text)


def op_name(target: object) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.mul.Tensor"
    raise NotCanonicalizable(f"op {target!r} has no canonical name")


def resolve_op(name: str) -> Any:
    """Inverse of op_name: "aten.mul.Tensor" -> torch.ops.aten.mul.Tensor."""
    if name == "getitem":
        return operator.getitem
    namespace, packet, overload = name.split(".")
    ops = getattr(torch.ops, namespace)
    if namespace == "prims" and not hasattr(ops, packet):
        # Inductor's decompositions emit prims of its own (prims.fma on CUDA), registered
        # when torch._inductor.inductor_prims is imported: a compile worker or a warm
        # process may not have imported it yet.
        importlib.import_module("torch._inductor.inductor_prims")
    return getattr(getattr(ops, packet), overload)


def _input_spec(node: fx.Node) -> TensorSpec:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise NotCanonicalizable(f"input {node.name} is not a tensor: {type(value).__name__}")
    if any(not isinstance(s, int) for s in (*value.shape, *value.stride())):
        raise NotCanonicalizable(f"input {node.name} has a symbolic shape {tuple(value.shape)}")
    return TensorSpec.of(value)


def _canon(value: Any, number: Mapping[fx.Node, Ref]) -> Any:
    """An FX argument -> its canonical Python value (Ref, scalar, torch value or tuple)."""
    if isinstance(value, fx.Node):
        return number[value]
    if isinstance(value, (list, tuple)):
        return tuple(_canon(v, number) for v in value)
    if isinstance(value, torch.device):
        return torch.device(value.type)
    if value is None or isinstance(
        value, (bool, int, float, complex, str, torch.dtype, torch.layout, torch.memory_format)
    ):
        return value
    raise NotCanonicalizable(f"argument {value!r} of type {type(value).__name__}")


# --- text form --------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, Ref):
        return {value.kind: value.index}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # "inf", "-inf", "nan": plain JSON has no such numbers
    if isinstance(value, complex):
        return {"complex": [_encode(value.real), _encode(value.imag)]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    ((tag, payload),) = value.items()
    if tag in ("in", "node"):
        return Ref(tag, int(payload))
    if tag == "float":
        return float(payload)
    if tag == "complex":
        real, imag = (_decode(part) for part in payload)
        return complex(real, imag)
    if tag == "device":
        return torch.device(payload)
    if tag in ("dtype", "layout", "memory_format"):
        return getattr(torch, payload)
    raise ValueError(f"unknown tag {tag!r} in canonical text")


def _dumps(
    inputs: Sequence[TensorSpec], nodes: Sequence[CanonicalNode], outputs: Sequence[Ref]
) -> bytes:
    doc = {
        "version": CANONICAL_VERSION,
        "inputs": [
            {
                "dtype": str(s.dtype).removeprefix("torch."),
                "shape": list(s.shape),
                "stride": list(s.stride),
                "device": s.device_type,
            }
            for s in inputs
        ],
        "nodes": [
            {
                "op": n.op,
                "args": [_encode(a) for a in n.args],
                "kwargs": {k: _encode(v) for k, v in n.kwargs.items()},
            }
            for n in nodes
        ],
        "outputs": [_encode(r) for r in outputs],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def region_of(
    inputs: Sequence[TensorSpec], nodes: Sequence[CanonicalNode], outputs: Sequence[Ref]
) -> CanonicalRegion:
    """A canonical region from its parts (refs already numbered: inputs, then nodes in order)."""
    return parse(_dumps(inputs, nodes, outputs))


def parse(text: bytes) -> CanonicalRegion:
    """Canonical text -> CanonicalRegion (the inverse of canonicalize's text)."""
    doc = json.loads(text)
    if doc.get("version") != CANONICAL_VERSION:
        raise ValueError(f"canonical text version {doc.get('version')!r}")
    inputs = tuple(
        TensorSpec(getattr(torch, s["dtype"]), tuple(s["shape"]), tuple(s["stride"]), s["device"])
        for s in doc["inputs"]
    )
    nodes = tuple(
        CanonicalNode(
            n["op"],
            tuple(_decode(a) for a in n["args"]),
            {k: _decode(v) for k, v in n["kwargs"].items()},
        )
        for n in doc["nodes"]
    )
    outputs = tuple(_decode(r) for r in doc["outputs"])
    return CanonicalRegion(inputs, nodes, outputs, bytes(text))


# --- back to FX ---------------------------------------------------------------------------


def materialize(region: CanonicalRegion, device: torch.device) -> fx.GraphModule:
    """Build a GraphModule that computes the region; placeholders carry fake-free metadata.

    Device constants take `device` (type and index), so a region canonicalized on cuda:0
    runs on whatever GPU the loading process uses.
    """
    graph = fx.Graph()
    values: dict[Ref, fx.Node] = {}
    for i in range(len(region.inputs)):
        values[Ref("in", i)] = graph.placeholder(f"in{i}")

    def bind(value: Any) -> Any:
        if isinstance(value, Ref):
            return values[value]
        if isinstance(value, tuple):
            return [bind(v) for v in value]
        if isinstance(value, torch.device):
            return device if value.type == device.type else value
        return value

    for j, node in enumerate(region.nodes):
        args = tuple(bind(a) for a in node.args)
        kwargs = {k: bind(v) for k, v in node.kwargs.items()}
        values[Ref("node", j)] = graph.call_function(resolve_op(node.op), args, kwargs)
    graph.output(tuple(values[r] for r in region.outputs))
    return fx.GraphModule(torch.nn.Module(), graph)
