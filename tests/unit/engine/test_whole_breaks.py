"""A graph-broken model stored whole as Dynamo's CompilePackage
(fcache.engine.whole.packaged): a warm process traces no frame, its output and gradients
match eager, on both sides of a data-dependent branch.

Each run is a fresh process (a warm start is a new process), with the text executor
(tests/text_executor.py), on a model kept in a file of its own (Dynamo's package
checks the sources it traced, which a `python -c` script has none of).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests import fresh

ROOT = Path(__file__).resolve().parents[3]

_MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = self.a(x).relu()
        if x.sum() > 0:  # data-dependent: a graph break, two resume functions
            y = y * 2
        else:
            y = y - 1
        return self.b(y).tanh()
"""

# Dynamo's package bookkeeping failing on a frame a warm process traces anew.
_PLANTED_FAILURE = """
from torch._dynamo import package
from torch._dynamo.exc import PackageError
def refuse(self, *args, **kwargs):
    raise PackageError("planted")
package.CompilePackage.add_guarded_code = refuse
"""


def test_a_loaded_package_failing_in_dynamo_hands_the_call_to_torch_compiles_route(
    tmp_path: Path,
) -> None:
    """A warm process traces a frame the package lacks (the branch the cold process never
    took) and Dynamo's package bookkeeping fails on it: the call runs on torch.compile's
    route, correct, not failing the step; the marker sends later processes there at once."""
    (tmp_path / "broken.py").write_text(_MODEL)
    drive(tmp_path, (1,))
    warm = drive(tmp_path, (1, -1), prelude=_PLANTED_FAILURE)  # outputs checked by drive
    assert warm["loaded"] == 1
    assert "failed (PackageError: planted); taking torch.compile's route" in warm["log"]
    again = drive(tmp_path, (1, -1))
    assert again["loaded"] == 0 and "taking torch.compile's route" in again["log"]


# A function whose code has no module (exec'd, as a dataclass's generated __init__ is:
# transformers' model outputs), with a graph break inside: Dynamo compiles it as a frame
# of its own, which a package cannot locate in another process.
_EXEC_MODEL = (
    _MODEL
    + """
_scope = {"torch": torch, "__name__": __name__}  # as a dataclass's: its module's globals
exec("def helper(y):\\n    torch._dynamo.graph_break()\\n    return y * 3\\n", _scope)


class NetExec(Net):
    def forward(self, x):
        return _scope["helper"](super().forward(x))
"""
)

# A loop over data (a mixture of experts' dispatch as DBRX writes it): under fullgraph=True
# Dynamo raises a data-dependent UserError, not Unsupported; torch.compile's route breaks
# the graph at `nonzero()`.
_LOOP_MODEL = (
    _MODEL
    + """

class NetLoop(Net):
    def forward(self, x):
        y = self.a(x).relu()
        for row in (x.sum(1) > 0).nonzero():  # as many iterations as positive rows
            y = y + y[row[0]]
        return self.b(y).tanh()
"""
)

# Pytree code traced (associative_scan, as the pure-torch paths of state-space models use
# it): Dynamo guards torch.utils._pytree through a source that registers a guard of its own
# when it is built, so its guards unpickle only inside a tracing context.
_SCAN_MODEL = (
    _MODEL
    + """

def combine(left, right):
    return left[0] * right[0], right[0] * left[1] + right[1]


class NetScan(Net):
    def forward(self, x):
        from torch._higher_order_ops.associative_scan import associative_scan

        y = self.a(x)
        _, h = associative_scan(combine, (torch.sigmoid(y), y), dim=0, combine_mode="generic")
        return self.b(h).tanh()
"""
)

