"""glibc's heap kept for large blocks (fcache.heap): in fresh processes, through glibc's own
count of mapped blocks (a pytest process's heap says nothing about a fresh one's)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.fresh import run_json

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Is a fresh 20 MB block a mapping of its own (glibc's mallinfo2: hblks, mapped blocks)?
# Then hold two in the heap, free them, and see whether the heap kept their pages.
_PROBE = """
import ctypes, json
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print(json.dumps({"skip": "glibc without mallinfo2"})); raise SystemExit
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in FIELDS.split()]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SETUP
size = 20_000_000
before = libc.mallinfo2().hblks
block = libc.malloc(size)
mapped = libc.mallinfo2().hblks > before
libc.free(block)
blocks = [libc.malloc(size), libc.malloc(size)]
held = libc.mallinfo2().arena
for b in blocks:
    libc.free(b)
print(json.dumps({"adapted": ADAPTED, "mapped": mapped,
                  "kept": libc.mallinfo2().arena >= held}))
"""


def _probe(setup: str, adapted: str, **env: str) -> dict[str, object]:
    script = _PROBE.replace("SETUP", setup).replace("ADAPTED", adapted)
    report = run_json(script, timeout=120, **env)
    if "skip" in report:
        pytest.skip(str(report["skip"]))
    return report


_KEEP = "from fcache import heap\nadapted = heap.keep_large_blocks()"


def test_a_fresh_process_maps_large_blocks_and_one_that_keeps_them_uses_its_heap() -> None:
    plain = _probe("", "None")
    assert plain["mapped"] is True  # glibc's start: a 20 MB block is an mmap, unmapped on free

    kept = _probe(_KEEP, "adapted")
    assert kept["adapted"] is True
    assert kept["mapped"] is False  # served from the heap
    assert kept["kept"] is True  # and 40 MB freed at the heap's top stays with the process


def test_heap_settings_the_user_chose_stay_as_they_are() -> None:
    for env in (
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
        {"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "131072"},
    ):
        report = _probe(_KEEP, "adapted", **env)
        assert report["adapted"] is False, env
        assert report["mapped"] is True, env  # glibc's own behaviour, untouched


# The eager executor: the regions go through fcache's whole pipeline without Inductor's C++
# builds and compile worker processes (the heap is kept whatever compiles the regions).
_MODEL = """
import json, torch, fcache
from fcache import heap
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
settings = fcache.Settings(cache_dir=CACHE, progress=False, executors=("eager",))
f = fcache.jit(model, settings=settings)
before = heap.keep_large_blocks.cache_info().currsize
f(torch.randn(4, 8)).sum().backward()
print(json.dumps({"before": before, "after": heap.keep_large_blocks.cache_info().currsize,
                  "loaded": fcache.stats(f).functions_loaded}))
"""


def test_cold_and_warm_processes_keep_large_blocks_before_their_first_cpu_step(
    tmp_path: Path,
) -> None:
    script = _MODEL.replace("CACHE", repr(str(tmp_path / "cache")))
    cold = run_json(script, timeout=300)
    warm = run_json(script, timeout=300)
    assert cold == {"before": 0, "after": 1, "loaded": 0}
    # A warm process rebuilds its graphs from a stored function: no example inputs to see.
    assert warm == {"before": 0, "after": 1, "loaded": 1}
