"""Validation: a freshly compiled region runs once next to eager before it is stored.

Both run on the same inputs, made with the region's exact dtypes, shapes and strides
(seeded random values; an integer input used only as an index spread over the range it
indexes, other integer inputs zeros: fcache.frontend.samples), and their outputs are
compared:

- dtype, shape and device must be the same, and values close: within a tolerance of the
  dtype, measured against the norm of eager's output (fused kernels reassociate sums),
  with NaN and infinity where eager has them. An output that is further off passes if it
  is about as near a computation of the region one precision up (16-bit floats in
  float32, float32 in float64) as eager's is (a layer's region in bfloat16: eager rounds
  after every op, a fused kernel once). Anything else is
  a failure: the artifact is not stored, the region goes to the next executor, and the
  failure is counted.
- an integer (or boolean) output computed from floating values in the region may land one
  step off eager's where a float sits on a boundary: T5's relative-position buckets (a log
  truncated to an integer: Inductor's CUDA log moves some off eager's), a ReLU's mask in
  bfloat16 (`x <= 0` where x is near 0: eager rounds x after every op, a fused kernel
  once; 1.2% of a T5 layer's mask on the H200). Such an output passes if every difference
  is one step and it is about as near the region computed one precision up as eager's is
  (`_few_flips`: the elements off that reference at most `WIDE_MULTIPLIER` times eager's,
  plus `ROUNDED_FRACTION` of them). A wrong kernel (an index off by a stride, a flipped
  mask) misses by more, or in more places; an integer computed from integers only is
  compared exactly.
- an integer output of an op that draws random numbers (the philox seed and offset fused
  attention returns for its backward's dropout) is the generator's state when it ran:
  eager's and the kernel's runs read it at different moments, so only its dtype and
  shape are compared (Llama's float32 layer on an H200 was refused for that alone).
- strides may differ (nvFuser picks its own layout for some outputs): the output is then
  named in `Verdict.restride` with eager's strides, the artifact carries that list, and
  every process that loads it copies those outputs into eager's layout after each call
  (`restrided`), so what runs downstream (a `view`, say) sees the layout it was traced with.

Runs without autograd, on the caller's thread, on the region's device. Regions whose
inputs and outputs exceed `MAX_BYTES` are not run (their layout is trusted, counted as
unchecked): validating them would raise the first step's peak memory by as much. For
the same reason the validations of one device run together only while their estimated
bytes fit in `MAX_BYTES` (`_IN_FLIGHT`: a cold start validates on every compile's lease
thread, many at once), and outputs are compared a `CHUNK` at a time: compared whole in
double precision they took 38 times a bfloat16 output's bytes, and the cold starts of
Gemma2 and OPT (hidden 512, batch 2 x 1024, logits of 32000) peaked at 5.1 and 4.5 GiB of
GPU memory against 2.1 and 1.6 GiB warm (H200, bench/results/gpu-2026-11-29-4).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.node import map_aggregate

from fcache.executors.base import CompiledRegion, unchecked
from fcache.executors.eager import eager_module
from fcache.frontend.canonicalize import CanonicalRegion, Ref, parse, resolve_op
from fcache.frontend.samples import inputs_for, relaid

# Largest inputs plus eager outputs (bytes) a region may have to be validated.
MAX_BYTES = 1 << 30
# Elements compared at a time (`_relative_error`): 16 MiB a double copy.
CHUNK = 1 << 21
# Relative error allowed, against the norm of eager's output, by dtype: the loosest of the
# output's and the region's floating inputs' (a float32 output computed from bfloat16
# inputs, such as a batch norm's saved statistics, is as exact as the rounding eager does
# in bfloat16 on the way). Loose for 16-bit floats: eager rounds after every op, a fused
# kernel once; a wrong kernel (a transposed layout, a wrong reduction) is off by O(1) all
# the same.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}

# An output off eager's by more than the tolerance still passes when it is within this
# many times eager's own error from a reference one precision up (`_widened`, `_nearer`),
# as torch's own accuracy checks judge a compiled model against a float64 one.
WIDE_MULTIPLIER = 3.0
_TOO_FAR = "relative error"
_DIFFER = "values differ"

# The share of an integer output rounded from floats that may be one step off beyond what
# eager's own rounding explains (`_few_flips`). T5's buckets at 1024 tokens: six of 2047
# relative positions sit on a boundary (0.6% of the elements at most), in float32, where
# the reference one precision up is eager's own computation.
ROUNDED_FRACTION = 0.01

Restride = tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """`ok`: the values match. `restride`: (output index, eager's strides) of outputs laid
    out otherwise. `checked`: whether the region ran at all (False above MAX_BYTES)."""

    ok: bool
    restride: Restride = ()
    reason: str = ""
    checked: bool = True


def validate(region: CanonicalRegion, fn: CompiledRegion, device: torch.device) -> Verdict:
    """Run `fn` and the region's ops in eager on the same inputs; compare (module doc)."""
    size = _bytes(region)
    if size > MAX_BYTES:
        return Verdict(ok=True, checked=False)
    with _IN_FLIGHT.hold(str(device), size):
        return _validate(region, fn, device)


def _validate(region: CanonicalRegion, fn: CompiledRegion, device: torch.device) -> Verdict:
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch.no_grad(), on_device:
        try:
            inputs = inputs_for(region, device)
            expected = list(eager_module(region, device)(*[_same(t) for t in inputs]))
        except Exception:  # inputs eager itself refuses (overlapping strides): no judgement
            return Verdict(ok=True, checked=False)
        try:
            got = list(fn(list(inputs)))
        except Exception as exc:  # it compiled but does not run: as bad as wrong values
            return Verdict(ok=False, reason=f"raised {type(exc).__name__}: {exc}")
    if len(got) != len(expected):
        return Verdict(ok=False, reason=f"{len(got)} outputs, eager has {len(expected)}")
    restride = []
    seeded = _seeded_outputs(region)
    floor = max((TOLERANCE.get(s.dtype, 0.0) for s in region.inputs), default=0.0)
    wide: list[torch.Tensor] | None = None  # a reference one precision up, made if needed
    rounded: set[int] | None = None  # integer outputs computed from floats, found if needed
    for index, (out, ref) in enumerate(zip(got, expected, strict=True)):
        if index in seeded and isinstance(out, torch.Tensor) and not ref.is_floating_point():
            out, ref = out.new_zeros(out.shape), ref.new_zeros(ref.shape)  # dtype, shape only
        problem = _compare(out, ref, floor)
        if problem.startswith(_TOO_FAR):
            if wide is None:
                wide = _widened(region, inputs, device) or []
            if index < len(wide) and _nearer(out, ref, wide[index]):
                problem = ""
        elif problem.startswith(_DIFFER) and _one_step_off(out, ref):
            if rounded is None:
                rounded = _rounded_from_floats(region, inputs, device)
            if index in rounded and wide is None:
                wide = _widened(region, inputs, device) or []
            if index not in rounded:
                problem += ", computed from integers only"
            elif _few_flips(out, ref, wide[index] if wide and index < len(wide) else None):
                problem = ""
        if problem:
            return Verdict(ok=False, reason=f"output {index}: {problem}")
        if not same_layout(out, ref):
            restride.append((index, tuple(ref.stride())))
    return Verdict(ok=True, restride=tuple(restride))


def _seeded_outputs(region: CanonicalRegion) -> set[int]:
    """Positions of the region's outputs that an op drawing random numbers returns (its
    results, or items of them)."""

    def seeded(ref: Ref) -> bool:
        if ref.kind != "node":
            return False
        node = region.nodes[ref.index]
        if node.op == "getitem" and node.args and isinstance(node.args[0], Ref):
            return seeded(node.args[0])
        try:
            op = resolve_op(node.op)
        except Exception:  # an op this process cannot resolve: judged as any other
            return False
        return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())

    return {i for i, ref in enumerate(region.outputs) if seeded(ref)}


