"""The LMDB environments this process has open: one per real path, and the fork gate.

LMDB forbids opening one environment twice in a process (its fcntl locks belong to the
process, so closing either handle would drop both's locks): every LmdbStore on a
directory shares one `Handle`, counted by `Environments`, the process's one registry
(`environments()`, made through `fcache.process.shared`). `process.reset()` closes it,
and with it every environment of the process; a store that outlives the reset reopens
its environment through the next registry on its next call.

Modes: the layout directory is 0700 and its files 0600 (LMDB's own default is 0644 in a
0755 directory: any local user could read every artifact and its region text), or, with
a group for shared node caches, 2770 and 0660 owned by that group. Existing files and
directories this user owns are brought to those modes when opened; the cache directory
above the layout is created 0700 (or 2770) but, if it exists, left as it is.

Compaction (fcache.cache.lmdb.upkeep) swaps a compacted copy in at the same path and
marks the old environment retired (a row every transaction checks). `retire` takes its
handle out of the registry, so the next `acquire` opens the new one; the old handle is
closed once no store holds it and no transaction of this process runs on it.

Thread-safe. Fork: the registry watches fork (`fcache.process.watch`). `before_fork`
takes the registry lock and waits, through the `ForkGate`, until no transaction of this
process is in flight; the child starts with a fresh lock and gate, and closes and replaces
an inherited handle lazily, when a store sees that its handle's pid is not this process's.
Failure contract: an environment that cannot be opened raises `StoreUnavailable`.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import lmdb

from fcache import process
from fcache.errors import StoreUnavailable

LAYOUT = "lmdb.v1"

# One fixed, sparse reservation for every process. Growing the map later is what corrupts
# databases (py-lmdb #269: two processes resizing at once), and a process that opened with
# a different size than the others would resize on its first commit. 1 TiB costs address
# space only: without writemap the file grows with its contents, not with the map.
DEFAULT_MAP_SIZE = 1 << 40

# Slots in the shared reader table, fixed by the first opener: ranks × threads of a node,
# with room for slots that SIGKILLed processes leave until reader_check() frees them.
MAX_READERS = 4096

DB_NAMES = ("artifacts", "meta", "lru", "info", "leases", "stats")

_REGISTRY_KEY = ("fcache.cache.lmdb", "environments")


class ForkGate:
    """Makes fork() wait until no transaction of this process is in flight.

    A child must not use its parent's environment, and py-lmdb refuses to open it again
    until the inherited handle is closed; closing aborts whatever transactions the handle
    still has. Had another parent thread been inside a read transaction at fork time,
    that abort would release the *parent's* reader slot while the parent still reads. So
    fork waits for transactions to finish, and the child inherits none.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._forking = 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking += 1
            while self._active:
                self._cond.wait()

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking -= 1
            self._cond.notify_all()


@dataclass(slots=True)
class Handle:
    """This process's one open environment on a directory, shared by every LmdbStore on it."""

    path: str
    env: lmdb.Environment
    artifacts: lmdb._Database
    meta: lmdb._Database
    lru: lmdb._Database
    info: lmdb._Database
    leases: lmdb._Database
    stats: lmdb._Database
    pid: int
    refs: int = 0
    closed: bool = False  # by its registry's close (process.reset)
    # When stale reader slots were last freed (time.monotonic); -inf: never yet.
    readers_checked: float = -math.inf
    # The map's last page at that check: a file that grew since is checked at once.
    pages_checked: int = 0
    # Replaced by a compacted copy (upkeep): stores move to a fresh handle.
    retired: bool = False
    # Transactions of this process running on it (close waits for them).
    active: int = 0
    # When this process last considered compacting it (time.monotonic).
    compact_checked: float = -math.inf
    # Where this process maps the data file; 0 until looked up (upkeep).
    map_address: int = 0


def modes(group: int | None) -> tuple[int, int]:
    """(directory mode, file mode): owner only, or shared with a group (setgid directory,
    so files created inside inherit the group)."""
    return (0o700, 0o600) if group is None else (0o2770, 0o660)