# A graph break on a lock (SegFormer: transformers installs its output-capturing hooks
# under one): the frame under it makes closures and registers them as hooks, which Dynamo
# rebuilds with their module's globals, a dict it keeps in the resume code's constants.
_HOOKED_MODEL = (
    _MODEL
    + """
import threading

_lock = threading.Lock()


class Registry(dict):  # a dict of its own class, as transformers' registries are
    pass


_hooked = Registry()


def install_hook(module, scale):
    def hook(mod, args, output):  # a closure made in a compiled frame
        return output * scale
    module.register_forward_hook(hook)


def maybe_install(model):
    if getattr(model, "hooked", False):
        return
    with _lock:  # Dynamo cannot enter a lock: a graph break
        for name, sub in model.named_children():
            install_hook(sub, 1.0)
            _hooked.setdefault(name, len(_hooked))
        model.hooked = True


class NetHooked(Net):
    def forward(self, x):
        maybe_install(self)
        scale = 1 + sum(_hooked.values())
        return self.b(self.a(x).relu()).tanh() * scale
"""
)

# Graphs torch cannot key (Switch Transformers' router reassigns its own layer, `.to`,
# which Dynamo traces as `TensorBase.set_` and AOTAutogradCache's check refuses): under the
# package's settings each got torch's nonce key, `str(random.random())`, which repeats
# (Dynamo restores `random`'s state around every frame), so the second graph was answered
# with the first one's program: the same shapes, another activation.
_UNKEYED_MODEL = (
    _MODEL
    + """

class Router(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.classifier, self.act = torch.nn.Linear(8, 8, bias=False), act

    def forward(self, x):
        self.classifier = self.classifier.to(torch.float32)
        return self.act(self.classifier(x))


class NetUnkeyed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Router(torch.sigmoid), Router(torch.tanh)

    def forward(self, x):
        h = self.a(x)
        torch._dynamo.graph_break()
        return self.b(h)
"""
)

_DRIVE = """
import json, logging, sys
sys.path[:0] = [{here!r}, {root!r}]
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
import torch, fcache, broken
import fcache.engine.backend as backend_module
from torch._dynamo.utils import counters
from tests.text_executor import register
register()
{prelude}
traced = []  # Dynamo graphs handed to fcache's backend: none when nothing is traced
call = backend_module.Backend.__call__
backend_module.Backend.__call__ = lambda self, gm, xs: traced.append(1) or call(self, gm, xs)
torch.manual_seed(0)
model, reference = broken.{cls}(), broken.{cls}()
reference.load_state_dict(model.state_dict())
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
if {method!r}:  # Hugging Face's recipe: the module's bound forward compiled, the module called
    model.forward = compiled = fcache.jit(model.forward, settings=settings)
    run = model
else:
    run = compiled = fcache.jit(model, settings=settings)
x = torch.randn(4, 8)
errors = []
for step in range(2):
    for sign in {signs!r}:  # which side of the branch runs
        inputs = sign * x.abs() + 0.5 * sign
        out, ref = run(inputs), reference(inputs)
        out.square().mean().backward()
        ref.square().mean().backward()
        errors.append((out - ref).abs().max().item())
grad_error = max((p.grad - q.grad).abs().max().item()
                 for p, q in zip(model.parameters(), reference.parameters()))
stats = fcache.stats(compiled)
print(json.dumps({{
    "errors": errors, "grad_error": grad_error, "graphs": len(traced),
    "frames": dict(counters["frames"]), "loaded": stats.functions_loaded,
    "compiles": stats.compiles, "programs_loaded": stats.programs_loaded,
}}))
"""


def drive(
    tmp_path: Path,
    signs: tuple[int, ...],
    cls: str = "Net",
    prelude: str = "",
    method: bool = False,
) -> dict[str, Any]:
    environ = {
        **os.environ,
        "FCACHE_DIR": str(tmp_path / "fcache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{len(list(tmp_path.glob('*')))}"),
        "FCACHE_WHOLE": "1",
    }
    script = _DRIVE.format(
        here=str(tmp_path), root=str(ROOT), signs=signs, cls=cls, prelude=prelude, method=method
    )
    proc = fresh.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["log"] = proc.stderr
    assert max(report["errors"]) < 1e-5, report
    assert report["grad_error"] < 1e-5, report
    return report


