"""Whole stored functions (fcache.engine.whole.route): a warm process skips Dynamo, AOTAutograd
and partitioning; a changed source, a graph break, hooks, other inputs take the paths the
module docstring promises; outputs and gradients match eager in every case.

Each run is a fresh process (a warm start is a new process), on the built-in model with
the text executor (tests/text_executor.py: fcache's whole pipeline, no C++ compiler), or
with a Hugging Face model where `transformers` is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import fresh

ROOT = Path(__file__).resolve().parents[3]

_RUN = """
import json, sys
sys.path.insert(0, {root!r})
import torch
import fcache
import fcache.engine.compile.session as session_module
import fcache.engine.backend as backend_module
from torch._dynamo.utils import counters
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from tests.text_executor import register

register()
cuts = []
partition = session_module.partition
session_module.partition = lambda graph, **kw: cuts.append(1) or partition(graph, **kw)
traced = []  # Dynamo graphs handed to fcache's backend: none when nothing is traced
events = []  # compile workers asked for, Dynamo graphs traced: in order
call = backend_module.Backend.__call__
backend_module.Backend.__call__ = (
    lambda self, gm, xs: traced.append(1) or events.append("trace") or call(self, gm, xs))
prestart = backend_module.Backend.prestart
backend_module.Backend.prestart = (
    lambda self, d: events.append(f"workers {{d}}") or prestart(self, d))
