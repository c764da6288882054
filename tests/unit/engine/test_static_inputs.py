"""The roles of a compiled graph's inputs for CUDA graphs (fcache.engine.cudagraphs
.input_roles): static inputs, read in place instead of copied at every replay, are a
forward's parameters and buffers wherever they sit among its inputs, as AOTAutograd's
metadata says, and a backward's saved tensors; mutated inputs are those the graph writes
to. Programs record both, so a warm process that loads a whole stored function (and traces
nothing) hands its CUDA-graph wrapper the same ones, also where a graph rebuilt from text
could not tell an input from a mutated one of its layout. Each call of a stored function
starts a new generation, as entering a torch.compile'd function does.

Each run is a fresh process on the CPU with the text executor (tests/text_executor.py); a
recording wrapper stands in for CUDA graphs (which capture nothing on a CPU) and sees
what they would be given. The replays themselves: tests/gpu/test_cudagraphs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fresh import ROOT, run_json

_RUN = """
import json, sys
sys.path.insert(0, {root!r})
import torch
import fcache
from fcache import api
from fcache.engine.whole import route as whole
from fcache.examples.models import ModelConfig, build, sample_tokens
from tests.text_executor import register

register()
seen = []  # [model, kind, static inputs, mutated inputs]


class Recorder:
    def __call__(self, kind, gm, fn, roles):
        seen.append([name, kind, list(roles.static), list(roles.mutated)])
        return fn


class Averaged(torch.nn.Module):
    # A buffer written in place by the forward, of the input's own shape.
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("mean", torch.zeros(4, 8))

    def forward(self, x):
        y = self.lin(x)
        self.mean.mul_(0.9).add_(0.1 * y.detach())
        return y


api._wrapper = lambda settings: Recorder
loaded = []
load = whole.Whole._load
whole.Whole._load = lambda self, *a: (lambda fn: loaded.append(fn is not None) or fn)(
    load(self, *a))
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))

name = "gpt"
cfg = ModelConfig(family="gpt", layers=2, dim=32, heads=2, vocab=64, max_seq=16)
torch.manual_seed(0)
model = build(cfg)
tokens = sample_tokens(cfg, 2, 8)
compiled = fcache.jit(model, settings=settings)
compiled(tokens).float().square().mean().backward()
# Each call of a stored function is a new generation, as each entry into a torch.compile'd
# function is: CUDA-graph trees tell steps apart by it.
from torch._dynamo.mutation_guard import GenerationTracker
before = GenerationTracker.generation
for _ in range(3):
    compiled(tokens)
generations = GenerationTracker.generation - before

name = "averaged"
averaged, reference = Averaged(), Averaged()
reference.load_state_dict(averaged.state_dict())
x = torch.randn(4, 8)
compiled = fcache.jit(averaged, settings=settings)
compiled(x).sum().backward()
with torch.no_grad():  # another stored function: an inference graph
    compiled(x)
reference(x).sum().backward()
with torch.no_grad():
    reference(x)
print(json.dumps({{
    "seen": seen, "loaded": loaded, "generations": generations,
    "mean_error": (averaged.mean - reference.mean).abs().max().item(),
    "averaged_programs_loaded": fcache.stats(compiled).programs_loaded,
}}))
"""


def _run(tmp_path: Path) -> dict[str, Any]:
    report = run_json(
        _RUN.format(root=str(ROOT)),
        FCACHE_DIR=str(tmp_path / "fcache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    assert report["mean_error"] < 1e-6  # the buffer's updates happened, as eager's
    return report


def test_input_roles_cold_and_in_a_warm_process(tmp_path: Path) -> None:
    cold = _run(tmp_path)
    roles = {(model, kind): (static, mutated) for model, kind, static, mutated in cold["seen"]}
    assert set(roles) == {
        ("gpt", "forward"),
        ("gpt", "backward"),
        ("averaged", "forward"),
        ("averaged", "backward"),
        ("averaged", "inference"),
    }, cold["seen"]
    # GPT's forward: its 29 parameters and the token ids (index 1, among them) as inputs;
    # every parameter is read in place, the tokens are not. Nothing is written to.
    static, mutated = roles["gpt", "forward"]
    assert len(static) == 29 and 1 not in static and mutated == []
    back_static, back_mutated = roles["gpt", "backward"]
    assert back_static == list(range(len(back_static))) and back_static and back_mutated == []
    # The averaged model's forward and inference graphs take (weight, bias, buffer, x):
    # the buffer is written to, and static; x, of the buffer's layout, is neither.
    for kind in ("forward", "inference"):
        static, mutated = roles["averaged", kind]
        assert len(static) == 3 and len(mutated) == 1 and mutated[0] in static, (kind, roles)
    assert cold["generations"] >= 3

    warm = _run(tmp_path)
    # GPT: its whole stored function, nothing traced. The averaged model (a class of this
    # script, not storable whole) is traced by Dynamo and finds its three stored programs.
    # Both rebuild their graphs from text, and get the roles they were compiled with.
    assert warm["loaded"] == [True] and warm["averaged_programs_loaded"] == 3
    assert sorted(warm["seen"]) == sorted(cold["seen"])
    assert warm["generations"] >= 3