def test_a_graph_broken_model_is_stored_and_a_warm_process_traces_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "broken.py").write_text(_MODEL)
    cold = drive(tmp_path, (1, -1))
    assert cold["loaded"] == 0, cold
    assert "storing Dynamo's package" in cold["log"], cold["log"][-3000:]

    warm = drive(tmp_path, (1, -1))
    assert "not loaded" not in warm["log"], warm["log"][-3000:]
    assert warm["loaded"] == 1 and warm["compiles"] == 0
    # Neither Dynamo (no frame traced) nor fcache's backend ran: both sides of the
    # branch, forward and backward, ran the stored graphs.
    assert warm["frames"] == {} and warm["graphs"] == 0, warm


def test_graphs_torch_cannot_key_never_share_a_stored_program(tmp_path: Path) -> None:
    """Each gets a key of its own (`drive` checks outputs and gradients against eager, in
    the cold process and in the warm one that loads the package). The router changes its
    module at every call, so Dynamo traces its frames again at the second call (cold: 4
    graphs in 2 steps), and a warm process the first call's (the package holds the
    second's); every program is loaded, none compiled."""
    (tmp_path / "broken.py").write_text(_UNKEYED_MODEL)
    cold = drive(tmp_path, (1,), "NetUnkeyed")
    assert "storing Dynamo's package" in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1,), "NetUnkeyed")
    assert warm["loaded"] == 1 and warm["compiles"] == 0, (warm, warm["log"][-3000:])


def test_a_graph_broken_bound_forward_is_stored_and_loads(tmp_path: Path) -> None:
    """`model.forward = fcache.jit(model.forward)` on a graph-broken model: the wrapper set
    on the module (it holds a lock) was pickled with the module's guards, and the package
    was not stored ("the function's own frame's guards could not be serialized")."""
    (tmp_path / "broken.py").write_text(_MODEL)
    cold = drive(tmp_path, (1, -1), method=True)
    assert "not stored" not in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1, -1), method=True)
    assert warm["loaded"] == 1 and warm["graphs"] == 0, (warm, warm["log"][-3000:])


def test_a_loop_over_data_is_stored_as_a_package_and_loaded_warm(tmp_path: Path) -> None:
    """It was declined ("not captured whole"): every warm process traced it with Dynamo."""
    (tmp_path / "broken.py").write_text(_LOOP_MODEL)
    cold = drive(tmp_path, (1, -1), "NetLoop")
    assert "storing Dynamo's package" in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1, -1), "NetLoop")
    assert warm["loaded"] == 1 and warm["graphs"] == 0, (warm, warm["log"][-3000:])


def test_a_resume_function_holding_a_module_s_globals_is_stored_and_loads(
    tmp_path: Path,
) -> None:
    """Pickle cannot write a module, nor a module's globals (a lock, a ContextVar among
    them): the package was not stored ("cannot pickle 'module' object", SegFormer), and
    every warm process traced the model. They are stored by name and read back as the
    loading process's own (a copy of a module's globals would be stale)."""
    (tmp_path / "broken.py").write_text(_HOOKED_MODEL)
    cold = drive(tmp_path, (1,), "NetHooked")
    assert "not stored" not in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1,), "NetHooked")
    assert "not loaded" not in warm["log"], warm["log"][-3000:]
    assert warm["loaded"] == 1 and warm["graphs"] == 0 and warm["compiles"] == 0, warm


# The second guard manager a warm process builds (a resume function's; the first is the
# model's frame, without which the package cannot serve the call) fails, as a guard on
# state the model's first call makes does (SegFormer: transformers' registry of output
# recorders, empty until then: "IndexError: list index out of range").
_SECOND_GUARDS_FAIL = """
from torch._dynamo import package
build, calls = package.load_guard_manager, []
def failing(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        raise IndexError("planted")
    return build(*args, **kwargs)
package.load_guard_manager = failing
"""


