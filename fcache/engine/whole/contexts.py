"""Context managers around a whole stored function's load and aot_compile
(fcache.engine.whole.route): the garbage collector paused while one loads, builtins
carried and gradients set aside while one is compiled, guard sources pickled as torch
can rebuild them, parametrized modules' guards pickled by their path in the model; and
contexts entered only around the frames Dynamo compiles (`around_compiles`); and a frame
whose guards cannot be built left out of a package's install (`unbuildable_guards_skipped`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from fcache import process

log = logging.getLogger(__name__)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a function loads: loading allocates
    many objects (graphs, guards, kernels), which sets off full collections that walk
    every object of a process holding torch and a model (0.2 of a 1.0 s warm first step
    on a 16-layer Hugging Face Llama, CPU). Nothing is lost: garbage made meanwhile is
    collected at the next collection."""
    import gc

    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def builtins_carried() -> Iterator[None]:
    """torch 2.11's aot_compile refuses its own result when the traced bytecode loads a
    builtin (`type`, `len`: every Hugging Face forward does), because it looks for each
    global among the module's globals only. torch 2.13 carries the builtins the bytecode
    loads with the function's globals (`GraphCaptureOutput.get_runtime_env`); this does
    the same on releases without that, while aot_compile runs."""
    from torch._dynamo import convert_frame

    if hasattr(convert_frame, "_safe_builtins_dict"):  # torch's own fix is there
        yield
        return
    import builtins

    capture = convert_frame.GraphCaptureOutput
    original = capture.get_runtime_env

    def get_runtime_env(self: Any) -> Any:
        env = original(self)
        carried = {
            name: getattr(builtins, name)
            for name in env.external_refs
            if name not in env.used_globals and hasattr(builtins, name)
        }
        return dataclasses.replace(env, used_globals={**env.used_globals, **carried})

    capture.get_runtime_env = get_runtime_env
    try:
        yield
    finally:
        capture.get_runtime_env = original


@contextlib.contextmanager
def code_state_of(target: Any) -> Iterator[None]:
    """Dynamo's automatic-dynamic state (the sizes each input was seen at) kept per
    target while aot_compile traces it. Dynamo compiles a function from torch's own files
    (`nn.Linear.forward`, `nn.Embedding.forward`: the modules fcache.jit(blocks=True)
    compiles outside the blocks) through `external_utils.wrap_inline`, whose one `inner`
    code object frames all of them; torch 2.11 keys the state by code object alone
    (`pgo.CodeId.make(code)`), so the embedding's (2, 8) tokens and the output layer's
    (2, 8, 32) input were one input seen at two shapes, and the output layer was traced
    with every size symbolic at its first call (Inductor's dynamic graph, not regions).
    torch 2.13 keys it by the closure too (`CodeId.make(code, closure)`: per wrapped
    function); this does the same on 2.11, swapping the shared entry for the target's."""
    import inspect

    from torch._dynamo import external_utils, pgo

    if "closure" in inspect.signature(pgo.CodeId.make).parameters:  # torch's own fix
        yield
        return
    code_id = pgo.CodeId.make(external_utils.wrap_inline(target).__code__)
    states = pgo.get_code_state()
    shared = states.pop(code_id, None)
    kept: dict[Any, Any] = process.shared("contexts.code_states", dict)  # per target
    states[code_id] = kept.setdefault(target, pgo.CodeState())
    try:
        yield
    finally:
        state = states.pop(code_id, None)  # None: torch's state reset meanwhile
        if state is not None:
            kept[target] = state
        if shared is not None:
            states[code_id] = shared


@contextlib.contextmanager
def sources_rebuildable() -> Iterator[None]:
    """Guard sources pickled with their constructor's arguments only. torch 2.11 pickles
    a source (`torch._guards.dataclass_with_cached_hash`) as its class and every field,
    computed ones (`field(init=False)`: DefaultsSource's `field` and `_name`) too, which
    its constructor then refuses: a function whose guards read a default argument value
    (BERT's, Whisper's, Qwen2-MoE's forward on an H200) was stored but never loaded
    ("DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were
    given"). torch 2.13 leaves them out; this does the same while aot_compile pickles
    the guards it builds (`CompileArtifacts.guards_state`: bytes before it returns)."""
    patched = [(cls, cls.__dict__["__reduce__"]) for cls in _sources_misreduced()]
    for cls, _ in patched:
        cls.__reduce__ = _reduce_by_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, original in patched:
            cls.__reduce__ = original  # type: ignore[method-assign]


def _reduce_by_init(self: Any) -> tuple[type, tuple[Any, ...]]:
    fields = dataclasses.fields(self)
    return type(self), tuple(getattr(self, f.name) for f in fields if f.init)