def _steps(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """How many steps each element of an integer or boolean output is off eager's."""
    return (out.to(torch.int64) - ref.to(torch.int64)).abs()


def _differing(out: torch.Tensor, ref: torch.Tensor) -> str:
    """How far an integer or boolean output is off eager's: how many elements, by how much."""
    difference = _steps(out, ref)
    return (
        f"{_DIFFER} at {int(difference.count_nonzero())} of {difference.numel()} elements, "
        f"by up to {int(difference.max())}"
    )


def _one_step_off(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether every element of `out` is within one step of `ref`'s."""
    difference = _steps(out, ref)
    return difference.numel() > 0 and int(difference.max()) <= 1


def _few_flips(out: torch.Tensor, eager: torch.Tensor, wide: object) -> bool:
    """Whether `out` (one step off `eager` here and there) is about as near `wide`, the
    region's output one precision up, as eager's is: the elements off it at most
    WIDE_MULTIPLIER times eager's, plus ROUNDED_FRACTION of them. Without a reference,
    against eager itself: at most ROUNDED_FRACTION of the elements."""
    slack = ROUNDED_FRACTION * out.numel()
    if not isinstance(wide, torch.Tensor) or wide.shape != eager.shape:
        return int((out != eager).count_nonzero()) <= slack
    wide = wide.to(eager.dtype)
    eager_off = int((eager != wide).count_nonzero())
    return int((out != wide).count_nonzero()) <= WIDE_MULTIPLIER * eager_off + slack


def _rounded_from_floats(
    region: CanonicalRegion, inputs: Sequence[torch.Tensor], device: torch.device
) -> set[int]:
    """Positions of the region's integer or boolean outputs that depend on a floating value
    computed or read in the region: an op with a floating tensor argument and an integer
    result (a cast, a comparison), or anything computed from such a result. Found by
    running the region's ops in eager once and reading each result's dtype."""
    module = region.materialize(device)
    calls = [n for n in module.graph.nodes if n.op == "call_function"]
    if len(calls) != len(region.nodes):
        return set()
    floats: dict[str, bool] = {}  # each result's kind only: its value is freed as eager's

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            floats[n.name] = isinstance(value, torch.Tensor) and value.is_floating_point()
            return value

    try:
        with torch.no_grad():
            _Recorder(module).run(*inputs)
    except Exception:  # eager ran it above; if it cannot here, nothing is excused
        return set()
    floating: dict[Ref, bool] = {Ref("in", i): t.is_floating_point() for i, t in enumerate(inputs)}
    from_floats: set[Ref] = set()
    for j, (node, call) in enumerate(zip(region.nodes, calls, strict=True)):
        here = Ref("node", j)
        floating[here] = floats.get(call.name, False)
        refs = node.refs()
        if any(r in from_floats for r in refs) or (
            not floating[here] and any(floating.get(r, False) for r in refs)
        ):
            from_floats.add(here)
    return {i for i, ref in enumerate(region.outputs) if ref in from_floats}


def _widened(
    region: CanonicalRegion, inputs: Sequence[torch.Tensor], device: torch.device
) -> list[torch.Tensor] | None:
    """Eager's outputs of the region computed one precision up: in float32 where it
    computes in a 16-bit float, else in float64 where it computes in float32 (None if it
    has no such dtype, or that fails). The reference a region is judged against when it is
    off eager's by more than the tolerance: a layer's backward in bfloat16, where a fused
    kernel keeps float32 inside and eager rounds after every op, is several percent apart
    on some outputs, and which is nearer the truth is what counts. Ops without a kernel in
    the wider type (fused attention) run in the narrower one, their results widened."""
    text = region.text
    steps = [(torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
    if not any(_tag(low) in text for low, _ in steps):
        steps = [(torch.float32, torch.float64)]
    used = [(low, wide) for low, wide in steps if _tag(low) in text]
    if not used:
        return None
    for low, wide in used:
        text = text.replace(_tag(low), _tag(wide))
    widen = {low: wide for low, wide in used}
    moved = [relaid(t.to(widen[t.dtype]), t.stride()) if t.dtype in widen else t for t in inputs]
    try:
        with torch.no_grad():
            return list(_Widened(parse(text).materialize(device), used[0]).run(*moved))
    except Exception:
        return None


def _tag(dtype: torch.dtype) -> bytes:
    """How canonical text names a dtype."""
    return f'"{str(dtype).removeprefix("torch.")}"'.encode()


class _Widened(torch.fx.Interpreter):
    """Runs a widened region; an op that refuses the wider type runs in the narrower one
    (`step`: (narrower, wider)), its results widened."""

    def __init__(self, module: torch.fx.GraphModule, step: tuple[torch.dtype, torch.dtype]) -> None:
        super().__init__(module)
        self.low, self.wide = step

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            return super().run_node(n)
        except Exception:
            if n.op != "call_function":
                raise
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            narrow = functools.partial(_cast, self.wide, self.low)
            result = n.target(*map_aggregate(args, narrow), **map_aggregate(kwargs, narrow))  # type: ignore[operator]
            return map_aggregate(result, functools.partial(_cast, self.low, self.wide))


def _cast(source: torch.dtype, target: torch.dtype, value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == source:
        return value.to(target)
    return value


def _same(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same strides (clone() would make expanded inputs dense)."""
    return relaid(tensor, tensor.stride())


def restrided(fn: CompiledRegion, restride: Restride) -> CompiledRegion:
    """`fn` with the named outputs copied into their recorded strides after each call."""
    if not restride:
        return fn

    def relaid_outputs(call: CompiledRegion) -> CompiledRegion:
        def run(inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
            outputs = list(call(inputs))
            for index, stride in restride:
                outputs[index] = relaid(outputs[index], stride)
            return outputs

        return run

    run = relaid_outputs(fn)
    if (lean := unchecked(fn)) is not fn:
        run.unchecked = relaid_outputs(lean)  # type: ignore[attr-defined]
    return run


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides wherever the extent is above 1 (strides of size-1 dims are free)."""
    return a.shape == b.shape and all(
        x == y for x, y, n in zip(a.stride(), b.stride(), b.shape, strict=True) if n > 1
    )


def _compare(out: object, ref: torch.Tensor, floor: float = 0.0) -> str:
    """What is wrong with `out` against eager's `ref` ("" if nothing); `floor`: the least
    relative error allowed (from the inputs' dtypes)."""
    if not isinstance(out, torch.Tensor):
        return f"a {type(out).__name__}, not a tensor"
    if (out.dtype, out.shape, out.device.type) != (ref.dtype, ref.shape, ref.device.type):
        return (
            f"{out.dtype} {tuple(out.shape)} on {out.device.type}, eager gives "
            f"{ref.dtype} {tuple(ref.shape)} on {ref.device.type}"
        )
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        return "" if torch.equal(out, ref) else _differing(out, ref)
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)) or (
        not finite.all() and not _same_specials(out[~finite], ref[~finite])
    ):
        return "NaN or infinity where eager has none, or the other way round"
    if not finite.any():
        return ""
    relative = _relative_error(out, ref)
    tolerance = max(TOLERANCE.get(ref.dtype, 1e-4), floor)
    if relative > tolerance:
        return f"{_TOO_FAR} {relative:.2e} exceeds {tolerance:.0e}"
    return ""


def _nearer(out: torch.Tensor, eager: torch.Tensor, wide: torch.Tensor) -> bool:
    """Whether `out` is about as near the wider reference as eager's own output is (a
    wrong kernel is off by O(1); one that rounds less is nearer than eager)."""
    if not isinstance(wide, torch.Tensor) or wide.shape != eager.shape:
        return False
    tolerance = TOLERANCE.get(eager.dtype, 1e-4)
    return _relative_error(out, wide) <= WIDE_MULTIPLIER * _relative_error(eager, wide) + (
        tolerance / 10
    )


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The norm of the difference over the norm of `ref`, over their finite values, summed
    in double precision a `CHUNK` of elements at a time: whole, the double copies and
    masks of a logits-sized output took 38 times its bytes (2.4 GiB for a 62 MiB bfloat16
    one on a CPU), the first step's peak on a GPU."""
    wide = torch.complex128 if ref.is_complex() else torch.float64
    a_all, b_all = out.reshape(-1), ref.reshape(-1)
    error = norm = 0.0
    count = 0
    for start in range(0, a_all.numel(), CHUNK):
        a, b = a_all[start : start + CHUNK].to(wide), b_all[start : start + CHUNK].to(wide)
        finite = torch.isfinite(a) & torch.isfinite(b)
        error += float(torch.where(finite, a - b, 0).abs().square().sum())
        norm += float(torch.where(finite, b, 0).abs().square().sum())
        count += int(finite.sum())
    if not count:
        return 0.0
    return math.sqrt(error) / max(math.sqrt(norm), math.sqrt(count) * 1e-6)


def _same_specials(a: torch.Tensor, b: torch.Tensor) -> bool:
    """NaN where the other has NaN, the same infinity where it has one."""
    nan = b.isnan()
    return torch.equal(a.isnan(), nan) and torch.equal(a[~nan], b[~nan])


class Budget:
    """Bytes in flight per device, up to `total` each: `hold(device, size)` waits until
    `size` more fit (a size above `total` waits for all, then runs alone). Thread-safe."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._used: dict[str, int] = {}
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, device: str, size: int) -> Iterator[None]:
        size = min(size, self.total)
        with self._changed:
            self._changed.wait_for(lambda: self._used.get(device, 0) + size <= self.total)
            self._used[device] = self._used.get(device, 0) + size
        try:
            yield
        finally:
            with self._changed:
                self._used[device] -= size
                self._changed.notify_all()


_IN_FLIGHT = Budget(MAX_BYTES)


def _bytes(region: CanonicalRegion) -> int:
    # Inputs, and about as much again for eager's outputs and the compiled ones.
    size = sum(math.prod(s.shape) * s.dtype.itemsize for s in region.inputs)
    return 3 * size