def test_a_frame_whose_guards_cannot_be_built_is_left_out_not_the_package(
    tmp_path: Path,
) -> None:
    """The package loads without that frame's stored code (traced where reached, as
    torch.compile's route would), where before the whole package failed to load and the
    model was traced and stored again in every warm process."""
    (tmp_path / "broken.py").write_text(_MODEL)
    drive(tmp_path, (1, -1))
    warm = drive(tmp_path, (1, -1), prelude=_SECOND_GUARDS_FAIL)  # outputs checked by drive
    assert "left out (its guards: IndexError: planted)" in warm["log"], warm["log"][-3000:]
    assert "not loaded" not in warm["log"] and warm["loaded"] == 1, warm
    assert warm["compiles"] == 0, warm


def test_a_function_tracing_pytree_code_is_stored_and_loads(tmp_path: Path) -> None:
    """Its guards raised when a warm process unpickled them outside a trace: the stored
    function never loaded, and each process traced and stored it again."""
    (tmp_path / "broken.py").write_text(_SCAN_MODEL)
    cold = drive(tmp_path, (1, -1), "NetScan")
    assert cold["loaded"] == 0 and cold["graphs"] > 0, cold
    warm = drive(tmp_path, (1, -1), "NetScan")
    assert "not loaded" not in warm["log"], warm["log"][-3000:]
    assert warm["loaded"] >= 1 and warm["graphs"] == 0, warm


def test_a_function_whose_guards_do_not_unpickle_is_not_stored(tmp_path: Path) -> None:
    """The cold process unpickles the guards it stores, as a loading process would: where
    that fails, a marker sends later processes to torch.compile's route at once, where they
    load the programs the cold process stored while it recorded the package (they were
    keyed under the package's settings, and the first such process compiled them again)."""
    (tmp_path / "broken.py").write_text(_SCAN_MODEL)
    planted = "import torch._dynamo.package as p\np.load_guards_state = lambda data: 1 / 0\n"
    cold = drive(tmp_path, (1,), "NetScan", prelude=planted)
    assert "compiled function not stored (ZeroDivisionError" in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1,), "NetScan")
    assert warm["loaded"] == 0 and "taking torch.compile's route" in warm["log"], warm
    assert warm["programs_loaded"] >= 1 and warm["compiles"] == 0, warm


def test_a_branch_the_cold_process_never_took_is_compiled_when_reached(
    tmp_path: Path,
) -> None:
    """A resume function the cold process never reached has no stored code: the warm
    process traces it when reached (torch.compile's route would), not runs it eagerly
    for good, and the rest stays untraced."""
    (tmp_path / "broken.py").write_text(_MODEL)
    drive(tmp_path, (1,))
    warm = drive(tmp_path, (1, -1))
    assert warm["loaded"] == 1
    assert warm["graphs"] == 1, warm  # the other side's graph only


def test_a_frame_with_no_module_is_left_out_of_the_package(tmp_path: Path) -> None:
    """A frame whose code has no module is traced in every process, as torch.compile's
    route would; the rest of the function is stored and loaded (it failed the whole
    package before: OPT and Whisper on CUDA, whose model outputs are dataclasses)."""
    (tmp_path / "broken.py").write_text(_EXEC_MODEL)
    cold = drive(tmp_path, (1, -1), "NetExec")
    assert "not stored" not in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1, -1), "NetExec")
    assert warm["loaded"] == 1, warm["log"][-3000:]
    assert 0 < warm["graphs"] < cold["graphs"], (cold["graphs"], warm["graphs"])


# Parametrized layers (torch.nn.utils.parametrizations: Wav2Vec2's and HuBERT's positional
# conv is weight-normed): parametrizing swaps a module's class for one made for it alone,
# whose __getstate__ raises, and Dynamo's guard pickler pickled such a module by its class.
_NORMED_MODEL = (
    _MODEL
    + """

class NetNormed(Net):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 16))
        self.b = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(16, 8))

    def forward(self, x):
        return self.b(self.a(x).relu()).tanh()


class NetNormedBroken(NetNormed):
    def forward(self, x):
        y = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(y).tanh()
"""
)


