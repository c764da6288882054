"""Process-wide state: the one module of fcache that holds any.

Whatever lives as long as the process and is shared by every model in it is owned here,
so there is one place to look for it, one fork hook, one exit hook, and one `reset()`:

- shared objects, created once per process by key (`shared`): the Session of each
  Settings, the executor of each name, the registry of open LMDB environments. `reset()`
  closes them, newest first, and forgets them; `forget` drops one (its `close` did it).
- watchers (`watch`): objects with fork-sensitive or exit-time duties. Any of the methods
  `before_fork`, `after_fork_in_parent`, `after_fork_in_child` and `at_exit` that a
  watcher defines is called at that moment. Watchers are held weakly: an object that is
  garbage collected stops being called without unregistering.

Also `set_in_thread`: an attribute of a shared thread-local set for a block (how a
process-wide hook learns what the calling thread is doing), and `sweep_dead_dirs`:
folders a process of this user left behind when it was killed (the Inductor executor's
load folders, fcache-server's private socket folders).

Thread-safe. Fork: `before_fork` hooks run newest first, `after_fork_*` hooks oldest first
(as `os.register_at_fork` orders its own), and a child starts with a fresh lock, since
another parent thread might have held this one at the moment of the fork.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class _State:
    """Everything process-wide, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.shared: dict[Hashable, Any] = {}  # insertion order is creation order
        self.watchers: list[weakref.ref[Any]] = []


_STATE = _State()


def shared(key: Hashable, factory: Callable[[], T]) -> T:
    """The process's one object under `key`, made by `factory()` on first use. The factory
    runs under the lock, so two threads asking at once get the same object."""
    with _STATE.lock:
        if key not in _STATE.shared:
            _STATE.shared[key] = factory()
        return _STATE.shared[key]  # type: ignore[no-any-return]


@contextlib.contextmanager
def set_in_thread(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """`local.name` is `value` in this thread during the block, then what it was (None if
    unset): blocks nest."""
    outer = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, outer)


def peek(key: Hashable) -> Any:
    """The object under `key`, or None; never creates one."""
    with _STATE.lock:
        return _STATE.shared.get(key)


def forget(key: Hashable, obj: object) -> None:
    """Drop `obj` from the shared objects if it is still the one under `key` (its owner
    closed it). Does not close it."""
    with _STATE.lock:
        if _STATE.shared.get(key) is obj:
            del _STATE.shared[key]


def watch(obj: object) -> None:
    """Call obj's fork and exit hooks (see the module docstring) from now on; weakly held."""
    with _STATE.lock:
        _STATE.watchers = [r for r in _STATE.watchers if r() is not None]
        _STATE.watchers.append(weakref.ref(obj))


def unwatch(obj: object) -> None:
    with _STATE.lock:
        _STATE.watchers = [r for r in _STATE.watchers if r() is not None and r() is not obj]


def reset() -> None:
    """Close every shared object (newest first) and forget it: the process starts afresh.
    For tests and long-lived interpreters; models compiled before keep working only as
    far as their loaded kernels go."""
    with _STATE.lock:
        objects = list(_STATE.shared.items())
        _STATE.shared.clear()
    for key, obj in reversed(objects):
        close = getattr(obj, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception as exc:  # one broken object must not keep the others open
            log.warning("fcache: closing %r failed: %s", key, exc)


def _live_watchers() -> list[Any]:
    with _STATE.lock:
        return [w for w in (r() for r in _STATE.watchers) if w is not None]


def _call(watchers: list[Any], hook: str) -> None:
    for watcher in watchers:
        method = getattr(watcher, hook, None)
        if method is not None:
            method()


def _before_fork() -> None:
    # The lock is held across the fork so that no thread changes the tables meanwhile.
    _STATE.lock.acquire()
    _call(list(reversed(_live_watchers())), "before_fork")


def _after_fork_in_parent() -> None:
    try:
        _call(_live_watchers(), "after_fork_in_parent")
    finally:
        _STATE.lock.release()


def _after_fork_in_child() -> None:
    _STATE.lock = threading.RLock()
    _call(_live_watchers(), "after_fork_in_child")


def _at_exit() -> None:
    for watcher in reversed(_live_watchers()):
        try:
            _call([watcher], "at_exit")
        except Exception as exc:  # exit must go on: a failed flush costs only counters
            log.debug("fcache: exit hook of %r failed: %s", watcher, exc)


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
atexit.register(_at_exit)


def sweep_dead_dirs(base: str, prefix: str) -> None:
    """Remove the folders in `base` named `<prefix><pid>-...` that belong to this user and
    whose process is gone (one killed with -9 never removed its own). Never raises."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix) :].partition("-")[0]
        if not entry.name.startswith(prefix) or not pid.isdigit():
            continue
        try:
            if entry.stat().st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue
