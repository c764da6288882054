"""The Inductor executor's defences: package members checked before torch's loader sees
them, loads unpacked in a private directory that goes away, and keys that change with
every Inductor option and code-changing TORCHINDUCTOR_*/TRITON_* variable."""

from __future__ import annotations

import gc
import io
import os
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fcache.cache.artifact import Artifact
from fcache.errors import CorruptArtifact
from fcache.executors import inductor
from fcache.executors.inductor import InductorExecutor, check_package, code_env
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.partition import partition
from fcache.target import Target
from tests import fresh
from tests.graphs import capture

MODEL = "pkg/data/aotinductor/model/"
CPU = torch.device("cpu")


def package(members: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


GOOD = {MODEL + "wrapper.so": b"\x7fELF not really", MODEL + "wrapper_metadata.json": b"{}"}


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temp dir loads unpack under, watched for leftovers."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base


BAD = {
    "zip-slip": {**GOOD, MODEL + "../../../../../../../../tmp/fcache-slipped": b"x"},
    "absolute": {**GOOD, "/tmp/fcache-absolute": b"x"},
    "backslash": {**GOOD, MODEL + "..\\..\\evil": b"x"},
    "no library": {MODEL + "wrapper.cpp": b"int main(){}", MODEL + "compile_flags.json": b"{}"},
    "empty component": {**GOOD, MODEL + "a//b": b"x"},
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_unsafe_packages_are_refused_before_loading(kind: str, private_tmp: Path) -> None:
    payload = package(BAD[kind])
    with pytest.raises(CorruptArtifact):
        check_package(payload)
    with pytest.raises(CorruptArtifact):
        InductorExecutor().load(Artifact("inductor", "aoti-1", payload), CPU)
    assert list(private_tmp.iterdir()) == []  # nothing unpacked, nothing left
    assert not Path("/tmp/fcache-slipped").exists()


def test_links_and_non_zips_are_refused() -> None:
    with pytest.raises(CorruptArtifact, match="link"):
        check_package(package(GOOD, links=(MODEL + "evil.so",)))
    with pytest.raises(CorruptArtifact, match="not a zip"):
        check_package(b"\x7fELF a bare library")


def test_a_failed_load_leaves_no_folder_behind(private_tmp: Path) -> None:
    with pytest.raises(CorruptArtifact, match="does not load"):
        InductorExecutor().load(Artifact("inductor", "aoti-1", package(GOOD)), CPU)
    assert list(private_tmp.iterdir()) == []


def test_folders_of_dead_processes_are_swept(private_tmp: Path) -> None:
    dead = private_tmp / "fcache-aoti-load-999999999-abc"  # no such pid
    (dead / "aotinductor_x").mkdir(parents=True)
    mine = private_tmp / f"fcache-aoti-load-{os.getpid()}-abc"
    mine.mkdir()
    compiling = private_tmp / "fcache-aoti-12345678"  # a compile's own (all digits, even)
    compiling.mkdir()
    with pytest.raises(CorruptArtifact):
        InductorExecutor().load(Artifact("inductor", "aoti-1", package(GOOD)), CPU)
    assert not dead.exists()
    assert mine.exists() and compiling.exists()


@pytest.fixture(scope="module")
def compiled() -> tuple[Artifact, object]:  # slow: only the test marked slow uses it
    """One real AOTInductor package (a few seconds of g++)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).relu()

    (gm,) = capture(f, torch.randn(8), backward=False)
    (region,) = partition(gm.graph).regions
    canon = canonicalize(region)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FCACHE_INDUCTOR_CPU", "aoti")  # CPU regions are Python artifacts by default
        return InductorExecutor().compile(canon, CPU), canon


@pytest.mark.slow
def test_a_real_package_loads_from_a_private_folder_removed_with_it(
    compiled: tuple[Artifact, object], private_tmp: Path
) -> None:
    artifact, _ = compiled
    # Compiling changed no option that keys hash (Inductor writes its platform metadata
    # into the config during a compile: a process's keys must not change with it).
    assert inductor.config_digest() == _fresh_process_digest()
    names = check_package(artifact.payload)
    assert any(n.endswith(".so") for n in names)
    run = InductorExecutor().load(artifact, CPU)
    (workdir,) = private_tmp.iterdir()
    assert workdir.name.startswith(f"fcache-aoti-load-{os.getpid()}-")
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    # What the loader extracted is there, the only folder in the temp dir (torch 2.13 keeps
    # it until the region is collected; 2.11's loader removes it once the library is loaded).
    assert all(p.name.startswith("aotinductor_") for p in workdir.iterdir())
    x = torch.randn(8)
    torch.testing.assert_close(run([x])[0], (x * 2 + 1).relu())
    del run
    gc.collect()
    assert list(private_tmp.iterdir()) == []
    assert os.environ.get("TMPDIR") == os.environ.get("TMPDIR")  # restored (no KeyError)


# -- key completeness ----------------------------------------------------------------------


def _changed(value: object) -> object:
    """Some other value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, (list, tuple)):
        return [*value, "x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    if isinstance(value, (set, frozenset)):
        return {*value, "x"}
    return "x" if value is None else None


class _Choices:
    """A factory option's value (Inductor hashes its uuid)."""

    def uuid(self) -> str:
        return "fcache-test-choices"


def _options() -> list[str]:
    from torch._inductor import config

    return sorted(config.save_config_portable())


def test_every_inductor_option_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import config

    executor = InductorExecutor()
    target = Target.of(CPU)
    base = executor.toolchain(target)
    unchanged = []
    options = _options()
    assert len(options) > 100  # Inductor's whole portable config, not a hand-picked few
    factories = set(getattr(config, "_cache_config_factory_keys", ()))
    for name in options:
        if name in inductor.CONFIG_IGNORED:
            continue
        old = getattr(config, name)
        new = _Choices if name in factories else _changed(old)
        with config.patch({name: new}):
            if executor.toolchain(target) == base:
                unchanged.append(name)
    assert unchanged == []
    assert executor.toolchain(target) == base


CODE_VARIABLES = [
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "TORCHINDUCTOR_FREEZING",
    "TORCHINDUCTOR_CPP_WRAPPER",
    "TRITON_F32_DEFAULT",
    "TRITON_DEBUG",
    "TRITON_DEFAULT_FP_FUSION",
]
PLACE_VARIABLES = [
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCHINDUCTOR_COMPILE_THREADS",
    "TRITON_HOME",
]


@pytest.mark.parametrize("name", CODE_VARIABLES)
def test_code_changing_variables_are_in_the_key(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    executor = InductorExecutor()
    target = Target.of(CPU)
    monkeypatch.delenv(name, raising=False)
    base = executor.toolchain(target)
    monkeypatch.setenv(name, "1")
    assert executor.toolchain(target) != base
    assert f"{name}=1" in code_env(os.environ)


@pytest.mark.parametrize("name", PLACE_VARIABLES)
def test_places_and_parallelism_are_not(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    executor = InductorExecutor()
    target = Target.of(CPU)
    base = executor.toolchain(target)
    monkeypatch.setenv(name, "/somewhere/else/7")
    assert executor.toolchain(target) == base


def _fresh_process_digest(seed: str = "1") -> str:
    import sys

    code = "from fcache.executors.inductor import config_digest; print(config_digest())"
    root = Path(__file__).resolve().parents[3]
    return fresh.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_the_config_digest_is_the_same_in_another_process_and_hash_seed() -> None:
    from torch._inductor import config

    # As a compile leaves it: Inductor's own metadata in the config is not a setting.
    with config.patch({"aot_inductor.metadata": {"AOTI_DEVICE_KEY": "cpu"}}):
        assert _fresh_process_digest("2") == inductor.config_digest()
