"""tests/fresh.py: a fresh process forked from the pre-imported server behaves as one
started by `subprocess.run` would, and a command that sets a variable read at start-up or
import is started as usual."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fresh

_PROBE = """
import atexit, json, os, sys, threading, time
state = {"argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
         "torch_preloaded": "torch" in sys.modules, "fcache_loaded": "fcache" in sys.modules,
         "setting": os.environ.get("FCACHE_PROBE"), "hash": hash("fcache")}
import fcache  # from the checkout on PYTHONPATH
state["fcache_file"] = fcache.__file__
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
print(json.dumps(state))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


def _env(**extra: str) -> dict[str, str]:
    root = str(fresh.ROOT)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get(
        "PYTHONPATH")))), **extra}  # fmt: skip


@pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux only")
def test_a_forked_process_runs_its_script_as_the_interpreter_would(tmp_path: Path) -> None:
    import json

    proc = fresh.run([sys.executable, "-c", _PROBE, "one"], env=_env(FCACHE_PROBE="x"),
                     cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    state = json.loads(lines[0])
    assert state["torch_preloaded"] is True  # forked from the server, not started
    assert state["fcache_loaded"] is False  # and nothing of fcache came with it
    assert state["fcache_file"].startswith(str(fresh.ROOT))
    assert state["argv"] == ["-c", "one"] and state["name"] == "__main__"
    assert state["cwd"] == str(tmp_path) and state["path0"] == ""
    assert state["setting"] == "x"
    # At exit, as the interpreter: non-daemon threads joined, then atexit handlers.
    assert lines[1:] == ["thread joined", "atexit ran"]
    assert proc.stderr == "to stderr\n"


@pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux only")
def test_failures_input_modules_files_and_timeouts(tmp_path: Path) -> None:
    failed = fresh.run([sys.executable, "-c", "raise ValueError('boom')"], env=_env(),
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert failed.returncode == 1
    assert failed.stderr.startswith("Traceback") and "ValueError: boom" in failed.stderr
    assert "forkserver" not in failed.stderr  # the trace starts at the script, as python's
    echoed = fresh.run([sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"],
                       env=_env(), input="abc", capture_output=True, text=True)  # fmt: skip
    assert echoed.stdout == "cba\n"
    module = fresh.run([sys.executable, "-m", "json.tool"], env=_env(), input='{"a": 1}',
                       capture_output=True, text=True)  # fmt: skip
    assert module.returncode == 0 and '"a": 1' in module.stdout
    script = tmp_path / "script.py"
    script.write_text("import sys; print(sys.argv[1:], sys.path[0])\n")
    ran = fresh.run([sys.executable, str(script), "x"], env=_env(), capture_output=True,
                    text=True)  # fmt: skip
    assert ran.stdout == f"['x'] {tmp_path}\n"
    with pytest.raises(subprocess.TimeoutExpired):
        fresh.run([sys.executable, "-c", "import time; time.sleep(60)"], env=_env(),
                  capture_output=True, timeout=2)  # fmt: skip
    with pytest.raises(subprocess.CalledProcessError):
        fresh.run([sys.executable, "-c", "raise SystemExit(2)"], env=_env(), check=True)


def test_a_variable_read_at_start_up_gets_a_started_process() -> None:
    """PYTHONHASHSEED is read when the interpreter starts: a forked child would keep the
    server's seed. The command is started as usual, so the seed it sets holds."""
    probe = "import sys; print(hash('fcache'), 'torch' in sys.modules)"
    seeded = _env(PYTHONHASHSEED="7")
    expected = subprocess.run([sys.executable, "-c", probe], env=seeded, capture_output=True,
                              text=True, check=True)  # fmt: skip
    got = fresh.run([sys.executable, "-c", probe], env=seeded, capture_output=True, text=True,
                    check=True)  # fmt: skip
    assert got.stdout == expected.stdout and got.stdout.endswith("False\n")
    server = fresh._server["env"]
    assert fresh._start_differences(seeded, server) == ["PYTHONHASHSEED"]
    assert fresh._start_differences(_env(FCACHE_DIR="/x", PATH="/bin"), server) == []
    assert fresh._start_differences(_env(TORCH_LOGS="+dynamo"), server) == ["TORCH_LOGS"]


def test_a_variable_changed_in_this_process_since_the_server_started_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server imported torch with the environment it started with: a test that sets a
    start-up variable in its own process afterwards gets a started process."""
    fresh.run([sys.executable, "-c", "pass"], env=_env(), check=True)  # the server is up
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")
    probe = "import sys; print('torch' in sys.modules)"
    got = fresh.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert got.stdout == "False\n"


@pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux only")
def test_a_forked_popen_talks_waits_and_is_killed() -> None:
    echo = "import sys; print('ready', flush=True); print(sys.stdin.readline().upper(), end='')"
    proc = fresh.popen([sys.executable, "-c", echo], env=_env(), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert isinstance(proc, fresh.Forked)
    assert proc.stdout.readline() == "ready\n" and proc.poll() is None
    proc.stdin.write("go\n")
    out, err = proc.communicate(timeout=60)
    assert (out, err, proc.returncode) == ("GO\n", None, 0)
    sleeper = fresh.popen([sys.executable, "-c", "import time; time.sleep(60)"], env=_env())
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(timeout=0.5)
    sleeper.kill()
    assert sleeper.wait(timeout=30) == -9
