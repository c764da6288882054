"""nvFuser's kernel database, kept per process in a private directory, fed and harvested.

nvFuser 0.2.36 can no longer serialize a compiled fusion, but with the `kernel_db` option
it looks every kernel up before running NVRTC, keyed by the exact kernel source and NVRTC
options, in a directory of `db.csv` plus `kernel_N.cu` / `kernel_N.cubin`
(csrc/kernel_db/kernel_db.cpp). That lookup is what fcache carries between processes:
after a compile, the entries of the fusion's kernels are harvested into the artifact;
before a load, they are written back, and NVRTC is skipped.

The database is a process-wide singleton that reads its directory once, when first
opened, from `$TMPDIR/nvfuser_kernel_db`. Entries restored later would go unseen, and a
shared TMPDIR would mix processes (its CSV appends are not multi-process safe). So this
module drives the singleton through the two entry points nvFuser exports for its tests:
`KernelDb::get(dir, file, use_temp_dir, disabled, reset)` points it at a private
directory made with mkdtemp (removed by `close`, or at exit), and `KernelDb::write(code,
args, name, cubin)` adds a restored entry to its in-memory map and files. Both take
`std::string` (libstdc++'s C++11 ABI, which the mangled names pin) and
`std::vector<char>` by const reference; they are built here with ctypes and only read by
the callee.

If those symbols are missing (another nvFuser build), `KernelDb.open` returns None and
fcache runs without carrying kernels: warm loads then pay NVRTC again, nothing breaks.

Thread-safety: all methods are meant to be called from one thread (the nvFuser
runtime's worker; `close` after that worker stopped); nvFuser's own appends happen
inside executes on that thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fcache import process

log = logging.getLogger(__name__)

_GET = "_ZN7nvfuser8KernelDb3getERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_bbb"
_WRITE = (
    "_ZN7nvfuser8KernelDb5writeERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_S8_"
    "RKSt6vectorIcS5_E"
)
_CSV = "db.csv"
# The line format nvFuser's reader accepts (KernelDb::open); others are skipped there.
_ROW = re.compile(rb"^([\w-]+),([\w \+\-\=]+),([\w\-/]+\.cu),([\w\-/]+\.cubin)$")


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel_db entry: nvFuser's kernel name, NVRTC options, source and binary."""

    signature: str
    compile_args: str
    code: bytes
    cubin: bytes


