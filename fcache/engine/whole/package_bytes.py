"""A graph-broken function's package as bytes (fcache.engine.whole.packaged): Dynamo's
own record of its frames, the backends' results by kind, and what installing it needs that
the record lacks (module aliases, torch 2.11's unnamed resume functions); and read back by
an unpickler that names nothing but torch's package records.

Trust. The bytes come from the TieredCache, verified there (checksum, and signature with a
signing key) as every stored function is; the restricted unpickler keeps a forged or
damaged entry from naming any other callable, and a backend's bytes are loaded only by one
of torch's serializable kinds. A module, or a module's globals, is stored as its name and
read back as the one this process has already imported: reading never imports."""

from __future__ import annotations

import builtins
import io
import pickle  # the package's own record: see loads
import sys
import types
from typing import Any

# What a stored package's entry may name: Dynamo's package records (torch/_dynamo/package.py)
# and torch's version string. Its other contents are builtin values: the frames' bytecode
# and constants, and bytes (each frame's guards, which torch unpickles as it builds them,
# as the whole route's torch deserializer does with a stored function's; the backends'
# results, loaded by their own kind's deserializer, one of torch's serializable kinds).
_ENTRY_CLASSES = {("fcache.engine.whole.package_bytes", "nop")} | {
    ("torch._dynamo.package", name)
    for name in (
        "_DynamoCacheEntry", "_DynamoCodeCacheEntry", "_GuardedCodeCacheEntry",
        "SerializedCode", "SourceInfo", "InlinedSource", "SystemInfo",
    )
} | {("torch.torch_version", "TorchVersion")}  # fmt: skip
# Builtins a frame's bytecode constants may hold: builtin types (`super`, `slice`; making
# one runs no code of the entry's), and these two values. Never a builtin function.
_BUILTIN_VALUES = {"Ellipsis", "NotImplemented"}


def nop() -> None:
    """What Dynamo's bytecode calls to pop a NULL off the stack (`PyCodegen.pop_null`), in
    place of torch's `lambda: None`, which pickle cannot name: a graph break inside a list
    comprehension (Python 3.12 and later) put it in OPT's and Whisper's resume code on the
    H200, and their package was not stored ("Can't pickle local object
    'PyCodegen.pop_null.<locals>.<lambda>'"). Installed by `packaged.picklable_pop_null`."""


class _EntryPickler(pickle.Pickler):
    """Writes a module, or a module's globals, as its name (a persistent id), read back as
    the module this process has imported (`imported`): the live objects, never a copy.
    Dynamo puts them in a resume function's constants where it rebuilds a function of the
    frame (SegFormer's hook-installing frame, resumed after a graph break on a lock: the
    `__globals__` of transformers' output_capturing, modules among its values), and pickle
    either cannot write them (a module, a ContextVar) or would write a stale copy. (A
    persistent id, not `reducer_override`, which pickle does not consult for a dict.)"""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, types.ModuleType):
            return ("module", obj.__name__)
        name = obj.get("__name__") if type(obj) is dict else None
        if isinstance(name, str) and getattr(sys.modules.get(name), "__dict__", None) is obj:
            return ("globals", name)
        return None


class _EntryUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        builtin = module == "builtins" and (
            name in _BUILTIN_VALUES or isinstance(getattr(builtins, name, None), type)
        )
        if (module, name) in _ENTRY_CLASSES or builtin:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a stored package may not name {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        """A module or a module's globals, by name (`_EntryPickler`), as imported here."""
        match pid:
            case ("module", str(name)):
                return imported(name)
            case ("globals", str(name)):
                return imported(name).__dict__
        raise pickle.UnpicklingError(f"a stored package names {pid!r}")


def dumps(
    entry: Any, backends: dict[str, tuple[str, bytes]], aliases: Any, resumes: dict[int, str]
) -> bytes:
    out = io.BytesIO()
    _EntryPickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump((entry, backends, aliases, resumes))
    return out.getvalue()


def loads(data: bytes) -> tuple[Any, Any, dict[str, dict[str, str]], dict[int, str]]:
    """A stored package, read by an unpickler that names nothing but `_ENTRY_CLASSES`
    (the entry was verified by the TieredCache before: checksum, and signature with a
    key; this keeps a forged or damaged one from naming any other callable)."""
    return _EntryUnpickler(io.BytesIO(data)).load()  # type: ignore[no-any-return]


def kind_name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def serializable_kinds() -> dict[str, type]:
    """torch's serializable backend results by name: those a stored backend may be."""
    from torch._dynamo.aot_compile_types import SerializableCallable

    from fcache.engine.whole import serializable

    serializable.bundled()  # fcache's own kind exists once asked for
    found, todo = {}, [SerializableCallable]
    while todo:
        kind = todo.pop()
        found[kind_name(kind)] = kind
        todo.extend(kind.__subclasses__())
    return found


def imported(name: str) -> Any:
    """A module a stored package names, if this process has it (a package never
    imports one: a module Dynamo's bytecode refers to was imported by the traced code)."""
    module = sys.modules.get(name)
    if module is None:
        raise RuntimeError(f"module {name} is not imported")
    return module


def check_sources(entry: Any) -> None:
    """What CompilePackage checks on load, checked here first: every traced source read
    back from its module's file (a model defined in a `python -c` script has none, and
    its package could never load: each warm process would trace it twice, store it again)."""
    from torch._dynamo.package import _hash_sourcelines

    for code in entry.source_info.inlined_sources:
        module = sys.modules.get(code.module)
        try:
            checksum = _hash_sourcelines(module, code.firstlineno, code.lastlineno)
        except (OSError, TypeError) as exc:
            raise ValueError(f"a traced source of {code.module} has no file ({exc})") from exc
        if checksum != code.checksum:
            raise ValueError(f"a traced source of {code.module} changed while running")


def unnamed_resumes(package: Any) -> dict[int, str]:
    """torch 2.11 records a resume function with free variables without its name, and
    installs nothing for it: its callers' bytecode loads its code object from the module's
    globals by a name of the cold process (`__resume_at_<offset>_<n>`), found here by
    identity, by the code's position in the package."""
    found = {}
    for position, (code, entry) in enumerate(package._codes.items()):
        module = sys.modules.get(entry.python_module)
        if entry.install_to_global and not entry.function_names and module is not None:
            name = next((n for n, v in vars(module).items() if v is code), None)
            if name is not None:
                found[position] = name
    return found


def module_aliases(entry: Any) -> dict[str, dict[str, str]]:
    """The modules Dynamo's bytecode loads under names of its own
    (`___module_collections_<id>_c17`), by the module whose globals hold them: installed
    when a frame is traced, not by the package, so a loading process installs them."""
    import types

    found: dict[str, dict[str, str]] = {}
    for code in entry.codes:
        module = sys.modules.get(code.python_module)
        for name, value in vars(module).items() if module is not None else ():
            if name.startswith("___module_") and isinstance(value, types.ModuleType):
                found.setdefault(code.python_module, {})[name] = value.__name__
    return found
