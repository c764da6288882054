"""The Inductor executor on a GPU: a training step against eager; a warm process with empty
Inductor and Triton caches that runs no compiler (no g++, nvcc or ptxas, and no Triton
compile: its cache gets cubins only); both CUDA routes (Inductor's Python wrapper, the
default, and AOTInductor); a region compiled on another GPU index loaded on this one, its
kernels not built again.

Skipped without CUDA. Model runs are fresh processes (tests/e2e/runner.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pickle
from pathlib import Path

import pytest
import torch

from fcache.executors import inductor_python, inductor_source
from fcache.executors.base import unchecked
from fcache.executors.eager import eager_module
from fcache.executors.inductor import InductorExecutor
from fcache.frontend.samples import inputs_for
from tests.e2e.runner import assert_matches_eager, compiler_shims, env_for, run_model
from tests.graphs import capture_regions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = ("--device", "cuda", "--executors", "inductor,eager")


TRITON_BUILDS = ("*.ptx", "*.ttir", "*.llir")  # what a Triton compile leaves in its cache


@pytest.mark.parametrize("route", ["python", "aoti"])
def test_float32_step_matches_eager_and_warm_process_builds_nothing(
    tmp_path: Path, route: str
) -> None:
    routing = {"FCACHE_INDUCTOR_CUDA": route}
    cold_env = env_for(tmp_path / "fcache", tmp_path / "inductor",
                       TRITON_CACHE_DIR=str(tmp_path / "triton"), **routing)  # fmt: skip
    cold = run_model(2, cold_env, *CUDA)
    # TF32 is off for float32 matmuls by default: only fusion reorders the arithmetic.
    assert_matches_eager(cold, tol=1e-3)
    assert cold["compiles"] == cold["unique_regions"] > 0
    assert cold["fallbacks"] == 0

    log = tmp_path / "compilers.log"
    fresh_triton = tmp_path / "fresh-triton"
    env = env_for(tmp_path / "fcache", tmp_path / "fresh-inductor",
                  PATH=compiler_shims(tmp_path / "shims", log),
                  TRITON_CACHE_DIR=str(fresh_triton), **routing)  # fmt: skip
    warm = run_model(2, env, *CUDA)
    assert_matches_eager(warm, tol=1e-3)
    assert warm["compiles"] == 0
    assert warm["hits"] == {"local": cold["unique_regions"]}
    runs = log.read_text().splitlines() if log.exists() else []
    assert runs == [], f"compilers ran in a warm process: {runs[:5]}"
    built = [p.name for pattern in TRITON_BUILDS for p in fresh_triton.rglob(pattern)]
    assert built == [], f"Triton compiled kernels in a warm process: {built[:5]}"


def test_a_warm_process_rebuilds_no_tuned_reduction(tmp_path: Path) -> None:
    """A reduction kernel stored with the config its autotuning chose is not rescaled at
    load (inductor_kernels.settle): Inductor halved the RBLOCK of Gemma2's attention
    softmax in every warm process, built that variant with Triton and benchmarked both
    (0.83 s of a 3.5 s warm step on an H200)."""
    pytest.importorskip("transformers")
    import subprocess
    import sys

    args = [sys.executable, "-m", "bench.measure", "--system", "fcache", "--family",
            "hf-gemma2", "--layers", "1", "--dim", "512", "--heads", "8", "--vocab", "32000",
            "--batch", "2", "--seq", "1024", "--dtype", "bfloat16", "--device", "cuda",
            "--steps", "1"]  # fmt: skip
    reports = []
    for run in ("cold", "warm"):
        triton = tmp_path / f"triton-{run}"
        env = env_for(tmp_path / "fcache", tmp_path / f"inductor-{run}",
                      TRITON_CACHE_DIR=str(triton))  # fmt: skip
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reports.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = reports
    assert cold["compiles"] > 0 and warm["compiles"] == 0
    built = [p.name for pattern in TRITON_BUILDS for p in triton.rglob(pattern)]
    assert built == [], f"Triton compiled kernels in a warm process: {built[:5]}"


def test_bfloat16_step_matches_eager_within_bf16_tolerance(tmp_path: Path) -> None:
    report = run_model(
        2, env_for(tmp_path / "fcache", tmp_path / "inductor"), *CUDA, "--dtype", "bfloat16"
    )
    assert report["max_abs_error"] < 0.1, report
    assert report["max_grad_error"] < 0.1, report
    assert report["compiles"] == report["unique_regions"]


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def _region_and_inputs() -> tuple[object, list[torch.Tensor]]:
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    regions = capture_regions(lambda f: f(x, w).float().sum().backward(), _rms_norm)
    region = max(regions, key=lambda r: len(r.text))  # the norm's backward: two reductions
    return region, inputs_for(region, torch.device("cuda", 0))


def test_python_route_artifact_loads_and_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The artifact keeps, per kernel, only the config that won autotuning in the compile;
    loading and running it benchmarks nothing."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    region, inputs = _region_and_inputs()
    executor = InductorExecutor()
    artifact = executor.compile(region, torch.device("cuda", 0))
    assert inductor_python.is_payload(artifact.payload)
    header, kernels = inductor_python.split(artifact.payload)
    assert header["index"] == 0 and header["kernels"] and kernels
    tuners = pickle.loads(kernels)["autotuners"]
    assert {len(t.kernel.compile_results) for t in tuners} == {1}, [
        (t.kernel_name, len(t.kernel.compile_results)) for t in tuners
    ]
    benchmarked: list[str] = []
    original = CachingAutotuner.benchmark_all_configs

    def counted(self: CachingAutotuner, *args: object, **kwargs: object) -> object:
        benchmarked.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CachingAutotuner, "benchmark_all_configs", counted)
    got = executor.load(artifact, torch.device("cuda", 0))(list(inputs))
    torch.cuda.synchronize()
    assert benchmarked == []
    expected = eager_module(region, torch.device("cuda", 0))(*inputs)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def _triton_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every Triton compile from here on (Inductor calls `triton.compile` by attribute)."""
    import triton

    compiles: list[str] = []
    original = triton.compile

    def counted(src: object, *args: object, **kwargs: object) -> object:
        compiles.append(getattr(getattr(src, "fn", None), "__name__", str(src)[:40]))
        return original(src, *args, **kwargs)

    monkeypatch.setattr(triton, "compile", counted)
    return compiles