def _sources_misreduced() -> list[type]:
    """The guard source classes with computed fields and a `__reduce__` of their own,
    where this torch's passes those fields to the constructor (none where it does not)."""
    from torch._dynamo import source
    from torch._guards import Source

    # What unpickling does with a source: its class called with what `__reduce__` gives.
    rebuild, arguments = source.DefaultsSource(source.LocalSource("x"), 0).__reduce__()
    try:
        rebuild(*arguments)
        return []  # this torch leaves computed fields out (or they are patched already)
    except TypeError:
        pass
    found: list[type] = []
    stack: list[type] = [Source]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        computed = dataclasses.is_dataclass(cls) and not all(
            f.init for f in dataclasses.fields(cls)
        )
        if computed and "__reduce__" in cls.__dict__:
            found.append(cls)
    return found


@contextlib.contextmanager
def grads_hidden(model: torch.nn.Module | None) -> Iterator[None]:
    """The model's parameters without their gradients while aot_compile runs, put back
    after. torch saves each guarded tensor with its `.grad`, but a gradient is no guarded
    value and is saved as "missing", which torch then cannot assign when it rebuilds the
    guards in the loading process: a function traced after a training step (a second
    input shape) could be stored but never loaded. A forward reads no `.grad`."""
    held = [(p, p.grad) for p in (model.parameters() if model is not None else ())]
    held = [(p, g) for p, g in held if g is not None]
    for p, _ in held:
        p.grad = None
    try:
        yield
    finally:
        for p, g in held:
            p.grad = g


@contextlib.contextmanager
def own_attributes_hidden(model: torch.nn.Module | None, own: object) -> Iterator[None]:
    """`model`'s instance attributes that hold `own` (the compiled callable itself:
    `model.forward = fcache.jit(model.forward)`, Hugging Face's recipe) out of its
    `__dict__` while aot_compile runs, put back after. Dynamo pickles a guarded module's
    `__dict__`, callables included, and the compiled wrapper holds locks: the function
    was never stored. The traced function is the class's forward, which reads no
    instance attribute holding its own wrapper."""
    names = [k for k, v in vars(model).items() if v is own] if model is not None else []
    for name in names:
        del vars(model)[name]
    try:
        yield
    finally:
        for name in names:
            vars(model)[name] = own


@contextlib.contextmanager
def parametrized_by_path(model: torch.nn.Module | None) -> Iterator[None]:
    """Guards on a parametrized submodule of `model` (torch.nn.utils.parametrize:
    weight_norm, spectral_norm; Wav2Vec2's and HuBERT's positional conv) pickled, and
    unpickled, while this is entered around a compile or a load. Parametrizing a module
    swaps its class for one made for that module alone (`Parametrized<Cls>`, with the
    tensor's property on it), whose `__getstate__` raises: Dynamo's guard pickler falls
    back to pickling such a module by its class, so a function reaching one was never
    stored (fullgraph) or left every frame out of its package. And the class could not be
    named in another process: a guard on the module's type (Dynamo's TYPE_MATCH) is by
    the identity of the class.

    Here such a module is pickled as its path in `model`, its original class, the names
    of its parametrized tensors and its `__dict__` (tensors as Dynamo pickles any: their
    metadata), and unpickled as an object of the class of the LIVE module at that path,
    with that `__dict__`: the guards are built on the stored values, as for any module,
    and the type guard is on the class of this process's module. That class holds only
    the original class and a property per parametrized tensor; a module at that path
    whose class differs in either fails the load (compiled afresh), so a changed model
    never runs a stored function. The parametrizations themselves (weight_norm's or
    spectral_norm's module) are submodules, guarded as any module is.
    Outside this context (no model) the guard pickler does what it did before."""
    process.shared("contexts.parametrized_reducer", _install_parametrized_reducer)
    with process.set_in_thread(_by_path(), "model", model):
        yield


def _install_parametrized_reducer() -> bool:
    from torch._dynamo.guards import GuardsStatePickler
    from torch.nn.utils import parametrize

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        model = getattr(_by_path(), "model", None)
        if (
            model is None
            or not isinstance(obj, torch.nn.Module)
            or not parametrize.is_parametrized(obj)
            or id(obj) not in self.guard_tree_values  # not guarded: torch's "missing"
        ):
            return original(self, obj)
        path = next((n for n, m in model.named_modules(remove_duplicate=False) if m is obj), None)
        if path is None:  # not the model's: as before (refused)
            return original(self, obj)
        # What torch's own module reduction leaves out: plain values no guard reads.
        for value in obj.__dict__.values():
            if isinstance(value, (torch.Tensor, torch.nn.Module)) or callable(value):
                continue
            if id(value) not in self.guard_tree_values:
                self.missing_values[id(value)] = value
        names = tuple(sorted(obj.parametrizations.keys()))
        state = torch.nn.Module.__getstate__(obj)
        return _parametrized, (path, type(obj).__bases__[0], names, state)

    GuardsStatePickler.reducer_override = reducer_override
    return True


