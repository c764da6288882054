"""The layout contract and validation before storing (issue #13).

A region's outputs reach the rest of the graph with eager's sizes, strides and dtypes:
checked for Inductor on a region with transposed, sliced, expanded and channels-last
outputs; and, through the engine, with executors that break the contract on purpose (one
lays every output out contiguously, which is how a region's output broke a later `view` in
Hugging Face Llama; one computes wrong values, which must never be stored or run).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
import torch

import fcache
from fcache import process
from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.engine.compile.validate import Budget, relaid, restrided, same_layout, validate
from fcache.executors import registry
from fcache.executors.eager import eager_module
from fcache.frontend.canonicalize import CanonicalRegion, parse
from tests.graphs import capture_regions
from tests.text_executor import TextExecutor

CPU = torch.device("cpu")


def _layouts(x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = x.sin()
    b = a.t() * 2  # transposed: eager keeps the input's layout
    s = a[:, 1:]  # sliced, and read again below: a region output that is a view
    e = a[:, :1].expand(8, 5)  # expanded: stride 0
    c = s.cos() + e
    img_out = img.relu() * 3  # channels-last in, channels-last out
    return b, s, e, c, img_out


@functools.cache
def _region() -> CanonicalRegion:
    x = torch.randn(8, 6)
    img = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    (region,) = capture_regions(lambda f: f(x, img), _layouts)
    return region


def test_the_region_has_every_kind_of_output_layout() -> None:
    outs = eager_module(_region(), CPU)(*[s.empty(CPU) for s in _region().inputs])
    strides = [o.stride() for o in outs]
    assert any(s[0] < s[-1] for s in strides)  # transposed
    assert any(0 in s for s in strides)  # expanded
    assert any(not o.is_contiguous() and 0 not in o.stride() for o in outs)  # sliced too
    assert any(o.dim() == 4 and o.is_contiguous(memory_format=torch.channels_last) for o in outs)


@pytest.mark.parametrize("name", ["inductor", "eager"])
def test_an_executor_s_outputs_reach_the_graph_in_eager_s_layout(name: str) -> None:
    executor = registry.create(name)
    region = _region()
    fn = executor.load(executor.compile(region, CPU), CPU)
    verdict = validate(region, fn, CPU)
    assert verdict.ok and verdict.checked, verdict.reason
    inputs = [t.clone() for t in _inputs(region)]
    expected = eager_module(region, CPU)(*[t.clone() for t in inputs])
    got = restrided(fn, verdict.restride)(list(inputs))
    for out, ref in zip(got, expected, strict=True):
        assert same_layout(out, ref), (out.stride(), ref.stride())
        torch.testing.assert_close(out, ref)


def test_relaid_copies_into_any_strides_expanded_ones_included() -> None:
    x = torch.randn(3, 1).expand(3, 4)
    y = relaid(x.contiguous(), x.stride())
    assert y.stride() == x.stride() and torch.equal(y, x)
    t = torch.randn(5, 4).t()
    assert relaid(t.contiguous(), t.stride()).stride() == t.stride()


def test_validation_names_wrong_values_and_a_wrong_number_of_outputs() -> None:
    region = _region()
    eager = registry.create("eager").load(registry.create("eager").compile(region, CPU), CPU)
    off = validate(region, lambda xs: [o + 1 for o in eager(xs)], CPU)
    assert not off.ok and "relative error" in off.reason
    short = validate(region, lambda xs: list(eager(xs))[:-1], CPU)
    assert not short.ok and "outputs" in short.reason
    nan = validate(region, lambda xs: [o * float("nan") for o in eager(xs)], CPU)
    assert not nan.ok and "NaN" in nan.reason


# --- through the engine, with executors that break the contract ---------------------------


class _Broken(TextExecutor):
    """The text executor (tests/text_executor.py), its outputs spoiled by `spoil` (a layout
    change or wrong values)."""

    def __init__(self, name: str, spoil: object) -> None:
        self.name, self._spoil = name, spoil

    def load(self, artifact: Artifact, device: torch.device):  # type: ignore[no-untyped-def]
        run = super().load(artifact, device)
        return lambda inputs: [self._spoil(o) for o in run(inputs)]  # type: ignore[operator]


def _register() -> None:
    registry.register("contiguous", lambda: _Broken("contiguous", lambda o: o.contiguous()))
    registry.register("wrong", lambda: _Broken("wrong", lambda o: o + 1))


@pytest.fixture(autouse=True)
def _fresh_process() -> None:
    torch._dynamo.reset()
    process.reset()
    _register()
    yield
    process.reset()


def _transposed_then_viewed(x: torch.Tensor) -> torch.Tensor:
    b = x.sin().t() * 2  # the region's output: strides (1, 6) in eager
    flat = b.t().reshape(1, -1)  # a view only eager's layout allows, as in HF Llama
    return flat @ torch.ones(48, 3)  # opaque: the view stays outside the region


def _settings(tmp_path: Path, executors: str) -> fcache.Settings:
    return fcache.Settings(
        cache_dir=tmp_path, progress=False, executors=tuple(executors.split(","))
    )


def test_a_region_laid_out_otherwise_is_restrided_cold_and_warm(tmp_path: Path) -> None:
    x = torch.randn(8, 6)
    expected = _transposed_then_viewed(x)
    cold = fcache.jit(_transposed_then_viewed, settings=_settings(tmp_path, "contiguous,eager"))
    torch.testing.assert_close(cold(x), expected)
    stats = fcache.stats(cold)
    assert stats.restrided_outputs >= 1 and stats.compiles >= 1 and stats.fallbacks == 0

    process.reset()  # a new session: the artifact comes from LMDB, with its restride list
    _register()
    torch._dynamo.reset()
    warm = fcache.jit(_transposed_then_viewed, settings=_settings(tmp_path, "contiguous,eager"))
    torch.testing.assert_close(warm(x), expected)
    assert fcache.stats(warm).compiles == 0 and fcache.stats(warm).restrided_outputs >= 1


def test_a_region_with_wrong_values_is_not_stored_and_runs_in_eager(tmp_path: Path) -> None:
    x = torch.randn(8, 6)
    compiled = fcache.jit(_transposed_then_viewed, settings=_settings(tmp_path, "wrong,eager"))
    torch.testing.assert_close(compiled(x), _transposed_then_viewed(x))
    stats = fcache.stats(compiled)
    assert stats.validation_failures == {"wrong": stats.fallbacks} and stats.fallbacks >= 1
    assert stats.fallback_reasons == {"validation-failed": stats.fallbacks}
    assert stats.executors == {"eager": stats.fallbacks}
    session_stats = process.peek(("session", _settings(tmp_path, "wrong,eager"))).stats
    assert session_stats.tier("executor:wrong").invalid == stats.fallbacks
    assert session_stats.tier("fallback:validation-failed").fallbacks == stats.fallbacks
    process.reset()
    store = LmdbStore(tmp_path, 1 << 30)
    stored = [decode(store.get(e.key)) for e in store.entries()]  # type: ignore[arg-type]
    store.close()
    # Nothing unverified was stored: regions only as refusals, which hold no code.
    refusals = [a for a in stored if a.refused]
    assert refusals and all(a.refused == "validation-failed" for a in refusals)
    assert not [a for a in stored if a.executor == "wrong" and not a.refused]

    _register()  # a new session: the refusal sends the region to eager, nothing compiles
    torch._dynamo.reset()
    warm = fcache.jit(_transposed_then_viewed, settings=_settings(tmp_path, "wrong,eager"))
    torch.testing.assert_close(warm(x), _transposed_then_viewed(x))
    again = fcache.stats(warm)
    assert again.compiles == 0 and again.validation_failures == {}
    assert again.fallback_reasons == {"validation-failed": again.fallbacks} and again.fallbacks


class _Declining(_Broken):
    """Supports no region, as nvFuser declines ops it has no translation for."""

    def __init__(self) -> None:
        super().__init__("declining", lambda o: o)

    def supports(self, region: CanonicalRegion, target: object) -> bool:
        return False


def test_a_failure_is_reported_as_such_although_a_later_executor_declines(
    tmp_path: Path,
) -> None:
    # Inductor's failure must not be reported as the next executor's "unsupported" (GPU:
    # inductor, then nvFuser, which declines most regions, then eager).
    registry.register("declining", _Declining)
    x = torch.randn(8, 6)
    settings = _settings(tmp_path, "wrong,declining,eager")
    compiled = fcache.jit(_transposed_then_viewed, settings=settings)
    torch.testing.assert_close(compiled(x), _transposed_then_viewed(x))
    stats = fcache.stats(compiled)
    assert stats.fallbacks >= 1
    assert stats.fallback_reasons == {"validation-failed": stats.fallbacks}


def _inputs(region: CanonicalRegion) -> list[torch.Tensor]:
    from fcache.engine.compile.validate import inputs_for

    return inputs_for(region, CPU, seed=3)


class _Failing(_Broken):
    """Its compile always raises, and it counts how often it was asked."""

    def __init__(self) -> None:
        super().__init__("failing", lambda o: o)
        self.calls = 0

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        self.calls += 1
        raise RuntimeError("this compiler always fails")


def test_a_failed_compile_is_not_tried_again_in_the_process(tmp_path: Path) -> None:
    failing = _Failing()
    registry.register("failing", lambda: failing)
    settings = _settings(tmp_path, "failing,eager")
    x = torch.randn(8, 6)
    first = fcache.jit(_transposed_then_viewed, settings=settings)
    torch.testing.assert_close(first(x), _transposed_then_viewed(x))
    calls = failing.calls
    assert calls >= 1
    assert fcache.stats(first).fallback_reasons == {"compile-failed": fcache.stats(first).fallbacks}
    torch._dynamo.reset()
    again = fcache.jit(_transposed_then_viewed, settings=settings)  # a second model, same region
    torch.testing.assert_close(again(x), _transposed_then_viewed(x))
    assert failing.calls == calls  # remembered: not compiled (and failed) again
    assert fcache.stats(again).fallback_reasons == {"compile-failed": fcache.stats(again).fallbacks}
    process.reset()  # a new session: the refusal in LMDB remembers it
    registry.register("failing", lambda: failing)
    torch._dynamo.reset()
    later = fcache.jit(_transposed_then_viewed, settings=settings)
    torch.testing.assert_close(later(x), _transposed_then_viewed(x))
    assert failing.calls == calls
    assert fcache.stats(later).compiles == 0


def _widened(x: torch.Tensor) -> torch.Tensor:
    # A float32 output from the region's input: exact in float32, rounded like eager's
    # bfloat16 arithmetic when the input is bfloat16.
    return x.float().exp()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tolerance_is_the_loosest_of_the_outputs_and_inputs_dtypes(
    dtype: torch.dtype,
) -> None:
    (region,) = capture_regions(lambda f: f(torch.randn(64, 64, dtype=dtype)), _widened)
    exact = eager_module(region, CPU)

    def off_by_one_percent(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [out * 1.01 for out in exact(*inputs)]

    verdict = validate(region, off_by_one_percent, CPU)
    # 1% is a bfloat16 rounding error (eps 2^-8 per op), a bug in float32.
    assert verdict.ok == (dtype == torch.bfloat16), verdict.reason
    assert verdict.checked


class _OutOfMemory(_Failing):
    """Its compile always runs out of GPU memory: a passing condition, not the region's."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "oom"

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        self.calls += 1
        raise torch.OutOfMemoryError("CUDA out of memory (as a busy GPU says it)")


