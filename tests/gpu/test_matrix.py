"""The model matrix on a GPU (tests/models/zoo.py): every architecture in bf16 (the tiny
ResNet in float32: FLOAT32 says why) with fcache's default executors (Inductor first,
nvFuser where installed, eager last).

Per model: a training step at 3 layers, loss and every gradient against eager (bf16
tolerance, relative to each gradient's norm with a floor); at 4 layers on the same cache,
nothing compiled; inference. Then one new process on the warm cache runs every model and
compiles nothing; under pytest-xdist the training tests may run in other processes (with
other caches), so that test first trains here whatever this process has not.
Skipped without CUDA; FCACHE_REPORT_DIR, when set, receives a JSON line per model (what
bench/results keeps of a device run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fcache import process
from tests.models.test_matrix import step
from tests.models.zoo import BY_NAME, ZOO, loss

pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda")
# The tiny ResNet runs in float32: its batch norms normalize over a few values, and in
# bfloat16 eager's own gradients are 34% (H100) to 47% (CPU) off float32's, so comparing
# two bf16 roundings of it measures the rounding, not fcache.
FLOAT32 = {"resnet"}


def dtype_for(name: str) -> torch.dtype:
    return torch.float32 if name in FLOAT32 else torch.bfloat16


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # FCACHE_MATRIX_CACHE: one cache for several pytest processes (the models trained in
    # parallel, then the warm-process test alone on the cache they filled).
    shared = os.environ.get("FCACHE_MATRIX_CACHE")
    if shared:
        Path(shared).mkdir(parents=True, exist_ok=True)
        return Path(shared)
    return tmp_path_factory.mktemp("gpu-matrix")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    process.reset()


# Models whose training test filled this process's cache.
_TRAINED: set[str] = set()


def _report(name: str, **fields: Any) -> None:
    folder = os.environ.get("FCACHE_REPORT_DIR")
    if folder:
        with open(Path(folder) / "gpu-matrix.jsonl", "a") as f:
            f.write(json.dumps({"model": name, **fields}, default=str) + "\n")


def close_to_eager(result: dict[str, Any]) -> bool:
    """fcache's bf16 gradients match eager's bf16 ones, or are as close to the float32
    gradients as eager's are (where bf16 itself is far from float32, two roundings of it
    may be far from each other, both right)."""
    if result["grad_error"] < 5e-2:
        return True
    if "error_vs_float32" not in result:  # a float32 step: no rounding excuses a difference
        return False
    ours, eagers = result["error_vs_float32"]
    return bool(ours <= 1.25 * eagers + 2e-2)


@pytest.mark.parametrize("name", [e.name for e in ZOO])
def test_bf16_training_with_default_executors(name: str, cache: Path) -> None:
    entry = BY_NAME[name]
    shallow = step(entry, 3, cache, device=CUDA, dtype=dtype_for(name), executors=None)
    torch._dynamo.reset()
    deeper = step(entry, 4, cache, device=CUDA, dtype=dtype_for(name), executors=None)
    _report(
        name,
        loss=shallow["loss"],
        grad_error=shallow["grad_error"],
        error_vs_float32=shallow.get("error_vs_float32"),
        stats=shallow["stats"].to_dict(),
        deeper_compiles=deeper["stats"].compiles,
        deeper_grad_error=deeper["grad_error"],
    )
    _TRAINED.add(name)
    for result in (shallow, deeper):
        got, expected = result["loss"]
        assert got == pytest.approx(expected, rel=5e-2)
        assert close_to_eager(result), result
    assert deeper["stats"].compiles == 0, "a region depends on the depth"


@pytest.mark.parametrize("name", [e.name for e in ZOO])
def test_bf16_inference_with_default_executors(name: str, cache: Path) -> None:
    entry = BY_NAME[name]
    import fcache

    model = entry.build(3).to(CUDA, dtype_for(name)).eval()
    reference = entry.build(3).to(CUDA, dtype_for(name)).eval()
    inputs = {
        k: v.to(dtype_for(name)) if v.is_floating_point() else v
        for k, v in entry.inputs(CUDA).items()
    }
    compiled = fcache.jit(model, settings=fcache.Settings(cache_dir=cache, progress=False))
    with torch.no_grad():
        got, expected = loss(compiled(**inputs)), loss(reference(**inputs))
    assert got.item() == pytest.approx(expected.item(), rel=5e-2)


_WARM = """
import json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import torch
from tests.models.test_matrix import step
from tests.gpu.test_matrix import dtype_for
from tests.models.zoo import BY_NAME
out = {{}}
for name in {names!r}:
    torch._dynamo.reset()
    r = step(BY_NAME[name], 3, Path({cache!r}), device=torch.device("cuda"),
             dtype=dtype_for(name), executors=None)
    out[name] = dict(compiles=r["stats"].compiles, hits=r["stats"].hits, loss=r["loss"],
                     grad_error=r["grad_error"])
    if "error_vs_float32" in r:
        out[name]["error_vs_float32"] = r["error_vs_float32"]
print(json.dumps(out))
"""


def test_a_warm_process_compiles_nothing_for_any_model(cache: Path) -> None:
    names = [e.name for e in ZOO]
    for name in names:
        if name not in _TRAINED:  # trained by another xdist process, or not selected
            torch._dynamo.reset()
            step(BY_NAME[name], 3, cache, device=CUDA, dtype=dtype_for(name), executors=None)
    script = _WARM.format(root=str(ROOT), names=names, cache=str(cache))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, result in report.items():
        _report(name, **{f"warm_{k}": v for k, v in result.items()})
        assert result["compiles"] == 0, (name, result["hits"])
        assert close_to_eager(result), (name, result)