class _StdString(ctypes.Structure):
    """libstdc++'s std::string (C++11 ABI): data pointer, length, 16-byte local buffer."""

    _fields_ = (("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("local", ctypes.c_char * 16))

    def __init__(self, value: bytes) -> None:
        super().__init__()
        self._keep = ctypes.create_string_buffer(value, len(value) + 1)  # NUL-terminated
        self.data = ctypes.addressof(self._keep)
        self.size = len(value)
        # A heap string keeps its capacity where short strings keep their characters.
        ctypes.c_size_t.from_buffer(self, _StdString.local.offset).value = len(value)


class _StdVector(ctypes.Structure):
    """libstdc++'s std::vector<char>: begin, end, end of storage."""

    _fields_ = (("begin", ctypes.c_void_p), ("end", ctypes.c_void_p), ("cap", ctypes.c_void_p))

    def __init__(self, value: bytes) -> None:
        super().__init__()
        self._keep = ctypes.create_string_buffer(value, max(1, len(value)))
        self.begin = ctypes.addressof(self._keep)
        self.end = self.cap = self.begin + len(value)


def _codegen_library() -> str | None:
    """Path of the loaded libnvfuser_codegen.so (nvfuser_direct must be imported)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if path.endswith("libnvfuser_codegen.so"):
                    return path
    except OSError:
        pass
    return None


class KernelDb:
    """The process's private kernel database. Create with `KernelDb.open()`."""

    def __init__(self, directory: Path, write: Any, handle: int) -> None:
        self.directory = directory
        self._write = write
        self._handle = handle
        self._offset = 0  # bytes of db.csv already indexed
        self._rows = 0
        self._index: dict[bytes, tuple[str, str, str]] = {}  # code -> (name, args, cubin file)

    @classmethod
    def open(cls) -> KernelDb | None:
        """Point nvFuser's kernel database at a new private directory; None if impossible."""
        if sys.platform != "linux" or ctypes.sizeof(ctypes.c_void_p) != 8:
            return None
        path = _codegen_library()
        try:
            lib = ctypes.CDLL(path) if path else None
            get, write = (getattr(lib, name) for name in (_GET, _WRITE)) if lib else (None, None)
        except (OSError, AttributeError) as exc:
            log.warning("fcache: nvFuser's kernel_db entry points are missing (%s)", exc)
            return None
        if get is None:
            log.warning("fcache: libnvfuser_codegen.so is not loaded; no kernel_db")
            return None
        get.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_bool,
            ctypes.c_bool,
            ctypes.c_bool,
        ]
        get.restype = ctypes.c_void_p
        write.argtypes = [ctypes.c_void_p] * 5
        write.restype = ctypes.c_bool
        directory = Path(tempfile.mkdtemp(prefix="fcache-nvfuser-kdb-"))
        where, name = _StdString(os.fsencode(directory)), _StdString(_CSV.encode())
        handle = get(ctypes.addressof(where), ctypes.addressof(name), False, False, True)
        if not handle or not (directory / _CSV).is_file():
            log.warning("fcache: nvFuser's kernel_db did not open in %s", directory)
            shutil.rmtree(directory, True)
            return None
        db = cls(directory, write, handle)
        process.watch(db)  # its at_exit removes the directory if close() never came
        return db

    def close(self) -> None:
        """Remove the private directory. nvFuser reads it only while a build enables the
        kernel_db option, which only the owner's builds do: call after the last of them."""
        process.unwatch(self)
        shutil.rmtree(self.directory, True)

    def at_exit(self) -> None:
        shutil.rmtree(self.directory, True)

    @property
    def rows(self) -> int:
        """Entries nvFuser has written so far (each one an NVRTC compile or a restore)."""
        self._refresh()
        return self._rows

    def harvest(self, fusion_code: str) -> list[Kernel]:
        """The entries whose kernel source is part of `fusion_code` (FusionExecutorCache.
        get_cuda_kernel), whether this compile wrote them or found them."""
        self._refresh()
        text = fusion_code.encode()
        found = []
        for code, (name, args, cubin) in self._index.items():
            if code in text:
                found.append(Kernel(name, args, code, (self.directory / cubin).read_bytes()))
        return sorted(found, key=lambda k: k.code)

    def restore(self, kernels: Iterable[Kernel]) -> int:
        """Add entries nvFuser does not have yet; returns how many were added."""
        before = self.rows
        for kernel in kernels:
            if kernel.code in self._index or not _ROW.match(_row(kernel, "k.cu", "k.cubin")):
                continue
            strings = (kernel.code, kernel.compile_args.encode(), kernel.signature.encode())
            args = [*(_StdString(v) for v in strings), _StdVector(kernel.cubin)]
            if not self._write(self._handle, *(ctypes.addressof(a) for a in args)):
                log.warning("fcache: nvFuser's kernel_db refused kernel %s", kernel.signature)
            self._refresh()
        return self.rows - before

    def _refresh(self) -> None:
        """Index rows appended to db.csv since the last call."""
        with open(self.directory / _CSV, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            match = _ROW.match(line)
            if not match:
                continue  # the header, or a line nvFuser would skip too
            name, args, code_file, cubin_file = (g.decode() for g in match.groups())
            code = (self.directory / code_file).read_bytes()
            self._index.setdefault(code, (name, args, cubin_file))
            self._rows += 1


def _row(kernel: Kernel, code_file: str, cubin_file: str) -> bytes:
    return f"{kernel.signature},{kernel.compile_args},{code_file},{cubin_file}".encode()
