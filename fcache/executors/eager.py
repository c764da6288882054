"""The eager executor: runs a region's ops one by one, as PyTorch would without fcache.

It is the fallback of last resort, so it supports every region and cannot fail to
compile. Its artifact is the canonical text itself; it is not worth storing.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.fx as fx

from fcache.cache.artifact import Artifact
from fcache.executors.base import CompiledRegion
from fcache.frontend.canonicalize import CanonicalRegion, parse
from fcache.target import Target

_CONVERT = torch.ops.prims.convert_element_type.default


def eager_module(region: CanonicalRegion, device: torch.device) -> fx.GraphModule:
    """The region as a GraphModule that runs its ops one by one, casts made cheap to call."""
    module = region.materialize(device)
    fast_eager(module.graph)
    module.recompile()
    return module


def fast_eager(graph: fx.Graph) -> fx.Graph:
    """Replace, in place, ops that are slow to call in eager with equivalent ones.

    Inductor's decompositions turn every dtype cast into prims.convert_element_type, whose
    eager implementation is Python (torch._prims: empty_like, then copy_to): measured on
    the H100, 0.45 ms of host time per call against a few microseconds for
    aten._to_copy, which makes the same strides and always copies. A region that runs in
    eager (declined by every compiler, or not compiled at all) would pay that per cast."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is _CONVERT and len(node.args) == 2:
            node.target = torch.ops.aten._to_copy.default
            node.kwargs = {"dtype": node.args[1]}
            node.args = (node.args[0],)
    return graph


class EagerExecutor:
    name = "eager"
    version = "1"
    persistent = False
    compile_in_worker = False

    def available(self, device_type: str) -> bool:
        return True

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        return True

    def toolchain(self, target: Target) -> Mapping[str, str]:
        return {"torch": torch.__version__}

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        return Artifact(self.name, self.version, region.text)

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        forward = eager_module(parse(artifact.payload), device).forward

        def run(inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
            return forward(*inputs)

        return run