def test_python_route_artifact_from_another_gpu_index_runs_on_this_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As if compiled on cuda:1 (header and source say 1): loaded on cuda:0, the region is
    retargeted, its built kernels moved here (no Triton compile), and they run here, with
    the right values."""
    region, inputs = _region_and_inputs()
    executor = InductorExecutor()
    artifact = executor.compile(region, torch.device("cuda", 0))
    header, kernels = inductor_python.split(artifact.payload)
    header["source"] = inductor_source.retarget(header["source"], 0, 1)
    assert "_DeviceGuard(1)" in header["source"] and "_DeviceGuard(0)" not in header["source"]
    header["index"] = 1
    moved = inductor_python.pack(header, kernels)
    compiles = _triton_compiles(monkeypatch)
    got = executor.load(dataclasses.replace(artifact, payload=moved),
                        torch.device("cuda", 0))(list(inputs))  # fmt: skip
    expected = eager_module(region, torch.device("cuda", 0))(*inputs)
    for a, b in zip(got, expected, strict=True):
        assert a.device == torch.device("cuda", 0)
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
    assert compiles == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_kernels_built_on_one_gpu_load_on_another_without_a_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank on cuda:1 loads what the rank on cuda:0 compiled (one key for both): its
    kernels' cubins are loaded there, none is built again from source (every kernel was,
    before: 42-62 Triton compiles in a warm rank of a 16-layer Llama under FSDP2 or DDP),
    and the outputs on cuda:1 are eager's."""
    region, inputs = _region_and_inputs()
    executor = InductorExecutor()
    artifact = executor.compile(region, torch.device("cuda", 0))
    assert inductor_python.split(artifact.payload)[0]["index"] == 0
    there = [x.to("cuda:1") for x in inputs]
    compiles = _triton_compiles(monkeypatch)
    got = executor.load(artifact, torch.device("cuda", 1))(list(there))
    torch.cuda.synchronize(1)
    assert compiles == []
    expected = eager_module(region, torch.device("cuda", 1))(*there)
    for a, b in zip(got, expected, strict=True):
        assert a.device == torch.device("cuda", 1)
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_loaded_kernels_launch_directly_once_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variant a stitched graph runs from its second call (fcache.executors.base.
    unchecked) launches each kernel through Inductor's CachingAutotuner.run once, then
    straight through its launcher (fcache.executors.inductor_launch), with eager's
    values; under a profiler, launches go through Inductor again, so it records them."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from fcache.executors.inductor_launch import Launch

    region, inputs = _region_and_inputs()
    device = torch.device("cuda", 0)
    executor = InductorExecutor()
    lean = unchecked(executor.load(executor.compile(region, device), device))
    # Inductor's wrapper as this torch writes it: its device guard found and dropped
    # (inductor_source.unchecked_source), the variant entered where cuda:0 is current.
    call = inspect.unwrap(lean)
    assert call is not lean, "the wrapper's device guard was not found"
    assert getattr(call, "__name__", "") == "call", "no unchecked variant to test"
    assert "_DeviceGuard" not in call.__code__.co_names
    through_inductor: list[str] = []
    original = CachingAutotuner.run

    def counted(self: CachingAutotuner, *args: object, **kwargs: object) -> object:
        through_inductor.append(self.fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CachingAutotuner, "run", counted)
    expected = eager_module(region, device)(*inputs)
    results = [lean(list(inputs))]
    kernels = len(through_inductor)
    assert kernels > 0
    results.append(lean(list(inputs)))
    torch.cuda.synchronize()
    # Newer Inductor launches directly itself (its kernels are then left unwrapped).
    torch_does_it = not any(isinstance(v, Launch) for v in call.__globals__.values())
    assert len(through_inductor) == (2 * kernels if torch_does_it else kernels)
    with torch.profiler.profile():
        results.append(lean(list(inputs)))
    assert len(through_inductor) == (3 if torch_does_it else 2) * kernels
    for got in results:
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def _write_at_length(cache: torch.Tensor, new: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """A static cache's update before its first call: `length` is still a CPU scalar."""
    position = torch.arange(new.shape[2], device=new.device) + length.to(new.device)
    return cache.index_copy(2, position, new * 2)


def test_a_cpu_scalar_input_of_a_cuda_region_compiles_as_one() -> None:
    """Inductor compiles the region for the devices its inputs have: traced with the CPU
    scalar on the GPU (fcache 2026-11-29), the kernel read it through a device pointer and
    every launch failed ("CUDA driver error: invalid argument"); Llama's static-cache
    prefill ran such a layer cut by op."""
    cache = torch.zeros(2, 4, 16, 8, device="cuda", dtype=torch.bfloat16)
    new = torch.randn(2, 4, 3, 8, device="cuda", dtype=torch.bfloat16)
    length = torch.tensor(5)
    (region,) = [
        r
        for r in capture_regions(lambda f: f(cache, new, length), _write_at_length)
        if any(s.device_type == "cpu" for s in r.inputs)
    ]
    device = torch.device("cuda", 0)
    assert [t.device.type for t in region.example_inputs(device)] == [
        s.device_type for s in region.inputs
    ]
    inputs = inputs_for(region, device)
    executor = InductorExecutor()
    got = executor.load(executor.compile(region, device), device)(list(inputs))
    expected = eager_module(region, device)(*inputs)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
