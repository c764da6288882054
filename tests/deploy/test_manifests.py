"""deploy/ as shipped, checked without a container runtime: every manifest, unit and
settings file parses; every command line in them loads as a valid fcache-server
configuration (service.config.load, what the server itself runs); the systemd unit agrees
with the install steps and the example config and overrides none of it; the DaemonSet's
hostPath directories are handed to the server's user, it listens on its socket only and
probes through it; Compose starts a service once what it depends on is healthy; the
image's default command listens on no TCP port, and one it is given without a token file
makes the server refuse to start; the socket mode the files state is the one the server
makes; every flag a file, README or docs page gives fcache-server or fcache exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import ServerConfig, load

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Absolute paths in the manifests that a test maps into its own directory.
HOST_PATHS = ("/var/lib/fcache-server", "/run/fcache", "/run/secrets", "/etc/fcache")


# -- parsers for the formats that are not YAML or TOML ----------------------------------


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """[Section] -> key -> values (a key may repeat, as Environment= does)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: {line!r} is not Key=Value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += (" " if pending else "") + line.removesuffix("\\").strip()
        if line.endswith("\\"):
            continue
        word, _, rest = pending.partition(" ")
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _exec_form(instructions: list[tuple[str, str]], word: str) -> list[str]:
    (args,) = [a for w, a in instructions if w == word]
    value = json.loads(args)
    assert isinstance(value, list), f"{word} must be in exec form (a JSON array)"
    return [str(v) for v in value]


# -- loading a manifest's command line as the server would ------------------------------


def _mapped(args: Sequence[str], root: Path) -> list[str]:
    """The arguments with HOST_PATHS moved under root; the files they name exist there (a
    token file, a config), as on a host that followed the README."""
    out = []
    for arg in args:
        for host in HOST_PATHS:
            arg = arg.replace(host, str(root) + host)
        out.append(arg)
    for arg in out:
        flag, _, value = arg.partition("=")
        if flag.endswith(("token-file", "tls-ca", "tls-cert", "tls-key", "signing-key-file")):
            Path(value).parent.mkdir(parents=True, exist_ok=True)
            Path(value).write_text("token\n")
    return out


def load_args(args: Sequence[str], root: Path, env: dict[str, str] | None = None) -> ServerConfig:
    return load(_mapped(args, root), env or {})


