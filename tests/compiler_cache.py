"""A C++ compiler cache for one test session: what ccache does, for the command ccache
cannot cache (Inductor compiles and links each CPU kernel in one `g++ ... -shared -o
kernel.so` call, which ccache counts as linking and passes through).

The suite compiles the same few tiny models in tens of fresh processes, each with an empty
Inductor directory (so that no test warms another's compiler); g++ took about half of the
CPU time of the files that compile with Inductor. conftest.py puts a `g++` that runs this
script first on PATH: a command with the same arguments and the same input files' contents
as one run before in the session gets that run's output file, byte for byte, and its
stderr; anything else runs the real compiler (and is remembered if it succeeded). The
cache lives in a directory made for the session; nothing outside the suite uses it.

    compiler_cache.py REAL_COMPILER CACHE_DIR ARG...
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile

# Arguments that name an input file whose contents, not path, belong in the key.
_SOURCES = (".cpp", ".cc", ".cxx", ".c", ".o", ".h", ".hpp")


def key(compiler: str, args: list[str]) -> str | None:
    """The cache key of `args`, or None for a command this cache does not take (no single
    output file, preprocessing only, standard input, an input that is not there)."""
    if "-o" not in args or "-E" in args or "-" in args or args.count("-o") != 1:
        return None
    digest = hashlib.sha256(compiler.encode())
    skip_next = False
    for arg in args:
        if skip_next:  # the output's path: where the result goes, not what it is
            skip_next = False
            digest.update(b"\0-o OUT")
            continue
        if arg == "-o":
            skip_next = True
            continue
        if arg.endswith(_SOURCES) and not arg.startswith("-"):
            try:
                with open(arg, "rb") as f:
                    digest.update(b"\0file " + hashlib.sha256(f.read()).digest())
            except OSError:
                return None
            continue
        digest.update(b"\0" + arg.encode())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    compiler, cache_dir, args = argv[0], argv[1], argv[2:]
    name = key(compiler, args)
    if name is None:
        os.execv(compiler, [compiler, *args])
    output = args[args.index("-o") + 1]
    stored, stored_err = os.path.join(cache_dir, name), os.path.join(cache_dir, name + ".err")
    if os.path.exists(stored):
        _copy(stored, output)
        with open(stored_err, "rb") as f:
            sys.stderr.buffer.write(f.read())
        return 0
    proc = subprocess.run([compiler, *args], stderr=subprocess.PIPE)
    sys.stderr.buffer.write(proc.stderr)
    if proc.returncode == 0 and os.path.exists(output):
        # The error text first: a reader that finds the output finds its stderr too.
        temporary = _temporary(stored_err)
        with open(temporary, "wb") as f:
            f.write(proc.stderr)
        os.replace(temporary, stored_err)
        _copy(output, stored)
    return proc.returncode


def _temporary(path: str) -> str:
    fd, name = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    os.close(fd)
    return name


def _copy(source: str, target: str) -> None:
    """Copies atomically: a process reading `target` sees the whole file or none."""
    temporary = _temporary(target)
    with open(source, "rb") as src, open(temporary, "wb") as dst:
        dst.write(src.read())
    os.chmod(temporary, os.stat(source).st_mode & 0o777)
    os.replace(temporary, target)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
