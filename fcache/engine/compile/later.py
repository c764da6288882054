"""A compiled graph resolved on a thread of its own: its callable waits for it at its first
call (fcache.engine.compile.session compiles a forward's regions this way while
AOTAutograd goes on to the backward)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)


def later(
    resolve: Callable[[], Callable[[list[Any]], Any]],
    label: str,
    waited: Callable[[float], None],
) -> Callable[[list[Any]], Any]:
    """A boxed callable for what `resolve()`, started on a thread now, returns: its first
    call waits for it (and raises what it raised), and tells `waited` how long."""
    done: Future[Callable[[list[Any]], Any]] = Future()

    def run() -> None:
        try:
            done.set_result(resolve())
        except BaseException as exc:  # re-raised by the first call (if there is one)
            log.info("fcache: %s: its regions could not be resolved: %s", label, exc)
            done.set_exception(exc)

    # Not a daemon: a process that exits before the graph's first call (a forward never
    # followed by its backward) finishes the compile, and stores it, before it exits,
    # instead of being torn down with a compile half done (an abort, on a GPU).
    threading.Thread(target=run, name=f"fcache-{label}", daemon=False).start()
    fn: Callable[[list[Any]], Any] | None = None

    def call(args: list[Any]) -> Any:
        nonlocal fn
        if fn is None:
            start = time.perf_counter()
            try:
                fn = done.result()
            finally:
                waited(time.perf_counter() - start)
        return fn(args)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call
