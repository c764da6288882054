"""fcache.jit's contract beyond the happy path: fallbacks, graph breaks, the registered
backend, bad settings and an unusable cache directory. Regions run in eager here (they
are cheap); the tests in tests/e2e compile with Inductor."""

from __future__ import annotations

import os
import stat
import sys
import warnings
from pathlib import Path

import pytest
import torch

import fcache
from fcache.errors import ConfigError
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target
from tests import fresh
from tests.text_executor import TextExecutor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _settings(tmp_path: Path, **kw: object) -> fcache.Settings:
    return fcache.Settings(cache_dir=tmp_path / "cache", progress=False, **kw)  # type: ignore[arg-type]


class _NoComplex(TextExecutor):
    """A compiler with a gap: no region with a complex input (Inductor had this one)."""

    name = "nocomplex"

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        return not any(spec.dtype.is_complex for spec in region.inputs)


def test_a_region_no_compiler_supports_runs_in_eager_and_is_counted(tmp_path: Path) -> None:
    def rotate(x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x)
        return torch.view_as_real(z * z + 1j)

    registry.register("nocomplex", _NoComplex)
    x = torch.randn(4, 3, 2)
    compiled = fcache.jit(rotate, settings=_settings(tmp_path, executors=("nocomplex", "eager")))
    torch.testing.assert_close(compiled(x), rotate(x))
    stats = fcache.stats(compiled)
    assert stats.fallbacks >= 1
    assert stats.fallback_reasons == {"unsupported": stats.fallbacks}
    assert stats.executors.get("eager", 0) >= 1
    assert stats.compiles == 0


def test_graph_breaks_compile_every_graph(tmp_path: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        return torch.sigmoid(y) + 1

    x = torch.randn(8, requires_grad=True)
    compiled = fcache.jit(f, settings=_settings(tmp_path, executors=("eager",)))
    out = compiled(x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    f(x).sum().backward()
    torch.testing.assert_close(out, f(x))
    torch.testing.assert_close(grad, x.grad)
    stats = fcache.stats(compiled)
    assert stats.graphs == 4  # two captured graphs, each a forward and a backward
    assert stats.regions >= 2


def test_stats_of_something_not_compiled_by_fcache_is_a_clear_error() -> None:
    with pytest.raises(fcache.FcacheError, match=r"not compiled by fcache\.jit"):
        fcache.stats(torch.nn.Linear(2, 2))


def test_a_bad_setting_fails_at_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FCACHE_COMPILE_WORKERS", "zero")
    with pytest.raises(ConfigError, match="FCACHE_COMPILE_WORKERS='zero'"):
        fcache.jit(torch.nn.Linear(2, 2))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_cache_dir_costs_one_warning_and_caching_goes_on_in_memory(
    tmp_path: Path,
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = fcache.jit(torch.tanh, settings=fcache.Settings(cache_dir=locked / "c"))
        torch.testing.assert_close(compiled(torch.ones(3)), torch.tanh(torch.ones(3)))
    messages = [str(w.message) for w in caught if "cache directory" in str(w.message)]
    assert len(messages) == 1, messages


def test_an_unusable_cache_path_costs_one_warning(tmp_path: Path) -> None:
    from tests.text_executor import register

    register()  # an executor whose artifacts are stored, as a compiler's are
    # A regular file where the directory should be: unusable even for root.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    settings = fcache.Settings(cache_dir=blocker / "c", progress=False, executors=("text",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = fcache.jit(torch.tanh, settings=settings)
        torch.testing.assert_close(compiled(torch.ones(3)), torch.tanh(torch.ones(3)))
    messages = [str(w.message) for w in caught if "cache directory" in str(w.message)]
    assert len(messages) == 1, messages


def test_torch_compile_finds_the_fcache_backend_by_name(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend='fcache')\n"
        "x = torch.randn(5)\n"
        "torch.testing.assert_close(f(x), torch.sin(x) * 2 + 1)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "FCACHE_DIR": str(tmp_path), "FCACHE_EXECUTORS": "eager",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    out = fresh.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