def test_a_model_with_parametrized_layers_is_stored_whole_and_loads(tmp_path: Path) -> None:
    """weight_norm and spectral_norm: stored whole (it was declined, "Serialization of
    parametrized modules is only supported through state_dict()", and every warm process
    traced it); a warm process loads it, traces nothing and matches eager (drive checks
    outputs and gradients; spectral_norm's power iteration updates its buffers each step)."""
    (tmp_path / "broken.py").write_text(_NORMED_MODEL)
    cold = drive(tmp_path, (1, -1), "NetNormed")
    assert "not stored" not in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1, -1), "NetNormed")
    assert "not loaded" not in warm["log"], warm["log"][-3000:]
    assert warm["loaded"] == 1 and warm["graphs"] == 0 and warm["frames"] == {}, warm


def test_a_graph_broken_model_with_parametrized_layers_is_packaged_and_loads(
    tmp_path: Path,
) -> None:
    """The same through a graph break: every frame was left out of the package (its guards
    did not pickle) and the function was declined."""
    (tmp_path / "broken.py").write_text(_NORMED_MODEL)
    cold = drive(tmp_path, (1, -1), "NetNormedBroken")
    assert "not stored" not in cold["log"], cold["log"][-3000:]
    warm = drive(tmp_path, (1, -1), "NetNormedBroken")
    assert "not loaded" not in warm["log"], warm["log"][-3000:]
    assert warm["loaded"] == 1 and warm["graphs"] == 0, (warm, warm["log"][-3000:])


def test_a_parametrized_module_s_guards_load_only_onto_the_same_parametrization() -> None:
    """A stored parametrized module is rebuilt as an object of the live module's class at
    its path, and only where that module is parametrized as the stored one was: a model
    changed there fails the load (compiled afresh), never runs the stored function."""
    import functools

    import pytest
    import torch
    from torch.nn.utils.parametrizations import weight_norm

    from fcache.engine.whole import contexts

    def model(norm: Any) -> torch.nn.Module:
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        if norm is not None:
            norm(net[1])
        return net

    # What the guard pickler stores for the module (`_parametrized` and its arguments).
    state = torch.nn.Module.__getstate__(model(weight_norm)[1])
    stored = ("1", torch.nn.Linear, ("weight",), state)
    live = model(weight_norm)
    with contexts.parametrized_by_path(live):
        rebuilt = contexts._parametrized(*stored)
    assert type(rebuilt) is type(live[1]) and rebuilt.__dict__.keys() == state.keys()
    # Not parametrized, or its class not the stored one's (another original class, other
    # tensors; which parametrization runs is a submodule's, guarded as any module is).
    conv = torch.nn.Sequential(torch.nn.Linear(4, 4), weight_norm(torch.nn.Conv1d(4, 4, 1)))
    for other in (model(None), model(functools.partial(weight_norm, name="bias")), conv):
        with contexts.parametrized_by_path(other), pytest.raises(RuntimeError):
            contexts._parametrized(*stored)
    with pytest.raises(RuntimeError):  # no model: nothing to rebuild it as
        contexts._parametrized(*stored)


_OPT = """
import json, sys
sys.path[:0] = [{root!r}]
import torch, fcache
import fcache.engine.backend as backend_module
from tests.text_executor import register
from transformers import OPTConfig, OPTForCausalLM
register()
traced = []
call = backend_module.Backend.__call__
backend_module.Backend.__call__ = lambda self, gm, xs: traced.append(1) or call(self, gm, xs)
# Layer-drop draws a random number and branches on it: a graph break in every layer.
cfg = OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                word_embed_proj_dim=32, attn_implementation="sdpa", use_cache=False,
                layerdrop=1e-9)
torch.manual_seed(0)
model, reference = OPTForCausalLM(cfg).train(), OPTForCausalLM(cfg).train()
reference.load_state_dict(model.state_dict())
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(model, settings=settings)
tokens = torch.randint(0, 128, (2, 8))
out = compiled(input_ids=tokens).logits
ref = reference(input_ids=tokens).logits
out.float().square().mean().backward()
ref.float().square().mean().backward()
grad_error = max((p.grad - q.grad).abs().max().item()
                 for p, q in zip(model.parameters(), reference.parameters()) if p.grad is not None)
stats = fcache.stats(compiled)
print(json.dumps({{"error": (out - ref).abs().max().item(), "grad_error": grad_error,
                  "graphs": len(traced), "loaded": stats.functions_loaded}}))
"""


