"""Backoff: when to try a failing local tier again.

A local tier that failed a write (a full disk, an I/O error) is not switched off for the
rest of the process: its reads go on, and its writes are skipped for a while, then tried
again. The delay doubles with each failure in a row (1 s, 2 s, ... up to 60 s) and a
success resets it, so a disk that fills up and frees again costs a few skipped writes, not
every write of a long training job.

Lock-free: each method makes single attribute assignments, so concurrent callers at worst
both try once after a delay (one extra attempt). Safe across fork for the same reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0


class Backoff:
    """Failures in a row and when the next attempt is allowed."""

    def __init__(
        self,
        first_s: float = FIRST_DELAY_S,
        max_s: float = MAX_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._clock = clock
        self.failures = 0
        self._retry_at = 0.0

    def allows(self) -> bool:
        """Whether a call may go through now."""
        return self._clock() >= self._retry_at

    def failed(self) -> int:
        """Record a failure; returns how many there have been in a row, this one included."""
        self.failures += 1
        delay = min(self._first_s * 2 ** (self.failures - 1), self._max_s)
        self._retry_at = self._clock() + delay
        return self.failures

    def succeeded(self) -> int:
        """Record a success; returns how many failures in a row it ended."""
        ended, self.failures = self.failures, 0
        self._retry_at = 0.0
        return ended
