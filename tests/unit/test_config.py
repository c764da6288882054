"""Settings.from_env: every FCACHE_* variable parsed, and every bad value named in the error."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

from fcache import config
from fcache.config import Settings, parse_server_address, parse_size
from fcache.errors import ConfigError
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_without_variables(tmp_path: Path) -> None:
    s = Settings.from_env({"XDG_CACHE_HOME": str(tmp_path)})
    assert s.cache_dir == tmp_path / "fcache"
    assert s.max_bytes == 10 << 30
    assert s.server is None
    assert s.executors is None
    assert s.progress is None
    assert s.lease_timeout_s == 900.0


def test_every_variable_is_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    s = Settings.from_env(
        {
            "FCACHE_DIR": str(tmp_path / "c"),
            "FCACHE_MAX_BYTES": "512M",
            "FCACHE_MEMORY_ENTRIES": "7",
            "FCACHE_EXECUTORS": "Inductor, eager",
            "FCACHE_SERVER": "unix:///run/fcache.sock",
            "FCACHE_TOKEN_FILE": str(token),
            "FCACHE_TLS_CA": str(ca),
            "FCACHE_SERVER_TIMEOUT": "2.5",
            "FCACHE_LEASE_TIMEOUT": "30",
            "FCACHE_COMPILE_WORKERS": "3",
            "FCACHE_PROGRESS": "0",
            "FCACHE_CUDA_GRAPHS": "1",
            "FCACHE_WHOLE": "0",
        }
    )
    assert s.cache_dir == tmp_path / "c"
    assert s.max_bytes == 512 << 20
    assert s.memory_entries == 7
    assert s.executors == ("inductor", "eager")
    assert s.server == "unix:/run/fcache.sock"
    assert s.token_file == token
    assert s.tls_ca == ca
    assert s.server_timeout_s == 2.5
    assert s.lease_timeout_s == 30.0
    assert s.compile_workers == 3
    assert s.progress is False
    assert s.cuda_graphs is True
    assert s.whole is False and Settings().whole is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10G", 10 << 30),
        ("512MiB", 512 << 20),
        ("1.5g", 3 << 29),
        ("4096", 4096),
        (" 2 kb ", 2048),
        ("1T", 1 << 40),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size("X", text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("unix:/tmp/s", "unix:/tmp/s"),
        ("unix:///tmp/s", "unix:/tmp/s"),
        ("localhost:50051", "localhost:50051"),
        ("[::1]:8080", "[::1]:8080"),
    ],
)
def test_server_addresses(text: str, expected: str) -> None:
    assert parse_server_address("X", text) == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FCACHE_MAX_BYTES", "abc"),
        ("FCACHE_MAX_BYTES", "0"),
        ("FCACHE_MAX_BYTES", "-5G"),
        ("FCACHE_MEMORY_ENTRIES", "0"),
        ("FCACHE_MEMORY_ENTRIES", "many"),
        ("FCACHE_EXECUTORS", "inductor,tvm"),
        ("FCACHE_EXECUTORS", "eager,eager"),
        ("FCACHE_EXECUTORS", " , "),
        ("FCACHE_SERVER", "no-port"),
        ("FCACHE_SERVER", "host:99999"),
        ("FCACHE_SERVER", "unix:"),
        ("FCACHE_TOKEN_FILE", "/nonexistent/token"),
        ("FCACHE_TLS_CA", "/nonexistent/ca.pem"),
        ("FCACHE_SERVER_TIMEOUT", "soon"),
        ("FCACHE_LEASE_TIMEOUT", "0"),
        ("FCACHE_COMPILE_WORKERS", "0"),
        ("FCACHE_PROGRESS", "maybe"),
        ("FCACHE_CUDA_GRAPHS", "auto"),
        ("FCACHE_WHOLE", "sometimes"),
        ("FCACHE_SIGNING_KEY_FILE", "/nonexistent/signing.key"),
        ("FCACHE_CACHE_GROUP", "no-such-group-fcache"),
        ("FCACHE_INDUCTOR_CPU", "bogus"),
        ("FCACHE_INDUCTOR_CUDA", "Python"),
    ],
)
def test_bad_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    assert info.value.name == name
    assert name in str(info.value)
    assert repr(value) in str(info.value)


def test_empty_variables_mean_default() -> None:
    s = Settings.from_env({"FCACHE_MAX_BYTES": "", "FCACHE_SERVER": ""})
    assert s.max_bytes == 10 << 30
    assert s.server is None


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        Settings(max_bytes=0)
    with pytest.raises(ConfigError, match="server"):
        Settings(server="nonsense")
    assert Settings(server="unix:///x").server == "unix:/x"


def test_replace_keeps_the_rest(tmp_path: Path) -> None:
    s = Settings(cache_dir=tmp_path, max_bytes=100)
    t = s.replace(max_bytes=200)
    assert (t.cache_dir, t.max_bytes, s.max_bytes) == (tmp_path, 200, 100)


def test_trust_variables(tmp_path: Path) -> None:
    import grp
    import os

    key = tmp_path / "signing.key"
    key.write_bytes(os.urandom(32))
    group = grp.getgrgid(os.getgid()).gr_name
    s = Settings.from_env({"FCACHE_SIGNING_KEY_FILE": str(key), "FCACHE_CACHE_GROUP": group})
    assert (s.signing_key_file, s.cache_group) == (key, group)
    assert Settings.from_env({"FCACHE_CACHE_GROUP": str(os.getgid())}).cache_group == str(
        os.getgid()
    )
    assert Settings.from_env({}).signing_key_file is None


@pytest.mark.parametrize(
    ("local_world_size", "ranks"), [(None, 1), ("8", 8), ("0", 1), ("many", 1)]
)
def test_ranks_on_one_machine_share_its_cores_for_compile_workers(
    monkeypatch: pytest.MonkeyPatch, local_world_size: str | None, ranks: int
) -> None:
    # torchrun tells each rank how many share the machine: each starts its share of
    # workers, not four of its own.
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert config.local_ranks() == ranks
    assert Settings.from_env({}).compile_workers == min(4, 16 // ranks)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert Settings.from_env({}).compile_workers == 1


# A message lists what is accepted; each spelling it lists must be, and nothing else may be
# named: `FCACHE_WHOLE=auto` was refused "expected 1 or 0" while a typo was told "auto, 1 or 0".
@pytest.mark.parametrize("name", ["FCACHE_WHOLE", "FCACHE_CUDA_GRAPHS", "FCACHE_PROGRESS"])
def test_a_refusal_lists_exactly_what_is_accepted(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: "maybe"})
    expected = str(info.value).split("expected ", 1)[1]
    listed = re.findall(r"[a-z0-9]+", expected.replace(" or ", " ").replace("also", ""))
    assert listed, expected
    for spelling in listed:
        Settings.from_env({name: spelling})  # accepted: no ConfigError
    for refused in ("auto", "2", "y", "enable"):
        if refused in listed:
            continue
        with pytest.raises(ConfigError):
            Settings.from_env({name: refused})


def test_auto_is_refused_where_it_is_not_offered() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"FCACHE_WHOLE": "auto"})
    assert "auto" not in str(info.value).split("expected", 1)[1]
    assert Settings.from_env({"FCACHE_PROGRESS": "auto"}).progress is None


def test_inductor_packaging_is_checked_with_the_other_settings() -> None:
    """Read by the executor in every compile worker; a bad value used to surface at the
    model's first call, inside Dynamo."""
    with pytest.raises(ConfigError, match="FCACHE_INDUCTOR_CPU='bogus' is invalid: expected"):
        Settings.from_env({"FCACHE_INDUCTOR_CPU": "bogus"})
    for route in config.INDUCTOR_ROUTES:
        Settings.from_env({"FCACHE_INDUCTOR_CPU": route, "FCACHE_INDUCTOR_CUDA": route})


