"""Static inputs of compiled graphs (fcache.engine.cudagraphs.static_inputs): the inputs a
CUDA graph reads in place instead of copying at every replay. A forward's are the
parameters (and buffers) wherever they sit among its inputs, as AOTAutograd's metadata
says; the program records them, so a warm process that loads a whole stored function
(and traces nothing) hands its CUDA-graph wrapper the same ones. Each call of a stored
function starts a new generation, as entering a torch.compile'd function does.

Each run is a fresh process on the CPU with the text executor (tests/text_executor.py); a
recording wrapper stands in for CUDA graphs (which capture nothing on a CPU) and sees
what they would be given. The replays themselves: tests/gpu/test_cudagraphs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

_RUN = """
import json, sys
sys.path.insert(0, {root!r})
import torch
import fcache
from fcache import api
from fcache.engine import whole
from fcache.examples.models import ModelConfig, build, sample_tokens
from tests.text_executor import register

register()
seen = []  # (kind, static input indices, which of the inputs are this model's parameters)


class Recorder:
    def __call__(self, kind, gm, inputs, fn, static):
        params = [i for i, x in enumerate(inputs)
                  if any(x.shape == p.shape and x.dtype == p.dtype for p in shapes)]
        seen.append([kind, list(static), params, len(inputs)])
        return fn


api._wrapper = lambda settings: Recorder
loaded = []
load = whole.Whole._load
whole.Whole._load = lambda self, *a: (lambda fn: loaded.append(fn is not None) or fn)(
    load(self, *a))
cfg = ModelConfig(family="gpt", layers=2, dim=32, heads=2, vocab=64, max_seq=16)
torch.manual_seed(0)
model = build(cfg)
shapes = list(model.parameters())
tokens = sample_tokens(cfg, 2, 8)
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(model, settings=settings)
compiled(tokens).float().square().mean().backward()
# Each call of a stored function is a new generation, as each entry into a torch.compile'd
# function is: CUDA-graph trees tell steps apart by it.
from torch._dynamo.mutation_guard import GenerationTracker
before = GenerationTracker.generation
for _ in range(3):
    compiled(tokens)
print(json.dumps({{"seen": seen, "loaded": loaded,
                  "generations": GenerationTracker.generation - before}}))
"""


def _run(tmp_path: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "FCACHE_DIR": str(tmp_path / "fcache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUN.format(root=str(ROOT))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_parameters_are_static_inputs_cold_and_in_a_warm_process(tmp_path: Path) -> None:
    cold = _run(tmp_path)
    kinds = {kind: (static, params, n) for kind, static, params, n in cold["seen"]}
    assert set(kinds) == {"forward", "backward"}, cold["seen"]
    static, params, n = kinds["forward"]
    # Every parameter is read in place; the token ids (an input like any other) are not.
    assert params and set(params) <= set(static), (static, params)
    assert len(static) < n
    back_static, _, back_n = kinds["backward"]
    assert back_static == list(range(len(back_static))) and 0 < len(back_static) < back_n

    warm = _run(tmp_path)
    assert warm["loaded"] == [True]  # the whole stored function: nothing traced
    # Its graphs come with no example inputs: their static ones come from the programs.
    assert [s[:2] for s in warm["seen"]] == [s[:2] for s in cold["seen"]]
    assert cold["generations"] >= 3 and warm["generations"] >= 3
