"""deploy/: every fcache-server it defines passes the server's own checks, and none opens a
writable TCP listener without tokens (issue #17)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from service.config import ServerConfig, load

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_PATH_VALUE = re.compile(r"^(/etc/|/run/secrets/|/opt/)")


def _stand_in_files(values: list[str], tmp_path: Path) -> list[str]:
    """Paths of secrets and configs that exist only on a real machine -> stand-ins (the
    config file -> the example file, which is what its comment says to install)."""
    out = []
    for value in values:
        flag, eq, path = value.partition("=")
        target = path if eq else value
        if target.endswith("server.toml"):
            target = str(DEPLOY / "server.example.toml")
        elif _PATH_VALUE.match(target):
            stand_in = tmp_path / target.strip("/").replace("/", "_")
            stand_in.write_text("secret-token\n")
            target = str(stand_in)
        out.append(f"{flag}={target}" if eq else target)
    return out


def _env(lines: list[str], tmp_path: Path) -> dict[str, str]:
    env = {}
    for line in lines:
        name, _, value = line.partition("=")
        env[name.strip()] = _stand_in_files([value.strip()], tmp_path)[0]
    return env


def _dockerfile(tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    env_line = next(line for line in text.splitlines() if line.startswith("ENV "))
    pairs = shlex.split(env_line[len("ENV ") :])
    return [("Dockerfile", [], _env(pairs, tmp_path))]


def _systemd(tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    lines = (DEPLOY / "fcache-server.service").read_text().splitlines()
    env = [line[len("Environment=") :] for line in lines if line.startswith("Environment=")]
    return [("fcache-server.service", [], _env(env, tmp_path))]


def _compose(tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    image_env = _dockerfile(tmp_path)[0][2]
    return [
        (f"docker-compose.yml {name}", _stand_in_files(list(spec["command"]), tmp_path), image_env)
        for name, spec in doc["services"].items()
        if "command" in spec
    ]


def _kubernetes(tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DEPLOY / "k8s-daemonset.yaml").read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return [("k8s-daemonset.yaml", _stand_in_files(list(container["args"]), tmp_path), {})]


def _servers(tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    return [
        *_dockerfile(tmp_path),
        *_systemd(tmp_path),
        *_compose(tmp_path),
        *_kubernetes(tmp_path),
    ]


def _open_tcp(config: ServerConfig) -> list[str]:
    tokens = config.read_token_file or config.write_token_file
    return [a for a in config.listen if not a.startswith("unix:") and not tokens]


def test_every_deployed_server_is_valid_and_has_no_open_tcp_listener(tmp_path: Path) -> None:
    servers = _servers(tmp_path)
    assert len(servers) >= 5  # image, unit, compose upstream and node, DaemonSet
    for where, argv, env in servers:
        config = load(argv, env)  # raises for a TCP listener without tokens
        assert not config.insecure, where
        assert _open_tcp(config) == [], where


def test_nothing_in_deploy_turns_the_check_off() -> None:
    for path in DEPLOY.iterdir():
        if path.suffix == ".md":
            continue  # the documentation says what the flag does
        lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
        text = "\n".join(lines)
        assert "--insecure" not in text and "INSECURE" not in text, path.name
        assert not re.search(r"^\s*insecure\s*=", text, re.MULTILINE), path.name