def test_a_hugging_face_model_broken_by_layer_drop_starts_warm_without_tracing(
    tmp_path: Path,
) -> None:
    """OPT with layer-drop, as transformers writes it: the package needs the module aliases
    Dynamo's bytecode loads, guards through a registry's functions left out, and the
    decorated forward's own signature; a warm process traces no graph."""
    import pytest

    from fcache.engine.whole import packaged

    # Runs on torch 2.13 and 2.11 (on a CPU with transformers 5.17, the H200's versions:
    # OPT's package failed there on Dynamo's `lambda: None` constant before e101eb0).
    if not packaged.supported():
        pytest.skip("this torch has no CompilePackage fcache can store")
    environ = {**os.environ, "FCACHE_DIR": str(tmp_path / "fcache"), "FCACHE_WHOLE": "1"}
    reports = []
    for run in ("cold", "warm"):
        environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / f"inductor-{run}")
        proc = fresh.run(
            [sys.executable, "-c", _OPT.format(root=str(ROOT))],
            env=environ, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report["error"] < 1e-5 and report["grad_error"] < 1e-5, report
        reports.append((report, proc.stderr))
    (cold, _), (warm, log) = reports
    assert cold["graphs"] > 0 and cold["loaded"] == 0, cold
    assert warm["loaded"] == 1 and warm["graphs"] == 0, (warm, log[-3000:])


class _Planted:
    """What a forged package entry could hold: a call of another function at load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_stored_package_naming_any_other_callable_is_refused(tmp_path: Path) -> None:
    """A package entry is read by an unpickler that names only torch's package records:
    a planted call (here Path.touch) is refused before it runs, as is a backend result of
    a kind that is not one of torch's serializable ones."""
    import pickle

    import pytest

    from fcache.engine.whole import package_bytes

    marker = tmp_path / "ran"
    for planted in (
        (_Planted(marker), {}, {}),
        (None, {"b": ("builtins:eval", b"")}, {}),  # names a kind, loaded by name: see below
    ):
        data = pickle.dumps(planted)
        if planted[0] is not None:
            with pytest.raises(pickle.UnpicklingError, match="may not name pathlib"):
                package_bytes.loads(data)
        else:
            assert package_bytes.loads(data) == planted  # strings only; the kind is checked:
            assert "builtins:eval" not in package_bytes.serializable_kinds()
    with pytest.raises(pickle.UnpicklingError, match=r"may not name builtins\.eval"):
        package_bytes.loads(pickle.dumps((eval, {}, {})))  # a builtin function, never
    assert package_bytes.loads(pickle.dumps((super, {}, {})))[0] is super  # a type, as Dynamo's
    assert not marker.exists()
    kinds = package_bytes.serializable_kinds()
    assert "fcache.engine.whole.serializable:Bundled" in kinds


def test_the_bytecode_dynamo_emits_to_pop_a_null_can_be_stored() -> None:
    """torch emits a call of a `lambda: None` to pop a NULL (a graph break inside a list
    comprehension on Python 3.12: OPT's and Whisper's resume code on the H200), which no
    package could pickle. With the package route's codegen the constant is
    package_bytes.nop, and a stored entry holding it reads back through the restricted
    unpickler."""
    import pickle

    from torch._dynamo import codegen

    from fcache.engine.whole import package_bytes, packaged

    packaged.picklable_pop_null()
    packaged.picklable_pop_null()  # once per process: not wrapped twice
    emitted = codegen.PyCodegen.__new__(codegen.PyCodegen).pop_null()
    assert emitted[0].opname == "LOAD_CONST" and emitted[0].argval is package_bytes.nop
    assert [i.opname for i in emitted[1:]][-1] == "POP_TOP"
    stored = pickle.dumps((emitted[0].argval, {}, {}, {}))
    assert package_bytes.loads(stored)[0] is package_bytes.nop
    assert package_bytes.nop() is None
