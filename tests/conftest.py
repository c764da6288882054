import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests import tests.graphs

# Inductor's CPU vector-ISA probe: the first C++ codegen of every process with an empty
# Inductor cache dir builds and dlopens a test library per x86 ISA against torch's headers
# (about 8 s on 2 cores, in nearly every fresh process the suite starts). With this set,
# Inductor takes the ISAs the CPU reports (cpuid) without building them; the ISA it picks,
# and so the kernels it generates, are the same. Its bf16 and VNNI probes still build.
# Set before torch is imported (torch._inductor.config reads it then), and inherited by
# every process a test starts; a value set outside the suite is kept.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# One compute thread per process: `make test` runs two pytest workers on two cores, each
# starting processes of its own, and torch's default (a thread per core) oversubscribes the
# cores, its OpenMP threads spinning while they wait for each other: the model matrix's
# tests, two copies at once, took 135 s with two threads against 107 s with one. Set
# before torch is imported, for the same reason and in the same way as the above.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The files that take longest on two cores, longest first: every file of 10 s or more in a
# full `pytest -n 2 --dist loadfile --durations=0` run (each file's tests summed; each runs
# whole on one worker under `--dist loadfile`). They are started first, and each worker
# takes the next when it is nearly done with its own (longest processing time first): left
# to pytest-xdist's own order (the files with most tests first), the long one-test files
# (bench, torchrun, the dynamic-shapes run) came last, and one worker ran the last of them
# alone while the other had finished. A file missing here runs after them, in collection
# order; a file that grows long belongs here.
SLOWEST_FILES = (
    "tests/unit/test_bench_smoke.py",
    "tests/unit/engine/test_whole.py",
    "tests/unit/engine/test_whole_breaks.py",
    "tests/models/test_matrix.py",
    "tests/e2e/test_llama.py",
    "tests/unit/test_bench_distributed.py",
    "tests/unit/engine/test_dynamic.py",
    "tests/unit/frontend/test_layers.py",
    "tests/service/test_end_to_end.py",
    "tests/distributed/test_torchrun.py",
    "tests/reliability/test_safe_by_default.py",
    "tests/unit/engine/test_generate.py",
    "tests/unit/engine/test_program.py",
    "tests/e2e/test_share_torch_compile.py",
    "tests/redis/test_redis_nodes.py",
    "tests/reliability/test_bounds.py",
    "tests/redis/test_redis_nodes_inductor.py",
    "tests/unit/frontend/test_constants.py",
    "tests/unit/test_bench_generate.py",
    "tests/redis/test_redis_faults.py",
    "tests/reliability/test_network_faults.py",
    "tests/unit/engine/test_whole_ddp.py",
    "tests/unit/frontend/test_partition.py",
    "tests/unit/engine/test_static_inputs.py",
    "tests/unit/test_bench_varlen.py",
    "tests/unit/frontend/test_key.py",
    "tests/unit/test_heap.py",
    "tests/unit/executors/test_inductor_safety.py",
    "tests/unit/engine/test_session.py",
    "tests/unit/frontend/test_canonicalize.py",
    "tests/unit/executors/test_inductor_source.py",
    "tests/unit/executors/test_inductor_python.py",
    "tests/unit/engine/test_compile_deadline.py",
    "tests/reliability/test_poisoning.py",
    "tests/reliability/test_storage_faults.py",
    "tests/unit/test_bench_nested.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: files in collection order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {path: rank for rank, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))


@pytest.fixture(autouse=True)
def _isolated_inductor_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own Inductor cache dir: no test warms another's compiler
    by accident, and nothing is written to the user's /tmp/torchinductor_* dirs."""
    base = tmp_path_factory.getbasetemp() / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.fspath(base))
