"""A graph-broken function stored whole as Dynamo's CompilePackage.

Why. `aot_compile` (fcache.engine.whole.route) refuses a function with a graph break, and
torch.compile's route then traces every frame in every process. Dynamo has a second way
to keep what it made, the one `torch._dynamo.config.caching_precompile` uses
(torch/_dynamo/package.py, in torch 2.11 and 2.13): a `CompilePackage` passed to
`torch._dynamo.optimize(backend, package=...)` records, for every frame Dynamo traces
from the function (the function itself, the resume functions after each break, the
functions it could not inline), the transformed bytecode, its guards (pickled), the
sources it read and the ids of the backend's results. `package.install(backends)` in
another process puts the resume functions and compiled graphs into their modules'
globals and the bytecode with its guards onto each code object as "precompile
entries", which the frame evaluator runs without tracing while their guards pass.

How. A cold process runs the function once through `optimize(..., package=...)`, with
fcache's backend wrapped as aot_compile wraps it (its results serializable, as
`serializable.Serializable`); after that first call the package's entry and the backends'
bytes are stored under the function's key, in the same TieredCache entry kind as a
whole function (signed and verified the same way), marked PACKAGED. A warm process
loads the entry, checks the traced sources (CompilePackage does, refusing a changed
one) and installs it; frames whose guards reject their inputs are traced by Dynamo as
torch.compile's route would.

Limits: one package per traced function and process. The cold process stores it again
whenever Dynamo traced more of it (another input signature, the other side of a branch);
a warm process stores nothing more, so what it traces anew (a resume function the cold
process never reached, another signature) it traces in every process. Frames a package
cannot hold are left out and traced where reached: code no module holds (a dataclass's
generated `__init__`), guards Dynamo cannot pickle. Not stored at all (torch.compile's
route, with the declined marker): a function whose own frame Dynamo skipped (a graph
break in a loop) or whose traced sources cannot be read back (a `python -c` script).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._dynamo.exc import InternalTorchDynamoError, PackageError

from fcache import process
from fcache.engine.programs import key as program_key
from fcache.engine.whole import contexts, package_bytes
from fcache.engine.whole import live as whole_live

log = logging.getLogger(__name__)

PACKAGED = "packaged"  # meta of an entry: a CompilePackage, not an aot_compile'd function


# The torch releases this route runs on. torch 2.11 has the same package code, but records
# a resume function with free variables without a name, and its install() has no closure
# factory for one (torch/_dynamo/symbolic_convert.py, package.py of 2.11): such a package
# is not stored there (`serialize`), and the function keeps torch.compile's route.
VERIFIED_FROM = "2.11"


def supported() -> bool:
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__.split("+")[0]) < VERIFIED_FROM:
        return False
    try:
        from torch._C._dynamo.eval_frame import (  # noqa: F401
            _debug_get_cache_entry_list,
            _debug_get_precompile_entries,
        )
        from torch._dynamo.package import CompilePackage  # noqa: F401
    except ImportError:
        return False
    return "package" in inspect.signature(torch._dynamo.eval_frame._optimize).parameters


class _Recording:
    """fcache's backend as the package needs it: each Dynamo graph's result serializable
    (serializable.Serializable) and kept by its backend id, compiled under the settings
    aot_compile compiles with (the result holds its compiled graphs itself)."""

    def __init__(self, backend: Callable[..., Any], recorded: dict[str, Any]) -> None:
        self._backend = backend
        self._recorded = recorded
        self.compiler_name = getattr(backend, "compiler_name", "fcache")

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Any:
        with torch._functorch.config.patch(
            bundled_autograd_cache=True,
            force_non_lazy_backward_lowering=True,
            **program_key.PACKAGE_SETTINGS,
        ):
            fn = self._backend(gm, example_inputs)
        backend_id = getattr(gm, "_backend_id", None)
        if backend_id is not None:
            self._recorded[backend_id] = fn
        return fn


class _Loaded:
    """A stored backend result as CompilePackage.install takes it."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def after_deserialization(self) -> Any:
        return self._fn


