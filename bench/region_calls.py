"""Host time inside Inductor's generated wrappers, per call, for `bench.step_profile`
(FCACHE_PROFILE_REGIONS=FILE): is a step's host time in the wrappers (fcache's regions,
torch.compile's one wrapper per graph) or between them?

`install()` (before compiling) wraps the `call` of every wrapper module Inductor's code
cache loads (and the variant without size asserts that fcache's steady calls run),
counting calls and host seconds, and keeps each module's last inputs.
`report(steps)` gives calls and microseconds per step per wrapper, the kind of Triton
launcher each kernel got, and, for the wrapper that takes the most host time, its
source and its host time per call as is and with parts of it taken out (size asserts,
the device guard, the kernel launches themselves): which part of a call costs what.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Any

import torch

_modules: list[dict[str, Any]] = []
_sequence: list[tuple[Any, list[Any]]] | None = None  # one step's calls, while recording
_graphs: list[tuple[Any, list[Any]]] | None = None
_by_thread: dict[str, float] = {}
_hooks: set[str] = set()  # what a call runs under: tracers, profilers, torch modes


def install() -> None:
    from torch._inductor.codecache import PyCodeCache

    from fcache.executors import inductor_python

    load = PyCodeCache.load_by_key_path.__func__  # type: ignore[attr-defined]
    entries: dict[int, dict[str, Any]] = {}

    def load_by_key_path(cls: Any, *args: Any, **kwargs: Any) -> Any:
        module = load(cls, *args, **kwargs)
        call = getattr(module, "call", None)
        if callable(call) and not getattr(call, "_timed", False):
            entry = {"module": module, "calls": 0, "s": 0.0, "inputs": None}
            entries[id(module)] = entry
            module.call = _timed(call, entry)
            _modules.append(entry)
        return module

    PyCodeCache.load_by_key_path = classmethod(load_by_key_path)  # type: ignore[method-assign]
    unchecked_call = inductor_python.unchecked_call

    def timed_unchecked(module: Any, source: str) -> Any:
        # fcache's steady calls skip the size asserts: a variant made from the source,
        # not through module.call; timed into the same entry.
        lean = unchecked_call(module, source)
        entry = entries.get(id(module))
        return lean if lean is None or entry is None else _timed(lean, entry)

    inductor_python.unchecked_call = timed_unchecked  # type: ignore[assignment]


def _timed(call: Any, entry: dict[str, Any]) -> Any:
    def timed(args: list[Any]) -> Any:
        entry["inputs"] = list(args)
        if _sequence is not None:
            _sequence.append((call, list(args)))
        start = time.perf_counter()
        out = call(args)
        took = time.perf_counter() - start
        entry["s"] += took
        entry["calls"] += 1
        thread = threading.current_thread().name
        if len(_hooks) < 20:
            _hooks.add(_hooks_now(thread))
        _by_thread[thread] = _by_thread.get(thread, 0.0) + took
        return out

    timed._timed = True  # type: ignore[attr-defined]
    timed.__wrapped__ = call  # type: ignore[attr-defined]
    if getattr(call, "_boxed_call", False):
        timed._boxed_call = True  # type: ignore[attr-defined]
    return timed


def _hooks_now(thread: str) -> str:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    tools = []
    if monitoring := getattr(sys, "monitoring", None):
        tools = [monitoring.get_tool(i) for i in range(6)]
    callback = torch._C._dynamo.eval_frame.set_eval_frame(None)
    torch._C._dynamo.eval_frame.set_eval_frame(callback)
    return repr((thread, sys.gettrace(), sys.getprofile(), tools, callback,
                 torch._C._len_torch_function_stack(), _get_current_dispatch_mode_stack(),
                 torch.is_grad_enabled()))  # fmt: skip


def reset() -> None:
    for entry in _modules:
        entry["calls"], entry["s"] = 0, 0.0
    _by_thread.clear()


def record() -> None:
    """Keep every wrapper call, and every fcache stitched-graph call, of what runs next
    (with inputs) for `replay`."""
    global _sequence, _graphs
    _sequence, _graphs = [], []


def replay() -> dict[str, Any]:
    """The recorded calls run again (best of 5, under no_grad): the wrappers back to back
    with nothing between them, then fcache's stitched graphs (each a forward or a
    backward: regions and the eager ops between them, without autograd's engine), with
    the host time spent in wrappers meanwhile. In-step wrapper time above the graphs'
    is the step's machinery; above the bare wrappers', what runs between them."""
    global _sequence, _graphs
    sequence, _sequence = _sequence or [], None
    graphs, _graphs = _graphs or [], None
    found: dict[str, Any] = {"calls": len(sequence), **_replayed(sequence)}
    if graphs:
        before = sum(e["s"] for e in _modules)
        found["graphs"] = {"calls": len(graphs), **_replayed(graphs)}
        found["graphs"]["wrapper_ms"] = round((sum(e["s"] for e in _modules) - before) / 5 * 1e3, 2)
    return found


def _replayed(calls: list[tuple[Any, list[Any]]]) -> dict[str, float]:
    host = wall = float("inf")
    with torch.no_grad():
        for _ in range(5):
            _sync()
            start = time.perf_counter()
            for call, inputs in calls:
                call(list(inputs))
            host = min(host, time.perf_counter() - start)
            _sync()
            wall = min(wall, time.perf_counter() - start)
    return {"host_ms": round(host * 1e3, 2), "wall_ms": round(wall * 1e3, 2)}


def install_graphs() -> None:
    """Record fcache's stitched graphs' calls too (before `fcache.jit`)."""
    from fcache.engine.compile import session

    make = session.stitch

    def recorded(*args: Any, **kwargs: Any) -> Any:
        run = make(*args, **kwargs)

        def graph(inputs: list[Any]) -> Any:
            if _graphs is not None:
                _graphs.append((graph_raw, list(inputs)))
            return run(inputs)

        graph_raw = run
        graph._boxed_call = True  # type: ignore[attr-defined]
        return graph

    session.stitch = recorded  # type: ignore[assignment]


def report(steps: int) -> dict[str, Any]:
    used = [e for e in _modules if e["calls"]]
    launchers: dict[str, int] = {}
    for entry in used:
        for value in vars(entry["module"]).values():
            results = getattr(value, "compile_results", None)
            if getattr(value, "launchers", None) is not None and results is not None:
                kind = type(results[0]).__name__ if results else "none"
                launchers[kind] = launchers.get(kind, 0) + 1
    used.sort(key=lambda e: -e["s"])
    out: dict[str, Any] = {
        "wrappers_used": len(used),
        "calls_per_step": sum(e["calls"] for e in used) / steps,
        "host_ms_per_step": round(sum(e["s"] for e in used) / steps * 1e3, 2),
        "host_ms_per_step_by_thread": {k: round(v / steps * 1e3, 2) for k, v in _by_thread.items()},
        "launcher_kinds": launchers,
        "hooks": sorted(_hooks),
        "top": [
            {
                "calls_per_step": e["calls"] / steps,
                "us_per_call": round(e["s"] / e["calls"] * 1e6, 1),
                "kernels": _kernels(e["module"]),
            }
            for e in used[:8]
        ],
    }
    if used:
        out["variants_us"], out["source"] = _variants(used[0])
    return out


def _kernels(module: Any) -> int:
    return sum(1 for v in vars(module).values() if getattr(v, "launchers", None) is not None)


_GUARD = re.compile(
    r"^(\s*)with torch\.cuda\._DeviceGuard\(\d+\):\n\1    torch\.cuda\.set_device\(\d+\)\n", re.M
)


def _variants(entry: dict[str, Any]) -> tuple[dict[str, float], str]:
    """Host microseconds per call of the wrapper's source as is and with parts taken out,
    each loaded as its own module and called with the last inputs it saw."""
    from torch._inductor.codecache import PyCodeCache

    with open(entry["module"].__file__) as f:
        source = f.read()
    no_asserts = re.sub(r"^\s*assert_(size_stride|alignment)\(.*\n", "", source, flags=re.M)
    no_guard = _unguarded(no_asserts)
    no_launch = re.sub(r"^(\s*)(\w+)\.run\(", r"\1_noop(", no_guard, flags=re.M)
    no_launch += "\n\ndef _noop(*args, **kwargs):\n    pass\n"
    found: dict[str, float] = {}
    for name, text in (("as_is", source), ("no_asserts", no_asserts),
                       ("no_guard", no_guard), ("no_launch", no_launch)):  # fmt: skip
        try:
            call = PyCodeCache.load(text + f"\n# variant {name}\n").call
            call = getattr(call, "__wrapped__", call)
            found[name] = _time(call, entry["inputs"])
        except Exception as exc:  # an experiment: say what failed, keep the others
            found[name] = -1.0
            found[f"{name}_error"] = repr(exc)[:200]  # type: ignore[assignment]
    return found, source


def _unguarded(source: str) -> str:
    """`source` with its device guard removed and the guarded block dedented."""
    match = _GUARD.search(source)
    if match is None:
        return source
    indent = match.group(1)
    head, rest = source[: match.start()], source[match.end() :]
    lines = rest.split("\n")
    for i, line in enumerate(lines):
        if line.strip() and not line.startswith(indent + "    "):
            break
        lines[i] = line[4:] if line.startswith(indent + "    ") else line
    return head + "\n".join(lines)


def _time(call: Any, inputs: list[Any], n: int = 200) -> float:
    best = float("inf")
    with torch.no_grad():  # torch.compile's wrappers write into out= buffers
        for _ in range(5):
            _sync()
            start = time.perf_counter()
            for _ in range(n):
                call(list(inputs))
            best = min(best, (time.perf_counter() - start) / n)
    _sync()
    return round(best * 1e6, 2)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
