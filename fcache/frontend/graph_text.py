"""A whole aten graph <-> JSON bytes, without pickle: what fcache keeps of a captured graph so
that a warm process can stitch it again without tracing (fcache.engine.programs.graph).

The graphs AOTAutograd hands a compiler are flat: placeholders, calls of aten/prims
overloads (and operator.getitem), tensor constants (get_attr), one output. Each node is
kept with its name, op, arguments and, for values, the tensor facts later stages may read
(shape, stride, dtype, device, storage offset, requires_grad); a constant with its
contents (base64 of its bytes, up to MAX_CONSTANT_BYTES in all). Loading builds the nodes
without those facts: stitching a graph needs none of them, and building a fake tensor per
node costs seconds on a 16-layer model. `with_values` attaches them (as FakeTensors) when
a caller needs them after all (CUDA-graph checks read devices and mutations); `owner`
gives the constants a module to live on.

Anything else (parameters read by get_attr, higher-order ops, symbolic sizes, opaque
objects) raises NotSerializable; the caller then keeps no program for that graph.
Deterministic: the same graph gives the same bytes.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen

from fcache.frontend.canonicalize import op_name, resolve_op
from fcache.frontend.constants import constant_of

VERSION = 2  # 2: tensor constants
# Bytes of constants a stored graph may carry (a model's lifted tables, index lists).
MAX_CONSTANT_BYTES = 16 << 20
_CONSTANT = "fcache_constant"  # meta of a loaded get_attr node: the tensor it reads


class NotSerializable(Exception):
    """The graph holds something this text cannot express."""


def dumps(gm: fx.GraphModule) -> bytes:
    nodes = []
    constant_bytes = 0
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output", "get_attr"):
            raise NotSerializable(f"{node.op} node {node.name}")
        record: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "args": _encode(node.args),
            "kwargs": {k: _encode(v) for k, v in node.kwargs.items()},
        }
        if node.op == "get_attr":
            value = constant_of(gm, node)
            if value is None or isinstance(value, torch.nn.Parameter):
                raise NotSerializable(f"get_attr node {node.name} reads no tensor constant")
            constant_bytes += value.numel() * value.element_size()
            if constant_bytes > MAX_CONSTANT_BYTES:
                raise NotSerializable(f"constants over {MAX_CONSTANT_BYTES} bytes")
            record["target"] = node.target
            record["constant"] = _encode_constant(value)
        if node.op == "call_function":
            try:
                record["target"] = op_name(node.target)
            except Exception as exc:  # NotCanonicalizable: a higher-order op, a Python function
                raise NotSerializable(str(exc)) from None
        if node.op != "output":
            record["val"] = _encode_value(node.meta.get("val"))
        nodes.append(record)
    doc = {"version": VERSION, "boxed": isinstance(gm.graph._codegen, _BoxedCodeGen)}
    doc["nodes"] = nodes
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def loads(data: bytes) -> fx.Graph:
    """The graph of `dumps`, its nodes without `meta["val"]` (see `with_values`)."""
    doc = json.loads(data)
    if doc.get("version") != VERSION:
        raise NotSerializable(f"graph text version {doc.get('version')!r}")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for record in doc["nodes"]:
        args = _decode(record["args"], env)
        kwargs = {k: _decode(v, env) for k, v in record["kwargs"].items()}
        if record["op"] == "output":
            graph.output(args[0])
            continue
        if record["op"] == "placeholder":
            node = graph.placeholder(record["name"])
        elif record["op"] == "get_attr":
            node = graph.get_attr(record["target"])
            node.name = record["name"]
            node.meta[_CONSTANT] = _decode_constant(record["constant"])
        else:
            node = graph.call_function(resolve_op(record["target"]), tuple(args), kwargs)
            node.name = record["name"]
        node.meta["fcache_val"] = record["val"]
        env[record["name"]] = node
    if doc["boxed"]:
        graph.set_codegen(_BoxedCodeGen())
    return graph


def owner(graph: fx.Graph) -> torch.nn.Module:
    """A module holding the constants a loaded graph's get_attr nodes read."""
    module = torch.nn.Module()
    for node in graph.nodes:
        if node.op == "get_attr":
            *path, name = node.target.split(".")  # type: ignore[union-attr]
            holder = module
            for part in path:
                if not hasattr(holder, part):
                    holder.add_module(part, torch.nn.Module())
                holder = getattr(holder, part)
            holder.register_buffer(name, node.meta[_CONSTANT], persistent=False)
    return module


