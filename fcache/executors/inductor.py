"""The Inductor executor: one AOTInductor package per region (Triton on CUDA, C++ on CPU).

Why AOTInductor and not `standalone_compile` + `CompiledArtifact.save/load`: measured on
torch 2.13 CPU (bench/inductor_packaging.py, results in bench/results/), per region:

    route                         compile    load (fresh process, empty Inductor cache)   call
    standalone_compile            ~1 s       ~3 s: g++ rebuilds every kernel (the
                                             artifact carries C++ source only)             ~11 us
    AOTInductor package           ~6 s       ~2 ms: dlopen, no compiler                    6-9 us

A package carries its built kernels (the shared object on CPU, cubins on CUDA), loads
without importing Inductor, takes the device index at load time (a `standalone_compile`
artifact bakes `cuda:0` into its wrapper, so ranks on other GPUs could not share it), and
its C++ runner calls a little faster. Its compile is slower (the C++ wrapper is built with
g++), a cost paid once per unique region per cluster, and in parallel on a cold start.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping

import torch

from fcache.cache.artifact import Artifact
from fcache.errors import CompileError, CorruptArtifact
from fcache.executors.base import CompiledRegion
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target

# Options that change the generated code; they are part of the key (toolchain).
INDUCTOR_OPTIONS: Mapping[str, object] = {
    # Regions are small; -O1 on the wrapper is what Inductor uses by default too.
    "aot_inductor.compile_wrapper_opt_level": "O1",
}
# On CUDA, on top. Measured on the H100 (torch 2.11), one RoPE-backward region, first
# compile in a process with an empty Inductor cache: 76 s as Inductor sets it, 22 s
# without the CPU vector-ISA probe, 15 s without the precompiled header as well; later
# compiles in that process take 8-12 s (bench/results/gpu-h100-aoti-first-compile.json).
# - The probe compiles and loads a test library per x86 ISA (AVX-512, AVX2) against
#   torch's headers, to pick the flags of C++ kernels. A CUDA package has none: its C++
#   is the wrapper, which launches Triton kernels.
# - The precompiled header costs 6 s once per Inductor cache and saves about 1.3 s per
#   wrapper; a compile worker builds a handful of regions, so it does not pay off.
CUDA_OPTIONS: Mapping[str, object] = {
    "cpp.vec_isa_ok": False,
    "aot_inductor.precompile_headers": False,
}


def options(device_type: str) -> dict[str, object]:
    """The Inductor options fcache compiles with for a device type."""
    return {**INDUCTOR_OPTIONS, **(CUDA_OPTIONS if device_type == "cuda" else {})}


def _triton_version() -> str:
    try:
        import triton

        return str(triton.__version__)
    except ImportError:
        return "none"


class InductorExecutor:
    name = "inductor"
    version = "aoti-1"
    persistent = True
    compile_in_worker = True

    def available(self, device_type: str) -> bool:
        return device_type in ("cpu", "cuda")

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        # Inductor lowers every core aten op (falling back to ATen calls inside the
        # package where it has no lowering); complex dtypes are its known gap.
        return target.device_type in ("cpu", "cuda") and not any(
            spec.dtype.is_complex for spec in region.inputs
        )

    def toolchain(self, target: Target) -> Mapping[str, str]:
        chain = {
            "torch": f"{torch.__version__}+{torch.version.git_version[:12]}",
            "options": repr(sorted(options(target.device_type).items())),
        }
        if target.device_type == "cuda":
            chain["triton"] = _triton_version()
            chain["cuda"] = str(torch.version.cuda)
        return chain

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        start = time.perf_counter()
        module = region.materialize(device)
        example = tuple(region.example_inputs(device))
        try:
            program = torch.export.export(module, example, strict=False)
            with tempfile.TemporaryDirectory(prefix="fcache-aoti-") as tmp:
                path = os.path.join(tmp, "region.pt2")
                torch._inductor.aoti_compile_and_package(
                    program, package_path=path, inductor_configs=options(device.type)
                )
                with open(path, "rb") as f:
                    payload = f.read()
        except Exception as exc:
            raise CompileError(f"AOTInductor failed: {type(exc).__name__}: {exc}") from exc
        return Artifact(
            self.name,
            self.version,
            payload,
            compile_seconds=time.perf_counter() - start,
            producer={"torch": torch.__version__},
        )

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        index = device.index if device.index is not None else -1
        if device.type == "cuda" and index < 0:
            index = torch.cuda.current_device()
        # The loader reads a path; it unpacks the package into its own directory, so the
        # file can go as soon as the loader exists.
        with tempfile.NamedTemporaryFile(prefix="fcache-", suffix=".pt2") as f:
            f.write(artifact.payload)
            f.flush()
            try:
                loader = torch._C._aoti.AOTIModelPackageLoader(f.name, "model", False, 1, index)
            except RuntimeError as exc:
                raise CorruptArtifact(f"AOTInductor package does not load: {exc}") from exc
        return loader.boxed_run
