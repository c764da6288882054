"""Generation under `fcache.jit`: `fcache.jit(model).generate(...)` runs the model's own
`generate` with every call of the model going through fcache.

Why. `fcache.jit(model)` returns torch.compile's wrapper (an OptimizedModule), whose other
attributes are the original module's: `compiled.generate` was the original's method, which
calls the original module, uncompiled. It ran and compiled nothing (torch.compile's result
has the same trait; Hugging Face's docs set `model.forward = torch.compile(model.forward)`
instead, which works here too: `model.forward = fcache.jit(model.forward)`).

How. For the length of a `generate` call, the module's `_compiled_call_impl` is what
`fcache.jit(model, blocks=True)` sets on a block (and `nn.Module.compile()` on a module):
torch.compile of its `_call_impl` with fcache's backend, behind the whole stored functions
where torch supports them, the backend and record the same as the wrapper's. Every call
the loop makes (prefill, each decode step) then goes through fcache: regions for the
static shapes, one dynamic graph once a length is seen at a second size (a DynamicCache's
length; torch's automatic dynamic), nothing new per token after that. Models with a key/value
cache take torch.compile's route (a cache object has no key: not stored whole), so a warm
process traces with Dynamo and loads every compiled graph.

Transformers' own compile of the decode step (`generate` on a GPU with a static cache
compiles `__call__` with Inductor, `generation_config.compile_config`) is turned off for the
call (`disable_compile=True`) unless the caller passes `disable_compile` itself: under it,
fcache's call would be traced into Inductor's graph and never run.

A static cache's tensors are marked static addresses before each call, for CUDA graphs
(fcache.engine.static_caches says why): by the whole route in front of every module and
function fcache.jit compiled (the plain decode loop's calls, and `model.forward =
fcache.jit(model.forward)`'s, too), and here where that route is off.

Thread-safe: the compiled call is installed while any thread is inside `generate` and
removed when the last one leaves (what was there before is put back).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from fcache.engine.static_caches import mark_static_caches
from fcache.engine.whole.route import Whole


class Generate:
    """`compiled.generate` for a module compiled by fcache.jit: `model.generate` with the
    module's calls compiled by `compile_call(model)` (made at the first call)."""

    def __init__(
        self, model: torch.nn.Module, compile_call: Callable[[torch.nn.Module], Any]
    ) -> None:
        self._model = model
        self._compile_call = compile_call
        self._call: Any = None
        self._lock = threading.Lock()
        self._inside = 0  # threads inside generate
        self._previous: Any = None  # the module's own _compiled_call_impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model
        config = getattr(model, "generation_config", None)
        if hasattr(config, "disable_compile"):  # transformers >= 4.50
            kwargs.setdefault("disable_compile", True)
        self._enter()
        try:
            return model.generate(*args, **kwargs)
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._lock:
            if self._call is None:
                call = self._compile_call(self._model)
                # The whole route marks static caches itself, at every call.
                self._call = call if isinstance(call, Whole) else _marking_static_caches(call)
            if self._inside == 0:
                self._previous = vars(self._model).get("_compiled_call_impl")
                self._model._compiled_call_impl = self._call
            self._inside += 1

    def _leave(self) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                if self._previous is None:
                    vars(self._model).pop("_compiled_call_impl", None)
                else:
                    self._model._compiled_call_impl = self._previous
                self._previous = None

    def __repr__(self) -> str:
        return f"<fcache-compiled generate of {type(self._model).__name__}>"


def has_generate(model: object) -> bool:
    """Whether `model` is a module with a `generate` method (a Hugging Face generative
    model, or any module that defines one)."""
    return isinstance(model, torch.nn.Module) and callable(getattr(type(model), "generate", None))


def _marking_static_caches(call: Callable[..., Any]) -> Callable[..., Any]:
    """`call`, marking first the static caches among its arguments."""

    def marked(*args: Any, **kwargs: Any) -> Any:
        mark_static_caches(args, kwargs)
        return call(*args, **kwargs)

    return marked