def test_jit_refuses_a_bad_variable_at_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import fcache

    monkeypatch.setenv("FCACHE_INDUCTOR_CPU", "bogus")
    with pytest.raises(ConfigError, match="FCACHE_INDUCTOR_CPU"):
        fcache.jit(lambda x: x + 1)


def test_torch_compile_backend_refuses_a_bad_variable_when_torch_looks_it_up() -> None:
    """`torch.compile(f, backend="fcache")` fails at that call, with the message last, not
    at the first call from inside Dynamo."""
    code = "import torch; torch.compile(lambda x: x + 1, backend='fcache'); print('made')"
    env = {**os.environ, "FCACHE_INDUCTOR_CPU": "bogus", "PYTHONPATH": str(ROOT)}
    out = fresh.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and "made" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last == "fcache.errors.ConfigError: FCACHE_INDUCTOR_CPU='bogus' is invalid: " + (
        "expected python or aoti"
    )
    assert "_dynamo/output_graph" not in out.stderr  # not from inside a compile


def test_every_variable_the_config_reads_is_listed_and_sets_a_field() -> None:
    source = Path(config.__file__).read_text().split("# -- what `fcache config` prints")[0]
    read = set(re.findall(r"\"(FCACHE_[A-Z_]+)\"", source))
    listed = {v.name for v in config.VARIABLES}
    assert read == listed
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert {v.field for v in config.VARIABLES if v.field} == fields


def test_describe_says_where_each_value_came_from(tmp_path: Path) -> None:
    env = {"FCACHE_DIR": str(tmp_path), "FCACHE_MAX_BYTES": "512M", "FCACHE_INDUCTOR_CPU": "aoti"}
    described = {d.name: d for d in config.describe(env, {"FCACHE_DIR": "--dir"})}
    assert list(described) == [v.name for v in config.VARIABLES]
    assert (described["FCACHE_DIR"].value, described["FCACHE_DIR"].source) == (
        str(tmp_path),
        "--dir",
    )
    assert (described["FCACHE_MAX_BYTES"].value, described["FCACHE_MAX_BYTES"].source) == (
        "512M",
        "environment",
    )
    assert described["FCACHE_INDUCTOR_CPU"].value == "aoti"
    assert (described["FCACHE_WHOLE"].value, described["FCACHE_WHOLE"].source) == ("1", "default")
    assert described["FCACHE_PROGRESS"].value == "auto"
    assert described["FCACHE_SERVER"].value == "none"
    for text in ("10G", "512M", "3", "1536K"):
        assert config.format_size(parse_size("X", text)) == text


def test_paths_given_as_strings_are_paths() -> None:
    # fcache.jit(settings=Settings(cache_dir="/x")) keeps working with the default key,
    # which is found next to the store: cache_dir / "signing.key".
    settings = Settings(cache_dir="/tmp/fcache-x", signing_key_file="/tmp/k")  # type: ignore[arg-type]
    assert settings.cache_dir == Path("/tmp/fcache-x")
    assert settings.signing_key_file == Path("/tmp/k")


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_lease_timeouts_must_be_finite_and_positive(value: str) -> None:
    with pytest.raises(ConfigError, match="FCACHE_LEASE_TIMEOUT"):
        Settings.from_env({"FCACHE_LEASE_TIMEOUT": value})


def test_verification_is_on_unless_turned_off() -> None:
    assert Settings().verify is True
    assert Settings.from_env({"FCACHE_VERIFY": "0"}).verify is False
    with pytest.raises(ConfigError, match="FCACHE_VERIFY"):
        Settings.from_env({"FCACHE_VERIFY": "maybe"})
