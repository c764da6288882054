"""Executors by name: the ones fcache ships and any registered, each created once per process.

Adding an executor is one module with a class that implements `fcache.executors.base.Executor`
and one call, before the settings that name it are made:

    from fcache.executors import registry
    registry.register("mine", MyExecutor)     # FCACHE_EXECUTORS=mine,eager now accepts it

The built-in ones are named here by import path, so that `import fcache` imports none of
them (nvFuser, and Inductor with it, are heavy or absent). This module imports nothing of
fcache's but `process` and `errors`: `fcache.config` asks it which names are valid.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from fcache import process
from fcache.errors import ConfigError

if TYPE_CHECKING:
    from fcache.executors.base import Executor

log = logging.getLogger(__name__)

# Name -> "module:class". The order of DEFAULT_ORDER is the order tried when the settings
# name none: Inductor first, nvFuser for the regions Inductor fails on, eager always last.
# Inductor first because its regions load in milliseconds, where nvFuser schedules each
# loaded fusion again (about 0.8 s each on an H100): on the H100, HF Llama at 2 layers
# starts warm in 6.4 s with Inductor first against 19.7 s with nvFuser first, its cold
# start is 64 s against 44 s, its steady step 8.4 ms against 8.9 ms
# (bench/results/gpu-h100-hf-llama-executors.md).
BUILTIN: Mapping[str, str] = {
    "nvfuser": "fcache.executors.nvfuser:NvFuserExecutor",
    "inductor": "fcache.executors.inductor:InductorExecutor",
    "eager": "fcache.executors.eager:EagerExecutor",
}
DEFAULT_ORDER = ("inductor", "nvfuser", "eager")

_FACTORIES = "executor-factories"  # process.shared key of the registered factories


def _registered() -> dict[str, Callable[[], Executor]]:
    return process.shared(_FACTORIES, dict)


def register(name: str, factory: Callable[[], Executor]) -> None:
    """Make `name` an executor settings may name; `factory()` builds it on first use.
    Registering a name again replaces the factory for executors not yet created."""
    if not name or not name.isidentifier() or name != name.lower():
        raise ConfigError("executor name", name, "a lowercase identifier")
    _registered()[name] = factory


def names() -> tuple[str, ...]:
    """Every executor name settings may use, built-in ones first."""
    return (*BUILTIN, *(n for n in _registered() if n not in BUILTIN))


def create(name: str) -> Executor:
    """The process's one executor of that name (executors are stateless or thread-safe)."""
    return process.shared(("executor", name), lambda: _factory(name)())


def _factory(name: str) -> Callable[[], Executor]:
    if (factory := _registered().get(name)) is not None:
        return factory
    if name not in BUILTIN:
        raise ConfigError("executor", name, f"one of {', '.join(names())}")
    module, _, attr = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def default_order(device_type: str) -> tuple[str, ...]:
    return tuple(n for n in DEFAULT_ORDER if create(n).available(device_type))


def resolve(requested: Sequence[str] | None, device_type: str) -> tuple[Executor, ...]:
    """The executors to try for regions on `device_type`, in order, ending with eager.

    Executors that cannot run on this device type in this process are skipped; one the
    settings asked for by name costs a warning when it is skipped on a GPU.
    """
    order = list(default_order(device_type) if requested is None else requested)
    executors = []
    for name in order:
        executor = create(name)
        if executor.available(device_type):
            executors.append(executor)
        elif requested is not None and device_type == "cuda":
            log.warning(
                "fcache: the %s executor cannot run on %s here; regions go to %s",
                name,
                device_type,
                [n for n in order if n != name],
            )
    if not executors or executors[-1].name != "eager":
        executors = [e for e in executors if e.name != "eager"] + [create("eager")]
    return tuple(executors)