class Packaged:
    """A function (fcache's whole-function target) run through Dynamo with a
    CompilePackage: `fn` runs it (the first call of a cold one stores the package with
    `store`), `guard_check` says whether its first frame's guards accept the inputs."""

    def __init__(
        self,
        target: Callable[..., Any],
        backend: Callable[..., Any],
        dynamic: bool | None,
        guards: Callable[..., Any],
        package: Any,
        store: Callable[[Packaged, tuple[Any, ...], dict[str, Any]], None] | None = None,
        failed: Callable[[tuple[Any, ...], dict[str, Any], BaseException], Any] | None = None,
        context: Callable[[], Any] | None = None,
        installed: dict[str, set[str]] | None = None,
    ) -> None:
        self._target = target
        self._package = package
        self._store = store
        # A call whose Dynamo bookkeeping failed: what runs it instead of raising.
        self._failed = failed
        self._installed = installed  # a loaded one's: module globals before its install
        self._running = process.shared("packaged.pickle_guards_state", _bypass_hook)
        self._context = context  # what the cold first call runs in
        self.recorded: dict[str, Any] = {}
        self._signature = inspect.signature(target, follow_wrapped=False)  # the frame's own
        self._compiled = torch._dynamo.optimize(
            _Recording(backend, self.recorded),
            package=package,
            guard_filter_fn=frames_guards(guards),
            dynamic=dynamic,
        )(target)
        self.seconds = 0.0
        self._stored = 0  # Dynamo graphs in the package as last stored

    def fn(self, *args: Any, **kwargs: Any) -> Any:
        # Dynamo's package bookkeeping can fail where torch.compile's route would not (a
        # frame whose module it cannot find, a guard it cannot serialize: an
        # AssertionError in torch 2.13), at the first call or at any later one that
        # traces a new frame: such a call is handed to `failed` (torch.compile's route).
        first = self._context is not None and self.seconds == 0.0
        start = time.perf_counter()
        # A cold package's first call runs in its context (gradients hidden while Dynamo
        # pickles guards); a later one may trace a frame too, which then compiles in it.
        around: Any = contextlib.nullcontext()
        if self._context is not None and self._store is not None:  # recording
            around = self._context() if first else contexts.around_compiles(self._context)
        try:
            with around, process.set_in_thread(self._running, "package", self._package):
                out = self._compiled(*args, **kwargs)
        except (PackageError, AssertionError, InternalTorchDynamoError) as exc:
            # (An internal error is how Dynamo reports any other exception of its own
            # bookkeeping, a KeyError in a package's name lookup; where torch.compile's
            # route fails the same way, the handler's call raises it again.)
            if self._failed is None:
                raise
            self._store = None
            return self._failed(args, kwargs, exc)
        if first:
            self.seconds = time.perf_counter() - start
        # Stored again whenever Dynamo traced more of it (the other side of a branch,
        # reached later in the cold process): a warm process then traces none of it.
        if self._store is not None and len(self.recorded) > self._stored:
            self._stored = len(self.recorded)
            self._store(self, args, kwargs)
        return out

    def on_failure(
        self, handler: Callable[[tuple[Any, ...], dict[str, Any], BaseException], Any]
    ) -> None:
        """What runs a call whose Dynamo bookkeeping failed, in place of raising (a loaded
        package's; a cold one's is given to `new`)."""
        self._failed = handler

    def forget(self) -> None:
        """A loaded package out of this process (`_forget`): its globals, its bytecode."""
        _forget(self._package, self._installed)

    def stop_storing(self) -> None:
        """No store after a failed one (a frame Dynamo traces later is not stored)."""
        self._store = None

    def guard_check(self, *args: Any, **kwargs: Any) -> bool:
        from torch._C._dynamo.eval_frame import (
            _debug_get_cache_entry_list,
            _debug_get_precompile_entries,
        )

        code = self._target.__code__  # type: ignore[attr-defined]
        entries = [*_debug_get_precompile_entries(code), *_debug_get_cache_entry_list(code)]
        if not entries:
            return self._store is not None  # cold, before its first call
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError:
            return False
        bound.apply_defaults()
        f_locals = dict(bound.arguments)
        if any(e.guard_manager.check(f_locals) for e in entries):
            return True
        if log.isEnabledFor(logging.DEBUG):
            for e in entries:
                verbose = e.guard_manager.check_verbose(f_locals)
                log.debug(
                    "fcache: a package frame's guards reject: %s", verbose.verbose_code_parts[:3]
                )
        return False

    def serialize(self) -> bytes:
        """The package's entry and its backends' bytes; ValueError where a frame's guards
        could not be stored (torch bypasses such a frame) or a backend result is missing."""
        entry = self._package.cache_entry()
        # A frame whose guards could not be pickled is left out ("bypassed": a warm process
        # traces it when reached), but not the function's own: then nothing would be saved.
        own = entry.codes[0]  # the function's own frame (CompilePackage.validate)
        if own.bypassed:
            raise ValueError("the function's own frame's guards could not be serialized")
        # Dynamo skipped it (a graph break in a loop): a warm process would find no entry
        # to check, and trace it all again.
        if not own.guarded_codes:
            raise ValueError("Dynamo compiled none of the function's own frame")
        package_bytes.check_sources(entry)
        resumes = package_bytes.unnamed_resumes(self._package)
        unnamed = [code.install_to_global and not code.function_names for code in entry.codes]
        if any(u and i not in resumes for i, u in enumerate(unnamed)):
            raise ValueError("a resume function with free variables not found by name")
        backends = {}
        for backend_id in entry.backend_ids:
            fn = self.recorded.get(backend_id)
            if fn is None:
                raise ValueError(f"no result recorded for {backend_id}")
            kind = type(fn)
            backends[backend_id] = (
                package_bytes.kind_name(kind),
                kind.serialize_compile_artifacts(fn),
            )
        return package_bytes.dumps(entry, backends, package_bytes.module_aliases(entry), resumes)


