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
    FCACHE_SIGNING_KEY_FILE key that signs and verifies entries FCACHE_DIR/signing.key,
                                                               made on first use (0600)
    FCACHE_VERIFY          check signatures of what is read    1 (0: loudly logged, unsafe)
    FCACHE_CACHE_GROUP     group sharing the cache directory   none (owner only: 0600/0700)
    FCACHE_CUDA_GRAPHS     replay steps as CUDA graphs: 1, 0   0
    FCACHE_WHOLE           store whole functions (no Dynamo)   1
    FCACHE_REGIONS         how graphs are cut: layers, ops     layers
    FCACHE_REDIS           Redis tier: redis://host:port/db,   none
                           rediss://, unix:///path?db=N,
                           redis+cluster://host:port
    FCACHE_REDIS_TIMEOUT   deadline of one Redis command, s    5
    FCACHE_REDIS_TTL       entries expire after, s             none (Redis's LRU evicts)
    FCACHE_REDIS_LEASE_TTL a dead holder's lease lapses after  30
    FCACHE_INDUCTOR_CUDA,  how Inductor regions are packaged:  python
    FCACHE_INDUCTOR_CPU    python or aoti (read by the executor)

`VARIABLES` lists them with their meaning (docs/settings.md is checked against it), and
`describe` says what each is in a process and where the value came from (`fcache config`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from fcache.errors import ConfigError
from fcache.executors import registry

REGION_MODES = ("layers", "ops")
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
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(name, text, "a finite number of seconds > 0")
    return value


def _count(name: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(name, text, f"an integer >= {minimum}") from None
    if value < minimum:
        raise ConfigError(name, text, f"an integer >= {minimum}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str, text: str) -> bool:
    # The message names every spelling accepted, so that it agrees with what is.
    lowered = text.strip().lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise ConfigError(name, text, "1 or 0 (also true/false, yes/no, on/off)")


def _tristate(name: str, text: str) -> bool | None:
    if text.strip().lower() in ("auto", ""):
        return None
    try:
        return _flag(name, text)
    except ConfigError:
        raise ConfigError(name, text, "auto, 1 or 0 (also true/false, yes/no, on/off)") from None


def parse_choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    # Exactly as written: the executor reading the variable compares it as it is.
    if text not in choices:
        raise ConfigError(name, text, " or ".join(choices))
    return text


# How Inductor regions are packaged, per device type: "python" (Inductor's Python wrapper
# and its built kernels) or "aoti" (an AOTInductor package); fcache.executors.inductor.
INDUCTOR_ROUTES = ("python", "aoti")
INDUCTOR_ROUTE_VARIABLES = {"cuda": "FCACHE_INDUCTOR_CUDA", "cpu": "FCACHE_INDUCTOR_CPU"}


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
    # None: signing.key in cache_dir, created on first use.
    signing_key_file: Path | None = None
    # Whether what is read must carry a valid signature. Off only when asked (FCACHE_VERIFY=0),
    # and then loudly: any writer of a cache tier can run code in this process.
    verify: bool = True
    # A group whose members share the cache directory: files 0660 and directories 2770
    # owned by it. None: the owner only (0600 files in 0700 directories).
    cache_group: str | None = None
    # Capture each compiled forward/backward in a CUDA graph (fcache.engine.cudagraphs).
    cuda_graphs: bool = False
    # Store and load whole compiled functions, so that a warm process skips Dynamo
    # (fcache.engine.whole.route). Off: every process traces with Dynamo, then finds the stored
    # programs (for comparison, or a model whose globals change in ways guards miss).
    whole: bool = True
    # How graphs are cut into regions (fcache.frontend.partition): "layers", each repeated
    # layer of the model one region with its matmuls and attention (few calls a step, as
    # torch.compile's graph), the rest by op; "ops", every region between two matmuls.
    regions: str = "layers"
    # The Redis tier (fcache.cache.redis): a URL parse_redis_url accepts; entries' time to
    # live (None: kept until Redis's maxmemory-policy evicts them); how long a compile lease
    # outlives its holder's last renewal (a dead holder's lease lapses within it).
    redis: str | None = None
    redis_timeout_s: float = 5.0
    redis_ttl_s: float | None = None
    redis_lease_ttl_s: float = 30.0

    def __post_init__(self) -> None:
        # Paths given as strings (Settings(cache_dir="/x")) work as they always did.
        for name in ("cache_dir", "token_file", "tls_ca", "signing_key_file"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))
        if self.max_bytes <= 0:
            raise ConfigError("max_bytes", self.max_bytes, "a size > 0")
        if self.memory_entries < 1:
            raise ConfigError("memory_entries", self.memory_entries, "an integer >= 1")
        if self.compile_workers < 1:
            raise ConfigError("compile_workers", self.compile_workers, "an integer >= 1")
        for name in ("server_timeout_s", "lease_timeout_s", "compile_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(name, value, "a finite number of seconds > 0")
        if self.executors is not None:
            parse_executors("executors", ",".join(self.executors))
        if self.regions not in REGION_MODES:
            raise ConfigError("regions", self.regions, " or ".join(REGION_MODES))
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
        if v := env.get("FCACHE_VERIFY"):
            kw["verify"] = _flag("FCACHE_VERIFY", v)
        if v := env.get("FCACHE_CACHE_GROUP"):
            kw["cache_group"] = parse_group("FCACHE_CACHE_GROUP", v)
        if v := env.get("FCACHE_CUDA_GRAPHS"):
            kw["cuda_graphs"] = _flag("FCACHE_CUDA_GRAPHS", v)
        if v := env.get("FCACHE_WHOLE"):
            kw["whole"] = _flag("FCACHE_WHOLE", v)
        if v := env.get("FCACHE_REGIONS"):
            kw["regions"] = parse_choice("FCACHE_REGIONS", v, REGION_MODES)
        # Read by the Inductor executor itself, in every compile worker (so not a field);
        # checked here so that a bad value stops the program at start, not inside Dynamo.
        for variable in INDUCTOR_ROUTE_VARIABLES.values():
            if v := env.get(variable):
                parse_choice(variable, v, INDUCTOR_ROUTES)
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


def _existing_file(name: str, text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise ConfigError(name, text, "the path of an existing file")
    return path


# -- what `fcache config` prints -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variable:
    """One FCACHE_* variable: the Settings field it sets (None: read by an executor)."""

    name: str
    field: str | None
    meaning: str


VARIABLES = (
    Variable("FCACHE_DIR", "cache_dir", "local cache directory (LMDB)"),
    Variable("FCACHE_MAX_BYTES", "max_bytes", "local cache bound, LRU eviction beyond"),
    Variable("FCACHE_MEMORY_ENTRIES", "memory_entries", "loaded regions kept in memory"),
    Variable("FCACHE_EXECUTORS", "executors", "executors to try, in order"),
    Variable("FCACHE_SERVER", "server", "fcache-server address: unix:/path or host:port"),
    Variable("FCACHE_TOKEN_FILE", "token_file", "token sent to the server"),
    Variable("FCACHE_TLS_CA", "tls_ca", "CA (PEM) that verifies a TLS server"),
    Variable("FCACHE_SERVER_TIMEOUT", "server_timeout_s", "deadline of one server call, s"),
    Variable("FCACHE_LEASE_TIMEOUT", "lease_timeout_s", "longest wait for another's compile, s"),
    Variable("FCACHE_COMPILE_WORKERS", "compile_workers", "processes compiling in parallel"),
    Variable("FCACHE_COMPILE_TIMEOUT", "compile_timeout_s", "longest one region may compile, s"),
    Variable("FCACHE_PROGRESS", "progress", "progress on stderr: auto, 1 or 0"),
    Variable("FCACHE_SIGNING_KEY_FILE", "signing_key_file", "key that signs and verifies"),
    Variable("FCACHE_VERIFY", "verify", "check signatures of what is read: 1 or 0 (unsafe)"),
    Variable("FCACHE_CACHE_GROUP", "cache_group", "group that shares the cache directory"),
    Variable("FCACHE_CUDA_GRAPHS", "cuda_graphs", "replay steps as CUDA graphs: 1 or 0"),
    Variable("FCACHE_WHOLE", "whole", "store whole functions (a warm process skips Dynamo)"),
    Variable("FCACHE_REGIONS", "regions", "how graphs are cut: layers or ops"),
    Variable("FCACHE_REDIS", "redis", "Redis tier: redis://host:port/db (docs/redis.md)"),
    Variable("FCACHE_REDIS_TIMEOUT", "redis_timeout_s", "deadline of one Redis command, s"),
    Variable("FCACHE_REDIS_TTL", "redis_ttl_s", "Redis entries expire after, s"),
    Variable("FCACHE_REDIS_LEASE_TTL", "redis_lease_ttl_s", "a dead holder's lease lapses, s"),
    Variable("FCACHE_INDUCTOR_CUDA", None, "Inductor regions on CUDA: python or aoti"),
    Variable("FCACHE_INDUCTOR_CPU", None, "Inductor regions on CPU: python or aoti"),
)


@dataclass(frozen=True, slots=True)
class Described:
    """A variable's effective value in this process and where it came from."""

    name: str
    value: str
    source: str  # "default", "environment", or what overrode both (a command-line flag)
    meaning: str


def describe(
    environ: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None
) -> list[Described]:
    """Every variable's effective value, as `Settings.from_env(environ)` and the executors
    see it. `overrides`: variable -> what set it instead (e.g. {"FCACHE_DIR": "--dir"}),
    whose value is already in `environ`. Raises ConfigError as from_env does."""
    env = os.environ if environ is None else environ
    settings = Settings.from_env(env)
    overrides = overrides or {}
    out = []
    for variable in VARIABLES:
        if variable.field is None:
            value = env.get(variable.name) or INDUCTOR_ROUTES[0]
        else:
            value = _text(variable.field, getattr(settings, variable.field))
        given = env.get(variable.name) is not None and (
            env[variable.name] != "" or variable.name == "FCACHE_PROGRESS"
        )
        source = overrides.get(variable.name) or ("environment" if given else "default")
        out.append(Described(variable.name, value, source, variable.meaning))
    return out


def _text(field: str, value: object) -> str:
    if field == "executors" and value is None:
        return f"{','.join(registry.DEFAULT_ORDER)} (those available on the device)"
    if field == "progress" and value is None:
        return "auto"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    if field == "max_bytes" and isinstance(value, int):
        return format_size(value)
    if field == "redis" and isinstance(value, str):
        return redact_url(value)  # never a password on a terminal
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_size(n: int) -> str:
    """Bytes as parse_size reads them back: 10G, 512M, or a byte count."""
    for unit in ("T", "G", "M", "K"):
        if n % _UNITS[unit.lower()] == 0:
            return f"{n // _UNITS[unit.lower()]}{unit}"
    return str(n)
