"""The executor registry: built-in names, a new executor in one class plus one
`register` call (the README's example, tests/text_executor.py), and the order executors
are tried in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fcache
from fcache import process
from fcache.errors import ConfigError
from fcache.executors import registry
from tests.text_executor import register


@pytest.fixture(autouse=True)
def _fresh_process() -> None:
    torch._dynamo.reset()
    process.reset()  # registrations and executors are process state
    yield
    process.reset()


def test_built_in_names_and_the_default_order_on_cpu() -> None:
    assert registry.names()[:3] == ("nvfuser", "inductor", "eager")
    assert [e.name for e in registry.resolve(None, "cpu")] == ["inductor", "eager"]
    assert registry.create("eager") is registry.create("eager")


def test_eager_always_closes_the_list() -> None:
    assert [e.name for e in registry.resolve(["inductor"], "cpu")] == ["inductor", "eager"]
    assert [e.name for e in registry.resolve(["eager", "inductor"], "cpu")] == ["inductor", "eager"]


def test_unknown_names_are_config_errors_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="FCACHE_EXECUTORS"):
        fcache.Settings.from_env({"FCACHE_EXECUTORS": "text,eager"})
    with pytest.raises(ConfigError, match="lowercase identifier"):
        registry.register("Not A Name", lambda: registry.create("eager"))


def test_a_registered_executor_compiles_caches_and_is_hit_by_a_new_session(tmp_path: Path) -> None:
    register()
    settings = fcache.Settings.from_env(
        {"FCACHE_EXECUTORS": "text,eager", "FCACHE_DIR": str(tmp_path)}
    ).replace(progress=False)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).relu() + x

    x = torch.randn(8, 4)
    first = fcache.jit(f, settings=settings)
    torch.testing.assert_close(first(x), f(x))
    cold = fcache.stats(first)
    assert cold.executors == {"text": 1} and cold.compiles == 1

    process.reset()  # a new session: nothing in memory, the LMDB tier has the region
    register()
    torch._dynamo.reset()
    second = fcache.jit(f, settings=settings)
    torch.testing.assert_close(second(x), f(x))
    warm = fcache.stats(second)
    assert warm.compiles == 0 and warm.hits == {"local": 1}
