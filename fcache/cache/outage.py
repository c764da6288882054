"""OutageLog: the warnings of a server that keeps failing, repeated with a count.

The first failure after the server answered is a warning at once. While it keeps failing,
every `every_s` seconds the next failure is a warning again, saying how many calls failed
(or were skipped by the circuit breaker) since the last warning and why the latest did:
a token the server refuses for the whole run stays in the log, with a growing count,
instead of one line at the start. The end of the outage is logged at INFO, with its total.

Thread-safe; a forked child starts with a fresh lock (watched through fcache.process).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fcache import process

# Often enough that an operator tailing a log sees it, rarely enough not to drown it.
WARN_EVERY_S = 60.0


class OutageLog:
    def __init__(
        self,
        log: logging.Logger,
        name: str,
        every_s: float = WARN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._name = name
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._total = 0  # failed calls in this outage
        self._unreported = 0  # of them, since the last warning
        self._warned_at: float | None = None
        self._latest = "skipped (circuit open)"
        process.watch(self)

    def failed(self, why: str | None) -> None:
        """Count a failed call (`why`: its reason; None for a call the circuit breaker
        skipped) and warn if a warning is due."""
        with self._lock:
            self._total += 1
            self._unreported += 1
            self._latest = why or self._latest
            now = self._clock()
            first = self._warned_at is None
            elapsed = 0.0 if self._warned_at is None else now - self._warned_at
            if not first and elapsed < self._every_s:
                if why is not None:
                    self._log.debug("%s: %s", self._name, why)
                return
            count, self._unreported, self._warned_at = self._unreported, 0, now
            total, latest = self._total, self._latest
        if first:
            self._log.warning(
                "%s: %s (going on without it; while it fails, a warning every %.0f s "
                "counts the failed calls)",
                self._name,
                latest,
                self._every_s,
            )
        else:
            self._log.warning(
                "%s still failing: %d calls failed or skipped in the last %.0f s, %d since "
                "it failed first; latest: %s",
                self._name,
                count,
                elapsed,
                total,
                latest,
            )

    def recovered(self) -> None:
        with self._lock:
            total, self._total, self._unreported, self._warned_at = self._total, 0, 0, None
        if total:
            self._log.info("%s answers again, after %d failed calls", self._name, total)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
