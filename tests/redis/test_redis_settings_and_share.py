"""The Redis tier's settings (bad input: one clear message naming the setting, never the
password) and `share_torch_compile(redis=URL)`: Inductor's own remote caches on the same
Redis, through the class torch itself instantiates."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fcache import process
from fcache.cache.redis import RedisStore
from fcache.cache.torch_entries import fcache_key
from fcache.config import Settings
from fcache.errors import ConfigError
from fcache.share import share_torch_compile
from fcache.stats import CacheStats
from service.config import load
from tests.redis.support import RedisServer
from tests.service.support import ROOT

# Inductor's FX graph cache names its entries pt2:fx-graph-v1::KEY:c1.
KEY = "fredis0123456789"
TORCH_KEY = f"pt2:fx-graph-v1::{KEY}:c1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://cache:6379", "a Redis URL"),
        ("redis://cache:99999/0", "a Redis URL"),
        ("redis://cache:6379/zero", "a database number"),
        ("unix://relative.sock", "unix:///absolute/path"),
        ("redis+cluster://cache:7000/3", "database 0 only"),
    ],
)
def test_a_bad_redis_url_names_the_variable_and_value(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"FCACHE_REDIS": value})
    assert str(caught.value).startswith(f"FCACHE_REDIS={value!r} is invalid")
    assert expected in str(caught.value)


def test_a_password_never_shows_in_a_message() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"FCACHE_REDIS": "redis://fcache:s3cret@cache:6379/x"})
    assert "s3cret" not in str(caught.value) and "fcache:***@cache" in str(caught.value)
    with pytest.raises(ConfigError, match="FCACHE_REDIS_TTL"):
        Settings.from_env({"FCACHE_REDIS": "redis://cache/0", "FCACHE_REDIS_TTL": "0"})
    settings = Settings.from_env(
        {"FCACHE_REDIS": "redis://cache:6379/2", "FCACHE_REDIS_LEASE_TTL": "5"}
    )
    assert (settings.redis, settings.redis_lease_ttl_s, settings.redis_ttl_s) == (
        "redis://cache:6379/2",
        5.0,
        None,
    )


def test_the_server_checks_its_redis_flags(tmp_path: Path) -> None:
    db = ["--db", str(tmp_path)]
    config = load([*db, "--redis", "unix:///run/redis.sock?db=1", "--redis-ttl", "3600"], {})
    assert config.redis == "unix:///run/redis.sock?db=1" and config.redis_ttl_s == 3600
    with pytest.raises(ConfigError, match="either --upstream or --redis"):
        load([*db, "--redis", "redis://r/0", "--upstream", "upstream:7470"], {})
    with pytest.raises(ConfigError, match="set only together with redis"):
        load([*db, "--redis-lease-ttl", "5"], {})
    with pytest.raises(ConfigError, match="FCACHE_SERVER_REDIS"):
        load(db, {"FCACHE_SERVER_REDIS": "redis://:pw@r:1:2"})
    # As a command: one line on stderr, exit status 2, no traceback, no password.
    done = subprocess.run(
        [sys.executable, "-m", "service.main", *db, "--redis", "redis://:hunter2@r/db"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "--redis" in done.stderr
    assert "Traceback" not in done.stderr and "hunter2" not in done.stderr


def test_fcache_stats_with_a_bad_redis_url_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["FCACHE_REDIS"] = "redis://cache:6379/not-a-db"
    done = subprocess.run(
        [sys.executable, "-m", "fcache.cli", "stats", "--dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fcache: FCACHE_REDIS='redis://cache:6379/not-a-db' is invalid: expected a database "
        "number, not 'not-a-db'"
    ]


@pytest.fixture
def sharing_reset() -> Iterator[None]:
    yield
    process.reset()  # puts torch's backends back


def test_share_torch_compile_puts_inductors_caches_on_the_redis(
    redis_server: RedisServer, sharing_reset: None
) -> None:
    """What Inductor stores through its own RemoteFxGraphCache lands in the Redis as an
    fcache envelope, and a second process's RemoteFxGraphCache (a fresh store, as another
    node's) reads it back."""
    from torch._inductor import remote_cache

    with pytest.raises(ConfigError, match="not both"):
        share_torch_compile("unix:/some.sock", redis=redis_server.url())
    sharing = share_torch_compile(redis=redis_server.url())
    assert sharing.store.name == "redis"
    value = {"a graph": [1, 2, 3]}
    remote_cache.RemoteFxGraphCache("fx-graph-v1").put(KEY, value)
    assert remote_cache.RemoteFxGraphCache("fx-graph-v1").get(KEY) == value
    counters = sharing.counters()["torch:fx-graph-v1"]
    assert (counters.puts, counters.hits) == (1, 1)
    # In the Redis: fcache's frame and envelope, under the torch key's fcache key.
    other_node = RedisStore(redis_server.url(), CacheStats())
    stored = other_node.get(fcache_key(TORCH_KEY))
    assert stored is not None and b'"torch_key":"' + TORCH_KEY.encode() in stored
    # Corrupted behind fcache's back: a counted miss, never bytes handed to torch.
    entry = next(iter(redis_server.client().keys("fcache:v1:*")))
    raw = redis_server.client().get(entry)
    assert raw is not None
    redis_server.client().set(entry, raw[:-3] + b"xyz")
    assert remote_cache.RemoteFxGraphCache("fx-graph-v1").get(KEY) is None
    assert sharing.counters()["redis"].corrupt == 1


def test_nothing_needs_redis_py_without_a_redis() -> None:
    """fcache-server and fcache import redis-py only where a Redis is configured: a node
    without one (the GPU machine this project measures on had no redis-py) still starts."""
    code = (
        "import sys; sys.modules['redis'] = None\n"  # `import redis` now raises ImportError
        "import service.server, fcache.cli, fcache.cache.tiered, fcache.share\n"
        "print('imported')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]
