"""ServerConfig: flags over environment over file, validated once, errors that name the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fcache.errors import ConfigError
from service.config import DEFAULT_LISTEN, load
from service.main import main


def test_defaults_need_a_db_and_say_the_tcp_listener_may_be_open() -> None:
    config = load(["--db", "/data/fcache", "--insecure"], {})
    assert config.db == Path("/data/fcache") and config.listen == DEFAULT_LISTEN
    assert config.max_bytes == 50 << 30 and config.max_upload_bytes == 1 << 30
    assert config.upstream is None and config.read_token_file is None
    assert config.signing_key_file is None and config.insecure
    assert (config.max_concurrent_rpcs, config.max_inflight_bytes) == (1024, 1 << 30)
    assert config.socket_mode == 0o660 and config.socket_group is None


def test_a_tcp_listener_without_tokens_is_refused_unless_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--insecure") as info:
        load(["--db", "/d", "--listen", "127.0.0.1:7470"], {})
    assert info.value.name == "listen"
    # The default listener is a Unix socket, so a bare server starts.
    assert load(["--db", "/d"], {}).listen[0].startswith("unix:/")
    assert load(["--db", "/d", "--listen", "unix:/run/f.sock"], {}).listen == ("unix:/run/f.sock",)
    loopback = ["--db", "/d", "--listen", "127.0.0.1:7470"]
    assert load(loopback, {"FCACHE_SERVER_INSECURE": "1"}).insecure
    tokens = tmp_path / "write"
    tokens.write_text("secret\n")
    assert not load(["--db", "/d", "--write-token-file", str(tokens)], {}).insecure


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    file = tmp_path / "server.toml"
    file.write_text('db = "/from/file"\nmax_bytes = "1G"\ngrace_s = 5\nlisten = ["unix:/f.sock"]\n')
    env = {"FCACHE_SERVER_CONFIG": str(file), "FCACHE_SERVER_MAX_BYTES": "2G"}
    flags = ["--max-bytes", "3G", "--listen", "127.0.0.1:0", "--listen", "unix:/a", "--insecure"]
    config = load(flags, env)
    assert config.max_bytes == 3 << 30
    assert config.listen == ("127.0.0.1:0", "unix:/a")
    assert config.db == Path("/from/file") and config.grace_s == 5.0
    config = load([], env)
    assert config.max_bytes == 2 << 30 and config.listen == ("unix:/f.sock",)


def test_json_files_and_comma_separated_listen(tmp_path: Path) -> None:
    file = tmp_path / "server.json"
    file.write_text(json.dumps({"db": "/d", "max_lease_s": 60}))
    env = {"FCACHE_SERVER_LISTEN": "unix:/s.sock, [::1]:7470", "FCACHE_SERVER_GRACE": "2"}
    env["FCACHE_SERVER_INSECURE"] = "true"
    config = load(["--config", str(file)], env)
    assert config.listen == ("unix:/s.sock", "[::1]:7470")
    assert config.max_lease_s == 60.0 and config.grace_s == 2.0


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--db", "/d", "--max-bytes", "lots"], {}, "--max-bytes"),
        (["--db", "/d"], {"FCACHE_SERVER_MAX_BYTES": "-1"}, "FCACHE_SERVER_MAX_BYTES"),
        (["--db", "/d", "--listen", "nowhere"], {}, "--listen"),
        (["--db", "/d", "--listen", "unix:relative.sock"], {}, "--listen"),
        (["--db", "/d", "--upstream", "host:99999"], {}, "--upstream"),
        (["--db", "/d", "--read-token-file", "/no/such/file"], {}, "--read-token-file"),
        (["--db", "/d", "--grace", "soon"], {}, "--grace"),
        (["--db", "/d", "--log-level", "LOUD"], {}, "--log-level"),
        ([], {}, "db"),
        (["--db", "/d", "--max-bytes", "1M", "--max-upload-bytes", "2M"], {}, "max_upload_bytes"),
        (["--db", "/d", "--max-lease", "0"], {}, "max_lease_s"),
        (["--db", "/d", "--signing-key-file", "/no/such/key"], {}, "--signing-key-file"),
        (["--db", "/d", "--max-concurrent-rpcs", "0"], {}, "--max-concurrent-rpcs"),
        (["--db", "/d", "--socket-mode", "0066"], {}, "--socket-mode"),
        (["--db", "/d", "--socket-group", "no-such-group-x"], {}, "--socket-group"),
        (["--db", "/d", "--insecure", "--max-inflight-bytes", "1M"], {}, "max_inflight_bytes"),
        (["--db", "/d"], {"FCACHE_SERVER_INSECURE": "maybe"}, "FCACHE_SERVER_INSECURE"),
    ],
)
def test_bad_values_name_their_setting(argv: list[str], env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(argv, env)
    assert info.value.name == named


def test_a_bad_file_key_names_file_and_key(tmp_path: Path) -> None:
    file = tmp_path / "server.toml"
    file.write_text('db = "/d"\nmax_bytez = "1G"\n')
    with pytest.raises(ConfigError, match="max_bytez") as info:
        load(["--config", str(file)], {})
    assert str(file) in info.value.name
    file.write_text('db = "/d"\nmax_bytes = "big"\n')
    with pytest.raises(ConfigError) as info:
        load(["--config", str(file)], {})
    assert info.value.name == f"{file}: max_bytes"


def test_tls_needs_certificate_and_key(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="tls_cert/tls_key"):
        load(["--db", "/d", "--tls-cert", str(cert)], {})


def test_upstream_credentials_need_an_upstream(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    with pytest.raises(ConfigError, match="upstream_token_file"):
        load(["--db", "/d", "--upstream-token-file", str(token)], {})


def test_main_reports_a_bad_setting_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--db", "/d", "--max-bytes", "0"]) == 2
    assert "--max-bytes='0' is invalid" in capsys.readouterr().err