def new(
    target: Callable[..., Any],
    backend: Callable[..., Any],
    dynamic: bool | None,
    guards: Callable[..., Any],
    store: Callable[[Packaged, tuple[Any, ...], dict[str, Any]], None],
    failed: Callable[[tuple[Any, ...], dict[str, Any], BaseException], Any],
    context: Callable[[], Any],
) -> Packaged:
    """A cold packaged function: traced at its first call (in `context`), stored after
    it; a call whose Dynamo bookkeeping fails is handed to `failed`."""

    picklable_pop_null()
    package = _package_type()(target)
    return Packaged(target, backend, dynamic, guards, package, store, failed, context)


@functools.cache
def _package_type() -> type:
    from torch._dynamo.package import CompilePackage

    class Package(CompilePackage):  # type: ignore[misc]
        """A frame Dynamo compiles from code no module holds (a dataclass's generated
        `__init__`, exec'd from "<string>": transformers' model outputs) is left out of
        the package, not failing it: a warm process traces that frame when reached."""

        def code_context(self, code: Any) -> Any:
            if code not in self._codes:
                try:
                    self._add_user_function(code)
                except PackageError as exc:
                    log.debug("fcache: a frame left out of the package: %s", exc)
                    return self._left_out()
            return super().code_context(code)

        @contextlib.contextmanager
        def _left_out(self) -> Iterator[None]:
            # What Dynamo records for the frame goes to an entry no one stores.
            self._current_entry = types.SimpleNamespace(
                bypassed=True, guarded_codes=[], import_sources={}, backend_ids=[]
            )
            try:
                yield
            finally:
                self._current_entry = None

    return Package


def _bypass_hook() -> threading.local:
    """Guards Dynamo cannot pickle (a function its pickler cannot name: a PicklingError,
    which torch reports as an internal error, failing the call) leave their frame out of
    the package (a warm process traces it), not fail the call. torch's own bypass, for a
    PackageError, fails too: its caller then asserts that guards were saved. Installed
    once per process; it acts only in a thread running a packaged function (the
    returned thread-local's `package`, set around a packaged function's call)."""
    import torch._dynamo.guards as guards

    running = threading.local()
    original = guards.pickle_guards_state

    def pickled(state: Any, builder: Any) -> bytes:
        package = getattr(running, "package", None)
        if package is None:
            return original(state, builder)
        try:
            return original(state, builder)
        except Exception as exc:
            log.info("fcache: a frame left out of the package (guards: %s)", exc)
            package.bypass_current_entry()  # add_guarded_code then records nothing
            return b""

    guards.pickle_guards_state = pickled
    return running


def picklable_pop_null() -> None:
    """Dynamo's `PyCodegen.pop_null` with `package_bytes.nop` as the function it calls,
    where torch puts a lambda (torch 2.11 and 2.13 alike): the same bytecode, a constant a
    package can store. Once per process, for every Dynamo compile (the call is the same)."""
    process.shared("packaged.pop_null", _install_pop_null)


def _install_pop_null() -> bool:
    from torch._dynamo.codegen import PyCodegen

    original = PyCodegen.pop_null

    def pop_null(self: Any) -> list[Any]:
        out = original(self)
        first = out[0] if out else None
        value = getattr(first, "argval", None)
        if first is not None and first.opname == "LOAD_CONST" and _lambda(value):
            out[0] = self.create_load_const_unchecked(package_bytes.nop)
        return out

    PyCodegen.pop_null = pop_null  # type: ignore[method-assign]
    return True


def _lambda(value: Any) -> bool:
    return callable(value) and getattr(value, "__name__", None) == "<lambda>"


def frames_guards(guards: Callable[[Sequence[Any]], list[bool]]) -> Callable[..., list[bool]]:
    """`guards` (serializable.storable_guards) for every frame of a package, less those on a
    function's closure (a decorated forward's wrapper, traced as a frame of its own after
    a break: its closure pickles as missing and its guards fail to build on load)."""

    def keep(entries: Sequence[Any]) -> list[bool]:
        kept = zip(guards(entries), entries, strict=True)
        return [k and not _unpicklable_reach(e.name) for k, e in kept]

    return keep


