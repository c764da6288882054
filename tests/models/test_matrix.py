"""The model matrix on CPU: models nobody here wrote (tests/models/zoo.py) through fcache.

For each architecture: two training steps at 3 layers (the second runs folded views), loss
and every gradient against eager; the same at 4 layers on the same cache, compiling nothing
(no region may depend on the depth); inference (`eval()`, `no_grad`); training under
`torch.autocast` with bf16; and, for a decoder, an encoder and a vision model, a new process
on the warm cache compiling nothing (all eight on the GPU: tracing every model twice more
would add about two minutes to CI here). Regions go to the text executor
(tests/text_executor.py), which runs them op by op but stores them like a compiler's
artifacts, so everything but code generation is exercised in seconds; the GPU matrix
(tests/gpu/test_matrix.py) compiles the same models with the default executors.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

import fcache
from fcache import process
from tests import fresh
from tests.models.zoo import BY_NAME, ZOO, Entry, loss
from tests.text_executor import register

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
EXECUTORS = ("text", "eager")
# Gradient error, relative to the gradient's norm, or to a floor: some true gradients (an
# attention key bias) are zero up to rounding, and their relative error means nothing.
FLOOR = 1e-3  # of the largest gradient norm of the model


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    torch._dynamo.reset()
    process.reset()
    register()
    yield
    process.reset()


def _settings(cache: Path, executors: tuple[str, ...] | None = EXECUTORS) -> fcache.Settings:
    return fcache.Settings(cache_dir=cache, progress=False, executors=executors)


def step(
    entry: Entry,
    layers: int,
    cache: Path,
    *,
    autocast: bool = False,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    executors: tuple[str, ...] | None = EXECUTORS,
) -> dict[str, Any]:
    """Two training steps of the entry with fcache and in eager, on the same weights (the
    second runs a stitched graph's views folded, fcache.engine.rewrite.views): the loss of each,
    the larger gradient error. `executors=None`: fcache's default order for the device."""
    model = entry.build(layers).to(device=device, dtype=dtype)
    reference = entry.build(layers).to(device=device, dtype=dtype)
    inputs = {
        k: v.to(dtype) if v.is_floating_point() else v for k, v in entry.inputs(device).items()
    }
    compiled = fcache.jit(model, settings=_settings(cache, executors))
    mixed = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    losses, errors = [], []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        with mixed:
            got = loss(compiled(**inputs))
            expected = loss(reference(**inputs))
        got.backward()
        expected.backward()
        losses.append((got.item(), expected.item()))
        errors.append(grad_error(model, reference))
    result = {
        "loss": losses[-1],
        "first_loss": losses[0],
        "grad_error": max(errors),
        "stats": fcache.stats(compiled),
    }
    if dtype != torch.float32:
        # In 16 bits eager is itself far from the exact gradients on some models (a tiny
        # ResNet's batch norms: 47% in bfloat16), so fcache is also measured against a
        # float32 eager step: (fcache's error, eager's error), both against float32.
        exact = entry.build(layers).to(device=device)
        loss(exact(**entry.inputs(device))).backward()
        result["error_vs_float32"] = (grad_error(model, exact), grad_error(reference, exact))
    return result


def grad_error(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    """The largest gradient error, each relative to its gradient's norm or to the floor;
    a gradient eager computes and fcache does not is an infinite error."""
    pairs = [
        (p.grad, q.grad)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
        if q.grad is not None
    ]
    floor = FLOOR * max(q.norm().item() for _, q in pairs)
    return max(
        float("inf") if p is None else (p - q).norm().item() / max(q.norm().item(), floor)
        for p, q in pairs
    )


@pytest.mark.parametrize("name", [e.name for e in ZOO])
def test_training_matches_eager_and_a_deeper_model_compiles_nothing(
    name: str, tmp_path: Path
) -> None:
    entry = BY_NAME[name]
    shallow = step(entry, 3, tmp_path)
    for got, expected in (shallow["first_loss"], shallow["loss"]):
        assert got == pytest.approx(expected, rel=1e-5)
    assert shallow["grad_error"] < 1e-4
    assert shallow["stats"].compiles == shallow["stats"].unique_regions > 0
    assert shallow["stats"].fallbacks == 0

    torch._dynamo.reset()
    deeper = step(entry, 4, tmp_path)
    assert deeper["loss"][0] == pytest.approx(deeper["loss"][1], rel=1e-5)
    assert deeper["grad_error"] < 1e-4
    assert deeper["stats"].compiles == 0, "a region depends on the depth"
    assert deeper["stats"].regions > shallow["stats"].regions


@pytest.mark.parametrize("name", [e.name for e in ZOO])
def test_inference_matches_eager(name: str, tmp_path: Path) -> None:
    entry = BY_NAME[name]
    model, reference = entry.build(2).eval(), entry.build(2).eval()
    inputs = entry.inputs(CPU)
    compiled = fcache.jit(model, settings=_settings(tmp_path))
    with torch.no_grad():
        got, expected = loss(compiled(**inputs)), loss(reference(**inputs))
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert fcache.stats(compiled).graphs >= 1


@pytest.mark.parametrize("name", [e.name for e in ZOO])
def test_training_under_bf16_autocast_matches_eager(name: str, tmp_path: Path) -> None:
    result = step(BY_NAME[name], 2, tmp_path, autocast=True)
    got, expected = result["loss"]
    assert got == pytest.approx(expected, rel=2e-2)
    assert result["grad_error"] < 5e-2


_WARM = """
import json, sys
sys.path.insert(0, {root!r})
import torch, fcache
from tests.models.test_matrix import step
from tests.models.zoo import BY_NAME
from tests.text_executor import register
register()
out = {{}}
for name in {names!r}:
    torch._dynamo.reset()
    result = step(BY_NAME[name], 2, __import__("pathlib").Path({cache!r}))
    out[name] = [result["stats"].compiles, result["stats"].hits.get("local", 0),
                 result["grad_error"]]
print(json.dumps(out))
"""


def test_a_warm_new_process_compiles_nothing(tmp_path: Path) -> None:
    names = ["llama", "bert", "vit"]
    for name in names:  # fill the cache in this process
        torch._dynamo.reset()
        step(BY_NAME[name], 2, tmp_path)
    process.reset()
    script = _WARM.format(root=str(ROOT), names=names, cache=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = fresh.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (compiles, local_hits, error) in report.items():
        assert compiles == 0 and local_hits > 0, name
        assert error < 1e-4, name
