"""Rewrites of Inductor's generated wrapper (fcache.executors.inductor_source): another
GPU index, lighter imports, and the variant without size and stride asserts (compiled in
the wrapper's namespace by fcache.executors.inductor_unchecked.unchecked_call)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from fcache.executors import inductor_source, inductor_unchecked

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
    moved = inductor_source.retarget(WRAPPER, 0, 3)
    for form in ("_DeviceGuard(3)", "set_device(3)", "get_raw_stream(3)",
                 "DeviceProperties(type='cuda', index=3,", "'cuda:3'", "]cuda:3\""):  # fmt: skip
        assert form in moved, form
    assert "(0)" not in moved and "index=0" not in moved and "cuda:0" not in moved
    # Kernel code, sizes and other numbers stay as they were.
    assert "tl.arange(0, R0_BLOCK)" in moved and "(4096, 1024), (1024, 1)" in moved
    assert inductor_source.retarget(moved, 3, 0) == WRAPPER


def test_kernel_sources_are_the_strings_the_wrapper_passes_to_inductor() -> None:
    """What a retargeted wrapper hands `async_compile.triton` (the built kernels moved to
    another GPU are registered under it: fcache.executors.inductor_kernels.moved)."""
    here = inductor_source.kernel_sources(WRAPPER)
    there = inductor_source.kernel_sources(inductor_source.retarget(WRAPPER, 0, 3))
    assert list(here) == list(there) == ["triton_poi_fused_2"]
    assert here["triton_poi_fused_2"].startswith("\n@triton_heuristics.pointwise(")
    assert "index=0," in here["triton_poi_fused_2"]
    assert there["triton_poi_fused_2"] == here["triton_poi_fused_2"].replace("index=0,", "index=3,")
    assert inductor_source.kernel_sources("x = f('a', 'b')\n") == {}


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
    header = _inductor_header()
    assert "select_algorithm" in header and "memory_planning" in header
    unused = inductor_source.lighter(header + "def call(args):\n    return align(100)\n")
    _heavy_imports_after(
        unused,
        "assert namespace['call']([]) == 128\n"
        "from torch._inductor.codegen.memory_planning import _align\n"
        "assert namespace['align'] is _align\n",
    )
    # A wrapper that calls torch's own library kernels takes them from torch.
    mm = "def call(args):\n    return extern_kernels.mm(*args)\n"
    used = inductor_source.lighter(header + mm)
    assert "select_algorithm" not in used
    _heavy_imports_after(
        used,
        "a, b = torch.randn(3, 4), torch.randn(4, 5)\n"
        "assert torch.equal(namespace['call']([a, b]), torch.mm(a, b))\n",
    )
    # One that calls a kernel of Inductor's own keeps the import it needs.
    own = header + "def call(args):\n    return extern_kernels._mm_plus_mm(*args)\n"
    assert inductor_source.lighter(own) == own.replace(
        "codegen.memory_planning import _align", "utils import _align"
    )


def _heavy_imports_after(wrapper: str, checks: str) -> None:
    """Runs `wrapper` (as `namespace`) and `checks` in a fresh interpreter, then asserts
    that neither of the heavy modules was imported (the checks' own imports come after)."""
    script = (
        "import sys, torch\n"
        f"namespace = {{}}\nexec({wrapper!r}, namespace)\n"
        "heavy = [m for m in sys.modules if m.endswith(('select_algorithm', 'memory_planning'))]\n"
        f"{checks}"
        "print(heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_the_library_calls_taken_from_torch_are_inductors_own() -> None:
    """`lighter` replaces `extern_kernels` by torch for the names in TORCH_EXTERN: each
    must be what Inductor registers under that name, on this torch."""
    from torch._inductor.select_algorithm import extern_kernels

    for name in sorted(inductor_source.TORCH_EXTERN):
        assert getattr(extern_kernels, name) is getattr(torch, name), name


# -- the variant without size and stride asserts ---------------------------------------


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("wrapper")
    module.seen = []  # type: ignore[attr-defined]
    module.assert_size_stride = lambda x, size, stride: module.seen.append(size)  # type: ignore[attr-defined]
    exec(source, vars(module))
    return module


FUNCTION_FORM = """
def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    assert_size_stride(arg0_1, (4, ), (1, ))
    assert_size_stride(arg1_1, (4, ), (1, ))
    with torch.no_grad():
        buf0 = arg0_1 + scale * arg1_1
        del arg0_1
    return (buf0, )


def benchmark_compiled_module(times=10, repeat=10):
    return call([])
"""
METHOD_FORM = """
class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        arg0_1, arg1_1 = args
        args.clear()
        assert_size_stride(arg0_1, (4, ), (1, ))
        assert_size_stride(arg1_1, (4, ), (1, ))
        buf0 = arg0_1 + scale * arg1_1
        return (buf0, )

runner = Runner(partitions=[])
call = runner.call
"""


@pytest.mark.parametrize("source", [FUNCTION_FORM, METHOD_FORM], ids=["function", "method"])
def test_the_unchecked_call_computes_the_same_without_size_asserts(source: str) -> None:
    source = "import torch\nscale = 3.0\n" + source
    module = _module(source)
    lean = inductor_unchecked.unchecked_call(module, source)
    assert lean is not None
    x, y = torch.randn(4), torch.randn(4)
    args = [x, y]
    (got,) = lean(args)
    assert args == [] and module.seen == []  # boxed like the original; nothing asserted
    torch.testing.assert_close(got, x + 3 * y)
    # The variant resolves the module's names, as they are once it has loaded (a copy of
    # its namespace, in which Triton kernels launch directly: inductor_launch).
    assert {k: v for k, v in lean.__globals__.items() if k != "__builtins__"} == {
        k: v for k, v in vars(module).items() if k != "__builtins__"
    }
    (again,) = module.call([x, y])
    assert module.seen == [(4,), (4,)]  # the original still checks
    torch.testing.assert_close(again, x + 3 * y)


def test_no_unchecked_call_where_there_is_nothing_to_drop_or_the_form_is_unknown() -> None:
    no_asserts = "def call(args):\n    return (args[0],)\n"
    assert inductor_unchecked.unchecked_call(_module(no_asserts), no_asserts) is None
    uses_self = METHOD_FORM.replace("buf0 = arg0_1", "buf0 = self.partitions or arg0_1")
    assert inductor_unchecked.unchecked_call(_module(uses_self), uses_self) is None
    assert inductor_unchecked.unchecked_call(types.ModuleType("m"), "x = 1\n") is None


def test_no_unchecked_call_where_the_rewrite_reads_the_body_wrong() -> None:
    # A body the rewrite cuts short (here: a line at the wrong indent ends it early)
    # compiles, but calls less than the original: no variant.
    source = FUNCTION_FORM.replace("    return (buf0, )", "    return (other(buf0), )")
    source = source.replace("        del arg0_1\n", "        del arg0_1\n# a comment at column 0\n")
    module = _module("import torch\nscale = 3.0\nother = abs\n" + source)
    assert inductor_source.unchecked_source(source) is not None  # the text alone is cut
    assert inductor_unchecked.unchecked_call(module, source) is None


GUARDED_FORM = """
def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    assert_size_stride(arg0_1, (4, ), (1, ))
    with torch.cuda._DeviceGuard(1):
        torch.cuda.set_device(1)
        buf0 = arg0_1 + scale * arg1_1
        del arg0_1
    return (buf0, )
"""


class _FakeCuda:
    """The device calls of a GPU wrapper, recorded (the test runs on any machine)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        outer = self

        class Guard:
            def __init__(self, index: int) -> None:
                self.index = index

            def __enter__(self) -> None:
                outer.calls.append(f"enter {self.index}")

            def __exit__(self, *exc: object) -> None:
                outer.calls.append("exit")

        self._DeviceGuard = Guard

    def set_device(self, index: int) -> None:
        self.calls.append(f"set {index}")


def _guarded_module() -> tuple[types.ModuleType, str, _FakeCuda]:
    source = "scale = 3.0\n" + GUARDED_FORM
    module = _module(source)
    cuda = _FakeCuda()
    module.torch = types.SimpleNamespace(cuda=cuda)  # type: ignore[attr-defined]
    return module, source, cuda


def test_the_unchecked_call_skips_the_device_guard_only_on_the_regions_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, source, cuda = _guarded_module()
    variant = inductor_source.unchecked_source(source)
    assert variant is not None and variant.device == 1
    assert "_DeviceGuard" not in variant.text and "set_device" not in variant.text
    lean = inductor_unchecked.unchecked_call(module, source)
    assert lean is not None and lean.__wrapped__.__code__.co_name == "call"  # type: ignore[attr-defined]
    x, y = torch.randn(4), torch.randn(4)
    monkeypatch.setattr(inductor_unchecked, "_current_device", lambda: 1)
    (got,) = lean([x, y])
    torch.testing.assert_close(got, x + 3 * y)
    assert cuda.calls == [] and module.seen == []  # on cuda:1 already: no guard, no assert
    # Another device current (a thread that never set it, say): the wrapper's own call,
    # guard and checks included.
    monkeypatch.setattr(inductor_unchecked, "_current_device", lambda: 0)
    (got,) = lean([x, y])
    torch.testing.assert_close(got, x + 3 * y)
    assert cuda.calls == ["enter 1", "set 1", "exit"] and module.seen == [(4,)]


def test_a_wrapper_guarding_two_devices_keeps_its_guards() -> None:
    two = GUARDED_FORM.replace(
        "    return (buf0, )",
        "    with torch.cuda._DeviceGuard(0):\n        torch.cuda.set_device(0)\n"
        "        buf1 = buf0 * 2\n    return (buf1, )",
    )
    variant = inductor_source.unchecked_source(two)
    assert variant is not None and variant.device is None  # its asserts still go
    assert variant.text.count("_DeviceGuard") == 2
    # A guard and nothing else to drop: still a variant.
    bare = GUARDED_FORM.replace("    assert_size_stride(arg0_1, (4, ), (1, ))\n", "")
    variant = inductor_source.unchecked_source(bare)
    assert variant is not None and variant.device == 1


def test_an_unchecked_call_is_made_beneath_a_wrapping_of_call() -> None:
    source = "import torch\nscale = 3.0\n" + FUNCTION_FORM
    module = _module(source)
    inner = module.call

    def timed(args: list[torch.Tensor]) -> object:  # as a profiler's timer wraps it
        return inner(args)

    timed.__wrapped__ = inner  # type: ignore[attr-defined]
    module.call = timed  # type: ignore[attr-defined]
    assert inductor_unchecked.unchecked_call(module, source) is not None
