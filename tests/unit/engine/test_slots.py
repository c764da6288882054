"""Compile slots (fcache.engine.compile.slots): a process asks for a region's lease only with a
slot free, and gives the slot back while it waits for another process's compile, so that
processes missing on the same graph split its regions instead of one compiling them all."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import fcache
from fcache.cache.artifact import Artifact
from fcache.engine.compile.session import Session
from fcache.engine.compile.slots import Slot, Slots
from fcache.engine.record import ModelRecord
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion
from tests.graphs import capture
from tests.text_executor import TextExecutor


def _waiters(slots: Slots) -> int:
    return len(slots._waiting)


def _queued(slots: Slots, count: int) -> bool:
    return _waiters(slots) == count


def _taker(slots: Slots, size: int, order: list[int]) -> threading.Thread:
    def take() -> None:
        slot = slots.take(size)
        order.append(size)
        slot.release()

    thread = threading.Thread(target=take)
    thread.start()
    return thread


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_slots_go_to_the_largest_region_waiting_and_come_back_once() -> None:
    slots = Slots(1)
    held = slots.take(1)
    order: list[int] = []
    threads = []
    for size in (3, 9, 5):  # they arrive in this order while the only slot is held
        threads.append(_taker(slots, size, order))
        _until(functools.partial(_queued, slots, len(threads)), "a taker never queued")
    held.release()
    held.release()  # idempotent: a second release frees no second slot
    for thread in threads:
        thread.join(10)
    assert order == [9, 5, 3]
    assert slots._free == 1


def test_slots_hand_out_at_most_their_count() -> None:
    slots = Slots(2)
    first, second = slots.take(1), slots.take(1)
    order: list[int] = []
    third = _taker(slots, 4, order)
    _until(lambda: _waiters(slots) == 1, "the third taker never queued")
    assert order == []  # both slots are held
    first.release()
    third.join(10)
    assert order == [4]
    second.release()
    with pytest.raises(ValueError, match="count"):
        Slots(0)


def test_a_place_in_line_is_kept_from_joining_not_from_waiting() -> None:
    slots = Slots(1)
    small, large, middle = slots.join(3), slots.join(9), slots.join(5)  # one caller's regions
    order: list[int] = []

    def wait(size: int, slot: Slot) -> None:
        slot.wait()
        order.append(size)
        slot.release()

    # Their threads get going smallest first; the slot still goes to the largest.
    threads = [threading.Thread(target=wait, args=a) for a in ((3, small), (5, middle))]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    assert order == []  # the largest, first in line, has not waited yet: nobody passes it
    threads.append(threading.Thread(target=wait, args=(9, large)))
    threads[-1].start()
    for thread in threads:
        thread.join(10)
    assert order == [9, 5, 3]
    assert slots._free == 1 and _waiters(slots) == 0


def test_releasing_a_place_in_line_lets_the_next_pass() -> None:
    slots = Slots(1)
    first, second = slots.join(9), slots.join(1)
    first.release()  # never waited on: leaves the line
    assert second.wait() is second
    second.release()
    assert slots._free == 1 and _waiters(slots) == 0
    held = slots.take(1)
    queued = slots.join(2)
    waiter = threading.Thread(target=queued.wait)
    waiter.start()
    _until(lambda: _waiters(slots) == 1, "the waiter never queued")
    queued.release()  # from another thread, while it waits: it returns without a slot
    waiter.join(10)
    assert not waiter.is_alive()
    held.release()
    assert slots._free == 1 and _waiters(slots) == 0


def _session(cache_dir: Path, executor: str, whole: bool = True) -> Session:
    """A session that compiles with `executor` alone, in this process: one compile slot
    (the in-process compile thread), so regions compile one at a time."""
    settings = fcache.Settings(
        cache_dir=cache_dir, executors=(executor,), compile_workers=1, progress=False, whole=whole
    )
    return Session(settings)


COMPILED: list[int] = []  # region sizes, in the order OrderExecutor compiled them


class OrderExecutor(TextExecutor):
    name = "order"

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        COMPILED.append(len(region.nodes))
        return super().compile(region, device)


def test_a_graph_compiles_its_largest_region_first(tmp_path: Path) -> None:
    registry.register("order", OrderExecutor)
    COMPILED.clear()
    x, w = torch.randn(8, 16), torch.randn(16, 16)

    def fn(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return ((t * 2) @ m).sin().cos().exp().neg() + 1  # one op, a matmul, then five

    (gm,) = capture(fn, x, w, backward=False)
    session = _session(tmp_path, "order")
    try:
        stitched = session.compile_graph(gm.graph, gm, [x, w], "g", record=ModelRecord())
        out = stitched.fn([x.clone(), w.clone()])[0]
    finally:
        session.close()
    assert len(COMPILED) == 2
    assert COMPILED[0] == max(COMPILED) > min(COMPILED)
    torch.testing.assert_close(out, fn(x, w))


# Two sessions on one cache directory stand for two ranks (they share its LMDB leases).
# Their compiles meet at a barrier: it opens only when both compile at once.
MEET = threading.Barrier(2, timeout=15)


class MeetingExecutor(TextExecutor):
    name = "meet"

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        MEET.wait()
        return super().compile(region, device)


def test_two_processes_missing_together_split_the_regions(tmp_path: Path) -> None:
    registry.register("meet", MeetingExecutor)
    MEET.reset()
    x, w = torch.randn(8, 16), torch.randn(16, 16)

    def fn(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return ((t * 2).sin() @ m).cos() + 1  # two regions around the matmul

    (gm,) = capture(fn, x, w, backward=False)
    sessions = [_session(tmp_path, "meet", whole) for whole in (True, False)]  # two settings
    records = [ModelRecord(), ModelRecord()]
    outputs: list[torch.Tensor] = []

    def rank(i: int) -> None:
        stitched = sessions[i].compile_graph(gm.graph, gm, [x, w], "g", record=records[i])
        outputs.append(stitched.fn([x.clone(), w.clone()])[0])

    first = threading.Thread(target=rank, args=(0,))
    first.start()
    # The first holds one region's lease and compiles it, its other region waiting for
    # its slot: with every lease asked for at once it would hold both, and the second
    # rank, waiting on both, would never compile (the barrier would break).
    _until(lambda: MEET.n_waiting == 1, "the first rank never started compiling")
    second = threading.Thread(target=rank, args=(1,))
    second.start()
    try:
        first.join(60)
        second.join(60)
    finally:
        for session in sessions:
            session.close()
    assert [r.compiles for r in records] == [1, 1]
    assert sum(r.fallbacks.total() for r in records) == 0
    assert len(outputs) == 2
    for out in outputs:
        torch.testing.assert_close(out, fn(x, w))
