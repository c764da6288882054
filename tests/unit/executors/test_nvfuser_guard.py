"""The nvFuser executor without nvFuser: the import guard, `supports`, the executor's own
counters, the payload format and the kernel-database bookkeeping (with a stand-in for
nvFuser's native entry points)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fcache.errors import CorruptArtifact
from fcache.executors import registry
from fcache.executors.nvfuser import NvFuserExecutor, installed
from fcache.executors.nvfuser import payload as payload_format
from fcache.executors.nvfuser import translate as tr
from fcache.executors.nvfuser.kernel_db import Kernel, KernelDb
from fcache.target import Target
from tests.graphs import model_regions

GPU = Target("cuda", "sm_90")


def test_import_needs_neither_nvfuser_nor_a_gpu() -> None:
    code = (
        "import sys, fcache, fcache.executors.nvfuser as g;"
        "from fcache.executors import registry;"
        "assert 'nvfuser_direct' not in sys.modules;"
        "assert 'fcache.executors.nvfuser.runtime' not in sys.modules;"
        "assert [e.name for e in registry.resolve(None, 'cpu')] == ['inductor', 'eager']"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


GUARD_ONLY = """
import sys, threading
import torch
from fcache.executors import nvfuser as g, registry
from fcache.frontend.canonicalize import CanonicalNode, Ref, TensorSpec, region_of
from fcache.target import Target

x = TensorSpec(torch.float32, (4, 8), (8, 1), "cuda")
mul = CanonicalNode("aten.mul.Tensor", (Ref("in", 0), 2.0), {})
region = region_of([x], [mul], [Ref("node", 0)])
executor = registry.create("nvfuser")
assert isinstance(executor, g.NvFuserExecutor)
assert executor.supports(region, Target("cuda", "sm_90"))
assert executor.available("cuda") == g.installed() and not executor.available("cpu")
assert executor.stats()["compiles"] == 0
registry.resolve(None, "cuda")
executor.close()  # nothing was built: nothing to close
assert "nvfuser_direct" not in sys.modules, "the guard imported nvFuser"
assert "fcache.executors.nvfuser.runtime" not in sys.modules, "the guard imported the runtime"
assert not torch.cuda.is_initialized(), "the guard initialized CUDA"
assert not [t for t in threading.enumerate() if t.name.startswith("fcache-nvfuser")]
"""


def test_guard_use_imports_no_runtime_and_starts_nothing() -> None:
    # Everything but compile and load: supports, available, stats, close, and the registry
    # resolving executors for a CUDA device, in a fresh interpreter.
    subprocess.run([sys.executable, "-c", GUARD_ONLY], check=True)


def test_cpu_order_skips_nvfuser_even_when_asked() -> None:
    assert [e.name for e in registry.resolve(None, "cpu")] == ["inductor", "eager"]
    assert [e.name for e in registry.resolve(["nvfuser", "eager"], "cpu")] == ["eager"]


def test_executor_identity() -> None:
    executor = registry.create("nvfuser")
    assert isinstance(executor, NvFuserExecutor)
    assert (executor.name, executor.persistent) == ("nvfuser", True)


# The embedding's backward, a scatter: torch 2.13 decomposes it to a masked index_put,
# 2.11 to a plain one with accumulate=True.
SCATTERS = {"aten._unsafe_masked_index_put_accumulate.default", "aten.index_put.default"}


def _scatter(regions: list) -> str:
    (op,) = {node.op for region in regions for node in region.nodes} & SCATTERS
    return op


@pytest.mark.parametrize("family", ["llama", "gpt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_example_model_ops_are_all_covered(family: str, dtype: torch.dtype) -> None:
    regions = model_regions(family, dtype)
    ops = {node.op for region in regions for node in region.nodes}
    # The embedding's backward is a masked index_put (a scatter): left to the next executor.
    assert ops - set(tr.TRANSLATORS) <= {_scatter(regions)}
    executor = NvFuserExecutor()
    declined = [r for r in regions if not executor.supports(r, GPU)]
    # Declined on purpose: the embedding backward (a scatter), and in Llama the RoPE
    # backward, whose strided slice_scatter nvFuser segments into ~10 kernels.
    expected = {_scatter(regions)}
    if family == "llama":
        expected.add("aten.slice_scatter.default")
    for region in declined:
        assert {n.op for n in region.nodes} & expected, [n.op for n in region.nodes]
    assert len(declined) <= len(expected) + (family == "llama")
    assert all(not executor.supports(r, Target("cpu", "avx2")) for r in regions)


def test_declined_regions_are_counted_by_reason() -> None:
    regions = model_regions("llama", torch.float32)
    executor = NvFuserExecutor()
    scatter = _scatter(regions)
    before = executor.stats()["declined"].get(scatter, 0)
    for region in regions:
        executor.supports(region, GPU)
    after = executor.stats()["declined"][scatter]
    assert after == before + 1


def test_each_executor_has_its_own_stats() -> None:
    regions = model_regions("llama", torch.float32)
    one, two = NvFuserExecutor(), NvFuserExecutor()
    for region in regions:
        one.supports(region, GPU)
    assert one.stats()["declined"][_scatter(regions)] == 1
    assert two.stats()["declined"] == {}
    # The snapshot is a copy: changing it changes nothing.
    snapshot = one.stats()
    snapshot["declined"].clear()
    snapshot["builds"].append({})
    assert one.stats()["declined"] and one.stats()["builds"] == []
    # The same keys as the module function `stats()` gave before the executor owned them.
    assert set(two.stats()) == {
        "compiles", "compile_seconds", "loads", "load_seconds", "define_seconds", "reused",
        "nvrtc_compiles", "kernels_harvested", "kernels_restored", "cut_regions", "steps",
        "late_compiles", "runtime_fallbacks", "declined", "builds",
    }  # fmt: skip
    # The registry's executor is the process's one: one set of counters per process.
    assert registry.create("nvfuser") is registry.create("nvfuser")


def test_available_needs_cuda_and_nvfuser_direct() -> None:
    executor = NvFuserExecutor()
    assert not executor.available("cpu")
    assert executor.available("cuda") == installed()
    assert ("nvfuser" in registry.default_order("cuda")) == installed()
    executor.close()
    executor.close()  # idempotent, and harmless before any compile


def test_checks_see_arguments() -> None:
    region = model_regions("llama", torch.float32)[0]
    node = region.nodes[0]
    bad = type(node)("aten.constant_pad_nd.default", (node.args[0], (1, -1)), {})
    assert tr._node_reason(bad) == "negative padding"
    fp8 = type(node)("prims.convert_element_type.default", (node.args[0], torch.float8_e4m3fn), {})
    assert tr._node_reason(fp8) == "dtype torch.float8_e4m3fn"


def test_stride_order_matches_nvfusers_convention() -> None:
    x = torch.empty(2, 3, 4, device="meta")
    assert tr.stride_order(x) == [2, 1, 0]
    assert tr.stride_order(torch.empty(3, device="meta")) is None
    assert tr.stride_order(x.permute(0, 2, 1)) == [2, 0, 1]
    assert tr.stride_order(x.expand(2, 3, 4)[:, :, :2]) is None  # gapped: not dense


def _payload() -> payload_format.Payload:
    kernels = (
        Kernel("nvfuser_pointwise_f0_c1_r0_g0", "--std=c++17", b"__global__ k", b"\x00\x7fELF"),
    )
    return payload_format.Payload(
        region=model_regions("llama", torch.float32)[0].text,
        definition="def nvfuser_fusion(fd): ...",
        nvfuser="0.2.36+gitabc",
        inputs=({"sizes": [2], "strides": [1], "dtype": "float32", "device": "cuda"},),
        kernels=kernels,
        steps=(
            payload_format.StepRecord(
                model_regions("llama", torch.float32)[1].text, (("in", 0),), (("node", 3),)
            ),
        ),
    )


def test_payload_round_trip() -> None:
    original = _payload()
    assert payload_format.decode(payload_format.encode(original)) == original


@pytest.mark.parametrize("cut", [3, 20, -1])
def test_payload_damage_is_corrupt(cut: int) -> None:
    data = payload_format.encode(_payload())
    with pytest.raises(CorruptArtifact):
        payload_format.decode(data[:cut])
    with pytest.raises(CorruptArtifact):
        payload_format.decode(data + b"x")


class FakeNativeDb:
    """What nvFuser's KernelDb::write does: files named by map size, a CSV row appended."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "db.csv").write_text(
            "kernel_signature,compile_args,kernel_code_file,cubin_file\n"
        )
        self.codes: list[bytes] = []

    def write(self, code: bytes, args: str, name: str, cubin: bytes) -> bool:
        if code in self.codes:
            return True
        n = len(self.codes)
        (self.directory / f"kernel_{n}.cu").write_bytes(code)
        (self.directory / f"kernel_{n}.cubin").write_bytes(cubin)
        with open(self.directory / "db.csv", "a") as f:
            f.write(f"{name},{args},kernel_{n}.cu,kernel_{n}.cubin\n")
        self.codes.append(code)
        return True


