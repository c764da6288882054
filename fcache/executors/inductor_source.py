"""Rewrites of the Python wrapper Inductor generates for a region (its `call`): for
another GPU index (`retarget`; `kernel_sources` reads the kernel sources it then passes to
Inductor), with lighter imports (`lighter`), and without its size and stride asserts and
its device guard once fcache checks those itself (`unchecked_source`).

Each is a rewrite of generated text in a form Inductor has kept across versions; where
the text is not in that form, the rewrite changes nothing (or gives no variant), so a
newer Inductor costs speed, never correctness.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

# Where Inductor writes the device index: the wrapper's guard and stream, each kernel's
# DeviceProperties, and `cuda:N` in strings and comments.
_INDEX_FORMS = (
    (r"_DeviceGuard\({i}\)", "_DeviceGuard({j})"),
    (r"set_device\({i}\)", "set_device({j})"),
    (r"get_raw_stream\({i}\)", "get_raw_stream({j})"),
    (r"DeviceProperties\(type='cuda', index={i},", "DeviceProperties(type='cuda', index={j},"),
    (r"device\(type='cuda', index={i}\)", "device(type='cuda', index={j})"),
    (r"\bcuda:{i}\b", "cuda:{j}"),
)


def retarget(source: str, old: int, new: int) -> str:
    """`source` compiled for cuda:`old`, rewritten for cuda:`new`."""
    for pattern, replacement in _INDEX_FORMS:
        source = re.sub(pattern.format(i=old), replacement.format(j=new), source)
    return source


def kernel_sources(wrapper: str) -> dict[str, str]:
    """Each `async_compile.triton(name, source, ...)` of a wrapper: name -> source, as the
    wrapper passes them (string literals, read as Python reads them)."""
    sources = {}
    for node in ast.walk(ast.parse(wrapper)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "triton"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "async_compile"
            and len(node.args) >= 2
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args[:2])
        ):
            sources[node.args[0].value] = node.args[1].value  # type: ignore[attr-defined]
    return sources


# Two imports of Inductor's wrapper header that pull in its code generators (lowering,
# autotuning, sympy: about a second on a GPU host, the largest part of loading the first
# region of a warm process): `align`, the same function from the module that defines it,
# and `extern_kernels` (Inductor's library calls, such as mm): left out where unused, and
# where every call is to one of TORCH_EXTERN, taken from torch itself.
_ALIGN = "from torch._inductor.codegen.memory_planning import _align as align\n"
_EXTERN = "from torch._inductor.select_algorithm import extern_kernels\n"
# Library calls that Inductor registers as torch's own functions (ExternKernelChoice of
# torch.mm and so on): `extern_kernels.mm` is `torch.mm`. Checked against Inductor's
# registry by tests/unit/executors/test_inductor_source.py on every torch it runs with.
TORCH_EXTERN = frozenset({"mm", "addmm", "bmm", "baddbmm", "_int_mm", "convolution"})
_EXTERN_CALL = re.compile(r"\bextern_kernels\.(\w+)")


def lighter(source: str) -> str:
    """`source` (a wrapper) with its header's heavy imports replaced where that changes
    nothing it runs."""
    from torch._inductor import utils

    if _ALIGN in source and hasattr(utils, "_align"):
        source = source.replace(_ALIGN, "from torch._inductor.utils import _align as align\n", 1)
    if _EXTERN in source:
        calls = _EXTERN_CALL.findall(source)
        called = set(calls)
        # The import, then calls only (no other use of the name), each torch's own.
        if called <= TORCH_EXTERN and source.count("extern_kernels") == len(calls) + 1:
            light = f"import torch as extern_kernels  # {', '.join(sorted(called))}: torch's\n"
            source = source.replace(_EXTERN, light if called else "", 1)
    return source


# The wrapper's entry point: a function, or (torch 2.11 on) a method of its Runner.
_CALL = re.compile(r"^(?P<indent>[ \t]*)def call\((?:self, )?args\):[^\n]*\n", re.M)
_SIZE_ASSERT = re.compile(r"^[ \t]+assert_size_stride\([^\n]*\)\n", re.M)
# The device guard Inductor opens around a GPU wrapper's work, and the set_device under it.
_GUARD = re.compile(
    r"^(?P<indent>[ \t]+)with torch\.cuda\._DeviceGuard\((?P<index>\d+)\):\n"
    r"(?P=indent)    torch\.cuda\.set_device\((?P=index)\)\n",
    re.M,
)
# What `call` no longer names once its asserts and guards are gone.
DROPPED_NAMES = frozenset({"assert_size_stride", "torch", "cuda", "_DeviceGuard", "set_device"})


@dataclass(frozen=True)
class Unchecked:
    """A wrapper's `call` without its size and stride asserts and device guard, and the
    GPU index whose guard it dropped (None: it had none)."""

    text: str
    device: int | None


def unchecked_source(source: str) -> Unchecked | None:
    """The wrapper's `call` as a function `call(args)` without its size and stride asserts
    and its device guard (source text, to be compiled in the wrapper module's namespace);
    None where it has neither, or where `call` is not in the expected form.

    Each assert costs about 0.3-1.5 us of host time per input per call (H100 host; a
    region has 2-9 inputs and runs tens of times a step). It checks what the kernels
    assume of their inputs' sizes and strides; a caller may run this variant only where
    it has checked those itself (fcache.engine.rewrite.views checks them once, as it does for
    folded views, and graph inputs at every call). Alignment asserts stay.

    The guard (`with torch.cuda._DeviceGuard(i): torch.cuda.set_device(i)`) is three
    calls into torch per region call, a few us, where the current device is almost always
    `i` already; the variant's caller makes sure it is (inductor_unchecked.unchecked_call).
    A wrapper guarding two indices keeps its guards."""
    found = _CALL.search(source)
    if found is None:
        return None
    indent = found.group("indent")
    lines = []
    for line in source[found.end() :].split("\n"):
        if line.strip() and not line.startswith(indent + " "):
            break
        lines.append(line)
    body = textwrap.dedent("\n".join(lines))
    if re.search(r"\bself\b", body):  # it uses its runner (partitions): keep the original
        return None
    text, asserts = _SIZE_ASSERT.subn("", "def call(args):\n" + textwrap.indent(body, "    "))
    indices = {int(m.group("index")) for m in _GUARD.finditer(text)}
    device = None
    if len(indices) == 1:
        # `if True:` keeps the guarded block as it was indented (CPython drops the test).
        text = _GUARD.sub(
            lambda m: f"{m.group('indent')}if True:  # device set by the caller\n", text
        )
        (device,) = indices
    return Unchecked(text, device) if asserts or device is not None else None
