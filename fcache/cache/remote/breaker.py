"""CircuitBreaker: how RemoteStore stops calling a server that keeps failing.

After `failures` failures in a row, calls are refused for `cooldown_s` seconds, so a
dead server costs each caller one fast exception, not one deadline. Thread-safe; a
forked child starts with a fresh lock (the breaker watches fork through fcache.process),
since another parent thread might have held the old one at the moment of the fork.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fcache import process


class CircuitBreaker:
    """Counts consecutive failures; open (refusing calls) for `cooldown_s` after `failures`.

    Thread-safe. After the cooldown, calls go through again; one more failure reopens it
    at once, and one success closes it.
    """

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = failures
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until = 0.0
        process.watch(self)

    def allows(self) -> bool:
        with self._lock:
            return self._clock() >= self._open_until

    def probing(self) -> bool:
        """Whether the circuit was open and its cooldown has passed: the next call is the
        first to reach the server again."""
        with self._lock:
            return self._consecutive >= self._failures and self._clock() >= self._open_until

    def succeeded(self) -> int:
        """Record a success; returns how many failures in a row it ended."""
        with self._lock:
            ended, self._consecutive = self._consecutive, 0
            return ended

    def failed(self) -> int:
        """Record a failure; returns how many there have been in a row, this one included."""
        with self._lock:
            self._consecutive += 1
            if self._consecutive >= self._failures:
                self._open_until = self._clock() + self._cooldown_s
            return self._consecutive

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
