"""Inductor's Python-wrapper route: on CUDA, the artifact format checked without a GPU (the
payload's framing, the refusals of malformed ones, and retargeting a wrapper compiled on
one GPU index to another; the GPU tests load and run real ones); on CPU, a real region
compiled here and loaded in a fresh process where no compiler may run."""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fcache.cache.artifact import Artifact
from fcache.errors import ConfigError, CorruptArtifact
from fcache.executors import inductor_python
from fcache.executors.inductor import InductorExecutor, route
from fcache.target import Target
from tests import fresh
from tests.e2e.runner import compiler_shims, env_for, parse_report

WRAPPER = "def call(args):\n    x, = args\n    return (x + 1,)\n"  # any wrapper source


def test_payload_round_trips_and_malformed_ones_are_refused() -> None:
    header = {"format": inductor_python.FORMAT, "device": "cuda", "index": 0, "kernels": ["k"],
              "source": WRAPPER}  # fmt: skip
    payload = inductor_python.pack(header, b"kernels")
    assert inductor_python.is_payload(payload)
    assert inductor_python.split(payload) == (header, b"kernels")
    # Artifacts from before CPU ones existed name no device: CUDA.
    older = {k: v for k, v in header.items() if k != "device"}
    assert inductor_python.split(inductor_python.pack(older, b"")) == (header, b"")
    with pytest.raises(CorruptArtifact, match="unknown header"):
        inductor_python.split(inductor_python.pack({**header, "device": "tpu"}, b""))
    cut = payload[: len(inductor_python.MAGIC) + 6]
    with pytest.raises(CorruptArtifact, match="bad header"):
        inductor_python.split(cut)
    with pytest.raises(CorruptArtifact, match="unknown header"):
        inductor_python.split(inductor_python.pack({**header, "format": 99}, b""))
    with pytest.raises(CorruptArtifact, match="unknown header"):
        inductor_python.split(inductor_python.pack({**header, "index": "0"}, b""))


def test_an_artifact_loads_only_on_its_device_type() -> None:
    header = {"format": inductor_python.FORMAT, "index": 0, "kernels": [], "source": WRAPPER}
    artifact = Artifact("inductor", InductorExecutor.version, inductor_python.pack(header, b""))
    with pytest.raises(CorruptArtifact, match="for cuda, not cpu"):
        InductorExecutor().load(artifact, torch.device("cpu"))
    cpu = {**header, "device": "cpu", "index": -1}
    artifact = Artifact("inductor", InductorExecutor.version, inductor_python.pack(cpu, b""))
    with pytest.raises(CorruptArtifact, match="for cpu, not cuda"):
        InductorExecutor().load(artifact, torch.device("cuda", 0))  # refused before any CUDA


@pytest.mark.parametrize(("device", "variable"), [("cuda", "FCACHE_INDUCTOR_CUDA"),
                                                  ("cpu", "FCACHE_INDUCTOR_CPU")])  # fmt: skip
def test_the_route_is_part_of_the_key_and_checked(
    device: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor = InductorExecutor()
    target = Target(device_type=device, capability="sm_90" if device == "cuda" else "avx2")
    other = Target(device_type="cpu" if device == "cuda" else "cuda", capability="x")
    monkeypatch.delenv(variable, raising=False)
    assert route(device) == "python"
    default, others = executor.toolchain(target), executor.toolchain(other)
    monkeypatch.setenv(variable, "aoti")
    assert executor.toolchain(target) != default
    assert executor.toolchain(other) == others  # each device type has its own setting
    monkeypatch.setenv(variable, "cuda-graphs")
    with pytest.raises(ConfigError, match=f"{variable}='cuda-graphs'"):
        route(device)


# -- CPU: a real region ---------------------------------------------------------------------


def _rms_relu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w).relu()


@pytest.fixture(scope="module")
def cpu_artifact() -> Artifact:
    """One CPU region compiled by the default (Python) route: a second or so of g++."""
    from fcache.frontend.canonicalize import canonicalize
    from fcache.frontend.partition import partition
    from tests.graphs import capture

    (gm,) = capture(_rms_relu, torch.randn(8, 64), torch.randn(64), backward=False)
    (region,) = partition(gm.graph).regions
    with pytest.MonkeyPatch.context() as env:
        env.delenv("FCACHE_INDUCTOR_CPU", raising=False)
        return InductorExecutor().compile(canonicalize(region), torch.device("cpu"))


_LOAD_AND_RUN = """
import json, pickle, sys, torch
from fcache.executors.inductor import InductorExecutor
run = InductorExecutor().load(pickle.load(open(sys.argv[1], "rb")), torch.device("cpu"))
x, w = torch.randn(8, 64), torch.randn(64)
ref = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w).relu()
print(json.dumps({"error": (run([x, w])[0] - ref).abs().max().item()}))
"""


