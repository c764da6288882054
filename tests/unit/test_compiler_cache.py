"""The suite's C++ compiler cache (tests/compiler_cache.py): a command run before with the
same arguments and input contents gets the same output bytes without compiling; anything
else compiles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import compiler_cache

SCRIPT = Path(compiler_cache.__file__)


def _compile(tmp_path: Path, source: Path, output: Path, log: Path) -> bytes:
    real = shutil.which("g++", path="/usr/local/bin:/usr/bin:/bin")
    assert real is not None
    # A "compiler" that logs each run, then runs g++: the cache must not call it on a hit.
    logged = tmp_path / "logged-g++"
    logged.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{real}" "$@"\n')
    logged.chmod(0o755)
    command = [sys.executable, "-S", str(SCRIPT), str(logged), str(tmp_path / "cache"),
               str(source), "-shared", "-fPIC", "-O1", "-o", str(output)]  # fmt: skip
    subprocess.run(command, check=True)
    return output.read_bytes()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_repeated_compile_is_answered_from_the_cache_and_a_changed_one_compiles(
    tmp_path: Path,
) -> None:
    (tmp_path / "cache").mkdir()
    log = tmp_path / "runs.log"
    source = tmp_path / "a" / "kernel.cpp"
    source.parent.mkdir()
    source.write_text('extern "C" int f(int x) { return x + 1; }\n')
    first = _compile(tmp_path, source, tmp_path / "a" / "kernel.so", log)
    # The same source at another path, to another output: a hit, the same bytes.
    other = tmp_path / "b" / "kernel.cpp"
    other.parent.mkdir()
    other.write_text(source.read_text())
    assert _compile(tmp_path, other, tmp_path / "b" / "kernel.so", log) == first
    assert log.read_text().split() == ["run"]
    other.write_text('extern "C" int f(int x) { return x + 2; }\n')  # changed: compiled
    assert _compile(tmp_path, other, tmp_path / "b" / "kernel.so", log) != first
    assert log.read_text().split() == ["run", "run"]


def test_commands_without_one_output_file_are_not_cached() -> None:
    assert compiler_cache.key("g++", ["--version"]) is None
    assert compiler_cache.key("g++", ["-E", "x.cpp", "-o", "x.i"]) is None
    assert compiler_cache.key("g++", ["missing.cpp", "-o", "x.so"]) is None
