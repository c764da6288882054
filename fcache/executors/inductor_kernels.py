"""The built Triton kernels a CUDA artifact of Inductor's Python route carries
(fcache.executors.inductor_python): their cubins, read where Triton built them and written
where Inductor's loader reads them; each kernel settled on the config its autotuning
chose; and the kernels moved to another GPU index than the one they were built on."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from fcache.errors import CorruptArtifact
from fcache.executors.inductor_source import kernel_sources

log = logging.getLogger(__name__)


def cubins(static: list[Any], index: int) -> dict[str, bytes]:
    """The built cubin of each kept config, by its path under Triton's cache directory:
    where Inductor's loader (`reload_cubin_path`) looks for it, and where Triton built it in
    this process. A pickled autotuner does not carry it (Inductor drops it, to keep its own
    cache entries small)."""
    from torch._inductor.runtime import triton_heuristics as th

    base = th.triton_cache_dir(index)
    found = {}
    for entry in static:
        for result in entry.kernel.compile_results:
            kernel = result.kernel
            rel = os.path.join(th.triton_hash_to_path_key(kernel.hash), f"{kernel.name}.cubin")
            with open(os.path.join(base, rel), "rb") as f:
                found[rel] = f.read()
    return found


def moved(autotuners: list[Any], source: str, index: int) -> list[Any]:
    """Built kernels of a wrapper compiled on another GPU index, made cuda:`index`'s:
    `source` is the wrapper retargeted there. Each kernel's device becomes `index` (where
    its launcher loads the cubin, the folder its cubin is read from) and it is registered
    under the kernel source the retargeted wrapper passes to Inductor. [] where a kernel
    is not in the form this knows: Inductor then builds that wrapper's kernels from source
    (slower, never wrong)."""
    from torch._inductor.async_compile import CompiledTritonKernels

    sources = kernel_sources(source)
    moved = []
    for entry in autotuners:
        kernel = entry.kernel
        text = sources.get(entry.kernel_name)
        props = getattr(kernel, "device_props", None)
        meta = getattr(kernel, "triton_meta", None)
        results = getattr(kernel, "compile_results", None) or []
        metas = [getattr(r, "compile_meta", None) for r in results]
        if (
            text is None
            or not hasattr(props, "_replace")
            or not isinstance(meta, dict)
            or not metas
            or not all(isinstance(m, dict) for m in metas)
        ):
            log.debug("fcache: kernel %s not moved to cuda:%d; built from source",
                      entry.kernel_name, index)  # fmt: skip
            return []
        kernel.device_props = props._replace(index=index)
        meta["device"] = index
        for result_meta in metas:
            result_meta["device"] = index
        moved.append(dataclasses.replace(entry, cache_key=CompiledTritonKernels.key(text)))
    return moved


def settle(kernel: Any) -> None:
    """A kernel that comes with the one config its autotuning chose runs that config: no
    occupancy rescaling at load. Inductor otherwise halves a reduction's RBLOCK where the
    built kernel uses many registers (`_dynamic_scale_rblock`), builds that variant with
    Triton in the loading process and benchmarks both at the first call, although the
    compile worker already did and chose: 0.83 s of a warm Gemma2 step on an H200 (one
    softmax kernel, `triton_red_fused_exp_prepare_softmax_online_sub`)."""
    if len(getattr(kernel, "compile_results", None) or ()) != 1:
        return  # untuned (every config kept): Inductor tunes it as usual
    kernel.inductor_meta = {**(kernel.inductor_meta or {}), "dynamic_scale_rblock": False}
    kernel.__dict__.pop("_could_rblock_scale", None)  # a cached answer from the worker


def place_cubins(cubins: dict[str, bytes], index: int) -> None:
    """Write each cubin where Inductor's loader reads it, unless it is there: Triton's
    cache directory, named by the kernel's hash (the same bytes for the same name)."""
    from torch._inductor.runtime import triton_heuristics as th

    base = th.triton_cache_dir(index)
    for rel, data in cubins.items():
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or len(parts) != 2:
            raise CorruptArtifact(f"Inductor Python artifact: cubin path {rel!r}")
        path = os.path.join(base, rel)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.{os.getpid()}.tmp"
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
