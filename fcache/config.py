"""Settings: the one place that reads FCACHE_* environment variables.

Everything else receives a `Settings` explicitly. `Settings.from_env()` validates every
variable once, at start, and fails with a message that names the variable; tests build
`Settings(...)` directly.

    FCACHE_DIR             local cache directory (LMDB)        ~/.cache/fcache
    FCACHE_MAX_BYTES       local cache bound, LRU eviction     10G (also 512M, bytes)
    FCACHE_MEMORY_ENTRIES  loaded regions kept in memory       4096
    FCACHE_EXECUTORS       executors to try, in order          per device
    FCACHE_SERVER          fcache-server: unix:/path, host:port none
    FCACHE_TOKEN_FILE      token sent to the server            none
    FCACHE_TLS_CA          CA (PEM) to verify a TLS server     none (plaintext)
    FCACHE_SERVER_TIMEOUT  deadline of one server call, s      10
    FCACHE_LEASE_TIMEOUT   longest wait for another's compile  900
    FCACHE_COMPILE_WORKERS parallel compile processes          min(4, cores / local ranks)
    FCACHE_COMPILE_TIMEOUT longest one region may compile, s   1800 (then it runs in eager)
    FCACHE_PROGRESS        progress on stderr: auto, 1, 0      auto (lines when no terminal)
    FCACHE_SIGNING_KEY_FILE key that signs and verifies entries none (entries unsigned)
    FCACHE_CACHE_GROUP     group sharing the cache directory   none (owner only: 0600/0700)
    FCACHE_CUDA_GRAPHS     replay steps as CUDA graphs: 1, 0   0
    FCACHE_WHOLE           store whole functions (no Dynamo)   1
    FCACHE_REDIS           Redis tier: redis://host:port/db,   none
                           rediss://, unix:///path?db=N,
                           redis+cluster://host:port
    FCACHE_REDIS_TIMEOUT   deadline of one Redis command, s    5
    FCACHE_REDIS_TTL       entries expire after, s             none (Redis's LRU evicts)
    FCACHE_REDIS_LEASE_TTL a dead holder's lease lapses after  30
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fcache.errors import ConfigError
from fcache.executors import registry

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(name: str, text: str) -> int:
    """'10G', '512MiB', '1.5g' or a plain byte count -> bytes (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(name, text, "a size such as 10G, 512M or a byte count")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise ConfigError(name, text, "a size > 0")
    return value


def parse_executors(name: str, text: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    known = registry.names()
    if not names or any(n not in known for n in names):
        raise ConfigError(name, text, f"a comma-separated list of {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ConfigError(name, text, "each executor named once")
    return names


def parse_server_address(name: str, text: str) -> str:
    """unix:/abs/path, unix:///abs/path or host:port (IPv6 as [::1]:port)."""
    text = text.strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :].lstrip("/")
        if not path:
            raise ConfigError(name, text, "unix:/absolute/path")
        return "unix:/" + path
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(name, text, "unix:/path or host:port")
    return text


REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def parse_redis_url(name: str, text: str) -> str:
    """A Redis URL fcache's Redis tier can use, returned stripped; ConfigError naming `name`
    otherwise. redis://[user:password@]host[:port][/db] and rediss:// (TLS);
    unix:///abs/path.sock[?db=N]; redis+cluster://host:port (or rediss+cluster://): any node
    of a Redis Cluster, which has database 0 only. Parsing only: nothing is contacted."""
    text = text.strip()
    shown = _redacted(text)  # a message must name the value, never its password
    expected = (
        "a Redis URL: redis://host:port/db, rediss://host:port/db, unix:///path.sock?db=N "
        "or redis+cluster://host:port"
    )
    try:
        url = urlsplit(text)
        _ = url.port  # raises ValueError when out of range or not a number
    except ValueError:
        raise ConfigError(name, shown, expected) from None
    if url.scheme not in REDIS_SCHEMES:
        raise ConfigError(name, shown, expected)
    query = parse_qs(url.query)
    db = query.get("db", [""])[-1]
    if url.scheme == "unix":
        if url.netloc or not url.path.startswith("/") or url.path == "/":
            raise ConfigError(name, shown, "unix:///absolute/path.sock[?db=N]")
    else:
        if not url.hostname:
            raise ConfigError(name, shown, expected)
        path = url.path.strip("/")
        if path:
            if db:
                raise ConfigError(name, shown, "the database in the path or in ?db=, not both")
            db = path
    if db and not db.isdigit():
        raise ConfigError(name, shown, f"a database number, not {db!r}")
    if url.scheme.endswith("+cluster") and db not in ("", "0"):
        raise ConfigError(name, shown, "no database number: a Redis Cluster has database 0 only")
    return text


def redact_url(url: str) -> str:
    """The URL without its password, for logs and reports."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def _redacted(text: str) -> str:
    try:
        return redact_url(text)
    except ValueError:
        return text


def _default_cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fcache"


def _positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, text, "a number of seconds") from None
    if not value > 0:
        raise ConfigError(name, text, "a number of seconds > 0")
    return value


def _count(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(name, text, f"an integer >= {minimum}") from None
    if value < minimum:
        raise ConfigError(name, text, f"an integer >= {minimum}")
    return value


def _tristate(name: str, text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in ("auto", ""):
        return None
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, text, "auto, 1 or 0")


def local_ranks() -> int:
    """Processes of one job on this machine, which share its cores: torchrun's
    LOCAL_WORLD_SIZE, or 1 when it is unset or unreadable."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _default_workers() -> int:
    # A few workers, each with its share of the cores for Inductor's own parallel builds.
    # Four, not eight: a GPU cold start starts them while this process traces, and on a
    # 16-core H100 host eight starting at once slowed the trace (Llama, 16 layers: 24.1 s
    # against 20.6 s with four, alternating cold starts, bench/results/
    # gpu-h100-workers-2026-11-26). Ranks on one machine share the cores (and, through a
    # server, compile each region once): each starts its share, not four of its own.
    return max(1, min(4, (os.cpu_count() or 1) // local_ranks()))


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything fcache can be told. Immutable; derive variants with `replace`."""

    cache_dir: Path = dataclasses.field(default_factory=lambda: _default_cache_dir(os.environ))
    max_bytes: int = 10 << 30
    memory_entries: int = 4096
    # None: the default order for the device (registry.DEFAULT_ORDER, those available).
    executors: tuple[str, ...] | None = None
    server: str | None = None
    token_file: Path | None = None
    tls_ca: Path | None = None
    server_timeout_s: float = 10.0
    lease_timeout_s: float = 900.0
    compile_workers: int = dataclasses.field(default_factory=_default_workers)
    # A compile worker busy with one region for longer is killed; the region falls back.
    compile_timeout_s: float = 1800.0
    # None: in place on a terminal, a line per region compiled elsewhere
    # (fcache.engine.compile.progress).
    progress: bool | None = None
    # Entries are signed with, and verified against, this key (fcache.cache.signing).
    signing_key_file: Path | None = None
    # A group whose members share the cache directory: files 0660 and directories 2770
    # owned by it. None: the owner only (0600 files in 0700 directories).
    cache_group: str | None = None
    # Capture each compiled forward/backward in a CUDA graph (fcache.engine.cudagraphs).
    cuda_graphs: bool = False
    # Store and load whole compiled functions, so that a warm process skips Dynamo
    # (fcache.engine.whole.route). Off: every process traces with Dynamo, then finds the stored
    # programs (for comparison, or a model whose globals change in ways guards miss).
    whole: bool = True
    # The Redis tier (fcache.cache.redis): a URL parse_redis_url accepts; entries' time to
    # live (None: kept until Redis's maxmemory-policy evicts them); how long a compile lease
    # outlives its holder's last renewal (a dead holder's lease lapses within it).
    redis: str | None = None
    redis_timeout_s: float = 5.0
    redis_ttl_s: float | None = None
    redis_lease_ttl_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ConfigError("max_bytes", self.max_bytes, "a size > 0")
        if self.memory_entries < 1:
            raise ConfigError("memory_entries", self.memory_entries, "an integer >= 1")
        if self.compile_workers < 1:
            raise ConfigError("compile_workers", self.compile_workers, "an integer >= 1")
        if self.executors is not None:
            parse_executors("executors", ",".join(self.executors))
        if self.server is not None:
            object.__setattr__(self, "server", parse_server_address("server", self.server))
        if self.redis is not None:
            object.__setattr__(self, "redis", parse_redis_url("redis", self.redis))
        for field, value in (
            ("redis_timeout_s", self.redis_timeout_s),
            ("redis_ttl_s", self.redis_ttl_s),
            ("redis_lease_ttl_s", self.redis_lease_ttl_s),
        ):
            if value is not None and not value > 0:
                raise ConfigError(field, value, "a number of seconds > 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from FCACHE_* variables; raises ConfigError naming the bad variable."""
        env = os.environ if environ is None else environ
        kw: dict[str, object] = {"cache_dir": _default_cache_dir(env)}
        if v := env.get("FCACHE_DIR"):
            kw["cache_dir"] = Path(v).expanduser()
        if v := env.get("FCACHE_MAX_BYTES"):
            kw["max_bytes"] = parse_size("FCACHE_MAX_BYTES", v)
        if v := env.get("FCACHE_MEMORY_ENTRIES"):
            kw["memory_entries"] = _count("FCACHE_MEMORY_ENTRIES", v, 1)
        if v := env.get("FCACHE_EXECUTORS"):
            kw["executors"] = parse_executors("FCACHE_EXECUTORS", v)
        if v := env.get("FCACHE_SERVER"):
            kw["server"] = parse_server_address("FCACHE_SERVER", v)
        if v := env.get("FCACHE_TOKEN_FILE"):
            kw["token_file"] = _existing_file("FCACHE_TOKEN_FILE", v)
        if v := env.get("FCACHE_TLS_CA"):
            kw["tls_ca"] = _existing_file("FCACHE_TLS_CA", v)
        if v := env.get("FCACHE_SERVER_TIMEOUT"):
            kw["server_timeout_s"] = _positive_float("FCACHE_SERVER_TIMEOUT", v)
        if v := env.get("FCACHE_LEASE_TIMEOUT"):
            kw["lease_timeout_s"] = _positive_float("FCACHE_LEASE_TIMEOUT", v)
        if v := env.get("FCACHE_COMPILE_WORKERS"):
            kw["compile_workers"] = _count("FCACHE_COMPILE_WORKERS", v, 1)
        if v := env.get("FCACHE_COMPILE_TIMEOUT"):
            kw["compile_timeout_s"] = _positive_float("FCACHE_COMPILE_TIMEOUT", v)
        if (v := env.get("FCACHE_PROGRESS")) is not None:
            kw["progress"] = _tristate("FCACHE_PROGRESS", v)
        if v := env.get("FCACHE_SIGNING_KEY_FILE"):
            kw["signing_key_file"] = _existing_file("FCACHE_SIGNING_KEY_FILE", v)
        if v := env.get("FCACHE_CACHE_GROUP"):
            kw["cache_group"] = parse_group("FCACHE_CACHE_GROUP", v)
        if v := env.get("FCACHE_CUDA_GRAPHS"):
            kw["cuda_graphs"] = _flag("FCACHE_CUDA_GRAPHS", v)
        if v := env.get("FCACHE_WHOLE"):
            kw["whole"] = _flag("FCACHE_WHOLE", v)
        if v := env.get("FCACHE_REDIS"):
            kw["redis"] = parse_redis_url("FCACHE_REDIS", v)
        if v := env.get("FCACHE_REDIS_TIMEOUT"):
            kw["redis_timeout_s"] = _positive_float("FCACHE_REDIS_TIMEOUT", v)
        if v := env.get("FCACHE_REDIS_TTL"):
            kw["redis_ttl_s"] = _positive_float("FCACHE_REDIS_TTL", v)
        if v := env.get("FCACHE_REDIS_LEASE_TTL"):
            kw["redis_lease_ttl_s"] = _positive_float("FCACHE_REDIS_LEASE_TTL", v)
        return cls(**kw)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def parse_group(name: str, text: str) -> str:
    """A group name or number that exists on this machine; returned as given."""
    import grp

    text = text.strip()
    try:
        if text.isdigit():
            grp.getgrgid(int(text))
        else:
            grp.getgrnam(text)
    except KeyError:
        raise ConfigError(name, text, "the name or number of an existing group") from None
    return text


def group_id(group: str) -> int:
    """The gid of a group `parse_group` accepted."""
    import grp

    return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid


def _flag(name: str, text: str) -> bool:
    value = _tristate(name, text)
    if value is None:
        raise ConfigError(name, text, "1 or 0")
    return value


def _existing_file(name: str, text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise ConfigError(name, text, "the path of an existing file")
    return path
