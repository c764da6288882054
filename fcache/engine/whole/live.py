"""A stored whole function made live in the process that runs it (fcache.engine.whole.route).

torch's aot_compile gives a compiled function a copy of its module's globals and builds
its guards against that copy; pickle cannot name a decorated forward's closure; Dynamo's
bytecode loads modules and its compiled graph under names of its own. This module turns
such a function, compiled here or loaded, into one that runs as a function traced by
torch.compile's route does: with its module's live globals, guards built against them,
the live closure, and its traced sources checked against the ones in this process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import types
import uuid
from collections.abc import Callable
from typing import Any


def external(target: Callable[..., Any]) -> dict[str, Any]:
    """What a stored function refers to that pickle cannot name, by a name that is the
    same when it is stored and loaded: the contents of the traced function's closure. A
    decorated `forward` (Hugging Face's are) is a wrapper whose closure holds the real
    one, which pickle cannot find under its own qualified name."""
    cells = getattr(target, "__closure__", None) or ()
    return {
        f"closure:{target.__qualname__}:{i}": cell.cell_contents
        for i, cell in enumerate(cells)
        if not isinstance(cell.cell_contents, (type(None), bool, int, float, str, bytes))
    }


@functools.cache
def live_type() -> type:
    """torch's AOTCompiledFunction, except that deserializing it builds no guards: they
    are built once, by `go_live`, against the live globals."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    class Live(AOTCompiledFunction):  # type: ignore[misc]
        def __post_init__(self) -> None:
            self._artifacts.guard_manager = _LATER  # torch builds none when one is set
            super().__post_init__()

    return Live


_LATER = object()


def go_live(fn: Any, target: Callable[..., Any], guards: bool) -> Any:
    """`fn` running with the globals of `target`'s module itself, as a function traced by
    torch.compile's route does. torch gives an aot_compile'd function a copy of them, so
    that a module-level value changed after the function was made (a flag, a tensor) would
    be read stale by its bytecode and by its guards (for a loaded function, `guards`: they
    are built here, against the live module). The names Dynamo's bytecode needs beside the
    module's own (its compiled function under a unique name, the modules it imports under
    aliases) are installed in the module as Dynamo's tracing installs them."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    scope = target.__globals__
    made = fn.fn
    backend_id = fn._artifacts.backend_id
    for name, value in made.__globals__.items():
        if name != backend_id:
            scope.setdefault(name, value)
    # The compiled function goes under a name of this live function's own: the stored one
    # is Dynamo's, under which its tracing installed the traced graph itself (a GraphModule
    # that runs the model's ops eagerly), and which every function loaded from the same
    # entry shares. Its bytecode loads it by that name, so the name is renamed there.
    own = f"{backend_id}_{uuid.uuid4().hex}"
    scope[own] = made.__globals__[backend_id]
    code = made.__code__
    code = code.replace(co_names=tuple(own if n == backend_id else n for n in code.co_names))
    live = types.FunctionType(code, scope, made.__name__, made.__defaults__, made.__closure__)
    live.__kwdefaults__ = made.__kwdefaults__
    fn.fn = live
    if guards:
        artifacts = fn._artifacts
        with tracing_context():
            state = load_guards_state(artifacts.guards_state)
            artifacts.guard_manager = load_guard_manager(state, artifacts.original_code, scope)
    return fn


def tracing_context() -> contextlib.AbstractContextManager[Any]:
    """A throwaway tracing context, where none is active, for unpickling Dynamo's guards.
    Some guard sources register a guard of their own when they are built, in the trace
    that is running (`ImportSource`: Dynamo guards `torch.utils._pytree` through it
    wherever it traces pytree code, as `associative_scan` does); unpickled outside a
    trace they raise, and a stored function could never be loaded."""
    from torch._guards import TracingContext, tracing

    if TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    return tracing(TracingContext(None))


def check_guards(fn: Any) -> None:
    """Raise if `fn`'s pickled guards do not unpickle: what a loading process does first
    (a function that cannot be loaded is not stored, see route.Whole._compile_as)."""
    from torch._dynamo.package import load_guards_state

    with tracing_context():
        load_guards_state(fn._artifacts.guards_state)


def installed_modules(fn: Any, target: Callable[..., Any]) -> str:
    """JSON of the globals Dynamo installed for its bytecode that the traced function's
    module does not define (`___module_collections_<id>_c0`): modules, by name, to import
    again where the function is loaded. ValueError for any other kind of value: pickle
    does not carry it and the loading process would not have it."""
    env = fn._artifacts.runtime_env
    scope = fn.fn.__globals__
    modules = {}
    for name in sorted(getattr(env, "external_refs", ())):
        value = scope.get(name)
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        elif name.startswith("___"):
            raise ValueError(f"Dynamo's global {name} is a {type(value).__qualname__}")
    return json.dumps(modules, sort_keys=True)


def module_globals(target: Callable[..., Any], modules: str) -> dict[str, Any]:
    """The globals a loaded function runs with: its module's, and the modules it names."""
    scope = dict(getattr(target, "__globals__", {}))
    scope.update({name: importlib.import_module(m) for name, m in json.loads(modules).items()})
    return scope


def changed_source(fn: Any) -> str | None:
    """The first module whose source the loaded function `fn` was traced from differs
    here, None if all are the same. Checked before its bytecode first runs."""
    from torch._dynamo import package

    for source in fn.source_info().inlined_sources:
        module = importlib.import_module(source.module)
        now = package._hash_sourcelines(module, source.firstlineno, source.lastlineno)
        if now != source.checksum:
            return f"{source.module}, lines {source.firstlineno}-{source.lastlineno}"
    return None
