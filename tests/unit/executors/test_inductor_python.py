"""The CUDA route's artifact format, checked without a GPU: the payload's framing, the
refusals of malformed ones, and retargeting a wrapper compiled on one GPU index to another
(a wrapper as Inductor writes it; the GPU tests load and run real ones)."""

from __future__ import annotations

import pytest
import torch

from fcache.cache.artifact import Artifact
from fcache.errors import ConfigError, CorruptArtifact
from fcache.executors import inductor_python
from fcache.executors.inductor import InductorExecutor, cuda_route
from fcache.target import Target

# The device-index forms of a wrapper Inductor 2.11 generated on an H100 (abridged).
WRAPPER = """
triton_poi_fused_2 = async_compile.triton('triton_poi_fused_2', '''
@triton_heuristics.pointwise(
    size_hints={'x': 4194304},
    triton_meta={'signature': {'in_ptr0': '*bf16'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90), 'constants': {}},
)
@triton.jit
def triton_poi_fused_2(in_ptr0, xnumel, XBLOCK : tl.constexpr):
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
''', device_str='cuda')
#   %x_1 : Tensor "bf16[4096, 1024][1024, 1]cuda:0" = PlaceHolder[target=x_1]
class Runner:
    def call(self, args):
        x_1, = args
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((4096, 1024), (1024, 1), torch.bfloat16)
            stream0 = get_raw_stream(0)
            triton_poi_fused_2.run(x_1, buf0, 4194304, stream=stream0)
        return (buf0, )
def get_args():
    x_1 = rand_strided((4096, 1024), (1024, 1), device='cuda:0', dtype=torch.bfloat16)
"""  # noqa: E501


def test_retarget_moves_every_device_index_form_and_nothing_else() -> None:
    moved = inductor_python.retarget(WRAPPER, 0, 3)
    for form in ("_DeviceGuard(3)", "set_device(3)", "get_raw_stream(3)",
                 "DeviceProperties(type='cuda', index=3,", "'cuda:3'", "]cuda:3\""):  # fmt: skip
        assert form in moved, form
    assert "(0)" not in moved and "index=0" not in moved and "cuda:0" not in moved
    # Kernel code, sizes and other numbers stay as they were.
    assert "tl.arange(0, R0_BLOCK)" in moved and "(4096, 1024), (1024, 1)" in moved
    assert inductor_python.retarget(moved, 3, 0) == WRAPPER


def test_payload_round_trips_and_malformed_ones_are_refused() -> None:
    header = {"format": inductor_python.FORMAT, "index": 0, "kernels": ["k"], "source": WRAPPER}
    payload = inductor_python.pack(header, b"kernels")
    assert inductor_python.is_payload(payload)
    assert inductor_python.split(payload) == (header, b"kernels")
    cut = payload[: len(inductor_python.MAGIC) + 6]
    with pytest.raises(CorruptArtifact, match="bad header"):
        inductor_python.split(cut)
    with pytest.raises(CorruptArtifact, match="unknown header"):
        inductor_python.split(inductor_python.pack({**header, "format": 99}, b""))
    with pytest.raises(CorruptArtifact, match="unknown header"):
        inductor_python.split(inductor_python.pack({**header, "index": "0"}, b""))


def test_a_cuda_artifact_is_refused_on_cpu() -> None:
    header = {"format": inductor_python.FORMAT, "index": 0, "kernels": [], "source": WRAPPER}
    artifact = Artifact("inductor", InductorExecutor.version, inductor_python.pack(header, b""))
    with pytest.raises(CorruptArtifact, match="CUDA only"):
        InductorExecutor().load(artifact, torch.device("cpu"))


def test_the_cuda_route_is_part_of_the_key_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    executor = InductorExecutor()
    cuda = Target(device_type="cuda", capability="sm_90")
    monkeypatch.delenv("FCACHE_INDUCTOR_CUDA", raising=False)
    assert cuda_route() == "python"
    default = executor.toolchain(cuda)
    monkeypatch.setenv("FCACHE_INDUCTOR_CUDA", "aoti")
    assert executor.toolchain(cuda) != default
    assert "route" not in executor.toolchain(Target(device_type="cpu", capability="avx2"))
    monkeypatch.setenv("FCACHE_INDUCTOR_CUDA", "cuda-graphs")
    with pytest.raises(ConfigError, match="FCACHE_INDUCTOR_CUDA='cuda-graphs'"):
        cuda_route()


def _inductor_header() -> str:
    """The imports and header of a Python wrapper, as this torch's Inductor writes them."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.utils import IndentedBuffer

    codegen = PythonWrapperCodegen.__new__(PythonWrapperCodegen)
    codegen.imports, codegen.header = IndentedBuffer(), IndentedBuffer()
    codegen.write_header()
    return codegen.imports.getvalue() + codegen.header.getvalue()


def test_a_loaded_wrapper_imports_no_code_generator_it_does_not_use() -> None:
    """Inductor's wrapper header imports its code generators (`align`, `extern_kernels`);
    a loaded region gets the same `align` from where it is defined, and no
    `extern_kernels` unless it calls one. Run in a fresh interpreter: what it imports is
    what a warm process pays."""
    import subprocess
    import sys

    header = _inductor_header()
    assert "select_algorithm" in header and "memory_planning" in header
    unused = inductor_python.lighter(header + "def call(args):\n    return align(100)\n")
    script = (
        "import sys, torch\n"
        f"namespace = {{}}\nexec({unused!r}, namespace)\n"
        "assert namespace['call']([]) == 128\n"
        "heavy = [m for m in sys.modules if m.endswith(('select_algorithm', 'memory_planning'))]\n"
        "from torch._inductor.codegen.memory_planning import _align\n"
        "assert namespace['align'] is _align\n"
        "print(heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
    # A wrapper that calls a library kernel keeps the import it needs.
    used = header + "def call(args):\n    return extern_kernels.mm(*args)\n"
    assert inductor_python.lighter(used) == used.replace(
        "codegen.memory_planning import _align", "utils import _align"
    )