def _parametrized(path: str, original: type, names: tuple[str, ...], state: Any) -> Any:
    """A parametrized module's stored guard state as an object of the live module's class
    (`parametrized_by_path`). Unpickled by torch's guard loader, which is plain pickle (a
    stored function's guards are trusted as the rest of the entry is: checksum and
    signature); this makes nothing but an instance of a class the live model already has,
    and only where that class is the stored one's kind (original class, tensor names)."""
    from torch.nn.utils import parametrize

    model = getattr(_by_path(), "model", None)
    if model is None:
        raise RuntimeError("a parametrized module's guards load only with their model")
    live = model.get_submodule(path)
    kind = type(live)
    same = (
        parametrize.is_parametrized(live)
        and kind.__bases__[0] is original
        and tuple(sorted(live.parametrizations.keys())) == names
    )
    if not same:
        raise RuntimeError(f"the module {path!r} is not parametrized as the stored one was")
    rebuilt = kind.__new__(kind)
    torch.nn.Module.__setstate__(rebuilt, state)
    return rebuilt


def _by_path() -> threading.local:
    """`model`, per thread: the model whose parametrized modules go by their path."""
    return process.shared("contexts.parametrized", threading.local)


@contextlib.contextmanager
def around_compiles(factory: Callable[[], contextlib.ExitStack]) -> Iterator[None]:
    """Every frame Dynamo compiles in this thread while this is entered is compiled inside
    `factory()` (an ExitStack of entered contexts, closed when that compile ends); calls
    that compile nothing pay nothing. A cold packaged function's later calls use it: its
    recording contexts (gradients hidden, guards pickled as loadable) around every call
    cost a graph-broken OPT 0.8 ms of a 5.5 ms step on a CPU, and its cold process stepped
    1.6x slower than its warm one on an H200. Dynamo runs its compile callbacks only for
    the outermost of compiles that overlap in time: a frame compiled while another thread
    compiles gets no contexts, so its guards may not store (torch.compile's route then)."""
    local = process.shared("contexts.around_compiles", _install_compile_callbacks)
    with process.set_in_thread(local, "factory", factory):
        yield


def _install_compile_callbacks() -> threading.local:
    """Dynamo's compile start and end callbacks, entering and closing the factory of the
    thread's `around_compiles` (once per process)."""
    local = threading.local()

    def start(_: Any) -> None:
        factory = getattr(local, "factory", None)
        if factory is not None and getattr(local, "stack", None) is None:
            local.stack = factory()

    def end(_: Any) -> None:
        stack = getattr(local, "stack", None)
        if stack is not None:
            local.stack = None
            stack.close()

    torch._dynamo.callback_handler.register_start_callback(start)
    torch._dynamo.callback_handler.register_end_callback(end)
    return local


@contextlib.contextmanager
def unbuildable_guards_skipped() -> Iterator[None]:
    """A frame's compiled code whose guards cannot be built in this process left out of the
    install (the frame is traced where it is reached), instead of failing the package.
    Guards may name state that the model's first call makes: transformers' registry of
    output recorders (`_CAN_RECORD_REGISTRY`) holds the classes that have run, and a guard
    on its second key cannot even be built before (IndexError: SegFormer's warm process
    failed to load its package and traced everything). Patched around `install` only,
    where torch has these two functions (2.13; if 2.11 lacks one, left as is)."""
    from torch._C._dynamo import eval_frame as c_eval_frame
    from torch._dynamo import package as dynamo_package

    build = getattr(dynamo_package, "load_guard_manager", None)
    enter = getattr(c_eval_frame, "_load_precompile_entry", None)  # install imports it
    if build is None or enter is None:
        yield
        return
    skipped = object()

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return build(*args, **kwargs)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.info("fcache: a frame's stored code left out (its guards: %s)", reason)
            return skipped

    def entered(code: Any, guard_manager: Any, *rest: Any) -> Any:
        return None if guard_manager is skipped else enter(code, guard_manager, *rest)

    with (
        mock.patch.object(dynamo_package, "load_guard_manager", guarded),
        mock.patch.object(c_eval_frame, "_load_precompile_entry", entered),
    ):
        yield
