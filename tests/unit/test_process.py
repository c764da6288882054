"""fcache.process: shared objects made once, closed by reset, watchers called around fork
and at exit (in a real child process and a real interpreter exit)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fcache import process
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


class _Closeable:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def close(self) -> None:
        self.log.append(self.name)


def test_shared_makes_one_object_per_key_and_reset_closes_newest_first() -> None:
    log: list[str] = []
    first = process.shared(("test", 1), lambda: _Closeable(log, "a"))
    assert process.shared(("test", 1), lambda: _Closeable(log, "other")) is first
    process.shared(("test", 2), lambda: _Closeable(log, "b"))
    assert process.peek(("test", 2)) is not None
    process.reset()
    assert log[-2:] == ["b", "a"]
    assert process.peek(("test", 1)) is None
    assert process.shared(("test", 1), lambda: _Closeable(log, "c")).name == "c"
    process.reset()


def test_forget_drops_only_the_object_still_under_its_key() -> None:
    log: list[str] = []
    obj = process.shared(("test", "forget"), lambda: _Closeable(log, "a"))
    process.forget(("test", "forget"), object())  # not the one there: nothing happens
    assert process.peek(("test", "forget")) is obj
    process.forget(("test", "forget"), obj)
    assert process.peek(("test", "forget")) is None
    assert log == []  # forget does not close


def test_a_failing_close_does_not_keep_the_others_open() -> None:
    log: list[str] = []

    class Broken:
        def close(self) -> None:
            raise RuntimeError("broken")

    process.shared(("test", "ok"), lambda: _Closeable(log, "ok"))
    process.shared(("test", "broken"), Broken)
    process.reset()
    assert log == ["ok"]


class _ForkWatcher:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _note(self, what: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"{what} {os.getpid()}\n")

    def before_fork(self) -> None:
        self._note("before")

    def after_fork_in_parent(self) -> None:
        self._note("parent")

    def after_fork_in_child(self) -> None:
        self._note("child")


def test_watchers_see_a_real_fork_and_are_held_weakly(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    watcher = _ForkWatcher(notes)
    process.watch(watcher)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    lines = [tuple(line.split()) for line in notes.read_text().splitlines()]
    me = str(os.getpid())
    # Parent and child race after the fork; "before" comes first, in the parent.
    assert lines[0] == ("before", me)
    assert sorted(lines[1:]) == [("child", str(pid)), ("parent", me)]
    # Dropped, it is called no more.
    del watcher
    notes.unlink()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert not notes.exists()


def test_at_exit_runs_for_live_watchers_at_interpreter_exit(tmp_path: Path) -> None:
    out = tmp_path / "exit"
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from fcache import process

class W:
    def at_exit(self):
        open({str(out)!r}, "w").write("flushed")

class Gone:
    def at_exit(self):
        open({str(out)!r} + ".gone", "w").write("should not run")

w = W()
process.watch(w)
g = Gone()
process.watch(g)
process.unwatch(g)
"""
    fresh.run([sys.executable, "-c", script], check=True)
    assert out.read_text() == "flushed"
    assert not Path(f"{out}.gone").exists()
