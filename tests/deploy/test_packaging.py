"""The distribution as pip sees it: its name is this project's (not the unrelated `fcache`
on PyPI) and the READMEs install that name; building it prints no deprecation warning of
the project's own; torch is an extra, so fcache-server and the `fcache` command run where
torch cannot even be imported; TOML settings have a parser on Python 3.10.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from fcache.stats import CacheStats
from tests.service.support import client, envelope, key_of

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Run before the code under test: any `import torch` then fails.
NO_TORCH = "import sys; sys.modules['torch'] = None; "


def test_distribution_name_is_not_the_unrelated_fcache() -> None:
    assert PROJECT["name"] == "torch-fcache"
    for readme in (ROOT / "README.md", ROOT / "deploy" / "README.md"):
        text = readme.read_text()
        assert "pip install torch-fcache" in text, readme
        assert not re.search(r"pip install fcache\b", text), readme


def test_the_version_the_commands_print_is_the_distribution_s() -> None:
    from fcache.version import __version__

    assert PROJECT["version"] == __version__


def test_torch_is_an_extra_and_tomli_comes_on_python_310() -> None:
    names = [re.split(r"[<>=;\[ ]", d, maxsplit=1)[0] for d in PROJECT["dependencies"]]
    assert "torch" not in names
    assert PROJECT["optional-dependencies"]["torch"] == ["torch>=2.8"]
    (tomli,) = [d for d in PROJECT["dependencies"] if d.startswith("tomli")]
    assert "python_version < '3.11'" in tomli
    assert {"grpcio-health-checking", "grpcio-reflection", "prometheus-client"} <= set(names)


def test_wheel_builds_without_deprecation_warnings(tmp_path: Path) -> None:
    """The project's own metadata (license as an SPDX string, not a table) raises none."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("fcache", "service"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    result = subprocess.run(
        [*command, str(source), "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert not re.search(r"deprecat", output, re.IGNORECASE), [
        line for line in output.splitlines() if "eprecat" in line
    ]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt"))
    assert metadata["Name"] == "torch-fcache"
    assert metadata["License-Expression"] == "Apache-2.0"
    torch_requirements = [r for r in metadata.get_all("Requires-Dist") if r.startswith("torch")]
    assert torch_requirements and all('extra == "torch"' in r for r in torch_requirements)
    assert b"fcache-server = service.main:main" in entry_points


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


def test_server_and_cli_run_without_torch(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    serve = NO_TORCH + "from service.main import main; sys.exit(main(sys.argv[1:]))"
    args = ["--db", str(tmp_path / "db"), "--listen", "127.0.0.1:0", "--insecure"]
    args += ["--ready-file", str(ready), "--metrics-listen", "127.0.0.1:0"]
    server = subprocess.Popen(
        [sys.executable, "-c", serve, *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert server.poll() is None, server.communicate()[0].decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (address,) = json.loads(ready.read_text())["addresses"]
        store = client(address, CacheStats())
        data = envelope(1000)
        try:
            store.put(key_of(7), data)
            assert store.get(key_of(7)) == data
        finally:
            store.close()
        stats = NO_TORCH + "from fcache.cli import main; sys.exit(main(sys.argv[1:]))"
        result = subprocess.run(
            [sys.executable, "-c", stats, "stats", "--server", address, "--json"],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["counters"]["puts"] == 1
    finally:
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=30)[0].decode()
    assert server.returncode == 0, output
