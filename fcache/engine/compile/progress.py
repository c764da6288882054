"""Progress of one graph's compile: regions compiled, loaded and reused, as they happen.

Three ways to show it, chosen by `enabled` (Settings.progress, FCACHE_PROGRESS) and where
stderr goes:

- on a terminal (enabled None and stderr a tty, or enabled True): one line on stderr,
  rewritten in place, finished with a newline;
- anywhere else (enabled None: torchrun, a batch job, CI): plain lines, one per region
  compiled and a summary when the graph is done (if anything was compiled, or it took
  LINES_SUMMARY_AFTER_S), through the `fcache.progress` logger at INFO when the program
  configured logging (its level and handlers decide), else on stderr; a graph that
  compiles for long logs a line every HEARTBEAT_S seconds, so a job that looks silent is
  visibly alive;
- enabled False: nothing.

Thread-safe: the pipeline reports from its capture thread and the heartbeat runs on a
daemon thread of its own, started by `compiling()` (a graph that only loads has none) and
stopped by `close()`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from typing import TextIO

log = logging.getLogger("fcache.progress")

HEARTBEAT_S = 30.0
LINES_SUMMARY_AFTER_S = 1.0


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        enabled: bool | None,
        stream: TextIO | None = None,
        *,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.stream = stream or sys.stderr
        tty = _isatty(self.stream)
        self.enabled = enabled is not False
        # In place on a terminal (or when forced); lines otherwise.
        self.in_place = enabled is True or (enabled is None and tty)
        self.label = label
        self.total = total
        self.compiled = self.reused = self.loaded = 0
        self._start = time.perf_counter()
        self._last = 0.0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_s = heartbeat_s

    def compiling(self) -> None:
        """Regions are about to be compiled: start the heartbeat (once). A graph whose
        regions all load starts no thread (a warm start pays nothing for one)."""
        if not self.enabled or not self.total or self._heartbeat or self._closed.is_set():
            return
        # The thread holds the progress weakly: one whose graph failed before close()
        # ends its heartbeat once it is collected.
        self._heartbeat = threading.Thread(
            target=_beat,
            args=(weakref.ref(self), self._closed, self._heartbeat_s),
            daemon=True,
            name="fcache-progress",
        )
        self._heartbeat.start()

    def add(self, regions: int) -> None:
        """More unique regions to resolve than announced (a layer cut by op)."""
        with self._lock:
            self.total += regions

    def update(self, *, compiled: int = 0, reused: int = 0, loaded: int = 0) -> None:
        with self._lock:
            self.compiled += compiled
            self.reused += reused
            self.loaded += loaded
            if not self.enabled:
                return
            if self.in_place:
                now = time.perf_counter()
                if now - self._last > 0.1:
                    self._last = now
                    self._write(f"\rfcache: {self.label}: {self._status()}")
                return
            for _ in range(compiled):
                self._line(
                    f"fcache: {self.label}: compiled a region "
                    f"({self._done()}/{self.total} unique regions ready, {self._elapsed()})"
                )

    def close(self) -> None:
        """Finish: the in-place line ends, or the summary line is written. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        with self._lock:
            if not self.enabled or not self.total:
                return
            if self.in_place:
                self._write(f"\rfcache: {self.label}: {self._status()}\n")
            elif self.compiled or time.perf_counter() - self._start >= LINES_SUMMARY_AFTER_S:
                self._line(f"fcache: {self.label}: {self._status()}")

    def beat(self) -> None:
        """Show that the compile is alive (the heartbeat thread calls it)."""
        with self._lock:
            if self._closed.is_set():
                return
            if self.in_place:
                self._write(f"\rfcache: {self.label}: {self._status()}")
            else:
                self._line(
                    f"fcache: {self.label}: still compiling, {self._done()}/{self.total} "
                    f"unique regions ready after {self._elapsed()}"
                )

    # -- output (under the lock) -----------------------------------------------------------

    def _status(self) -> str:
        return (
            f"{self._done()}/{self.total} unique regions ({self.compiled} compiled, "
            f"{self.loaded} loaded, {self.reused} in memory) in {self._elapsed()}"
        )

    def _done(self) -> int:
        return self.compiled + self.reused + self.loaded

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self._start:.1f} s"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self, text: str) -> None:
        """An INFO log line where the program set up logging (and lets INFO through), a
        line on the stream where it did not."""
        if self.stream is sys.stderr and log.hasHandlers():
            log.info("%s", text)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()


def _beat(ref: weakref.ref[Progress], closed: threading.Event, every_s: float) -> None:
    while not closed.wait(every_s):
        progress = ref()
        if progress is None:
            return
        progress.beat()
        del progress


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
