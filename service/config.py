"""ServerConfig: fcache-server's settings, merged from flags, environment and a file.

Precedence: command-line flag > environment variable FCACHE_SERVER_<NAME> > the optional
file (--config / FCACHE_SERVER_CONFIG; TOML or JSON, keys as in the table) > default.
A flag or variable that overrides a key the file sets logs a warning naming both.
`load` validates everything once, before anything starts, and raises ConfigError naming
the flag, variable or file key that holds the bad value.

Flags are the keys with dashes (--max-bytes); variables are FCACHE_SERVER_ and the key in
capitals (FCACHE_SERVER_MAX_BYTES). Times drop their unit: --grace, FCACHE_SERVER_GRACE.

| key                 | meaning                                                | default        |
|---------------------|--------------------------------------------------------|----------------|
| listen              | unix:/abs/path or host:port (port 0: any); repeatable  | user socket (1)|
| db                  | directory of the LMDB store                            | required       |
| max_bytes           | size bound, LRU eviction beyond it (50G, 512M)         | 50G            |
| max_upload_bytes    | largest artifact accepted; at most max_bytes           | min(1G, max)   |
| upstream            | another fcache-server: read-through, write-back        | none           |
| upstream_token_file | token this server sends to its upstream                | none           |
| upstream_tls_ca     | CA certificate (PEM) of a TLS upstream                 | none           |
| redis               | Redis URL: read-through, write-back, cluster leases (3)| none           |
| redis_timeout_s     | deadline of one Redis command, in seconds              | 5              |
| redis_ttl_s         | Redis entries expire this long after their put         | none (LRU)     |
| redis_lease_ttl_s   | a dead node's Redis compile lease lapses after, s      | 30             |
| read_token_file     | tokens that may read, one a line                       | none           |
| write_token_file    | tokens that may read and write, one a line             | none           |
| tls_cert, tls_key   | PEM certificate chain and key: TLS on TCP listeners    | none           |
| grace_s             | seconds in-flight calls get to finish on SIGTERM       | 30             |
| max_lease_s         | longest a lease is held, or waited for, in seconds     | 900            |
| ready_file          | where to write the bound addresses (JSON) once serving | none           |
| log_level           | DEBUG, INFO, WARNING or ERROR                          | INFO           |
| signing_key_file    | key that verifies uploads and stored entries (0600)    | none           |
| insecure            | allow a TCP listener without token files               | off            |
| max_concurrent_rpcs | calls in flight at most, and Lease streams apart (2)   | 1024           |
| max_inflight_bytes  | artifact bytes held by calls in flight at most         | max(1G, upload)|
| socket_mode         | mode of the Unix socket files (octal)                  | 0660           |
| socket_group        | group of the Unix socket files; its members may connect| server's own   |
| metrics_listen      | host:port of the Prometheus endpoint (/metrics)        | none           |

(1) unix:$XDG_RUNTIME_DIR/fcache-server.sock, or unix:/tmp/fcache-server-UID.sock where
XDG_RUNTIME_DIR is unset: a default that needs no token file (see below), and the one
`fcache` clients reach with FCACHE_SERVER=unix:PATH.

(2) Short calls (Get, Put, FindMissing, Stats, Report) and Lease streams are bounded
apart, each by this number, so lease waiters never take their holder's slot; calls past
the bound get RESOURCE_EXHAUSTED, counted `overloaded` (service.budget.CallGate).

(3) redis://host:port/db, rediss://, unix:///path.sock?db=N or redis+cluster://host:port
(docs/redis.md); either an upstream or a Redis, not both: each is the node's way to the
rest of the cluster.

With neither token file set, every caller may read and write: such a server listens on
Unix sockets only, unless `insecure` is set. On a Unix socket, the kernel's word on the
peer's uid decides who may connect (root, the server's user, the socket group's members:
service.peercred), whatever the socket file's mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from fcache.config import (
    format_size,
    parse_group,
    parse_redis_url,
    parse_server_address,
    parse_size,
    redact_url,
)
from fcache.errors import ConfigError

log = logging.getLogger(__name__)

ENV_PREFIX = "FCACHE_SERVER_"


def _default_socket() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return f"unix:{runtime}/fcache-server.sock"
    return f"unix:{tempfile.gettempdir()}/fcache-server-{os.getuid()}.sock"


# A Unix socket: a TCP listener needs token files, and a default must start.
DEFAULT_LISTEN = (_default_socket(),)
DEFAULT_MAX_UPLOAD = 1 << 30
DEFAULT_MAX_INFLIGHT = 1 << 30
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Validated settings of one fcache-server. Build with `load` (or directly in tests)."""

    db: Path
    listen: tuple[str, ...] = DEFAULT_LISTEN
    max_bytes: int = 50 << 30
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    upstream: str | None = None
    upstream_token_file: Path | None = None
    upstream_tls_ca: Path | None = None
    redis: str | None = None
    redis_timeout_s: float = 5.0
    redis_ttl_s: float | None = None
    redis_lease_ttl_s: float = 30.0
    read_token_file: Path | None = None
    write_token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    grace_s: float = 30.0
    max_lease_s: float = 900.0
    ready_file: Path | None = None
    log_level: str = "INFO"
    signing_key_file: Path | None = None
    insecure: bool = False
    max_concurrent_rpcs: int = 1024
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT
    socket_mode: int = 0o660
    socket_group: str | None = None
    metrics_listen: str | None = None


