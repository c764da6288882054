"""Whole compiled functions in fcache's tiers, so that a warm process skips Dynamo too.

Why. A stored program (fcache.engine.programs.graph) lets a warm process skip AOTAutograd and
fcache's partitioning, but the program is found by the Dynamo graph, so the process still
traced the model with Dynamo first: 1-3 s on a 16-layer Hugging Face model, most of
torch.compile's own warm start. torch's precompile route (`aot_compile`) keeps what Dynamo
made as bytes: the transformed bytecode, its guards, the checksums of the source it
traced and the backend's result (for fcache, its programs: graph text and plan, never a
kernel). fcache stores those bytes in its tiers, beside the regions.

On by default (Settings.whole, FCACHE_WHOLE=0 turns it off): on an H100 a warm process
starts in 0.26-0.37x torch.compile's warm start on Hugging Face Llama and GPT-2
(bench/results/gpu-h100-warm-start-2026-11-25). On torch 2.11, whose aot_compile looks for
the builtins a forward loads among its module's globals, they are carried with the
function (`contexts.builtins_carried`), as torch 2.13 does. A function is traced with the
parameters' gradients put aside (torch cannot rebuild the guards of one traced with them).

How. `Whole` is the forward of a model `fcache.jit` compiled. The first call with a new
input signature computes a key without tracing (`call_key`: the function's name and
source, the module tree's types and tensor metadata, the inputs' metadata, grad, autocast
and other global state, configs, versions and fcache's settings), then:

- found: the bytes are loaded (each program rebuilds from its plan: region look-ups,
  nothing traced), the sources Dynamo traced are checked against the ones in this
  process (a changed line anywhere the model ran misses) and Dynamo's guards against
  this model and these inputs, all before the function first runs. All good: that is the
  signature's function.
- missing, or found but refused: `aot_compile` (Dynamo with fullgraph=True, then fcache's
  backend as usual), stored, used.
- a model with a graph break: on torch 2.13 and later, Dynamo's CompilePackage of its
  frames (fcache.engine.whole.packaged: every frame's bytecode and guards, the resume
  functions' too) is stored under the key instead, so a warm process traces none of them
  (a tiny OPT with layer-drop on the CPU: 0.34 s against 2.88 s traced);
- a model Dynamo cannot capture whole otherwise (a guard torch cannot serialize, a package
  Dynamo refuses): torch.compile's route for it, as before, and a marker under the key so
  that warm processes take that route at once.

Later calls check the guards of this signature's function (about 10 us on a 2-layer
model on a CPU) and run it; a call no stored function's guards accept takes the first-call
path again. Module hooks (the model's own or global ones, and its submodules' as they
are at its first call: Dynamo's guards do not look at hooks) take torch.compile's route:
a whole function is the model's `forward`, without `__call__`'s hooks. With CUDA graphs
on, a loaded function's programs are wrapped as a compiled one's are (one Dynamo graph:
one wrapper), their static inputs read from the programs. A model under DDP takes
torch.compile's route too, which cuts its graphs at DDP's buckets (fcache.engine.whole.ddp).

Trust. An entry is torch's pickle, read through the TieredCache (checksummed, and signed
and verified with a signing key, refused otherwise, as a stored program is) and only for
the key it was stored under; its kernels are fcache regions, verified as every region is.

Failure contract: nothing here makes a model fail that torch.compile's route would run.
A failed look-up, load, check or store is logged and costs time, never the step.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fcache.cache import torch_entries
from fcache.cache.artifact import Artifact
from fcache.cache.torch_entries import fcache_key
from fcache.engine.programs import store as programs
from fcache.engine.static_caches import mark_static_caches
from fcache.engine.whole import broken, contexts, ddp, packaged, serializable
from fcache.engine.whole import dims as whole_dims
from fcache.engine.whole import key as whole_key
from fcache.engine.whole import live as whole_live
from fcache.engine.whole.broken import first_line
from fcache.engine.whole.key import Wildcard, call_signature, unkeyable
from fcache.errors import CorruptArtifact

if TYPE_CHECKING:
    from fcache.engine.backend import Backend

log = logging.getLogger(__name__)

DECLINED = "declined"  # meta of a marker: why this function cannot be stored whole
MODULES = "modules"  # meta: modules Dynamo's bytecode loads by names of its own (JSON)


class Whole:
    """The compiled `forward` of `model` (or the compiled function `fn`, with `model`
    None): whole stored functions where possible, `fallback` (torch.compile's route)
    otherwise. Thread-safe: first calls take a lock, later ones only check guards."""

    def __init__(
        self,
        target: Callable[..., Any],
        model: torch.nn.Module | None,
        fallback: Callable[..., Any],
        backend: Backend,
        dynamic: bool | None,
    ) -> None:
        self._target = target  # type(model).forward for a module, else the function
        self._model = model
        self._fallback = fallback
        self._backend = backend
        self._dynamic = dynamic
        # AOTCompiledFunctions, one per input signature, shared by every Whole of this
        # backend and target: the repeated blocks of fcache.jit(blocks=True) are one
        # target, and a block whose inputs and parameters a function's guards accept runs
        # it as the block that loaded or compiled it does (no key, no load: 50-90 ms a
        # block on a CPU host).
        self._functions: list[Any] = backend.whole_functions.setdefault(target, [])
        self._last: Any = None  # the function this module's last call ran
        self._broken = broken.Broken(self)  # a graph-broken function's package
        self._submodules_hooked: bool | None = None  # at the first call (see _hooked)
        self._declined: set[str] = set()  # keys whose function runs through `fallback`
        # The same, by `call_signature`: a declined call's next calls take `fallback` without
        # computing the key again (4-8 ms of module walks, source reads and config digests
        # a step on a 4-layer Hugging Face model: most of what fcache's steps took over
        # torch.compile's on models not stored whole; bench/results/gpu-h200-any-model).
        self._declined_calls: set[Any] = set()
        # The same, by `call_signature(sizes=False)`, for inputs no key can describe.
        self._declined_kinds: set[Any] = set()
        self._lock = threading.Lock()
        functools.update_wrapper(self, target)
        # A bound forward's wrapper set back on its module is no override of the class's
        # forward: the module's key stays the module's (whole.key).
        setattr(self, whole_key.STANDS_FOR, (target, model))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self._fallback(*args, **kwargs)
        # A static key/value cache's tensors, which the decode step writes in place, are
        # fixed addresses (for CUDA graphs; fcache.engine.static_caches says why).
        mark_static_caches(args, kwargs)
        # Under DDP, torch.compile's route cuts the graphs at DDP's buckets (whole.ddp).
        if self._hooked() or ddp.bucketed():
            return self._fallback(*args, **kwargs)
        full = (self._model, *args) if self._model is not None else args
        fn = self._matching(full, kwargs)
        if fn is None:
            with self._lock:
                fn = self._function(full, kwargs)
        if fn is None:
            return self._fallback(*args, **kwargs)
        # What entering a torch.compile'd function does first: a new generation, by which
        # CUDA-graph trees tell one step's call from the next (without it, every step
        # after the first is taken for part of the first: recorded anew, never replayed).
        torch._dynamo.mutation_guard.GenerationTracker.generation += 1
        return fn.fn(*full, **kwargs)

    # What a graph-broken function's package (fcache.engine.whole.broken) needs of it.
    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def target(self) -> Callable[..., Any]:
        return self._target

    @property
    def model(self) -> Any:
        return self._model

    @property
    def dynamic(self) -> bool | None:
        return self._dynamic

    def store(self, key: str, data: bytes, seconds: float = 0.0, **meta: str) -> None:
        self._backend.session.cache.put(fcache_key(key), _entry(key, data, seconds, **meta))

    def decline(
        self,
        keys: list[str],
        reason: str,
        call: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
        drop: Any = None,
    ) -> None:
        """A marker under each of `keys` (later processes take torch.compile's route at
        once); with a `call` that is running, its signature's next calls here too, and
        the function `drop` that failed forgotten."""
        for key in keys:
            self.store(key, b"", **{DECLINED: reason})
        if call is not None:
            self._declined.update(keys)
            self._declined_calls.add(call_signature(self._model, *call))
        if drop is not None:
            if drop in self._functions:
                self._functions.remove(drop)
            self._last = None

    def fallback(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """torch.compile's route for a call of the whole function's own inputs."""
        return self._fallback(*(args[1:] if self._model is not None else args), **kwargs)

    def _hooked(self) -> bool:
        """Hooks a whole function would not run: the module's own (a whole function is
        `forward`, not `__call__`), global ones, and, as they were at this module's first
        call, its submodules' (Dynamo's guards do not look at hooks, torch's default: a
        function traced or stored without a submodule's hook would pass them). Hooked:
        torch.compile's route, which traces the hooks. A hook added to a submodule after
        the first call is not seen, as torch.compile does not see it."""
        model = self._model
        if model is None:
            return False
        if self._submodules_hooked is None:
            self._submodules_hooked = any(_has_hooks(m) for m in model.modules() if m is not model)
        return (
            self._submodules_hooked
            or _has_hooks(model)
            or torch.nn.modules.module._has_any_global_hook()
        )

    def _matching(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The function of these inputs' signature, if this process has it: the one this
        module ran last first (the list is shared by the modules of one target, whose
        guards may each accept only their own)."""
        last = self._last
        if last is not None and last.guard_check(*args, **kwargs):
            return last
        found = next((fn for fn in self._functions if fn.guard_check(*args, **kwargs)), None)
        if found is not None:
            self._last = found
        return found

    def _function(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The stored function for these inputs, compiled and stored if missing; None
        where torch.compile's route must run them."""
        fn = self._matching(args, kwargs)  # made by another thread meanwhile
        if fn is not None:
            return fn
        if self._broken.fn is not None:  # graph-broken: Dynamo checks its frames' guards
            return self._broken.fn
        signature = call_signature(self._model, args, kwargs)
        if signature in self._declined_calls:  # a model with a graph break: every step
            return None
        # An input no key describes (a Hugging Face key/value cache): declined by the
        # inputs' types, whatever their sizes. A decode loop's every step is a new length:
        # by the exact signature, each step would start a key, 4-8 ms of a token's time.
        kinds = call_signature(self._model, args, kwargs, sizes=False)
        if kinds in self._declined_kinds:
            return None
        inputs = args[1:] if self._model is not None else args
        if (kind := unkeyable(inputs, kwargs)) is not None:
            log.info("fcache: not stored whole (inputs not keyable: an input of type %s)",
                     kind.__qualname__)  # fmt: skip
            self._declined_kinds.add(kinds)
            return None
        try:
            exact, dyn, dims = whole_dims.keys(
                self._target, self._model, args, kwargs, self._dynamic, self._backend
            )
        except Exception as exc:  # an input fcache cannot describe: torch.compile's route
            log.info("fcache: not stored whole (inputs not keyable: %s)", exc)
            self._declined_calls.add(signature)
            return None
        keys = [k for k in (exact, dyn) if k is not None]
        if any(k in self._declined for k in keys):
            return None
        fn = None
        for k in keys:  # the exact signature's function first, then the dynamic one
            fn = self._load(k, args, kwargs)
            if fn is not None or k in self._declined:  # a stored marker declines it at once
                break
        if fn is None and not any(k in self._declined for k in keys):
            fn = self._compile(exact, dyn, dims, args, kwargs)
        if fn is None:
            self._declined.update(keys)
            self._declined_calls.add(signature)
            return None
        self._functions.append(fn)
        self._last = fn
        return fn

    def _load(self, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from fcache.engine.programs import graph as program

        session = self._backend.session
        start = time.perf_counter()
        try:
            found = session.cache.get(fcache_key(key))
            if found is None:
                return None
            entry = found[0]
            torch_entries.value_of(key, entry)  # CorruptArtifact unless stored for `key`
        except CorruptArtifact as exc:
            log.warning("fcache: ignoring stored function %s: %s", fcache_key(key), exc)
            return None
        if DECLINED in entry.meta:
            log.info("fcache: taking torch.compile's route (%s)", entry.meta[DECLINED])
            self._declined.add(key)
            return None
        if packaged.PACKAGED in entry.meta:
            return self._broken.load(key, entry, args, kwargs)
        token = program.building.set(
            program.Building(session, self._backend.record, 0, self._backend.new_wrapper())
        )
        try:
            with contexts.collector_paused(), contexts.parametrized_by_path(self._model):
                fn = whole_live.live_type().deserialize(
                    entry.payload,
                    f_globals=whole_live.module_globals(
                        self._target, entry.meta.get(MODULES, "{}")
                    ),
                    external_closure_data=whole_live.external(self._target),
                )
                whole_live.go_live(fn, self._target, guards=True)
            changed = whole_live.changed_source(fn)
            if changed:
                log.info("fcache: stored function is stale (%s changed); compiling", changed)
                return None
            if not fn.guard_check(*args, **kwargs):
                log.info("fcache: stored function's guards reject these inputs; compiling")
                return None
        except Exception as exc:  # a foreign torch, a damaged entry: compile afresh
            log.warning(
                "fcache: stored function %s not loaded (%s); compiling",
                key, exc, exc_info=log.isEnabledFor(logging.DEBUG),
            )  # fmt: skip
            return None
        finally:
            program.building.reset(token)
        with self._backend.record.lock:
            self._backend.record.functions_loaded += 1
        log.debug("fcache: stored function loaded in %.3fs", time.perf_counter() - start)
        return fn

    def _compile(
        self,
        exact: str | None,
        dyn: str | None,
        dims: Wildcard,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """aot_compile for these inputs; stored under `dyn` (`dims` left out) when its
        graphs came out symbolic and `dyn` holds no function yet (one that is there
        rejected these inputs: a size its guards exclude), under `exact` otherwise."""
        # No marks of ours on the caller's tensors: torch's automatic dynamic makes the
        # dimensions this process saw at two sizes dynamic (a process that did not, one
        # whose stored dynamic function is missing or rejects these inputs, compiles this
        # size, and stores it under its exact key).
        symbolic: list[bool] = []
        fn = self._compile_as([k for k in (exact, dyn) if k], args, kwargs, symbolic)
        if fn is None or not isinstance(fn, tuple):
            return fn
        fn, data, seconds, modules = fn
        cache = self._backend.session.cache
        key = exact
        free = dyn is not None and (exact is None or cache.get(fcache_key(dyn)) is None)
        if any(symbolic) and free:
            key = dyn
        if key is not None and data is not None:
            self.store(key, data, seconds, **{MODULES: modules})
        return fn

    def _compile_as(
        self, keys: list[str], args: tuple[Any, ...], kwargs: dict[str, Any], symbolic: list[bool]
    ) -> Any:
        """aot_compile for these inputs: (function, its bytes or None where it cannot be
        stored, seconds, modules), or None where Dynamo cannot capture it whole (a marker
        stored under `keys` then says so)."""
        start = time.perf_counter()
        # A cold start: the compile workers start now, while Dynamo traces, not when
        # AOTAutograd does (a GPU worker's start-up, 4.5-5 s on an H100 host, is about a
        # 2-layer model's whole capture).
        self._backend.prestart(_device(args, kwargs, self._model))
        guards = functools.partial(
            serializable.storable_guards, serializable.freevars(self._target)
        )
        try:
            # torch 2.11 offers aot_compile only with this set (2.13: always on).
            with (
                torch._dynamo.config.patch(enable_aot_compile=True),
                programs.pickled_outside_modes(),
                contexts.sources_rebuildable(),  # guards are pickled as they are built
                contexts.parametrized_by_path(self._model),
                contexts.builtins_carried(),
                contexts.grads_hidden(self._model),
                contexts.own_attributes_hidden(self._model, self),
                contexts.code_state_of(self._target),
                warnings.catch_warnings(),
            ):
                # Dynamo's guards read each input's .grad; an input that is an activation
                # (a block's, under fcache.jit(blocks=True)) makes torch warn about it.
                warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor")
                compiled = torch.compile(
                    self._target,
                    backend=serializable.Serializable(self._backend, symbolic),
                    fullgraph=True,
                    dynamic=self._dynamic,
                    options={"guard_filter_fn": guards},
                )
                fn = compiled.aot_compile((args, kwargs))
            if not fn.guard_check(*args, **kwargs):  # the gradients back: a forward read them
                raise RuntimeError("its guards reject the inputs it was traced for")
        except Exception as exc:
            reason = first_line(exc)
            if (fn := self._broken.new(keys, exc)) is not None:
                return fn
            log.info(
                "fcache: not stored whole, a warm process will trace it with Dynamo (%s)",
                reason,
            )
            self.decline(keys, reason)
            return None
        seconds = time.perf_counter() - start
        try:
            modules = whole_live.installed_modules(fn, self._target)
            data = type(fn).serialize(fn, whole_live.external(self._target)).serialized_data
            with contexts.parametrized_by_path(self._model):
                whole_live.check_guards(fn)  # what a loading process unpickles first
        except Exception as exc:  # usable here, not storable: later processes take
            # torch.compile's route at once (they would trace, compile and fail again)
            reason = first_line(exc)
            log.info("fcache: compiled function not stored (%s)", reason)
            self.decline(keys, f"not storable: {reason}")
            modules, data = "{}", None
        return whole_live.go_live(fn, self._target, guards=False), data, seconds, modules


def install(compiled: Any, model: Any, backend: Backend, dynamic: bool | None) -> Any:
    """`compiled` (torch.compile's result for `model`) with whole stored functions in
    front of it where torch supports them; `compiled` itself otherwise."""
    if isinstance(model, torch.nn.Module):
        # torch's own aot_compile for modules replaces the OptimizedModule's forward too.
        forward = compiled.forward
        if (wrapped := in_place(model, forward, backend, dynamic)) is not forward:
            compiled.forward = wrapped
        return compiled
    if inspect.isfunction(model) and _supported():
        return Whole(model, None, compiled, backend, dynamic)
    if inspect.ismethod(model) and isinstance(model.__self__, torch.nn.Module):
        # A module's bound method (Hugging Face's recipe: `model.forward =
        # fcache.jit(model.forward)`): stored whole as the module's own forward is, its
        # function called with the module as `self`.
        owner = model.__self__
        if inspect.isfunction(model.__func__) and _supported() and not _lazy_or_ddp(owner):
            return Whole(model.__func__, owner, compiled, backend, dynamic)
    return compiled


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def in_place(
    model: torch.nn.Module,
    fallback: Callable[..., Any],
    backend: Backend,
    dynamic: bool | None,
) -> Callable[..., Any]:
    """What calling `model` runs once compiled in place (`fallback`: torch.compile of its
    `_call_impl`, as nn.Module.compile() makes it), with whole stored functions in front
    where torch supports them (not for a lazy module: its shapes are set at its first call;
    nor for a DDP module: whole.ddp)."""
    if not _supported() or _lazy_or_ddp(model):
        return fallback
    return Whole(type(model).forward, model, fallback, backend, dynamic)


def _lazy_or_ddp(model: torch.nn.Module) -> bool:
    """A lazy module (its shapes are set at its first call) or a DDP one (whole.ddp)."""
    return hasattr(model, "_initialize_hook") or ddp.is_ddp(model)


def _supported() -> bool:
    try:
        from torch._dynamo.aot_compile import AOTCompiledFunction
    except ImportError:
        return False
    return all(hasattr(AOTCompiledFunction, n) for n in ("serialize", "deserialize"))


def _entry(key: str, data: bytes, seconds: float = 0.0, **meta: str) -> Artifact:
    """A stored function (or a DECLINED marker) as torch entries are stored."""
    entry = torch_entries.artifact(key, data, str(torch.__version__))
    return dataclasses.replace(entry, compile_seconds=seconds, meta={**entry.meta, **meta})


def _device(
    args: tuple[Any, ...], kwargs: dict[str, Any], model: torch.nn.Module | None
) -> torch.device | None:
    """The device of the first tensor among the inputs, else of the model's parameters."""
    params = model.parameters() if model is not None else iter(())
    values = itertools.chain(args, kwargs.values(), itertools.islice(params, 1))
    return next((v.device for v in values if isinstance(v, torch.Tensor)), None)
