"""Progress where jobs run: lines (one per region compiled, a summary, a heartbeat while a
compile is long) when stderr is no terminal, one rewritten line on a terminal, nothing when
switched off; INFO log records where the program configured logging."""

from __future__ import annotations

import gc
import io
import logging
import sys
import threading
import time

import pytest

from fcache.engine.compile.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "fcache-progress")


def test_no_terminal_one_line_per_region_compiled_and_a_summary() -> None:
    out = io.StringIO()
    progress = Progress("forward graph", 3, None, out)
    progress.update(compiled=1)
    progress.update(loaded=1)
    progress.update(compiled=1)
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("fcache: forward graph: compiled a region (1/3 unique regions")
    assert "(3/3 unique regions" not in lines[0] and "3/3 unique regions ready" in lines[1]
    assert "3/3 unique regions (2 compiled, 1 loaded, 0 in memory) in" in lines[2]
    assert "\r" not in out.getvalue()


def test_a_long_compile_shows_it_is_alive() -> None:
    out = io.StringIO()
    progress = Progress("backward graph", 2, None, out, heartbeat_s=0.05)
    progress.compiling()
    deadline = time.monotonic() + 10
    while "still compiling" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.close()
    assert "fcache: backward graph: still compiling, 0/2 unique regions ready after" in (
        out.getvalue()
    )
    assert _threads() == 0


def test_a_warm_graph_that_was_quick_says_nothing() -> None:
    out = io.StringIO()
    progress = Progress("forward graph", 2, None, out)
    assert _threads() == 0  # nothing to compile yet: no heartbeat thread
    progress.update(loaded=2)
    progress.close()
    assert out.getvalue() == ""


def test_terminal_line_is_rewritten_in_place() -> None:
    out = Terminal()
    progress = Progress("forward graph", 2, None, out)
    progress.update(compiled=1)
    time.sleep(0.15)
    progress.update(loaded=1)
    progress.close()
    text = out.getvalue()
    assert text.startswith("\rfcache: forward graph: ") and text.count("\n") == 1
    last = text.rsplit("\r", 1)[1]
    assert last.startswith("fcache: forward graph: 2/2 unique regions (1 compiled, 1 loaded")
    assert last.endswith(" s\n")


def test_switched_off_shows_nothing_and_starts_no_thread() -> None:
    out = Terminal()
    progress = Progress("forward graph", 5, False, out)
    progress.compiling()
    assert _threads() == 0
    progress.update(compiled=5)
    progress.close()
    assert out.getvalue() == ""


def test_lines_go_to_logging_where_the_program_configured_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="fcache.progress"):
        progress = Progress("forward graph", 1, None, sys.stderr)
        progress.update(compiled=1)
        progress.close()
    records = [r for r in caplog.records if r.name == "fcache.progress"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert "compiled a region" in records[0].getMessage()


def test_an_unclosed_progress_stops_its_heartbeat_once_collected() -> None:
    progress = Progress("forward graph", 1, None, io.StringIO(), heartbeat_s=0.02)
    progress.compiling()
    thread = progress._heartbeat
    assert thread is not None and thread.is_alive()
    del progress
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
