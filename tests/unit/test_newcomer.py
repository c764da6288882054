"""What a new user meets first: `fcache.jit(3)` is a TypeError from fcache before anything
touches the disk, and `print(fcache.stats(model))` reads like `ccache -s`: labelled,
rounded, no dataclass repr."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fcache
from fcache.stats import ModelStats


@pytest.mark.parametrize("model", [3, "model.pt", None])
def test_jit_of_a_non_callable_is_a_type_error_before_any_directory(
    model: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FCACHE_DIR", str(cache))
    with pytest.raises(TypeError, match=r"fcache\.jit compiles an nn\.Module or a function"):
        fcache.jit(model)
    with pytest.raises(TypeError):
        fcache.jit(model, settings=fcache.Settings(cache_dir=cache))
    assert not cache.exists()


def test_printed_stats_read_like_a_report(tmp_path: Path) -> None:
    torch._dynamo.reset()
    settings = fcache.Settings(cache_dir=tmp_path / "c", progress=False, executors=("eager",))

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin() + x.cos()

    compiled = fcache.jit(f, settings=settings)
    compiled(torch.randn(8))
    text = str(fcache.stats(compiled))
    assert "ModelStats(" not in text
    lines = dict(line.split(":", 1) for line in text.splitlines())
    assert lines["Graphs captured"].strip() == "1"
    assert lines["Regions"].strip().endswith("unique)")
    assert "Time in fcache" in lines and lines["Time in fcache"].strip().endswith(" s")


def test_printed_stats_round_and_label_every_number() -> None:
    stats = ModelStats(
        graphs=2,
        regions=40,
        unique_regions=12,
        compiles=10,
        compile_seconds=65.3149,
        load_seconds=0.01234,
        graph_seconds=66.0871,
        fallbacks=3,
        fallback_reasons={"compile-failed": 3},
        hits={"local": 2},
        misses={"memory": 12, "local": 10, "remote": 10},
        executors={"inductor": 10, "eager": 2},
    )
    assert str(stats).splitlines() == [
        "Graphs captured:            2",
        "Regions:                    40 (12 unique)",
        "  compiled:                 10 / 12 (83%) in 65.3 s",
        "  loaded from a cache:      2 / 12 (17%) in 0.01 s",
        "  found in memory:          0 / 12 (0%)",
        "Run in eager:               3 regions (3 compile-failed)",
        "Look-ups, memory:           0 hits, 12 misses",
        "Look-ups, local:            2 hits, 10 misses",
        "Look-ups, remote:           0 hits, 10 misses",
        "Executors (unique regions): eager 2, inductor 10",
        "Time in fcache:             66.1 s",
    ]
