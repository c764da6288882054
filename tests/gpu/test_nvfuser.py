"""The nvFuser executor on a GPU: translations against eager, a bf16 training step, compile
counts that do not grow with depth, and a warm process that compiles nothing.

Skipped without CUDA or nvfuser_direct. FCACHE_REPORT_DIR, when set, receives the JSON
reports of the cold and warm processes (tests/gpu/nvfuser_run.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import fcache
from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.executors import registry
from fcache.executors.nvfuser import payload as payload_format
from fcache.executors.nvfuser import translate as tr
from fcache.frontend.canonicalize import CanonicalRegion

try:
    import nvfuser_direct  # noqa: F401

    HAVE_NVFUSER = True
except ImportError:
    HAVE_NVFUSER = False

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and HAVE_NVFUSER), reason="needs CUDA and nvfuser_direct"
    ),
]

# Shared with the CPU translation tests.
from tests.graphs import capture_regions, random_inputs, same_layout  # noqa: E402

HERE = Path(__file__).parent
SMALL = ModelConfig(family="llama", layers=2, dim=64, heads=4, vocab=256, max_seq=128)
# The anchor's shape (DESIGN.md): d=1024, 16 heads, batch 2 x 2048 tokens.
ANCHOR = ["--layers", "2", "--dim", "1024", "--heads", "16", "--seq", "2048", "--vocab", "4096"]


def settings(tmp_path: Path) -> fcache.Settings:
    return fcache.Settings(cache_dir=tmp_path, compile_workers=1, progress=False)


def stats() -> dict[str, Any]:
    """The counters of the process's nvFuser executor, the one fcache.jit compiles with."""
    return registry.create("nvfuser").stats()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm().clamp_min(1e-6))


def training_step(
    model: torch.nn.Module, tokens: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any]]:
    out = model(tokens)
    out.float().square().mean().backward()
    grads = {
        n.removeprefix("_orig_mod."): p.grad.detach().clone()  # torch.compile's wrapper
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    return out.detach(), grads


# --- the model ------------------------------------------------------------------------------


def test_llama_bf16_step_matches_eager(tmp_path: Path) -> None:
    eager = build(SMALL).to(device="cuda", dtype=torch.bfloat16)
    model = copy.deepcopy(eager)
    tokens = sample_tokens(SMALL, 2, 64).cuda()
    compiled = fcache.jit(model, executors=["nvfuser", "eager"], settings=settings(tmp_path))
    out, grads = training_step(compiled, tokens)
    want_out, want_grads = training_step(eager, tokens)
    assert relative_error(out, want_out) < 2e-2
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        assert relative_error(grad, want_grads[name]) < 3e-2, name
    record = fcache.stats(compiled)
    print("\nllama bf16 step:", json.dumps(record.to_dict()))
    errors = {n: round(relative_error(g, want_grads[n]), 5) for n, g in grads.items()}
    print("gradient relative errors:", json.dumps(errors))
    slowest = sorted(stats()["builds"], key=lambda b: -b["nvfuser_s"])[:6]
    print("slowest nvFuser builds:", json.dumps(slowest))
    # All but the embedding backward (a scatter) and the two RoPE backward regions (strided
    # scatters, left to the next executor on purpose: see nvfuser._poor_fits).
    assert record.executors.get("nvfuser", 0) >= record.unique_regions - 3
    assert stats()["runtime_fallbacks"] == 0


def test_compiles_do_not_grow_with_layers(tmp_path: Path) -> None:
    counts = {}
    fusions = {}
    for layers in (2, 8):
        cfg = dataclasses.replace(SMALL, layers=layers)
        model = build(cfg).to(device="cuda", dtype=torch.bfloat16)
        # Static shapes: Dynamo's automatic dynamic is per code object and process, so an
        # earlier test of this worker that ran the same model class at another length
        # would make these graphs symbolic (compiled whole by Inductor, not by nvFuser).
        compiled = fcache.jit(
            model,
            executors=["nvfuser", "eager"],
            settings=settings(tmp_path / f"L{layers}"),
            dynamic=False,
        )
        training_step(compiled, sample_tokens(cfg, 2, 64).cuda())
        counts[layers] = fcache.stats(compiled).compiles
        fusions[layers] = stats()["compiles"] + stats()["loads"]
    print("\nnvFuser compiles by layers:", counts, "fusions built in process:", fusions)
    assert counts[2] == counts[8] > 0
    # One process, one fusion per region: the 8-layer model built no new one.
    assert fusions[8] == fusions[2]


# --- a second process -----------------------------------------------------------------------


def _process(cache: Path, out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    subprocess.run(
        [
            sys.executable,
            str(HERE / "nvfuser_run.py"),
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            *ANCHOR,
        ],
        check=True,
        timeout=400,
        env={**os.environ, "PYTHONPATH": _pythonpath(), **(env or {})},
    )
    return json.loads(out.read_text())


def _pythonpath() -> str:
    root = str(HERE.parents[1])  # the checkout, so the child imports this fcache
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)


def test_warm_process_compiles_nothing(tmp_path: Path) -> None:
    """Cold then warm process on one cache (FCACHE_NVFUSER_CACHE, if set, keeps it for a
    traced run afterwards); reports go to FCACHE_REPORT_DIR."""
    reports = Path(os.environ.get("FCACHE_REPORT_DIR", tmp_path))
    reports.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("FCACHE_NVFUSER_CACHE", tmp_path / "cache"))
    cold = _process(cache, reports / "nvfuser_cold.json")
    warm = _process(cache, reports / "nvfuser_warm.json")
    cold_s = cold["nvfuser"]["compile_seconds"]
    warm_s = warm["nvfuser"]["load_seconds"]
    print(f"\nnvFuser seconds: cold {cold_s:.2f}, warm {warm_s:.2f} ({warm_s / cold_s:.2f}x)")
    print(
        "NVRTC: cold", cold["nvfuser"]["nvrtc_compiles"], "warm", warm["nvfuser"]["nvrtc_compiles"]
    )
    print("first step: cold", cold["first_step_seconds"], "warm", warm["first_step_seconds"])
    assert warm["fcache"]["compiles"] == 0
    assert warm["nvfuser"]["loads"] == cold["nvfuser"]["compiles"] > 0
    # The RoPE and RMSNorm regions are segmented: cut into steps, loaded warm as steps, and
    # the warm process computes what the cold one did.
    assert cold["nvfuser"]["cut_regions"] >= 1
    assert warm["loss"] == pytest.approx(cold["loss"], rel=1e-3)
    assert warm["grad_abs_sum"] == pytest.approx(cold["grad_abs_sum"], rel=1e-3)
    assert warm["nvfuser"]["nvrtc_compiles"] == 0
    # Fusions with identical kernels share a kernel_db entry: restored once, harvested twice.
    assert 0 < warm["nvfuser"]["kernels_restored"] <= cold["nvfuser"]["kernels_harvested"]


