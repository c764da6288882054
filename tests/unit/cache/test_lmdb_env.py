"""The process's registry of LMDB environments: one per directory, through fork and reset."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from fcache import process
from fcache.cache.lmdb import LAYOUT, LmdbStore
from fcache.cache.lmdb.env import environments


def key(i: int) -> str:
    return f"{i:032x}"


def open_files_under(directory: Path) -> list[str]:
    """The paths under `directory` that this process holds file descriptors on."""
    prefix = os.path.realpath(directory) + os.sep
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed meanwhile
        if target.startswith(prefix):
            paths.append(target)
    return paths


def wait_child(pid: int, timeout: float = 30.0) -> int:
    """The child's exit code; kills it (and fails) if it hangs, e.g. on an inherited lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"child {pid} hung")


def test_the_registry_is_one_shared_object_per_process(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, 1 << 20)
    assert environments() is environments()
    assert process.peek(("fcache.cache.lmdb", "environments")) is environments()
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_waits_for_transactions_and_the_child_gets_fresh_locks(tmp_path: Path) -> None:
    # A parent thread keeps reading through every fork: the gate makes each fork wait for
    # its transaction, so the child's closing of the inherited environment cannot abort
    # the parent's reader. The child opens another directory too, which needs the registry
    # lock that fork held: it must have a fresh one, not the inherited held one.
    store = LmdbStore(tmp_path / "shared", 1 << 20)
    store.put(key(1), b"parent")
    failures: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                assert store.get(key(1)) == b"parent"
            except BaseException as exc:
                failures.append(exc)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(5):
            pid = os.fork()
            if pid == 0:  # the child: report through the exit status only
                code = 3
                try:
                    other = LmdbStore(tmp_path / f"child{n}", 1 << 20)
                    other.put(key(n), b"own")
                    ok = store.get(key(1)) == b"parent" and other.get(key(n)) == b"own"
                    store.put(key(100 + n), b"child")
                    code = 0 if ok else 1
                finally:
                    os._exit(code)
            assert wait_child(pid) == 0
    finally:
        stop.set()
        reader.join()
    assert failures == []
    assert [store.get(key(100 + n)) for n in range(5)] == [b"child"] * 5
    store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_reset_closes_the_environments_and_stores_reopen(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path, 1 << 20)
    store.put(key(1), b"kept")
    env_dir = tmp_path / LAYOUT
    assert open_files_under(env_dir)  # data.mdb and lock.mdb are open
    registry = environments()

    process.reset()

    assert open_files_under(env_dir) == []
    assert environments() is not registry  # the next use makes a new registry
    again = LmdbStore(tmp_path, 1 << 20)
    assert again.get(key(1)) == b"kept"
    assert store.get(key(1)) == b"kept"  # the old store reopens through the new registry
    store.close()
    assert again.get(key(1)) == b"kept"  # one environment, shared and counted
    again.close()
    assert open_files_under(env_dir) == []