def _unpicklable_reach(name: str) -> bool:
    """Whether a guard reads through a function's closure or its defaults (a decorated
    forward's wrapper; transformers' mask functions, reached through a registry's dict):
    such functions pickle as missing and the guard fails to build on load. What they guard
    is the traced source's, which the package checks by checksum. TODO: a default that is
    not a literal of its source (set at run time) goes unguarded."""
    return "__closure__" in name or ".__defaults__" in name


def load(
    data: bytes,
    target: Callable[..., Any],
    backend: Callable[..., Any],
    dynamic: bool | None,
    guards: Callable[..., Any],
) -> Packaged:
    """The stored package installed: its frames run without tracing while their guards
    pass. RuntimeError where a traced source changed or the entry is from another torch."""

    entry, stored, aliases, resumes = package_bytes.loads(data)
    kinds = package_bytes.serializable_kinds()
    if unknown := {kind for kind, _ in stored.values()} - set(kinds):
        raise RuntimeError(f"stored results of kinds torch cannot load: {sorted(unknown)}")
    with torch._inductor.config.patch(enable_autograd_for_aot=True):
        backends = {
            bid: _Loaded(kinds[kind].deserialize_compile_artifacts(blob))
            for bid, (kind, blob) in stored.items()
        }
    package = _package_type()(target, entry)  # checks versions and the traced sources
    before = _globals_of(package)
    try:
        for module, names in aliases.items():  # Dynamo's bytecode loads modules by these
            scope = package_bytes.imported(module).__dict__
            for alias, name in names.items():
                scope.setdefault(alias, package_bytes.imported(name))
        with whole_live.tracing_context(), contexts.unbuildable_guards_skipped():
            package.install(backends)  # its guards are unpickled in the tracing context
        codes = list(package._codes.items())
        for position, name in resumes.items():  # torch 2.11's, by the name its callers use
            code, code_entry = codes[position]
            package_bytes.imported(code_entry.python_module).__dict__[name] = code
    except BaseException:
        _forget(package, before)
        raise
    _unskip_unreached(package)
    _names_taken(before)
    return Packaged(target, backend, dynamic, guards, package, installed=before)


def _names_taken(before: dict[str, set[str]]) -> None:
    """Dynamo names what it installs in a module's globals (`__resume_at_<offset>_<n>`,
    `__builtins_dict___<n>`) from a counter of its process; a package installs the cold
    process's names. A frame traced after it would take them again: an assertion (a failed
    step) or, for a resume function, silently the wrong code. The counter moves past every
    number the package installed."""
    import itertools

    from torch._dynamo import bytecode_transformation as bt

    numbers = [
        int(match.group(1))
        for module, names in before.items()
        for name in set(vars(sys.modules[module])) - names
        if (match := re.fullmatch(r"__\w+?_(\d+)", name))
    ]
    if numbers:
        bt._unique_id_counter = itertools.count(max(next(bt._unique_id_counter), max(numbers) + 1))


def _globals_of(package: Any) -> dict[str, set[str]]:
    """The names in the globals of every module the package installs into, before it does:
    install() also writes names it does not record (the builtins dict of each frame's
    guards), and a compile afresh in this process asserts that none of its names exist."""
    modules = {getattr(entry, "python_module", None) for entry in package._codes.values()}
    return {m: set(sys.modules[m].__dict__) for m in modules if m in sys.modules}


def _unskip_unreached(package: Any) -> None:
    """install() marks a code with no stored guarded code "skip" (Dynamo never looks at
    it again): a resume function the cold process never reached (the other side of a
    data-dependent branch) would run eagerly for good. Such codes are left to Dynamo,
    which compiles them when reached, as torch.compile's route does."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    for code, entry in package._codes.items():
        if not entry.guarded_codes and entry.install_to_global and not entry.bypassed:
            set_code_exec_strategy(
                code, FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)
            )


def _forget(package: Any, before: dict[str, set[str]] | None = None) -> None:
    """A package whose install failed part way, out of this process: its globals out of
    the modules (a compile afresh needs the names free) and the bytecode it put on each
    code object (the function's and every nested frame's: `uninstall` resets only the
    function's; left there, the nested frames' bytecode loads globals now gone)."""
    from torch._C._dynamo.eval_frame import _reset_precompile_entries
    from torch._dynamo.package import _lookup_code

    try:
        package.uninstall()
    except Exception:
        log.debug("fcache: a failed package's globals not all removed", exc_info=True)

    for module, names in (before or {}).items():
        scope = sys.modules[module].__dict__
        for name in set(scope) - names:
            scope.pop(name, None)
    for code, entry in package._codes.items():
        _reset_precompile_entries(code)
        if entry.code_source:
            try:
                _reset_precompile_entries(_lookup_code(entry))
            except Exception:
                log.debug("fcache: a nested frame of a failed package not found", exc_info=True)