@pytest.mark.slow
def test_a_cpu_region_loads_in_a_fresh_process_and_no_compiler_runs(
    cpu_artifact: Artifact, tmp_path: Path
) -> None:
    header, _ = inductor_python.split(cpu_artifact.payload)
    assert header["device"] == "cpu" and len(header["kernels"]) >= 1
    path = tmp_path / "artifact.pickle"
    path.write_bytes(pickle.dumps(cpu_artifact))
    log = tmp_path / "compilers.log"
    env = env_for(tmp_path / "fcache", tmp_path / "empty-inductor",
                  PATH=compiler_shims(tmp_path / "shims", log))  # fmt: skip
    proc = fresh.run([sys.executable, "-c", _LOAD_AND_RUN, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert parse_report(proc.stdout)["error"] < 1e-5
    runs = log.read_text().splitlines() if log.exists() else []
    assert runs == [], f"a compiler ran while a CPU region loaded: {runs[:3]}"
    # The kernel's shared object was imported from a private folder, removed once loaded.
    assert not list((tmp_path / "empty-inductor").glob("fcache-kernel-*"))


@pytest.mark.slow
def test_a_loaded_cpu_region_has_a_variant_without_its_size_asserts(
    cpu_artifact: Artifact,
) -> None:
    run = InductorExecutor().load(cpu_artifact, torch.device("cpu"))
    lean = run.unchecked  # type: ignore[attr-defined]
    assert "assert_size_stride" not in lean.__code__.co_names
    x, w = torch.randn(8, 64), torch.randn(64)
    torch.testing.assert_close(lean([x, w])[0], run([x, w])[0], rtol=0, atol=0)
    torch.testing.assert_close(lean([x, w])[0], _rms_relu(x, w))
    with pytest.raises(AssertionError):  # the checked call still checks
        run([x.t().contiguous().t(), w])


@pytest.mark.slow
def test_a_cpu_artifact_with_a_missing_or_cut_kernel_is_refused(cpu_artifact: Artifact) -> None:
    from torch._inductor.codecache import PyCodeCache

    PyCodeCache.cache_clear()  # a wrapper this process loaded before is not imported again
    header, kernels = inductor_python.split(cpu_artifact.payload)
    cut = inductor_python.pack(header, kernels[:-1])
    other = [["0" * 64, size] for _, size in header["kernels"]]
    foreign = inductor_python.pack({**header, "kernels": other}, kernels)
    for payload, why in ((cut, "do not match"), (foreign, "lacks a kernel")):
        artifact = Artifact("inductor", InductorExecutor.version, payload)
        with pytest.raises(CorruptArtifact, match=why):
            InductorExecutor().load(artifact, torch.device("cpu"))


def test_answers_to_inductors_kernel_builds_are_per_thread_and_nest() -> None:
    """While a CPU region loads, this thread's `cpp_pybinding` calls are answered from its
    artifact; another thread's (a torch.compile running beside it) still reach Inductor."""
    from torch._inductor.async_compile import AsyncCompile

    from fcache import process

    def answer(name: str) -> Callable[..., str]:
        return lambda inductors, self, argtypes, source: f"{name}:{source}"

    compiler = AsyncCompile()

    def build(argtypes: list[str], source: str) -> object:
        return compiler.cpp_pybinding(argtypes, source)  # looked up now, as a wrapper does

    with inductor_python._answering(answer("outer")):
        assert build([], "a") == "outer:a"
        with inductor_python._answering(answer("inner")):
            assert build([], "b") == "inner:b"
        assert build([], "c") == "outer:c"
        local = process.peek("inductor_python.cpp_pybinding")
        elsewhere: list[object] = []
        thread = threading.Thread(target=lambda: elsewhere.append(getattr(local, "answer", 0)))
        thread.start()
        thread.join()
        assert elsewhere == [0]  # no answer there: Inductor's own build runs
    assert getattr(local, "answer", None) is None


def _complex_rotary(q: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Llama4's rotary embedding: pairs of features as complex numbers, rotated."""
    rotated = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2)) * freqs
    return torch.view_as_real(rotated).flatten(-2) * 2


def test_a_region_with_a_complex_input_is_compiled_and_validated() -> None:
    """Llama4's layers ran their rotary pieces in eager: complex inputs were refused."""
    from fcache.engine.compile.validate import validate
    from fcache.frontend.samples import inputs_for
    from tests.graphs import capture_regions

    angles = torch.outer(torch.arange(8.0), torch.rand(4))
    freqs = torch.polar(torch.ones_like(angles), angles)
    (region,) = capture_regions(lambda f: f(torch.randn(2, 8, 8), freqs), _complex_rotary)
    cpu = torch.device("cpu")
    assert any(s.dtype.is_complex for s in region.inputs)
    executor = InductorExecutor()
    assert executor.supports(region, Target("cpu", "avx2"))
    samples = inputs_for(region, cpu)
    assert all(t.imag.abs().sum() > 0 for t in samples if t.is_complex())  # both parts drawn
    fn = executor.load(executor.compile(region, cpu), cpu)
    verdict = validate(region, fn, cpu)
    assert verdict.ok and verdict.checked, verdict.reason
