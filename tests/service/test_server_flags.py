"""fcache-server's settings as an operator meets them: --help shows every default, a flag
or variable that beats the config file says so, TOML files load without tomllib (Python
3.10, through tomli), a TCP listener beyond loopback needs a token file, and the metrics
address is validated like the others."""

from __future__ import annotations

import builtins
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from fcache.errors import ConfigError
from service import probe
from service.config import _OPTIONS, load
from service.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_help_shows_the_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    flat = " ".join(out.split())
    for shown in (
        "(default: unix:/",
        "(default: 50G)",
        "--db PATH directory of the LMDB store (required)",
        "(default: 30 s)",
        "(default: 900 s)",
        "(default: INFO)",
        "--metrics-listen HOST:PORT",
        "--insecure",
    ):
        assert shown in flat, shown


def test_a_flag_or_variable_beating_the_file_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "server.toml"
    file.write_text('db = "/from/file"\nlisten = ["unix:/from/file.sock"]\n')
    env = {"FCACHE_SERVER_CONFIG": str(file), "FCACHE_SERVER_LISTEN": "unix:/from/env.sock"}
    with caplog.at_level(logging.WARNING, logger="service.config"):
        config = load([], env)
    assert config.listen == ("unix:/from/env.sock",)
    assert "listen: FCACHE_SERVER_LISTEN overrides the value in" in caplog.text
    assert "db:" not in caplog.text  # only what was overridden


def test_toml_without_tomllib_uses_tomli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.10 has no tomllib; the tomli package (a dependency there) reads the file."""
    pytest.importorskip("tomli")
    real_import = builtins.__import__

    def no_tomllib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tomllib":
            raise ModuleNotFoundError("No module named 'tomllib'", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tomllib)
    monkeypatch.delitem(sys.modules, "tomllib", raising=False)
    file = tmp_path / "server.toml"
    file.write_text('db = "/d"\nmax_bytes = "2G"\nlisten = ["unix:/s.sock"]\n')
    config = load(["--config", str(file)], {})
    assert config.max_bytes == 2 << 30 and config.listen == ("unix:/s.sock",)


@pytest.mark.parametrize(
    "address", ["0.0.0.0:7470", "[::]:7470", "10.1.2.3:7470", "node:7470", "127.0.0.1:7470"]
)
def test_tcp_without_tokens_is_refused(address: str, tmp_path: Path) -> None:
    # Loopback too: any local user could put code every reader runs.
    with pytest.raises(ConfigError, match="token file") as info:
        load(["--db", "/d", "--listen", address], {})
    assert info.value.name == "listen"
    tokens = tmp_path / "tokens"
    tokens.write_text("t\n")
    assert load(["--db", "/d", "--listen", address, "--write-token-file", str(tokens)], {})
    assert load(["--db", "/d", "--listen", address, "--read-token-file", str(tokens)], {})
    assert load(["--db", "/d", "--listen", address, "--insecure"], {}).insecure
    assert load(["--db", "/d", "--listen", address], {"FCACHE_SERVER_INSECURE": "true"}).insecure


def test_unix_sockets_need_no_tokens() -> None:
    assert load(["--db", "/d", "--listen", "unix:/s"], {}).listen == ("unix:/s",)


def test_open_tcp_refusal_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--db", "/d", "--listen", "0.0.0.0:7470"]) == 2
    assert "--insecure" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["unix:/m.sock", "nowhere", "host:99999"])
def test_bad_metrics_address_names_the_flag(address: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(["--db", "/d", "--metrics-listen", address], {})
    assert info.value.name == "--metrics-listen"


def test_metrics_address_from_the_environment() -> None:
    env = {"FCACHE_SERVER_METRICS_LISTEN": "127.0.0.1:9470"}
    assert load(["--db", "/d"], env).metrics_listen == "127.0.0.1:9470"


def _help() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "service.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return " ".join(out.split())


def test_help_defaults_read_back_as_the_defaults_the_server_uses() -> None:
    """`--socket-mode (default: 432)` was 0o660 in decimal, and --max-inflight-bytes showed
    1G where the server uses the larger of 1G and the upload bound."""
    flat = _help()
    effective = load(["--db", "/d"], {})
    shown = dict(re.findall(r"(--[a-z-]+) [A-Z:]+ .*? \(default: ([^)]*)\)", flat))
    checked = 0
    for option in _OPTIONS:
        text = shown.get(option.flag)
        if text is None or option.key in ("listen", "db") or text.startswith("the "):
            continue  # prose: the ones that depend on other settings, checked below
        if text == "none":
            assert getattr(effective, option.key) is None, option.key
        else:
            assert option.parse(option.flag, text.removesuffix(" s")) == getattr(
                effective, option.key
            ), option.key
        checked += 1
    assert checked >= 10
    assert "--socket-mode VALUE mode of the Unix socket files, octal (default: 0660)" in flat
    assert "(default: the larger of 1G and --max-upload-bytes)" in flat
    assert effective.max_inflight_bytes == max(1 << 30, effective.max_upload_bytes)
    big = load(["--db", "/d", "--max-bytes", "8G", "--max-upload-bytes", "2G"], {})
    assert big.max_inflight_bytes == 2 << 30


def test_help_lists_the_other_commands_and_the_version() -> None:
    flat = _help()
    assert "fcache-server backup PATH" in flat and "fcache-server health [ADDR]" in flat
    out = subprocess.run(
        [sys.executable, "-m", "service.main", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    from fcache.version import __version__

    assert (out.returncode, out.stdout.strip()) == (0, f"fcache-server {__version__}")


def test_start_up_output_is_all_in_the_log_format(tmp_path: Path) -> None:
    """'listening on' was a print, and a flag overriding the config file was logged before
    logging was set up, without the format: every line now is a log record."""
    file = tmp_path / "server.toml"
    file.write_text(f'db = "{tmp_path / "db"}"\nmax_bytes = "1G"\n')
    ready = tmp_path / "ready.json"
    socket = Path(tempfile.mkdtemp(prefix="fcache-t-")) / "s.sock"
    args = ["--config", str(file), "--max-bytes", "2G", "--listen", f"unix:{socket}",
            "--ready-file", str(ready), "--metrics-listen", "127.0.0.1:0"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = str(ROOT)
    server = subprocess.Popen(
        [sys.executable, "-m", "service.main", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert probe.main([f"unix:{socket}"]) == 0  # `fcache-server health`, as probes run it
    finally:
        server.send_signal(signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    lines = [line for line in output.splitlines() if line.strip()]
    record = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) [\w.]+: ")
    assert lines and all(record.match(line) for line in lines), output
    text = "\n".join(lines)
    assert f"listening on unix:{socket}" in text and "metrics on http://127.0.0.1:" in text
    assert "max_bytes: --max-bytes overrides the value in" in text


def test_health_probe_answers_for_a_server_that_is_not_there(tmp_path: Path) -> None:
    assert probe.main([f"unix:{tmp_path / 'nobody.sock'}", "--timeout", "2"]) == 1
    assert probe.main(["nowhere"]) == 2