def _restrict(path: str, mode: int, group: int | None) -> None:
    """Bring a directory or file this user owns to `mode` (and `group`); leave others'."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.geteuid():
        return
    if group is not None and info.st_gid != group:
        os.chown(path, -1, group)
    if info.st_mode & 0o7777 != mode:
        os.chmod(path, mode)


def _open_handle(path: str, map_size: int, group: int | None) -> Handle:
    dir_mode, file_mode = modes(group)
    try:
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=dir_mode, exist_ok=True)
            _restrict(parent, dir_mode, group)
        os.makedirs(path, mode=dir_mode, exist_ok=True)
        _restrict(path, dir_mode, group)
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=8,
            max_readers=MAX_READERS,
            # Cached read transactions would keep reader slots across fork.
            max_spare_txns=0,
            # Durable commits; writemap stays off because with it ENOSPC kills the process.
            sync=True,
            metasync=True,
            writemap=False,
            mode=file_mode,
        )
        for name in ("data.mdb", "lock.mdb"):
            _restrict(os.path.join(path, name), file_mode, group)
        # The reader slots of processes that died without closing (SIGKILL, OOM) are freed
        # by the store's first transaction, which counts them, and periodically after.
        dbs = {name: env.open_db(name.encode()) for name in DB_NAMES}
    except (lmdb.Error, OSError) as exc:
        raise StoreUnavailable(f"cannot open the local cache at {path}: {exc}") from exc
    return Handle(path=path, env=env, pid=os.getpid(), **dbs)


class Environments:
    """The registry: one handle per real path, reference-counted, and the fork gate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Guards the use counts of handles (refs of retired ones, active, closed). Taken
        # inside transactions, so never the registry lock: fork holds that one while it
        # waits for transactions to end.
        self._usage = threading.Lock()
        self._handles: dict[str, Handle] = {}
        self._gate = ForkGate()
        process.watch(self)

    def acquire(self, path: str, map_size: int, group: int | None = None) -> Handle:
        """The handle on `path` (a real path), opened if this process has none yet. The
        first opener's `group` decides the modes (see the module docstring)."""
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None and handle.pid != os.getpid():
                # Inherited through fork: the gate guaranteed it has no transaction in
                # flight, so closing it touches nothing of the parent's.
                handle.env.close()
                handle = None
            if handle is None:
                handle = _open_handle(path, map_size, group)
                self._handles[path] = handle
            handle.refs += 1
            return handle

    def release(self, handle: Handle) -> None:
        with self._lock:
            if handle.pid != os.getpid():
                return  # a parent's handle; acquire closes it if this process reopens
            if handle.retired:
                with self._usage:
                    handle.refs -= 1
                    self._close_if_idle(handle)
                return
            if self._handles.get(handle.path) is not handle:
                return
            handle.refs -= 1
            if handle.refs == 0:
                del self._handles[handle.path]
                handle.env.close()

    def retire(self, handle: Handle) -> None:
        """The environment was replaced by a compacted copy at its path: the next acquire
        opens the copy; this handle closes once unused. Idempotent."""
        with self._lock:
            if handle.retired or handle.pid != os.getpid():
                return
            if self._handles.get(handle.path) is handle:
                del self._handles[handle.path]
            with self._usage:
                handle.retired = True
                self._close_if_idle(handle)

    @staticmethod
    def _close_if_idle(handle: Handle) -> None:
        """Close a retired handle nobody uses; the caller holds the usage lock."""
        if handle.refs <= 0 and handle.active == 0 and not handle.closed:
            handle.closed = True
            handle.env.close()

    @contextmanager
    def transaction(self, handle: Handle | None = None) -> Iterator[None]:
        """Enter around every transaction, so that fork waits for it to end and a retired
        handle is not closed under it."""
        with self._gate.transaction():
            if handle is None:
                yield
                return
            with self._usage:
                if handle.closed:
                    # Closed meanwhile (process.reset): the caller's next call reopens.
                    raise lmdb.Error("environment closed")
                handle.active += 1
            try:
                yield
            finally:
                with self._usage:
                    handle.active -= 1
                    if handle.retired:
                        self._close_if_idle(handle)

    def close(self) -> None:
        """Close every environment (process.reset). Waits for transactions in flight, as
        fork does; a store still holding a handle reopens through the next registry."""
        with self._lock:
            self._gate.before_fork()
            try:
                handles, self._handles = list(self._handles.values()), {}
                for handle in handles:
                    handle.closed = True
                    handle.env.close()
            finally:
                self._gate.after_fork_in_parent()
        process.unwatch(self)

    # Fork hooks (fcache.process) ---------------------------------------------------------

    def before_fork(self) -> None:
        self._lock.acquire()
        self._gate.before_fork()

    def after_fork_in_parent(self) -> None:
        self._gate.after_fork_in_parent()
        self._lock.release()

    def after_fork_in_child(self) -> None:
        # The child has only the forking thread: start from fresh locks rather than inherit
        # ones that other parent threads might have held. Inherited handles are closed and
        # replaced lazily, when a store sees that its handle's pid is not this process's.
        self._lock = threading.Lock()
        self._usage = threading.Lock()
        self._gate = ForkGate()


def environments() -> Environments:
    """This process's registry of open environments."""
    return process.shared(_REGISTRY_KEY, Environments)