def _server_flags(args: Sequence[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    for arg in args:
        name, _, value = arg.partition("=")
        flags.setdefault(name, []).append(value)
    return flags


# -- every file parses -------------------------------------------------------------------


def test_every_file_in_deploy_is_checked_here() -> None:
    known = {
        "Dockerfile",
        "README.md",
        "docker-compose.yml",
        "docker-compose.redis.yml",  # checked in test_redis_manifests.py
        "fcache-server.service",
        "k8s-daemonset.yaml",
        "k8s-redis.yaml",  # checked in test_redis_manifests.py
        "server.example.toml",
    }
    assert {p.name for p in DEPLOY.iterdir()} == known


def test_yaml_and_toml_parse() -> None:
    (daemonset,) = yaml.safe_load_all((DEPLOY / "k8s-daemonset.yaml").read_text())
    assert daemonset["kind"] == "DaemonSet" and daemonset["apiVersion"] == "apps/v1"
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"upstream", "node"}
    assert tomllib.loads((DEPLOY / "server.example.toml").read_text())["db"]


def _example_config(root: Path) -> ServerConfig:
    """The example config as the server loads it, on a host that followed the systemd
    steps: /etc/fcache (the signing key the Trust steps make) mapped under root."""
    text = (DEPLOY / "server.example.toml").read_text().replace("/etc/fcache", f"{root}/etc/fcache")
    key = root / "etc/fcache/signing.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(os.urandom(32))
    key.chmod(0o640)  # as the steps leave it: owner and group fcache
    (root / "server.toml").write_text(text)
    return load(["--config", str(root / "server.toml")], {})


def test_example_config_loads_as_the_server_loads_it(tmp_path: Path) -> None:
    config = _example_config(tmp_path)
    assert config.db == Path("/var/lib/fcache-server")
    assert config.listen == ("unix:/run/fcache/fcache.sock",)


# -- systemd -----------------------------------------------------------------------------


def _install_steps() -> str:
    text = (DEPLOY / "README.md").read_text()
    return text.split("## systemd", 1)[1].split("```sh", 1)[1].split("```", 1)[0]


def test_unit_runs_what_the_install_steps_install() -> None:
    unit = systemd_unit(DEPLOY / "fcache-server.service")
    service = unit["Service"]
    steps = _install_steps()
    (venv,) = re.findall(r"python3 -m venv (\S+)", steps)
    distribution = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert f"{venv}/bin/pip install {distribution}" in steps
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == f"{venv}/bin/fcache-server"
    # The user the unit runs as is the one the steps create, a system user with no login.
    useradd = next(line for line in steps.splitlines() if line.startswith("useradd"))
    assert "--system" in useradd and useradd.split()[-1] == "fcache"
    assert service["User"] == ["fcache"] and service["Group"] == ["fcache"]
    assert "usermod -aG fcache" in steps
    # The config the unit names is the one the steps install.
    config_path = argv[argv.index("--config") + 1]
    assert f"deploy/server.example.toml {config_path}" in steps


def test_unit_environment_does_not_override_the_config_file() -> None:
    service = systemd_unit(DEPLOY / "fcache-server.service")["Service"]
    argv = shlex.split(service["ExecStart"][0])
    assert [a for a in argv[1:] if a.startswith("--")] == ["--config"]
    file_keys = set(tomllib.loads((DEPLOY / "server.example.toml").read_text()))
    for line in service.get("Environment", []) + service.get("EnvironmentFile", []):
        for assignment in shlex.split(line):
            name = assignment.partition("=")[0]
            assert not name.startswith("FCACHE_SERVER_"), f"the unit sets {name}"
    assert file_keys >= {"db", "listen"}


def test_unit_directories_match_the_config(tmp_path: Path) -> None:
    service = systemd_unit(DEPLOY / "fcache-server.service")["Service"]
    config = _example_config(tmp_path)
    (runtime,) = service["RuntimeDirectory"]
    (state,) = service["StateDirectory"]
    socket = Path(config.listen[0].removeprefix("unix:"))
    assert socket.parent == Path("/run") / runtime
    assert config.db == Path("/var/lib") / state
    writable = service["ReadWritePaths"][0].split()
    assert str(socket.parent) in writable and str(config.db) in writable
    assert service["UMask"] == ["0007"]  # the socket group-writable, nothing for others
    assert int(service["TimeoutStopSec"][0]) > config.grace_s
    assert service["ProtectSystem"] == ["strict"] and service["NoNewPrivileges"] == ["yes"]


def test_the_trust_steps_make_a_key_the_server_user_and_the_ranks_read(tmp_path: Path) -> None:
    """Issue #42: the unit runs as fcache, so the key the steps make must be the fcache
    user's to read (a root-owned 0600 key was not), and the training users' (group fcache,
    which the steps give them), and the server's config must name it."""
    from fcache.cache.signing import Signer

    steps = _install_steps()
    config = _example_config(tmp_path)
    key = "/etc/fcache/signing.key"
    assert config.signing_key_file == tmp_path / key.lstrip("/")
    assert f"head -c 32 /dev/urandom > {key}" in steps
    assert f"chown fcache:fcache {key}" in steps and f"chmod 0640 {key}" in steps
    assert "usermod -aG fcache" in steps
    assert f"FCACHE_SIGNING_KEY_FILE={key}" in (DEPLOY / "README.md").read_text()
    Signer.from_file(config.signing_key_file)  # a 0640 key is accepted


# -- Kubernetes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    (daemonset,) = yaml.safe_load_all((DEPLOY / "k8s-daemonset.yaml").read_text())
    return daemonset["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _server_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["containers"] if c["name"] == "fcache-server"]
    return container  # type: ignore[no-any-return]


def test_daemonset_server_args_load(pod: dict[str, Any], tmp_path: Path) -> None:
    container = _server_container(pod)
    config = load_args(container["args"], tmp_path)
    assert config.signing_key_file is not None  # readers refuse what is not signed
    key_volume = next(v for v in pod["volumes"] if v["name"] == "signing-key")
    assert key_volume["secret"]["defaultMode"] & 0o037 == 0  # a mode a key file may have
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket = Path(next(a for a in container["args"] if "unix:" in a).partition("unix:")[2])
    assert mounts["db"] == "/var/lib/fcache-server" == _server_flags(container["args"])["--db"][0]
    assert mounts["socket"] == str(socket.parent)
    assert volumes["db"]["hostPath"]["path"] == mounts["db"]
    assert volumes["socket"]["hostPath"]["path"] == mounts["socket"]
    # The metrics port is the metrics listener's; no gRPC port is open on the pod IP.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config.metrics_listen and ports == {"metrics": int(config.metrics_listen.split(":")[1])}
    assert pod["terminationGracePeriodSeconds"] > config.grace_s


def test_daemonset_listens_on_the_socket_only_and_probes_through_it(
    pod: dict[str, Any], tmp_path: Path
) -> None:
    """It listened on 0.0.0.0 in plaintext, with a token, only so that kubelet's gRPC probes
    reached it (and the server warned about it); the probes now run in the container."""
    container = _server_container(pod)
    config = load_args(container["args"], tmp_path)
    assert all(a.startswith("unix:") for a in config.listen), config.listen
    (socket,) = _server_flags(container["args"])["--listen"]
    for probe in ("readinessProbe", "livenessProbe"):
        argv = container[probe]["exec"]["command"]
        assert argv == ["fcache-server", "health", socket], argv


def test_compose_starts_what_depends_on_a_server_once_it_is_healthy() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for needed, how in service.get("depends_on", {}).items():
            assert how == {"condition": "service_healthy"}, name
            check = services[needed]["healthcheck"]["test"]
            assert check[:3] == ["CMD", "fcache-server", "health"], check
    assert services["node"]["depends_on"]  # the node waits for its upstream
    (socket,) = _server_flags(services["node"]["command"])["--listen"]
    assert services["node"]["healthcheck"]["test"][3] == socket


def test_daemonset_hostpaths_are_owned_by_the_server_user(pod: dict[str, Any]) -> None:
    """fsGroup does not apply to hostPath: an init container must chown the directories."""
    user, group = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    server = _server_container(pod)
    hostpath_names = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    server_mounts = {
        m["name"]: m["mountPath"] for m in server["volumeMounts"] if m["name"] in hostpath_names
    }
    assert server_mounts, "the server keeps its store and socket on the host"
    (init,) = pod["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    script = " ".join(init["command"] + init.get("args", []))
    chowns = re.findall(r"chown (\d+):(\d+) ([^&;]+)", script)
    assert chowns, script
    owned = {
        path
        for u, g, paths in chowns
        if (int(u), int(g)) == (user, group)
        for path in paths.split()
    }
    for name, path in server_mounts.items():
        assert init_mounts.get(name) == path, f"the init container does not mount {name}"
        assert path in owned, f"{path} is not chowned to {user}:{group}"
    security = init["securityContext"]
    assert security["runAsUser"] == 0
    assert "CHOWN" in security["capabilities"]["add"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert init["image"] == server["image"]


def test_daemonset_runs_as_the_image_user(pod: dict[str, Any]) -> None:
    instructions = dockerfile(DEPLOY / "Dockerfile")
    (user,) = [a for w, a in instructions if w == "USER"]
    uid, _, gid = user.partition(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(uid),
        int(gid),
    )
    server = _server_container(pod)["securityContext"]
    assert server["runAsNonRoot"] and not server["allowPrivilegeEscalation"]


# -- Compose -------------------------------------------------------------------------------


def test_compose_commands_load(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        config = load_args(service["command"], tmp_path / name)
        mounts = {v.split(":")[1] for v in service["volumes"]}
        assert str(config.db).removeprefix(str(tmp_path / name)) in mounts, name
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"]
    upstream = load_args(compose["services"]["upstream"]["command"], tmp_path / "u")
    assert upstream.write_token_file is not None  # TCP on 0.0.0.0
    node = load_args(compose["services"]["node"]["command"], tmp_path / "n")
    assert node.upstream == "upstream:7470" and node.upstream_token_file is not None


# -- the image -----------------------------------------------------------------------------


def test_image_sets_no_settings_in_its_environment() -> None:
    """ENV would beat a --config file silently; the defaults are CMD arguments instead."""
    for word, args in dockerfile(DEPLOY / "Dockerfile"):
        if word == "ENV":
            assert "FCACHE_SERVER_" not in args, args


def test_image_entrypoint_execs_the_server_with_the_arguments() -> None:
    entrypoint = _exec_form(dockerfile(DEPLOY / "Dockerfile"), "ENTRYPOINT")
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    assert 'exec fcache-server "$@"' in entrypoint[2] and "umask 0007" in entrypoint[2]


def _default_command(tmp_path: Path) -> list[str]:
    return _mapped(_exec_form(dockerfile(DEPLOY / "Dockerfile"), "CMD"), tmp_path)


def test_image_default_command_listens_on_no_tcp_port(tmp_path: Path) -> None:
    config = load(_default_command(tmp_path), {})
    assert all(a.startswith("unix:") for a in config.listen), config.listen


@pytest.fixture
def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


@pytest.fixture
def default_server(tmp_path: Path, server_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """The image's default command, run as the image runs it (paths under tmp_path)."""
    for host in HOST_PATHS[:2]:
        (Path(str(tmp_path) + host)).mkdir(parents=True)
    ready = tmp_path / "ready.json"
    args = [*_default_command(tmp_path), f"--ready-file={ready}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "service.main", *args],
        env=server_env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert process.poll() is None, process.communicate()[0].decode()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield json.loads(ready.read_text())
    process.send_signal(signal.SIGTERM)
    process.wait(20)


def test_image_default_command_serves_the_socket_only(default_server: dict[str, Any]) -> None:
    assert [a.startswith("unix:") for a in default_server["addresses"]] == [True]


def test_image_refuses_open_tcp_writes(tmp_path: Path, server_env: dict[str, str]) -> None:
    """Given a TCP listener and no token file, the image's command does not start."""
    args = [*_default_command(tmp_path), "--listen=0.0.0.0:0"]
    result = subprocess.run(
        [sys.executable, "-m", "service.main", *args],
        env=server_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "0.0.0.0:0" in result.stderr and "token file" in result.stderr


def test_nothing_in_deploy_turns_the_listener_check_off() -> None:
    """--insecure (a TCP listener without token files) is for tests, never a deployment."""
    for path in DEPLOY.iterdir():
        if path.suffix == ".md":
            continue  # the documentation says what the flag does
        lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
        text = "\n".join(lines)
        assert "--insecure" not in text and "INSECURE" not in text, path.name
        assert not re.search(r"^\s*insecure\s*=", text, re.MULTILINE), path.name


# -- what the files say against what the programs do --------------------------------------


def _socket_modes() -> list[tuple[str, int]]:
    """(file, mode) for every mode the files state for the server's socket."""
    found = []
    for path in sorted(DEPLOY.iterdir()):
        text = path.read_text()
        for match in re.finditer(r"socket[^.;\n]{0,40}?\b(0[0-7]{3})\b", text, re.IGNORECASE):
            found.append((path.name, int(match.group(1), 8)))
    return found


def test_the_socket_mode_the_files_state_is_the_one_the_server_makes(
    default_server: dict[str, Any],
) -> None:
    """deploy/README.md and the compose file said 0770; the server makes 0660."""
    stated = _socket_modes()
    assert {name for name, _ in stated} >= {"README.md", "docker-compose.yml"}, stated
    socket = Path(default_server["addresses"][0].removeprefix("unix:"))
    made = stat.S_IMODE(socket.stat().st_mode)
    default = next(f.default for f in dataclasses.fields(ServerConfig) if f.name == "socket_mode")
    assert {mode for _, mode in stated} == {made} == {default}, stated


def _server_parsers() -> dict[str, argparse.ArgumentParser]:
    from service import backup, probe
    from service.config import _parser

    return {"": _parser(), "backup": backup.parser(), "health": probe.parser()}


def _cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from fcache.cli import _parser

    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"": parser, **sub.choices}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def _command_lines() -> Iterator[tuple[str, list[str]]]:
    """(where, argv) of every fcache-server and fcache command in deploy/, the READMEs and
    docs/: the manifests' argument lists, probes and health checks, and every command in a
    code block, an inline code span or a comment."""
    (daemonset,) = yaml.safe_load_all((DEPLOY / "k8s-daemonset.yaml").read_text())
    container = _server_container(daemonset["spec"]["template"]["spec"])
    yield "k8s args", ["fcache-server", *container["args"]]
    for probe in ("readinessProbe", "livenessProbe"):
        yield f"k8s {probe}", container[probe]["exec"]["command"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        yield f"compose {name}", ["fcache-server", *service["command"]]
        if "healthcheck" in service:
            yield f"compose {name} healthcheck", service["healthcheck"]["test"][1:]
    cmd = _exec_form(dockerfile(DEPLOY / "Dockerfile"), "CMD")
    yield "Dockerfile CMD", ["fcache-server", *cmd]
    unit = systemd_unit(DEPLOY / "fcache-server.service")
    yield "systemd ExecStart", shlex.split(unit["Service"]["ExecStart"][0])
    texts = [*DEPLOY.iterdir(), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    command = re.compile(r"(?:^|(?<=[\s`(]))(?:/\S+/bin/)?(fcache-server|fcache)( [^`\n]*)")
    for path in texts:
        for code in _code(path):
            for match in command.finditer(code.replace("\\\n", " ")):  # continued lines
                words = match.group(2).split(" #")[0]
                words = re.sub(r"[\[\]|]", " ", words)  # usage syntax: [--json], a | b
                yield f"{path.name}: {match.group(0).strip()}", [match.group(1), *words.split()]


def _code(path: Path) -> list[str]:
    """What a file shows as commands: in markdown its code blocks and `code spans`; in
    other files the comment lines that begin with a command."""
    text = path.read_text()
    if path.suffix == ".md":
        blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        return blocks + re.findall(r"`([^`\n]+)`", prose)
    comments = [
        line.lstrip("#; ").rstrip() for line in text.splitlines() if line.lstrip()[:1] in "#;"
    ]
    return [line for line in comments if line.startswith(("fcache-server ", "fcache "))]


def test_every_flag_a_file_or_readme_uses_exists() -> None:
    parsers = {"fcache-server": _server_parsers(), "fcache": _cli_parsers()}
    checked = 0
    for where, argv in _command_lines():
        program = Path(argv[0]).name
        words = [w for w in argv[1:] if w]
        sub = words[0] if words and words[0] in parsers[program] else ""
        known = _flags(parsers[program][sub]) | ({"--help", "-h"})
        for word in words:
            if flag := re.match(r"--[a-z][a-z0-9-]*", word):
                assert flag.group(0) in known, f"{where}: {program} {sub} has no {flag.group(0)}"
                checked += 1
    assert checked > 30