def test_running_out_of_memory_leaves_no_refusal(tmp_path: Path) -> None:
    oom = _OutOfMemory()
    registry.register("oom", lambda: oom)
    x = torch.randn(8, 6)
    model = fcache.jit(_transposed_then_viewed, settings=_settings(tmp_path, "oom,eager"))
    torch.testing.assert_close(model(x), _transposed_then_viewed(x))
    assert oom.calls >= 1 and fcache.stats(model).fallbacks >= 1
    process.reset()
    store = LmdbStore(tmp_path, 1 << 30)
    stored = [decode(store.get(e.key)) for e in store.entries()]  # type: ignore[arg-type]
    store.close()
    assert not [a for a in stored if a.refused]  # the next process tries the region again


def _offset(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # In bfloat16, adding 200 keeps one bit after the point: eager, rounding after every
    # op, is about 11% off the float32 result; a kernel computing in float32 inside is not.
    return (torch.tanh(x * w) * 3 + 200 - 200) * w


class _WiderInside(TextExecutor):
    """Computes a region one precision up and rounds its outputs once, as Inductor's fused
    kernels keep float32 inside a bfloat16 region; `spoil` then changes the outputs (a
    wrong kernel)."""

    def __init__(
        self, name: str, spoil: object = None, low: str = "bfloat16", wide: str = "float32"
    ) -> None:
        self.name, self._spoil = name, spoil
        self._low, self._wide = getattr(torch, low), getattr(torch, wide)
        self._tags = (f'"{low}"'.encode(), f'"{wide}"'.encode())

    def load(self, artifact: Artifact, device: torch.device):  # type: ignore[no-untyped-def]
        wide = parse(artifact.payload.replace(*self._tags)).materialize(device)

        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            outs = wide(*[t.to(self._wide) if t.dtype == self._low else t for t in inputs])
            outs = [o.to(self._low) if o.dtype == self._wide else o for o in outs]
            return [self._spoil(o) for o in outs] if self._spoil else outs  # type: ignore[operator]

        return run


@pytest.mark.parametrize(("spoil", "accepted"), [(None, True), (lambda o: o * 1.5, False)])
def test_a_bfloat16_region_nearer_float32_than_eager_is_accepted(
    tmp_path: Path, spoil: object, accepted: bool
) -> None:
    registry.register("float32inside", lambda: _WiderInside("float32inside", spoil))
    torch.manual_seed(0)
    x, w = torch.randn(64, 256).bfloat16(), torch.randn(256).bfloat16()
    expected = _offset(x, w)
    compiled = fcache.jit(_offset, settings=_settings(tmp_path, "float32inside,eager"))
    got = compiled(x, w)
    stats = fcache.stats(compiled)
    if accepted:  # off eager by ~11%, but eager is that far from float32, not the kernel
        assert stats.fallbacks == 0 and stats.executors == {"float32inside": 1}
        assert ((got.double() - expected.double()).norm() / expected.double().norm()) > 0.05
    else:  # a wrong kernel is no nearer float32 than eager: refused as before
        assert stats.fallback_reasons == {"validation-failed": 1}
        torch.testing.assert_close(got, expected)


def _masked(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # As _offset, and the mask a ReLU's backward keeps: in bfloat16 eager rounds the small
    # positive values to 0 (about 7% of them here), so its mask is far off float32's.
    offset = torch.tanh(x * w) * 3 + 200 - 200
    return offset * w, offset <= 0


@pytest.mark.parametrize(
    ("spoil", "accepted"), [(None, True), (lambda o: ~o if o.dtype == torch.bool else o, False)]
)
def test_a_bfloat16_mask_nearer_float32_than_eager_is_accepted(
    tmp_path: Path, spoil: object, accepted: bool
) -> None:
    """A comparison of floats near its threshold (a ReLU's mask in a bfloat16 layer: 1.2%
    of T5's on the H200) flips where eager's rounding moved the value; a kernel nearer
    float32 than eager passes, a flipped mask does not."""
    registry.register("float32inside", lambda: _WiderInside("float32inside", spoil))
    torch.manual_seed(0)
    x, w = torch.randn(64, 256).bfloat16(), torch.randn(256).bfloat16()
    _, eager_mask = _masked(x, w)
    _, exact_mask = _masked(x.float(), w.float())
    assert (eager_mask != exact_mask).float().mean() > 0.02  # far more than 1% flipped
    compiled = fcache.jit(_masked, settings=_settings(tmp_path, "float32inside,eager"))
    _, mask = compiled(x, w)
    stats = fcache.stats(compiled)
    if accepted:
        assert stats.fallbacks == 0 and stats.executors == {"float32inside": 1}
        assert torch.equal(mask, exact_mask)
    else:
        assert stats.fallback_reasons == {"validation-failed": 1}
        assert torch.equal(mask, eager_mask)


def _offset32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # The same in float32 around 1e8 (a step of 8 between neighbours): eager is far off the
    # float64 result; a kernel keeping float64 inside is not.
    return (x * 1000 + 1e8 - 1e8) * w


def test_a_float32_region_nearer_float64_than_eager_is_accepted(tmp_path: Path) -> None:
    registry.register(
        "float64inside", lambda: _WiderInside("float64inside", low="float32", wide="float64")
    )
    torch.manual_seed(0)
    x, w = torch.randn(64, 256), torch.randn(256)
    compiled = fcache.jit(_offset32, settings=_settings(tmp_path, "float64inside,eager"))
    got = compiled(x, w)
    stats = fcache.stats(compiled)
    assert stats.fallbacks == 0 and stats.executors == {"float64inside": 1}
    exact = _offset32(x.double(), w.double())
    assert (got.double() - exact).norm() < (_offset32(x, w).double() - exact).norm()


def _seeded_region() -> CanonicalRegion:
    """native_dropout (an op that draws random numbers) and a comparison, both returning
    booleans: in0 -> (dropout's values, dropout's mask, in0 > 0)."""
    from fcache.frontend.canonicalize import CanonicalNode, Ref, TensorSpec

    nodes = (
        CanonicalNode("aten.native_dropout.default", (Ref("in", 0), 0.0, True), {}),
        CanonicalNode("getitem", (Ref("node", 0), 0), {}),
        CanonicalNode("getitem", (Ref("node", 0), 1), {}),
        CanonicalNode("aten.gt.Scalar", (Ref("in", 0), 0.0), {}),
    )
    spec = TensorSpec(torch.float32, (4, 4), (4, 1), "cpu")
    outputs = (Ref("node", 1), Ref("node", 2), Ref("node", 3))
    return CanonicalRegion((spec,), nodes, outputs, b"seeded")


def test_a_random_op_s_integer_outputs_are_compared_by_dtype_and_shape_only() -> None:
    """Fused attention returns its generator's seed and offset, which eager's run and the
    kernel's read at different moments; a comparison's booleans are compared exactly."""
    region = _seeded_region()
    eager = eager_module(region, CPU)

    def flipped(position: int):  # type: ignore[no-untyped-def]
        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            outs = list(eager(*inputs))
            outs[position] = ~outs[position]
            return outs

        return run

    assert validate(region, flipped(1), CPU).ok
    wrong = validate(region, flipped(2), CPU)
    assert not wrong.ok
    assert wrong.reason == "output 2: values differ at 16 of 16 elements, by up to 1"
    reshaped = validate(
        region,
        lambda xs: [*list(eager(*xs))[:1], torch.ones(3, dtype=torch.bool), list(eager(*xs))[2]],
        CPU,
    )
    assert not reshaped.ok and "output 1" in reshaped.reason


def _buckets(x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As T5's relative-position buckets: a log of floats truncated to integers; and an
    integer computed from integers only."""
    rounded = (torch.log(x.float().abs() + 1) * 4).to(torch.long)
    return rounded + 1, positions * 3 + 1


def _nudged(eager: torch.fx.GraphModule, output: int, count: int):  # type: ignore[no-untyped-def]
    """`eager`'s outputs with `count` elements of output `output` one step up."""

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outs = [o.clone() for o in eager(*inputs)]
        outs[output].view(-1)[:count] += 1
        return outs

    return run


def test_an_integer_rounded_from_floats_may_be_one_step_off_at_a_few_places() -> None:
    """A float sitting on a rounding boundary (T5's buckets on the H200: Inductor's log is
    not eager's to the last bit) lands one step off; a wrong kernel misses by more, in
    more places, or on integers that no float ever touched."""
    x, positions = torch.randn(64, 64), torch.arange(4096).reshape(64, 64)
    (region,) = capture_regions(lambda f: f(x, positions), _buckets)
    eager = eager_module(region, CPU)
    assert validate(region, _nudged(eager, 0, 20), CPU).ok  # 20 of 4096 elements
    too_many = validate(region, _nudged(eager, 0, 200), CPU)
    assert not too_many.ok
    assert too_many.reason == "output 0: values differ at 200 of 4096 elements, by up to 1"
    exact = validate(region, _nudged(eager, 1, 1), CPU)
    assert not exact.ok and exact.reason == (
        "output 1: values differ at 1 of 4096 elements, by up to 1, computed from integers only"
    )

    def two_steps(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        outs = [o.clone() for o in eager(*inputs)]
        outs[0].view(-1)[0] += 2
        return outs

    assert not validate(region, two_steps, CPU).ok


def test_validations_of_a_device_overlap_only_within_the_byte_budget() -> None:
    """A cold start validates on many threads at once; together they may hold at most the
    budget per device, and a region above it runs alone."""
    budget = Budget(100)
    done: list[tuple[str, int]] = []

    def take(device: str, size: int) -> threading.Thread:
        def hold() -> None:
            with budget.hold(device, size):
                done.append((device, size))

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        return thread

    with budget.hold("cuda:0", 60):
        for fits in (take("cpu", 60), take("cuda:0", 40)):  # another device; what is left
            fits.join(10)
            assert not fits.is_alive()
        over, alone = take("cuda:0", 41), take("cuda:0", 10**12)
        over.join(0.3)
        alone.join(0.3)
        assert over.is_alive() and alone.is_alive()  # waiting for the 60 to go back
    over.join(10)
    alone.join(10)
    assert done[:2] == [("cpu", 60), ("cuda:0", 40)]
    assert sorted(done[2:]) == [("cuda:0", 41), ("cuda:0", 10**12)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.complex64])
def test_the_relative_error_is_summed_in_chunks_as_over_the_whole(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Chunked (a logits-sized output's double copies took 38x its bytes), the same number
    as over the whole tensor, non-finite elements left out, across chunk edges."""
    from fcache.engine.compile import validate as module

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(6, 50, generator=gen).to(dtype)
    out = (ref.to(torch.complex128 if dtype.is_complex else torch.float64) * 1.01).to(dtype)
    out = out.t().contiguous().t()  # another layout than ref's
    out[2, 3] = ref[2, 3] = float("inf")
    out[4, 7] = float("nan")
    wide = torch.complex128 if dtype.is_complex else torch.float64
    a, b = out.to(wide), ref.to(wide)
    finite = a.isfinite() & b.isfinite()
    whole = ((a[finite] - b[finite]).norm() / b[finite].norm()).item()
    monkeypatch.setattr(module, "CHUNK", 7)
    assert module._relative_error(out, ref) == pytest.approx(whole, rel=1e-9)
