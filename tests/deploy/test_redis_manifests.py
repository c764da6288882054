"""deploy/'s Redis: the compose file and the Kubernetes manifests parse, agree with each
other, configure Redis as a cache (a memory bound, allkeys-lru, no persistence), and their
command lines run: the compose file's Redis and two node servers are started here, locally,
with the same arguments (hosts and paths mapped into the test's directory), and an artifact
put through one node is read through the other from the Redis.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import load
from tests.deploy.test_manifests import DEPLOY, ROOT, load_args
from tests.redis.support import free_port
from tests.service.support import client, envelope

COMPOSE = DEPLOY / "docker-compose.redis.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s-redis.yaml").read_text()))
    return {doc["kind"]: doc for doc in docs}


def _flag(argv: list[str], name: str) -> str:
    """The value of `name VALUE` in a redis-server command line (the last one wins)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name][-1]


def test_compose_runs_redis_as_a_cache_next_to_two_nodes(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    services = compose["services"]
    assert set(services) == {"redis", "node-a", "node-b"}
    redis = services["redis"]["command"]
    assert redis[0] == "redis-server"
    assert _flag(redis, "--maxmemory-policy") == "allkeys-lru" and _flag(redis, "--maxmemory")
    assert _flag(redis, "--save") == "" and _flag(redis, "--appendonly") == "no"
    for name in ("node-a", "node-b"):
        config = load_args(services[name]["command"], tmp_path / name)
        assert config.redis == "redis://redis:6379/0"  # the compose service's name
        assert "redis" in services[name]["depends_on"]
        mounts = {v.split(":")[1] for v in services[name]["volumes"]}
        assert str(config.db).removeprefix(str(tmp_path / name)) in mounts


def test_k8s_redis_matches_the_daemonsets_redis_url(k8s: dict[str, dict[str, Any]]) -> None:
    assert set(k8s) == {"ConfigMap", "Deployment", "Service"}
    conf = dict(line.split(" ", 1) for line in k8s["ConfigMap"]["data"]["redis.conf"].splitlines())
    assert conf["maxmemory-policy"] == "allkeys-lru" and conf["appendonly"] == "no"
    service = k8s["Service"]["metadata"]
    port = k8s["Service"]["spec"]["ports"][0]["port"]
    (daemonset,) = yaml.safe_load_all((DEPLOY / "k8s-daemonset.yaml").read_text())
    (server,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]]
    (url,) = [a.partition("=")[2] for a in server["args"] if a.startswith("--redis=")]
    host = f"{service['name']}.{service['namespace']}.svc.cluster.local"
    assert url == f"redis://{host}:{port}/0"
    assert service["namespace"] == daemonset["metadata"]["namespace"]
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    assert redis["command"] == ["redis-server", "/etc/redis/redis.conf"]
    assert {m["mountPath"] for m in redis["volumeMounts"]} >= {"/etc/redis"}
    # The memory bound leaves the container room: Redis's own overhead, and a fork-free
    # cache (no persistence) still needs some.
    limit = redis["resources"]["limits"]["memory"]
    assert int(conf["maxmemory"].removesuffix("gb")) < int(limit.removesuffix("Gi"))


def test_k8s_redis_config_starts_a_redis_server(
    k8s: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """redis-server takes the ConfigMap's file as it is (ports moved to a free loopback one:
    later arguments override the file)."""
    conf = tmp_path / "redis.conf"
    conf.write_text(k8s["ConfigMap"]["data"]["redis.conf"])
    port = free_port()
    with _running(["redis-server", str(conf), "--port", str(port), "--bind", "127.0.0.1",
                   "--dir", str(tmp_path)]):  # fmt: skip
        import redis

        answer = redis.Redis(port=port).config_get("maxmemory-policy")
        assert answer == {"maxmemory-policy": "allkeys-lru"}


@pytest.fixture
def short_path() -> Iterator[Path]:
    """A directory with a short path: the nodes' Unix sockets live under it (AF_UNIX paths
    are short; pytest's temp paths under xdist can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="fcache-rd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_compose_command_lines_run_locally(compose: dict[str, Any], short_path: Path) -> None:
    tmp_path = short_path
    services = compose["services"]
    port = free_port()
    redis_cmd = [*services["redis"]["command"], "--port", str(port), "--bind", "127.0.0.1",
                 "--dir", str(tmp_path)]  # fmt: skip
    with _running(redis_cmd):
        nodes = []
        for name in ("node-a", "node-b"):
            args = _localized(services[name]["command"], tmp_path / name, port)
            nodes.append(_server(args, tmp_path / name))
        with nodes[0] as a, nodes[1] as b:
            key, data = "c0" * 16, envelope(5000)
            client(a).put(key, data)
            deadline = time.monotonic() + 20
            while (got := client(b).get(key)) is None:  # written back to Redis, then read
                assert time.monotonic() < deadline, "node B never found node A's artifact"
                time.sleep(0.1)
            assert got == data


def _localized(args: list[str], root: Path, redis_port: int) -> list[str]:
    """A node's arguments with its paths under root and the Redis host on this machine."""
    out = []
    for arg in args:
        for host in ("/var/lib/fcache-server", "/run/fcache"):
            arg = arg.replace(host, str(root) + host)
        out.append(arg.replace("redis://redis:6379", f"redis://127.0.0.1:{redis_port}"))
    (root / "run" / "fcache").mkdir(parents=True)
    load(out, {})  # as the server loads them
    return out


class _server:
    """A node server started with the manifest's arguments; enters as its socket address."""

    def __init__(self, args: list[str], root: Path) -> None:
        self._ready = root / "ready.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "service.main", *args, f"--ready-file={self._ready}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def __enter__(self) -> str:
        deadline = time.monotonic() + 30
        while not self._ready.exists():
            assert self._process.poll() is None, self._process.communicate()[0].decode()
            assert time.monotonic() < deadline, "the node server did not start"
            time.sleep(0.05)
        return str(json.loads(self._ready.read_text())["addresses"][0])

    def __exit__(self, *exc: object) -> None:
        self._process.send_signal(signal.SIGTERM)
        self._process.wait(30)


class _running:
    def __init__(self, argv: list[str]) -> None:
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        self._port = int(_flag(argv, "--port"))

    def __enter__(self) -> None:
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self._port).ping():
                    return
            except redis.ConnectionError:
                assert self._process.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.wait(10)


def test_nothing_redis_related_points_at_a_real_host() -> None:
    """The manifests name the compose service and the cluster Service, never an address."""
    for path in (COMPOSE, DEPLOY / "k8s-redis.yaml", DEPLOY / "k8s-daemonset.yaml"):
        for line in path.read_text().splitlines():
            if "redis://" in line or "redis+cluster://" in line:
                line = line.replace("redis+cluster://", "redis://")
                netloc = line.split("redis://", 1)[1].split("/", 1)[0]
                host = netloc.rpartition("@")[2].partition(":")[0]
                assert host in ("redis", "fcache-redis.fcache.svc.cluster.local", "HOST"), line
