"""TLS on TCP listeners: a client that trusts the CA round-trips; a plaintext one cannot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fcache.cache.remote import CircuitBreaker, RemoteStore
from fcache.config import Settings
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats
from tests.service.support import StartServer, client, envelope, key_of

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_round_trip_and_plaintext_refused(start_server: StartServer, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server = start_server("--tls-cert", str(cert), "--tls-key", str(key))
    settings = Settings(server=server.tcp, tls_ca=cert, server_timeout_s=5)
    secure = RemoteStore.connect(settings, CacheStats())
    data = envelope(1000)
    secure.put(key_of(1), data)
    assert secure.get(key_of(1)) == data

    stats = CacheStats()
    plain = client(server.tcp, stats, timeout_s=2, breaker=CircuitBreaker(failures=99))
    with pytest.raises(StoreUnavailable):
        plain.get(key_of(1))
    assert stats.tier("remote").errors == 1
    # The Unix socket stays plaintext: only local processes reach it.
    assert client(server.unix).get(key_of(1)) == data
