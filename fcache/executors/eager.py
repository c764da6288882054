"""The eager executor: runs a region's ops one by one, as PyTorch would without fcache.

It is the fallback of last resort, so it supports every region and cannot fail to
compile. Its artifact is the canonical text itself; it is not worth storing.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fcache.cache.artifact import Artifact
from fcache.executors.base import CompiledRegion
from fcache.frontend.canonicalize import CanonicalRegion, parse
from fcache.runtime import fast_eager
from fcache.target import Target


def eager_module(region: CanonicalRegion, device: torch.device) -> torch.fx.GraphModule:
    """The region as a GraphModule that runs its ops one by one, casts made cheap to call."""
    module = region.materialize(device)
    fast_eager(module.graph)
    module.recompile()
    return module


class EagerExecutor:
    name = "eager"
    version = "1"
    persistent = False
    compile_in_worker = False

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