def stored_facts(node: fx.Node) -> tuple[list[int], list[int], str, str, int] | None:
    """A loaded node's tensor facts without building a tensor: (shape, stride, dtype name,
    device, storage offset), or None if its value is no tensor."""
    stored = node.meta.get("fcache_val")
    if not (isinstance(stored, dict) and "T" in stored):
        return None
    shape, stride, dtype, device, offset, _ = stored["T"]
    return shape, stride, dtype, device, offset


def with_values(graph: fx.Graph) -> fx.Graph:
    """Give every node of a loaded graph its `meta["val"]` (FakeTensors), in place. Nodes
    that have one keep it: a traced graph, or one given its values before, is unchanged."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    made: dict[str, Any] = {}  # nodes of one layout share one fake tensor: only facts are read
    for node in graph.nodes:
        if "fcache_val" in node.meta and "val" not in node.meta:
            node.meta["val"] = _decode_value(node.meta["fcache_val"], mode, made)
    return graph


# --- values ---------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return {"n": value.name}
    if isinstance(value, (list, tuple)):
        return {"l" if isinstance(value, list) else "t": [_encode(v) for v in value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    for kind in (torch.dtype, torch.layout, torch.memory_format):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    raise NotSerializable(f"argument {value!r} ({type(value).__name__})")


def _decode(value: Any, env: dict[str, fx.Node]) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, payload),) = value.items()
    if tag == "n":
        return env[payload]
    if tag == "l":
        return [_decode(v, env) for v in payload]
    if tag == "t":
        return tuple(_decode(v, env) for v in payload)
    if tag == "f":
        return float(payload)
    if tag == "device":
        return torch.device(payload)
    if tag in ("dtype", "layout", "memory_format"):
        return getattr(torch, payload)
    raise NotSerializable(f"unknown tag {tag!r}")


def _encode_constant(value: torch.Tensor) -> dict[str, Any]:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd compiles (and fcache dumps the graph) under a fake mode; this is real,
    # and copying a CUDA constant to the CPU under that mode raises.
    with unset_fake_temporarily():
        dense = value.detach().contiguous().cpu()
        data = dense.reshape(-1).view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(dense.dtype).removeprefix("torch."),
        "shape": list(dense.shape),
        "device": str(value.device),
        "data": base64.b64encode(data).decode(),
    }


def _decode_constant(record: dict[str, Any]) -> torch.Tensor:
    raw = bytearray(base64.b64decode(record["data"]))
    dtype = getattr(torch, record["dtype"])
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(record["shape"]).to(record["device"])


def _encode_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        dims = (*value.shape, *value.stride(), value.storage_offset())
        if any(not isinstance(d, int) for d in dims):
            raise NotSerializable("a symbolic shape")
        return {
            "T": [
                list(value.shape),
                list(value.stride()),
                str(value.dtype).removeprefix("torch."),
                str(value.device),
                value.storage_offset(),
                bool(value.requires_grad),
            ]
        }
    if isinstance(value, (list, tuple)):
        return {"l": [_encode_value(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise NotSerializable(f"a value of type {type(value).__name__}")


def _decode_value(value: Any, mode: Any, made: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "T" in value:
        spec = json.dumps(value["T"])
        if spec not in made:
            shape, stride, dtype, device, offset, requires_grad = value["T"]
            with mode:
                fake = torch.empty_strided(
                    shape, stride, dtype=getattr(torch, dtype), device=device
                )
                if offset:
                    fake = fake.as_strided(shape, stride, offset)
            made[spec] = fake.requires_grad_(requires_grad and fake.is_floating_point())
        return made[spec]
    if isinstance(value, dict) and "l" in value:
        return tuple(_decode_value(v, mode, made) for v in value["l"])
    return value
