"""Executor names -> executor objects, and the order to try them in on a device.

nvFuser is imported only when asked for and present, so `import fcache` works on a laptop
without CUDA or nvFuser. Eager always closes the list: every region runs somehow.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from fcache.executors.base import Executor

log = logging.getLogger(__name__)


def nvfuser_installed() -> bool:
    from fcache.executors.nvfuser import installed

    return installed()


def default_order(device_type: str) -> tuple[str, ...]:
    if device_type == "cuda" and nvfuser_installed():
        return ("nvfuser", "inductor", "eager")
    return ("inductor", "eager")


@functools.cache
def create(name: str) -> Executor:
    """The process-wide executor of that name (executors are stateless or thread-safe)."""
    if name == "inductor":
        from fcache.executors.inductor import InductorExecutor

        return InductorExecutor()
    if name == "eager":
        from fcache.executors.eager import EagerExecutor

        return EagerExecutor()
    if name == "nvfuser":
        from fcache.executors.nvfuser import NvFuserExecutor

        return NvFuserExecutor()
    raise ValueError(f"unknown executor {name!r}")


def resolve(names: Sequence[str] | None, device_type: str) -> tuple[Executor, ...]:
    """The executors to try for regions on `device_type`, in order, ending with eager.

    Executors that cannot run on this device (nvFuser on CPU, or not installed) are skipped.
    """
    order = list(default_order(device_type) if names is None else names)
    if "nvfuser" in order and (device_type != "cuda" or not nvfuser_installed()):
        if names is not None and device_type == "cuda":
            log.warning("fcache: nvFuser is not installed; regions go to %s", order[1:])
        order.remove("nvfuser")
    if "eager" not in order:
        order.append("eager")
    return tuple(create(name) for name in order)