# -- value parsers: (where the value came from, the raw value) -> value ------------------


def parse_listen_address(where: str, text: str) -> str:
    """unix:/abs/path or host:port, port 0 allowed; returns the address gRPC binds."""
    text = text.strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path.startswith("/"):
            raise ConfigError(where, text, "unix:/absolute/path")
        return "unix:" + "/" + path.lstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(where, text, "unix:/absolute/path or host:port")
    return text


def _listen(where: str, raw: object) -> tuple[str, ...]:
    """Addresses from a repeated flag, a comma-separated flag, variable or file string, or a
    file's list; each item may itself be a comma-separated list (issue #42: a flag given
    `unix:/x/s.sock,127.0.0.1:P` once made one socket named with the comma)."""
    given = raw if isinstance(raw, list) else [raw]
    items = [part for item in given for part in str(item).split(",")]
    addresses = tuple(parse_listen_address(where, a) for a in items if a.strip())
    if not addresses:
        raise ConfigError(where, raw, "at least one address")
    return addresses


def _path(where: str, raw: object) -> Path:
    text = str(raw).strip()
    if not text:
        raise ConfigError(where, raw, "a path")
    return Path(text).expanduser()


def _file(where: str, raw: object) -> Path:
    path = _path(where, raw)
    if not path.is_file():
        raise ConfigError(where, raw, "the path of an existing file")
    return path


def _size(where: str, raw: object) -> int:
    return parse_size(where, str(raw))


def _seconds(where: str, raw: object) -> float:
    try:
        value = float(str(raw))
    except ValueError:
        raise ConfigError(where, raw, "a number of seconds") from None
    if not value >= 0:
        raise ConfigError(where, raw, "a number of seconds >= 0")
    return value


def _upstream(where: str, raw: object) -> str:
    return parse_server_address(where, str(raw))


def _redis(where: str, raw: object) -> str:
    return parse_redis_url(where, str(raw))


def _positive_seconds(where: str, raw: object) -> float:
    value = _seconds(where, raw)
    if not value > 0:
        raise ConfigError(where, raw, "a number of seconds > 0")
    return value


def _metrics_listen(where: str, raw: object) -> str:
    text = str(raw).strip()
    if text.startswith("unix:"):
        raise ConfigError(where, raw, "host:port (the metrics endpoint is HTTP on TCP)")
    return parse_listen_address(where, text)


