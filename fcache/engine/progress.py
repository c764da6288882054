"""Progress of a long compile on stderr: regions compiled, reused and loaded.

Shown only on a terminal unless forced (FCACHE_PROGRESS=1), so logs of batch jobs and CI
stay clean. One line, rewritten in place, finished with a newline.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Not thread-safe: the compile pipeline reports from one thread."""

    def __init__(self, label: str, total: int, enabled: bool | None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total = total
        self.compiled = self.reused = self.loaded = 0
        self._start = time.perf_counter()
        self._last = 0.0

    def update(self, *, compiled: int = 0, reused: int = 0, loaded: int = 0) -> None:
        self.compiled += compiled
        self.reused += reused
        self.loaded += loaded
        now = time.perf_counter()
        if self.enabled and now - self._last > 0.1:
            self._last = now
            self._write("\r")

    def close(self) -> None:
        if self.enabled and self.total:
            self._write("\r")
            self.stream.write("\n")
            self.stream.flush()

    def _write(self, prefix: str) -> None:
        done = self.compiled + self.reused + self.loaded
        self.stream.write(
            f"{prefix}fcache: {self.label}: {done}/{self.total} unique regions "
            f"({self.compiled} compiled, {self.loaded} loaded, {self.reused} in memory) "
            f"{time.perf_counter() - self._start:.1f}s"
        )
        self.stream.flush()
