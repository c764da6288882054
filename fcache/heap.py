"""glibc's heap kept for large blocks, in processes that run CPU graphs.

Why. glibc serves an allocation above its mmap threshold (128 KiB at start) with an mmap
of its own and unmaps it when it is freed, and gives the heap's free top back to the
system past its trim threshold (128 KiB). A CPU training step makes and frees large
tensors every step (GPT-2's 12.9 MB logits, their gradient, the loss's intermediates), so
with those defaults each step maps, faults in and gives back tens of megabytes: a warm
fcache process on a 2-core CPU took 7,353 page faults and 32.9 ms a step where the process
that compiled took 33 faults and 31.6 ms (GPT-2, 8 layers), and 1.44x torch.compile's step
in alternating processes (bench/results/cpu-malloc-2026-11-26). A process that traced and
compiled the model got away with it by accident: its heap had grown around long-lived
allocations, and glibc raises its thresholds a little each time it frees a mapped block.
Raising them by one freed block is not enough (1,900-5,600 faults a step, measured).

How. Once per process, before its first CPU graph runs, the two thresholds are set as
`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456`
would set them at start: blocks up to 64 MiB come from the heap and up to 256 MiB of its
free top stay with the process (157 faults a step in that warm process; warm processes
0.82x torch.compile's step, the code before 1.27x: bench/results/cpu-heap-2026-11-26).
A user who chose the heap's settings (a `glibc.malloc.` tunable in `GLIBC_TUNABLES`, or a
`MALLOC_*_` variable) keeps them; other C libraries (musl, macOS) are left alone. The cost
is memory: up to 256 MiB of freed heap a process keeps instead of returning it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_MMAP_THRESHOLD = 64 * 1024 * 1024
_TRIM_THRESHOLD = 256 * 1024 * 1024


@functools.cache
def keep_large_blocks() -> bool:
    """Set glibc's two thresholds, once per process, unless the user chose the heap's
    settings; True if they were set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") and name.endswith("_") for name in os.environ
    ):
        return False  # the user chose the heap's settings
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        done = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) == 1
        return libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1 and done
    except (OSError, AttributeError) as exc:
        log.debug("fcache: glibc's heap settings left as they are (%s)", exc)
        return False