def _flag(where: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(where, raw, "true or false")


def _count(where: str, raw: object) -> int:
    try:
        value = int(str(raw))
    except ValueError:
        raise ConfigError(where, raw, "an integer >= 1") from None
    if value < 1:
        raise ConfigError(where, raw, "an integer >= 1")
    return value


def _mode(where: str, raw: object) -> int:
    try:
        value = int(str(raw), 8)
    except ValueError:
        raise ConfigError(where, raw, "an octal file mode such as 0660") from None
    if not 0 <= value <= 0o777 or value & 0o600 != 0o600:
        raise ConfigError(where, raw, "an octal mode the owner can read and write, e.g. 0660")
    return value


def _group(where: str, raw: object) -> str:
    return parse_group(where, str(raw))


def _log_level(where: str, raw: object) -> str:
    level = str(raw).strip().upper()
    if level not in _LOG_LEVELS:
        raise ConfigError(where, raw, ", ".join(_LOG_LEVELS))
    return level


@dataclass(frozen=True, slots=True)
class _Option:
    key: str  # the ServerConfig field and the file key
    parse: Callable[[str, object], object]
    help: str
    name: str = ""  # flag and variable name, when not the key (no unit suffix)

    @property
    def flag(self) -> str:
        return "--" + (self.name or self.key).replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + (self.name or self.key).upper()


_OPTIONS = (
    _Option("listen", _listen, "unix:/abs/path or host:port; repeat or comma-separate"),
    _Option("db", _path, "directory of the LMDB store"),
    _Option("max_bytes", _size, "size bound of the store, e.g. 50G; LRU eviction beyond"),
    _Option("max_upload_bytes", _size, "largest artifact accepted"),
    _Option("upstream", _upstream, "another fcache-server to read through and write back to"),
    _Option("upstream_token_file", _file, "token sent to the upstream"),
    _Option("upstream_tls_ca", _file, "CA certificate (PEM) of a TLS upstream"),
    _Option("redis", _redis, "Redis URL to read through, write back and lease compiles in"),
    _Option(
        "redis_timeout_s", _positive_seconds, "deadline of one Redis command, s", "redis_timeout"
    ),
    _Option("redis_ttl_s", _positive_seconds, "Redis entries expire after, s", "redis_ttl"),
    _Option(
        "redis_lease_ttl_s",
        _positive_seconds,
        "a dead node's Redis compile lease lapses after, s",
        "redis_lease_ttl",
    ),
    _Option("read_token_file", _file, "file of read-only tokens, one a line"),
    _Option("write_token_file", _file, "file of read-write tokens, one a line"),
    _Option("tls_cert", _file, "TLS certificate chain (PEM) for TCP listeners"),
    _Option("tls_key", _file, "TLS private key (PEM) for TCP listeners"),
    _Option("grace_s", _seconds, "seconds in-flight calls get to finish on SIGTERM", "grace"),
    _Option("max_lease_s", _seconds, "longest a lease is held or waited for, s", "max_lease"),
    _Option("ready_file", _path, "write the bound addresses here (JSON) once serving"),
    _Option("log_level", _log_level, "DEBUG, INFO, WARNING or ERROR"),
    _Option("signing_key_file", _file, "key (0600) that uploads and stored entries must verify"),
    _Option("insecure", _flag, "allow a TCP listener without token files"),
    _Option("max_concurrent_rpcs", _count, "calls in flight at most; RESOURCE_EXHAUSTED beyond"),
    _Option("max_inflight_bytes", _size, "artifact bytes held by calls in flight at most"),
    _Option("socket_mode", _mode, "mode of the Unix socket files, octal"),
    _Option("socket_group", _group, "group of the Unix socket files; its members may connect"),
    _Option("metrics_listen", _metrics_listen, "serve Prometheus metrics at http://ADDR/metrics"),
)
_FLAGS = ("insecure",)  # given without a value on the command line


_EPILOG = f"""\
Every flag can also be set as {ENV_PREFIX}<NAME> or in the --config file.

other commands:
  fcache-server backup PATH [--db DIR] [--config FILE]
                        copy the store (consistent, compacted) while the server runs
  fcache-server health [ADDR] [--timeout SECONDS]
                        ask a server's health service; exit 0 when it is SERVING
                        (the probe deploy/ runs; default ADDR: the default --listen)
"""


def _parser() -> argparse.ArgumentParser:
    from fcache.version import __version__

    parser = argparse.ArgumentParser(
        prog="fcache-server",
        description="Serve an fcache artifact cache to the processes of a node or cluster.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fcache-server {__version__}")
    parser.add_argument("--config", help="TOML or JSON file of settings (keys as the flags)")
    for option in _OPTIONS:
        if option.key in _FLAGS:
            parser.add_argument(
                option.flag, dest=option.key, action="store_const", const="1", help=option.help
            )
            continue
        action = "append" if option.key == "listen" else "store"
        parser.add_argument(
            option.flag,
            dest=option.key,
            action=action,
            help=_help(option),
            metavar=_metavar(option),
        )
    return parser


def _help(option: _Option) -> str:
    """The option's help with its default, as `fcache-server --help` shows it."""
    if option.key == "db":
        return f"{option.help} (required)"
    if option.key == "max_upload_bytes":
        return f"{option.help} (default: the smaller of 1G and --max-bytes)"
    if option.key == "max_inflight_bytes":  # set by validate(), from the upload bound
        return f"{option.help} (default: the larger of 1G and --max-upload-bytes)"
    if option.key == "socket_group":
        return f"{option.help} (default: the server's own group)"
    default = {f.name: f.default for f in dataclasses.fields(ServerConfig)}[option.key]
    if default is None:
        return f"{option.help} (default: none)"
    if isinstance(default, tuple):
        default = ",".join(default)
    elif option.parse is _size:
        default = format_size(default)
    elif option.parse is _mode:
        default = f"{default:04o}"  # as the flag takes it, never in decimal
    elif isinstance(default, float):
        default = f"{default:g} s"
    return f"{option.help} (default: {default})"


def _metavar(option: _Option) -> str:
    names = {
        _listen: "ADDR", _upstream: "ADDR", _metrics_listen: "HOST:PORT", _size: "SIZE",
        _file: "FILE", _path: "PATH", _seconds: "SECONDS", _log_level: "LEVEL",
        _redis: "URL", _positive_seconds: "SECONDS",
    }  # fmt: skip
    return names.get(option.parse, "VALUE")


def load(argv: Sequence[str], environ: Mapping[str, str]) -> ServerConfig:
    """Flags, environment and file -> a validated ServerConfig; ConfigError on a bad value.

    argparse itself exits with status 2 on an unknown flag, as command lines do."""
    args = vars(_parser().parse_args(argv))
    config_path = args.pop("config") or environ.get(ENV_PREFIX + "CONFIG")
    from_file = _read_file(Path(config_path)) if config_path else {}
    unknown = sorted(set(from_file) - {o.key for o in _OPTIONS})
    if unknown:
        raise ConfigError(f"{config_path}: {unknown[0]}", from_file[unknown[0]], "a known key")
    values: dict[str, object] = {}
    for option in _OPTIONS:
        if args.get(option.key) is not None:
            raw, where = args[option.key], option.flag
        elif environ.get(option.env):
            raw, where = environ[option.env], option.env
        elif option.key in from_file:
            raw, where = from_file[option.key], f"{config_path}: {option.key}"
        else:
            continue
        if option.key in from_file and not where.startswith(str(config_path)):
            # Not silently: a unit's Environment= or a flag beating the file surprises.
            log.warning("%s: %s overrides the value in %s", option.key, where, config_path)
        values[option.key] = option.parse(where, raw)
    return validate(values)


def validate(values: Mapping[str, object]) -> ServerConfig:
    """Cross-setting checks and defaults that depend on other settings; each value has
    been parsed on its own already."""
    if "db" not in values:
        raise ConfigError("db", None, f"a directory (--db or {ENV_PREFIX}DB)")
    config = ServerConfig(**values)  # type: ignore[arg-type]
    if "max_upload_bytes" not in values:
        upload = min(DEFAULT_MAX_UPLOAD, config.max_bytes)
        config = dataclasses.replace(config, max_upload_bytes=upload)
    if config.max_upload_bytes > config.max_bytes:
        # The store does not keep a value larger than its bound; accepting one would
        # acknowledge a write that is then not there.
        raise ConfigError(
            "max_upload_bytes", config.max_upload_bytes, f"at most max_bytes ({config.max_bytes})"
        )
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls_cert/tls_key", None, "both set, or neither")
    if config.max_lease_s <= 0:
        raise ConfigError("max_lease_s", config.max_lease_s, "a number of seconds > 0")
    if config.upstream is not None and config.redis is not None:
        # Each is the node's way to the rest of the cluster; two would each hold a copy.
        raise ConfigError(
            "redis", redact_url(config.redis), "either --upstream or --redis, not both"
        )
    if config.redis is None:
        for key in ("redis_timeout_s", "redis_ttl_s", "redis_lease_ttl_s"):
            if values.get(key) is not None:
                raise ConfigError(key, values[key], "set only together with redis")
    if config.upstream is None:
        for key in ("upstream_token_file", "upstream_tls_ca"):
            if values.get(key) is not None:
                raise ConfigError(key, values[key], "set only together with upstream")
    if "max_inflight_bytes" not in values:
        inflight = max(DEFAULT_MAX_INFLIGHT, config.max_upload_bytes)
        config = dataclasses.replace(config, max_inflight_bytes=inflight)
    if config.max_inflight_bytes < config.max_upload_bytes:
        # An upload of the largest accepted size could never be received.
        raise ConfigError(
            "max_inflight_bytes",
            config.max_inflight_bytes,
            f"at least max_upload_bytes ({config.max_upload_bytes})",
        )
    tcp = [a for a in config.listen if not a.startswith("unix:")]
    open_tcp = tcp and config.read_token_file is None and config.write_token_file is None
    if open_tcp and not config.insecure:
        # Any local user (or, off loopback, anyone) could put code every reader runs.
        raise ConfigError(
            "listen",
            tcp[0],
            "a Unix socket, or token files (--write-token-file, --read-token-file) for a "
            "TCP listener; --insecure allows a TCP listener open to every caller",
        )
    return config


def _toml() -> ModuleType:
    """tomllib (Python 3.11+), or tomli, the same parser as a package, on Python 3.10."""
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    return tomllib


def _read_file(path: Path) -> dict[str, object]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", str(path), f"a readable file ({exc.strerror})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else _toml().loads(text)
    except ValueError as exc:  # json and tomllib errors both derive from ValueError
        raise ConfigError("config", str(path), f"valid TOML or JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError("config", str(path), "a table of settings")
    return data
