"""What makes a Dynamo capture storable: the backend's results in torch's serializable
form (`Serializable`, whose results pickle as `Bundled` of this module) and the guards a
stored function keeps (`storable_guards`). Used by the whole route (aot_compile) and by a
graph-broken function's package (fcache.engine.whole.packaged) alike."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fcache.engine.backend import Backend


class Serializable:
    """fcache's backend as aot_compile needs it: its result (AOTAutograd's compiled
    function over fcache's programs) wrapped in torch's serializable form. torch 2.13
    wraps it itself when the backend has an AOTAutograd `compiler_fn`; torch 2.11 only
    for its own backends, and refuses others."""

    def __init__(self, backend: Backend, symbolic: list[bool] | None = None) -> None:
        self._backend = backend
        self._symbolic = symbolic if symbolic is not None else []  # per graph: sizes symbolic

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Any:
        from torch._dynamo.aot_compile_types import SerializableCallable

        from fcache.engine import dynamic

        self._symbolic.append(dynamic.is_symbolic(gm, example_inputs))
        fn = self._backend(gm, example_inputs)
        return fn if isinstance(fn, SerializableCallable) else bundled()(fn)


@functools.cache
def bundled() -> type:
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

    class Bundled(BundledAOTAutogradSerializableCallable):  # type: ignore[misc]
        # torch 2.13 wraps a result that has `serialize` once more: this one has none.
        serialize = None

    Bundled.__module__, Bundled.__qualname__ = __name__, "Bundled"
    return Bundled


def __getattr__(name: str) -> Any:
    if name == "Bundled":  # where pickle finds the class of a stored function's result
        return bundled()
    raise AttributeError(name)


def storable_guards(freevars: Sequence[str], entries: Sequence[Any]) -> list[bool]:
    """The guards a stored function keeps: all but those of a kind torch cannot
    serialize (object identities, closures), also where only a guard a kind derives from
    cannot be (an object's identity under a type check; torch's own filter keeps those
    and then fails to serialize them), and none on the traced function's closure
    (`freevars`: a decorator's wrapped function, whose guards torch 2.13 cannot rebuild
    on load; the closure a loaded function runs with is the live function's,
    `whole_live.external`).
    Unlike torch's own choice for aot_compile, guards on globals stay: a module-level
    constant the forward reads, changed at run time, makes the stored function miss, as
    torch.compile's route would recompile. What is dropped, the key and the checked
    sources stand for."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    keep = [
        e.guard_type not in unsupported
        and not unsupported.intersection(e.derived_guard_types)
        and _root(e.name) not in freevars
        for e in entries
    ]
    for e in entries:
        # torch builds the guards again after this filter, on the same Guard objects,
        # and refuses a second object for one source: a property that makes a new object
        # per access (transformers' `config.per_layer_config`) fails the second build.
        # What the first build recorded is forgotten; the second records it again.
        guard = e.orig_guard
        guard.guard_types = guard.code_list = None
        guard.obj_weakref = guard.guarded_class_weakref = None
    return keep


def _root(name: str) -> str:
    """The variable a guard's source starts from: "func" of "func.__closure__[3]"."""
    return re.split(r"[.\[]", name, maxsplit=1)[0]


def freevars(target: Callable[..., Any]) -> tuple[str, ...]:
    code = getattr(target, "__code__", None)
    return tuple(code.co_freevars) if code is not None else ()
