"""Compile slots: a process asks for a region's lease only when it can compile it now.

Single flight (TieredCache.compile_lease) has one of the processes that miss on a key
compile it: the first to ask. Asked for every region of a graph at once, the rank whose
capture ends first held every lease and compiled every region with its own workers, while
the other ranks' workers, started for the same cold start, stayed idle and their ranks
waited (four ranks of Llama on one 16-core H100 node: 14 regions compiled in one process,
by 4 of the 16 workers, one Inductor thread each).

So a region's lease is asked for only with a slot: one per compile worker (one for the
in-process compile thread), the largest region waiting first, as the pool orders its
work. A region another process holds gives its slot back as soon as it has to wait (the
lease's `waiting` callback), and the next region's lease is asked for; a granted one keeps
its slot until its compile returns (not through loading and validation, which run here
while the worker takes the next). Ranks thus share a cold start's regions by their free
workers, and a process alone asks for each lease no later than a worker can use it. A lease
granted after a wait (its holder died or gave up) is compiled without a slot: rare, and it
would otherwise queue again behind regions that came after it.

A graph's regions take their places in line all at once, largest first, before any of
their lease threads starts (`Slots.join`, then `Slot.wait` on the thread): taken by the
threads themselves, the first threads to get going held the free slots, so on GPT-2's
2-layer cold start (H100) the backward's largest region (45 ops, a 2.7 s compile, the
start's longest) found every slot held by smaller ones and reached a worker only when
the first of them was done (bench/results/gpu-h100-coldwarm-2026-11-26).

Measured (H100, four ranks of Llama-16 on one GPU through one server): one worker a rank,
37.2 s until all had stepped against 66.2 s before; four a rank, no change (capture bounds
those ranks), the compiles spread 1/0/4/8 where one rank made all 13
(bench/results/gpu-h100-slots-steady-2026-11-26).
"""

from __future__ import annotations

import heapq
import itertools
import threading


class Slots:
    """`count` slots, handed out by size, largest first (ties in arrival order).
    Thread-safe."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"slots: count must be >= 1, not {count}")
        self._free = count
        self._changed = threading.Condition()
        self._waiting: list[tuple[int, int]] = []  # a heap of (-size, arrival)
        self._arrivals = itertools.count()

    def join(self, size: int) -> Slot:
        """A place in line for a slot, taken now without waiting (`Slot.wait` waits). A
        caller with several regions joins for all of them before it waits on any, so
        that the largest goes first whichever of its threads gets going first."""
        with self._changed:
            ticket = (-size, next(self._arrivals))
            heapq.heappush(self._waiting, ticket)
        return Slot(self, ticket)

    def take(self, size: int) -> Slot:
        """Wait for a free slot; among waiters the largest `size` gets it first."""
        return self.join(size).wait()


class Slot:
    """A place in line for one of `Slots` (queued), then the slot (held), then done.
    Thread-safe; `release` is idempotent: it leaves the line or gives the slot back (a
    wait for another process's compile and the end of this process's own may both call
    it), and a `wait` still blocked returns without a slot."""

    def __init__(self, slots: Slots, ticket: tuple[int, int]) -> None:
        self._slots = slots
        self._ticket = ticket
        self._state = "queued"  # -> "held" -> "done", or "queued" -> "done"

    def wait(self) -> Slot:
        """Block until this place in line holds a slot (or is released). Returns self."""
        slots = self._slots
        with slots._changed:
            while self._state == "queued" and not (
                slots._free and slots._waiting[0] == self._ticket
            ):
                slots._changed.wait()
            if self._state == "queued":
                heapq.heappop(slots._waiting)
                slots._free -= 1
                self._state = "held"
                slots._changed.notify_all()  # the next in line may take a slot still free
        return self

    def release(self) -> None:
        slots = self._slots
        with slots._changed:
            if self._state == "queued":
                slots._waiting.remove(self._ticket)
                heapq.heapify(slots._waiting)
            elif self._state == "held":
                slots._free += 1
            else:
                return
            self._state = "done"
            slots._changed.notify_all()
