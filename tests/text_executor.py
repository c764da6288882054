"""TextExecutor: the README's ten-line example executor, and the CPU model matrix's.

It stores a region's canonical text and runs it op by op when loaded. That makes it a
cheap executor that still goes through every part of fcache but a compiler's own code
generation: capture, partition, canonical forms, keys, the LMDB tier and its envelope,
validation against eager, stitching, warm processes. The compilers themselves are
tested per executor (tests/unit/executors, tests/gpu) and on the GPU model matrix.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fcache.cache.artifact import Artifact
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion, parse
from fcache.target import Target


class TextExecutor:
    name, version, persistent, compile_in_worker = "text", "1", True, False

    def available(self, device_type: str) -> bool:
        return True

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        return True

    def toolchain(self, target: Target) -> Mapping[str, str]:
        return {"torch": torch.__version__}

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        return Artifact(self.name, self.version, region.text)

    def load(self, artifact: Artifact, device: torch.device):  # type: ignore[no-untyped-def]
        forward = parse(artifact.payload).materialize(device).forward
        return lambda inputs: forward(*inputs)


def register() -> None:
    registry.register("text", TextExecutor)