def test_kernel_db_harvest_and_restore(tmp_path: Path) -> None:
    native = FakeNativeDb(tmp_path)
    db = KernelDb(tmp_path, write=None, handle=0)
    # nvFuser compiles two kernels (an NVRTC run each): two rows.
    native.write(
        b"__global__ void a() {}", "--std=c++17 -DNDEBUG", "nvfuser_pointwise_f0_c1_r0_g0", b"A"
    )
    native.write(
        b"__global__ void b() {}", "--std=c++17 -DNDEBUG", "nvfuser_reduction_f0_c1_r0_g1", b"B"
    )
    assert db.rows == 2
    harvested = db.harvest("__global__ void b() {}\n")
    assert [(k.signature, k.cubin) for k in harvested] == [("nvfuser_reduction_f0_c1_r0_g1", b"B")]

    # Another process restores them: known code is skipped, new code goes through write.
    other = tmp_path / "other"
    other.mkdir()
    native2 = FakeNativeDb(other)
    calls: list[tuple[bytes, bytes, bytes]] = []

    def write(handle: int, code: int, args: int, name: int, cubin: int) -> bool:
        import ctypes

        def string(addr: int) -> bytes:
            data, size = (
                ctypes.c_void_p.from_address(addr).value,
                ctypes.c_size_t.from_address(addr + 8).value,
            )
            return ctypes.string_at(data, size)

        begin, end = (ctypes.c_void_p.from_address(cubin + o).value for o in (0, 8))
        calls.append((string(code), string(args), string(name)))
        return native2.write(
            string(code),
            string(args).decode(),
            string(name).decode(),
            ctypes.string_at(begin, end - begin),
        )

    db2 = KernelDb(other, write=write, handle=1)
    assert db2.restore(harvested + harvested) == 1
    assert db2.rows == 1
    assert db2.harvest("__global__ void b() {}") == harvested
    assert calls[0][2] == b"nvfuser_reduction_f0_c1_r0_g1"


def test_kernel_db_close_removes_its_directory(tmp_path: Path) -> None:
    directory = tmp_path / "kdb"
    directory.mkdir()
    FakeNativeDb(directory).write(b"__global__ void a() {}", "-O3", "k", b"A")
    db = KernelDb(directory, write=None, handle=0)
    assert db.rows == 1
    db.close()
    assert not directory.exists()
    db.at_exit()  # the exit hook after a close: nothing left to remove, no error