from fcache.engine.programs import graph as program_module
runs = []  # calls of fcache's compiled graphs: none if the model ran its traced graph eagerly
run_program = program_module.ProgramGraph.__call__
program_module.ProgramGraph.__call__ = lambda self, xs: runs.append(1) or run_program(self, xs)
import fcache.engine.whole.dims as dims_module
keys = []  # whole-function keys computed (a declined call's next calls compute none)
call_keys = dims_module.keys
dims_module.keys = lambda *a, **k: keys.append(1) or call_keys(*a, **k)
variant, device = {variant!r}, {device!r}
torch.manual_seed(0)
if variant.startswith("hf-"):
    from bench import hf
    model = hf.build(variant, 2, 64, 4, 128, 16)
    reference = hf.build(variant, 2, 64, 4, 128, 16)
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 128, (2, 8))
else:
    from fcache.examples import models
    cfg = models.ModelConfig(family="llama", layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    model, reference = models.build(cfg), models.build(cfg)
    tokens = models.sample_tokens(cfg, 2, 8)
    if variant == "changed":  # one op of the model's own source different: relu in the MLP
        import fcache.examples.models as m
        src = open(m.__file__).read().replace("F.silu(", "F.relu(")
        assert src != open(m.__file__).read()
        exec(compile(src, m.__file__, "exec"), m.__dict__)
        model, reference = m.build(cfg), m.build(cfg)
    if variant == "graph_break":  # a print in forward: Dynamo cannot capture it whole
        for mod in (model, reference):
            block = mod.blocks[0]
            inner = type(block).forward
            def forward(self, x, rope, inner=inner):
                torch._dynamo.graph_break()
                return inner(self, x, rope)
            type(block).forward = forward
    if variant == "default_args":  # a default argument's value guarded, pickled as 2.11 does
        import dataclasses
        from torch._dynamo import source
        source.DefaultsSource.__reduce__ = lambda self: (
            type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        def scaled(x, factor=1.0):
            return x * factor
        for mod in (model, reference):
            block = mod.blocks[0]
            inner = type(block).forward
            def forward(self, x, rope, inner=inner):
                return scaled(inner(self, x, rope))
            type(block).forward = forward
    if variant == "hooked":
        model.register_forward_hook(lambda mod, args, out: out * 2)
        reference.register_forward_hook(lambda mod, args, out: out * 2)
    if variant == "submodule_hooked":  # a submodule's hook: Dynamo's guards do not see it
        for mod in (model, reference):
            mod.blocks[1].mlp.register_forward_hook(lambda mod, args, out: out * 2)
model, reference = model.to(device), reference.to(device)
tokens = tokens.to(device)
settings = fcache.Settings.from_env().replace(progress=False)
if device == "cpu":
    settings = settings.replace(executors=("text", "eager"))
if {method!r}:  # Hugging Face's recipe: the module's bound forward compiled, the module called
    model.forward = compiled = fcache.jit(model.forward, settings=settings)
else:
    compiled = fcache.jit(model, settings=settings, blocks={blocks!r})
losses, expected = [], []
for step in range(2):  # a second call takes the loaded function's fast path
    out = model(tokens) if {method!r} else compiled(tokens)
    out = out.logits if hasattr(out, "logits") else out
    loss = out.float().square().mean()
    loss.backward()
    losses.append(loss.item())
program_runs = len(runs)
ref = reference(tokens)
ref = ref.logits if hasattr(ref, "logits") else ref
for step in range(2):
    ref = reference(tokens)
    ref = ref.logits if hasattr(ref, "logits") else ref
    loss = ref.float().square().mean()
    loss.backward()
    expected.append(loss.item())
error = max((p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), reference.parameters()) if p.grad is not None)
other = compiled(tokens[:1])  # another input shape: another stored function
other = other.logits if hasattr(other, "logits") else other
ref_other = reference(tokens[:1])
ref_other = ref_other.logits if hasattr(ref_other, "logits") else ref_other
stats = fcache.stats(compiled)
print(json.dumps({{
    "frames": len(traced), "aot": dict(counters["aot_autograd"]), "events": events[:3],
    "partitions": len(cuts), "functions_loaded": stats.functions_loaded,
    "programs_loaded": stats.programs_loaded, "compiles": stats.compiles,
    "unique_regions": stats.unique_regions, "program_runs": program_runs, "keys": len(keys),
    "losses": losses, "expected": expected, "grad_error": error,
    "other_error": (other - ref_other).abs().max().item(),
}}))
"""


def run(
    tmp_path: Path,
    variant: str = "plain",
    device: str = "cpu",
    blocks: bool = False,
    method: bool = False,
    **env: str,
) -> dict[str, Any]:
    """One fresh process compiling (or loading) `variant` with fcache.jit (its repeated
    blocks only, with `blocks`; its bound `forward`, with `method`); checked against eager
    before it is returned."""
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "FCACHE_DIR": str(tmp_path / "fcache"),
        # A fresh Inductor directory per process: only fcache's tiers are warm.
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{len(list(tmp_path.glob('*')))}"),
        "FCACHE_WHOLE": "1",  # the default; a caller's environment cannot turn it off
        **env,
    }
    script = _RUN.format(
        root=str(ROOT), variant=variant, device=device, blocks=blocks, method=method
    )
    proc = fresh.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["log"] = proc.stderr
    assert report["losses"] == pytest.approx(report["expected"], rel=1e-5)
    assert report["grad_error"] < 1e-4
    assert report["other_error"] < 1e-4
    # fcache's graphs ran, forward and backward of each step (not the traced graph, eagerly)
    assert report["program_runs"] >= 4
    return report


@pytest.fixture(scope="module")
def plain_cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The built-in model's cold run, once for the module: its fcache directory (each
    test copies it, so that none sees another's entries) and its report."""
    base = tmp_path_factory.mktemp("plain-cold")
    return base / "fcache", run(base)


def cold_copy(plain_cold: tuple[Path, dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    """`run(tmp_path)` as it would come out: the module's cold run, its cache copied to
    `tmp_path` (the next `run` gets an empty Inductor directory, as after a cold run)."""
    cache, report = plain_cold
    shutil.copytree(cache, tmp_path / "fcache")
    return report


def test_a_warm_process_traces_nothing(
    plain_cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cold = cold_copy(plain_cold, tmp_path)
    assert cold["frames"] >= 1 and cold["partitions"] == 4  # 2 shapes, forward + backward
    assert cold["functions_loaded"] == 0 and cold["compiles"] > 0
    # Compile workers asked for as soon as the stored function misses, before Dynamo
    # traces (they start on GPUs only).
    assert cold["events"][:2] == ["workers cpu", "trace"]

    warm = run(tmp_path)
    # Both shapes (the second traced after a step, its parameters holding gradients):
    # no Dynamo, no AOTAutograd, no partitioning.
    assert warm["frames"] == 0 and warm["aot"] == {} and warm["partitions"] == 0
    assert warm["functions_loaded"] == 2 and warm["compiles"] == 0 and warm["events"] == []

    # Off: the Dynamo route, which still loads the programs.
    off = run(tmp_path, FCACHE_WHOLE="0")
    assert off["frames"] >= 1 and off["functions_loaded"] == 0 and off["compiles"] == 0


def test_a_bound_forward_is_stored_whole_as_its_module_is(
    plain_cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """`model.forward = fcache.jit(model.forward)` (Hugging Face's recipe) is the module's
    own forward with the module as `self`: a warm process loads the functions the module's
    cold run stored, traces nothing (before, it took torch.compile's route: Dynamo every
    process, and no static-cache marks for CUDA graphs)."""
    cold_copy(plain_cold, tmp_path)
    warm = run(tmp_path, method=True)
    assert warm["frames"] == 0 and warm["aot"] == {} and warm["partitions"] == 0
    assert warm["functions_loaded"] == 2 and warm["compiles"] == 0


@pytest.mark.parametrize("variant", ["plain", "hf-llama"])
def test_blocks_are_traced_once_for_all_and_not_at_all_when_warm(
    tmp_path: Path, variant: str
) -> None:
    if variant.startswith("hf-"):
        pytest.importorskip("transformers")
    cold = run(tmp_path, variant, blocks=True)
    # Two blocks and three modules outside them (embedding, last norm, output layer), two
    # input shapes: per shape the first block and each module outside are traced (one
    # Dynamo graph each, its forward and backward cut); the second block runs the first's
    # function, whose guards accept it (neither traced nor loaded).
    assert cold["frames"] == 2 * (1 + 3) and cold["partitions"] == 2 * cold["frames"]
    assert cold["functions_loaded"] == 0 and cold["compiles"] > 0
    warm = run(tmp_path, variant, blocks=True)
    assert warm["frames"] == 0 and warm["partitions"] == 0 and warm["aot"] == {}
    assert warm["functions_loaded"] == 2 * (1 + 3) and warm["compiles"] == 0


def test_a_function_guarding_a_default_argument_loads(tmp_path: Path) -> None:
    """torch 2.11 pickled a guard source's computed fields as constructor arguments
    (DefaultsSource: a called function's default argument, read by BERT's, Whisper's and
    Qwen2-MoE's forward), and could not load the function back: a warm process traced
    again. The variant pickles sources as torch 2.11 does."""
    cold = run(tmp_path, "default_args")
    assert cold["functions_loaded"] == 0 and cold["compiles"] > 0
    warm = run(tmp_path, "default_args")
    assert "not loaded" not in warm["log"], warm["log"][-2000:]
    assert warm["functions_loaded"] == 2 and warm["frames"] == 0 and warm["compiles"] == 0


def test_a_changed_source_misses_and_the_unchanged_regions_still_hit(
    plain_cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cold_copy(plain_cold, tmp_path)
    changed = run(tmp_path, "changed")
    assert "stale" in changed["log"] or changed["functions_loaded"] == 0
    assert changed["functions_loaded"] == 0 and changed["frames"] >= 1
    assert 0 < changed["compiles"] < changed["unique_regions"]  # the MLP's regions only
    # The changed model runs classes exec'd here, not its file's: it cannot be stored
    # whole (pickle finds other classes under their names), every process traces it (at
    # once: the marker the first stored is obeyed), and its regions all hit.
    again = run(tmp_path, "changed")
    assert again["functions_loaded"] == 0 and "taking torch.compile's route" in again["log"]
    assert "not stored whole" not in again["log"]
    assert again["compiles"] == 0


def test_a_graph_break_takes_torch_compiles_route_at_once_when_warm(tmp_path: Path) -> None:
    cold = run(tmp_path, "graph_break")
    # The forward is defined in a `python -c` script: Dynamo's package of its frames
    # (fcache.engine.whole.packaged) cannot name its module either, so it is declined.
    assert "not stored whole" in cold["log"] or "function not stored" in cold["log"]
    # One key per input shape: the second step's call is known declined without one (a
    # key costs milliseconds a step on a Hugging Face model).
    assert cold["keys"] == 2
    warm = run(tmp_path, "graph_break")
    assert warm["functions_loaded"] == 0 and warm["frames"] >= 1 and warm["keys"] == 2
    assert warm["compiles"] == 0 and warm["programs_loaded"] > 0
    # The stored marker is obeyed: torch.compile's route at once, no second attempt to
    # capture the model whole (which used to trace it twice in every warm process).
    assert "taking torch.compile's route" in warm["log"]
    assert "not stored whole" not in warm["log"]


_SCALED = """
import torch
SCALE = 2.0
BIAS = torch.zeros(8)
def f(x):
    return torch.sin(x) * SCALE + BIAS
"""

_DRIVE = """
import json, sys
sys.path[:0] = [{here!r}, {root!r}]
import torch, fcache, scaled
from tests.text_executor import register
register()
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(scaled.f, settings=settings)
x = torch.randn(8)
errors = []
for scale, bias in {changes!r}:
    scaled.SCALE = scale
    if bias is not None:  # another tensor, same metadata: no guard tells them apart
        scaled.BIAS = torch.full((8,), bias)
    errors.append((compiled(x) - scaled.f(x)).abs().max().item())
print(json.dumps({{"errors": errors, "loaded": fcache.stats(compiled).functions_loaded}}))
"""


def test_module_globals_changed_at_run_time_are_seen(tmp_path: Path) -> None:
    """A stored function reads its module's globals live and guards them as torch.compile's
    route does: a constant changed after it was compiled or loaded makes it miss, and a
    global tensor replaced by another is the one it runs with (torch hands an aot_compile'd
    function a copy of the module's globals)."""
    (tmp_path / "scaled.py").write_text(_SCALED)
    environ = {**os.environ, "FCACHE_DIR": str(tmp_path / "fcache"), "FCACHE_WHOLE": "1"}

    def drive(*changes: tuple[float, float | None]) -> dict[str, Any]:
        script = _DRIVE.format(here=str(tmp_path), root=str(ROOT), changes=list(changes))
        proc = fresh.run(
            [sys.executable, "-c", script], env=environ, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert max(report["errors"]) < 1e-6, report
        return report

    assert drive((2.0, None), (3.0, None), (3.0, 1.0))["loaded"] == 0  # compiled here
    warm = drive((3.0, None), (2.0, None), (2.0, -1.0))  # changed after it was loaded
    assert warm["loaded"] == 1


def test_hooks_run(tmp_path: Path) -> None:
    """A forward hook on the model: torch.compile's route, which runs it (checked against
    eager inside `run`)."""
    hooked = run(tmp_path, "hooked")
    assert hooked["functions_loaded"] == 0 and hooked["frames"] >= 1


def test_a_submodules_hook_takes_torch_compiles_route(
    plain_cold: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A function stored without the hook (a plain cold run first) is not loaded for a
    model whose submodule has one: its guards would pass it, and the hook would not run
    (checked against eager inside `run`). (A submodule's full backward hook takes the
    same route, where torch.compile itself gives gradients off by 3e-3 on this model,
    aot_eager too: torch's, not tested here.)"""
    cold_copy(plain_cold, tmp_path)
    hooked = run(tmp_path, "submodule_hooked")
    assert hooked["functions_loaded"] == 0 and hooked["frames"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("family", ["hf-llama", "hf-gpt2"])
def test_hugging_face_models_are_stored_whole(tmp_path: Path, family: str) -> None:
    pytest.importorskip("transformers")
    run(tmp_path, family)
    warm = run(tmp_path, family)
    assert warm["functions_loaded"] == 2 and warm["frames"] == 0 and warm["compiles"] == 0


def test_inputs_no_key_describes_are_declined_by_type_whatever_their_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decode loop's calls: an object no key describes (a key/value cache) beside
    tensors whose length grows every step. Declined once, by the inputs' types: no step
    after the first computes a key (each cost 1.3 ms on a 4-layer Hugging Face Llama on a
    CPU, 4-8 ms on larger ones) or adds a signature to remember."""
    import types

    import torch

    from fcache.engine.whole import dims, route

    keys: list[int] = []
    monkeypatch.setattr(dims, "keys", lambda *a, **k: keys.append(1))
    ran: list[int] = []

    class Cache:
        pass

    def step(ids: torch.Tensor, mask: torch.Tensor, cache: Cache) -> torch.Tensor:
        return ids

    backend = types.SimpleNamespace(whole_functions={})
    whole = route.Whole(step, None, lambda ids, mask, cache: ran.append(1), backend, None)  # type: ignore[arg-type]
    cache = Cache()
    for length in range(16, 24):
        whole(torch.zeros(2, 1), torch.ones(2, length), cache)
    assert len(ran) == 8 and keys == []
    assert len(whole._declined_kinds) == 1 and not whole._declined_calls
    whole(torch.zeros(2, 1), torch.ones(2, 30), None)  # keyable: a key after all
    assert keys == [1]


_CUT_MODEL = """
import torch
from fcache.executors import registry
from tests.text_executor import TextExecutor


class NoComplex(TextExecutor):  # a compiler with a gap: layers with complex values
    name = "nocomplex"

    def supports(self, region, target):
        return not any(spec.dtype.is_complex for spec in region.inputs)


registry.register("nocomplex", NoComplex)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(16, 16)
        angles = torch.outer(torch.arange(8.0), torch.linspace(0, 1, 8))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        q = self.q(x)
        z = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2)) * self.freqs
        return x + torch.view_as_real(z).flatten(-2).tanh()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

_CUT_RUN = """
import json, sys
sys.path[:0] = [{here!r}, {root!r}]
import torch, fcache, cutmodel
torch.manual_seed(0)
model, reference = cutmodel.Net(), cutmodel.Net()
reference.load_state_dict(model.state_dict())
settings = fcache.Settings(cache_dir={cache!r}, progress=False, executors=("nocomplex", "eager"))
compiled = fcache.jit(model, settings=settings)
x = torch.randn(2, 8, 16)
out = compiled(x)
out.sum().backward()
reference(x).sum().backward()
stats = fcache.stats(compiled).to_dict()
stats["error"] = max((out - reference(x)).abs().max().item(), *(
    (p.grad - q.grad).abs().max().item()
    for p, q in zip(model.parameters(), reference.parameters())))
print(json.dumps(stats))
"""


def test_a_layer_cut_by_op_is_cut_alike_in_a_warm_process(tmp_path: Path) -> None:
    """A layer no compiler takes whole runs cut by op. A warm process rebuilds the graph
    from its stored text, whose nodes carry no values, and the cut goes by them: every op
    ran alone in eager there, its compiled pieces unused and nothing counted."""
    (tmp_path / "cutmodel.py").write_text(_CUT_MODEL)
    script = _CUT_RUN.format(here=str(tmp_path), root=str(ROOT), cache=str(tmp_path / "c"))
    runs = []
    for _ in range(2):
        proc = fresh.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["error"] < 1e-5 and warm["error"] < 1e-5
    assert cold["compiles"] >= 1 and cold["fallback_reasons"] == {"unsupported": cold["fallbacks"]}
    assert warm["functions_loaded"] == 1 and warm["compiles"] == 0
    assert warm["hits"] == {"local": cold["compiles"]}
    for field in ("regions", "unique_regions", "fallbacks", "executors"):
        assert warm[field] == cold[field], field