# --- regions, one by one --------------------------------------------------------------------


def check_region(region: CanonicalRegion) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    executor = registry.create("nvfuser")  # the process's: its fusions are shared
    # Translatable is enough: regions the executor declines as poor fits (strided
    # scatters) must still compute the right thing when they are compiled.
    assert not tr.unsupported(region), tr.unsupported(region)
    artifact = executor.compile(region, device)
    assert payload_format.decode(artifact.payload).region == region.text
    inputs = random_inputs(region)
    got = executor.load(artifact, device)(list(inputs))
    want = region.materialize(device)(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if tr.stride_order(w) is not None:  # a dense layout: eager's, size-1 dims aside
            assert same_layout(g, w), (g.stride(), w.stride())
        tol = 2e-2 if w.dtype in (torch.bfloat16, torch.float16) else 1e-4
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_model_regions_match_eager(family: str) -> None:
    # The shapes of the model tests: the Llama regions are already built in this process.
    cfg = dataclasses.replace(SMALL, family=family)
    model = build(cfg).to(device="cuda", dtype=torch.bfloat16)
    tokens = sample_tokens(cfg, 2, 64).cuda()
    regions = capture_regions(lambda m: m(tokens).float().sum().backward(), model)
    covered = [r for r in regions if not tr.unsupported(r)]
    assert len(regions) - len(covered) <= 1
    failures = []
    for region in covered:
        try:
            check_region(region)
        except Exception as exc:  # collect all: one GPU run should show every problem
            failures.append(f"{[n.op for n in region.nodes]}: {type(exc).__name__}: {exc}"[:2000])
    assert not failures, "\n".join(failures)


OP_CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "slices": lambda x: (
        (x * 2)[..., 1::3].sum(-1, keepdim=True)
        + (x * 2).unbind(1)[1][:, None]
        + sum(p.sum(1, keepdim=True) for p in (x * 3).split(2, 1))[:1]
    ),
    "scatters": lambda x: (
        torch.zeros_like(x).slice_scatter(x[:, ::2] * 2, 1, 0, None, 2)
        + (x + 1).select_scatter((x * 3)[:, 0], 1, 2)
    ),
    "cat_where_pad": lambda x: (
        torch.where(x > 0, torch.cat([x * 2, x], 0)[:4], -x)
        + torch.nn.functional.pad(x * 2, (1, 2, 0, 1), value=3.0)[1:, 3:]
    ),
    "reductions": lambda x: (
        torch.softmax(x * 2, -1)
        + (x * 1).amax(0, keepdim=True)
        + sum(torch.var_mean(x * 2, dim=1, correction=1, keepdim=True))
        + torch.log_softmax(x * 2, 0)
    ),
    "layout": lambda x: ((x * 2).t() + 1).t() * (x * 2).unsqueeze(1).expand(4, 3, 6).sum(1),
    "integers": lambda x: (
        ((x * 10).long() // 3 + (x * 10).long() % 4).float()
        + (torch.arange(x.shape[1], device=x.device) < 3).float()
    ),
    "math": lambda x: (
        torch.nn.functional.gelu(x.clamp(-1, 0.5))
        + x.sigmoid()
        + (x.abs() + 1).pow(-0.5)
        + (x.to(torch.bfloat16) * 3).float()
    ),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_families_match_eager(case: str) -> None:
    x = torch.randn(4, 6, device="cuda")
    regions = capture_regions(lambda f: f(x), OP_CASES[case])
    assert regions
    for region in regions:
        check_region(region)


def test_inputs_nvfuser_refuses_run_in_eager() -> None:
    # A fusion for CUDA inputs called with a CPU matrix (nvFuser takes CPU scalars only):
    # nvFuser refuses it at run time, and the region runs op by op instead (counted), with
    # the result eager gives. (It takes float64 for float32, so a dtype does not do.)
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.bfloat16) * 3).float() + 1

    x = torch.randn(4, 6, device="cuda")
    (region,) = capture_regions(lambda g: g(x), f)
    executor = registry.create("nvfuser")  # the one whose stats() counts the fallback
    device = torch.device("cuda")
    run = executor.load(executor.compile(region, device), device)
    torch.testing.assert_close(run([x])[0], f(x))
    before = stats()["runtime_fallbacks"]
    host = x.cpu()
    (got,) = run([host])
    assert stats()["runtime_fallbacks"] == before + 1
    torch.testing.assert_close(got, f(host), rtol=0, atol=0)
