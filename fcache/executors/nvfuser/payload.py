"""The nvFuser executor's artifact payload: definition, input descriptors and kernels, as bytes.

nvFuser 0.2.36 cannot serialize a compiled fusion, so the payload holds what makes a
warm start cheap: the canonical region (re-translated on load, deterministically), the
input descriptors nvFuser was given, and the kernel_db entries (source, NVRTC options,
cubin) of the fusion's kernels, which spare the loading process NVRTC. No pickle:

    offset  size  field
    0       4     magic b"FCNV"
    4       2     payload format version (u16, little-endian) = FORMAT_VERSION
    6       2     reserved, 0
    8       4     header length H (u32)
    12      H     header: UTF-8 JSON object, keys sorted
                    region       canonical region text (what `load` translates again)
                    definition   nvFuser's printout of the definition (repr(fd)): for
                                 people and `fcache explain`; never executed
                    inputs       per input: sizes, strides, dtype as defined
                    nvfuser      nvfuser_direct.version() that compiled it
                    steps        [] for one fusion; else the region cut along nvFuser's
                                 segments (fcache.executors.nvfuser.segments), in run
                                 order, each {region: canonical text, inputs, outputs:
                                 region values as [kind, index]}: one fusion each
                    kernels      per kernel: signature, compile_args, code and cubin sizes
                                 (of the steps' fusions where there are steps)
    12+H    ...   each kernel's code bytes then cubin bytes, in header order; nothing after

The envelope around it (fcache.cache.artifact) already checksums these bytes; `decode`
still checks every length, so a payload from a buggy writer is a CorruptArtifact, never
an index error.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fcache.errors import CorruptArtifact
from fcache.executors.nvfuser.kernel_db import Kernel

MAGIC = b"FCNV"
FORMAT_VERSION = 2
_PREAMBLE = struct.Struct("<4sHHI")


@dataclass(frozen=True, slots=True)
class Payload:
    """What an nvFuser artifact carries. `region` is canonical text (bytes)."""

    region: bytes
    definition: str
    nvfuser: str
    inputs: Sequence[Mapping[str, Any]] = ()
    kernels: Sequence[Kernel] = field(default_factory=tuple)
    steps: Sequence[StepRecord] = ()


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a cut region: its canonical text and the region values it reads and
    writes, as (kind, index) pairs of the parent region's Refs."""

    region: bytes
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]


def encode(payload: Payload) -> bytes:
    header = json.dumps(
        {
            "region": payload.region.decode(),
            "definition": payload.definition,
            "nvfuser": payload.nvfuser,
            "inputs": [dict(i) for i in payload.inputs],
            "steps": [
                {
                    "region": step.region.decode(),
                    "inputs": [list(r) for r in step.inputs],
                    "outputs": [list(r) for r in step.outputs],
                }
                for step in payload.steps
            ],
            "kernels": [
                {
                    "signature": k.signature,
                    "compile_args": k.compile_args,
                    "code_bytes": len(k.code),
                    "cubin_bytes": len(k.cubin),
                }
                for k in payload.kernels
            ],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    blobs = b"".join(part for k in payload.kernels for part in (k.code, k.cubin))
    return b"".join((_PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header)), header, blobs))


def decode(data: bytes) -> Payload:
    """Bytes -> Payload; raises CorruptArtifact for anything but a whole, well-formed one."""
    if len(data) < _PREAMBLE.size:
        raise CorruptArtifact(f"nvFuser payload is {len(data)} bytes, shorter than its preamble")
    magic, version, _, hlen = _PREAMBLE.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise CorruptArtifact(f"nvFuser payload magic {magic!r} version {version}")
    start = _PREAMBLE.size + hlen
    try:
        header = json.loads(data[_PREAMBLE.size : start])
        kernels, offset = [], start
        for k in header["kernels"]:
            code_end = offset + int(k["code_bytes"])
            cubin_end = code_end + int(k["cubin_bytes"])
            if cubin_end > len(data):
                raise ValueError("kernel bytes run past the payload")
            kernels.append(
                Kernel(
                    str(k["signature"]),
                    str(k["compile_args"]),
                    bytes(data[offset:code_end]),
                    bytes(data[code_end:cubin_end]),
                )
            )
            offset = cubin_end
        if offset != len(data):
            raise ValueError(f"{len(data) - offset} stray bytes after the kernels")
        return Payload(
            region=str(header["region"]).encode(),
            definition=str(header["definition"]),
            nvfuser=str(header["nvfuser"]),
            inputs=tuple(header["inputs"]),
            kernels=tuple(kernels),
            steps=tuple(
                StepRecord(
                    str(step["region"]).encode(),
                    tuple(_ref(r) for r in step["inputs"]),
                    tuple(_ref(r) for r in step["outputs"]),
                )
                for step in header["steps"]
            ),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptArtifact(f"unreadable nvFuser payload: {exc}") from None


def _ref(value: Any) -> tuple[str, int]:
    kind, index = value
    if kind not in ("in", "node"):
        raise ValueError(f"step value of kind {kind!r}")
    return str(kind), int(index)
