"""RemoteStore's own contract: fast, counted failures behind a circuit breaker, a warning
(repeated, with a count, while the outage lasts), recovery, verified transfers, and a
channel that survives fork."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fcache.cache.remote import CircuitBreaker, RemoteStore
from fcache.config import Settings
from fcache.errors import ConfigError, CorruptArtifact, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.protocol.wire import checksum
from fcache.stats import CacheStats
from tests.service.support import Launcher, ServerProcess, client, envelope, key_of


def test_a_dead_server_fails_fast_counted_and_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stats = CacheStats()
    store = client(
        f"unix:{tmp_path / 'nobody.sock'}",
        stats,
        timeout_s=5,
        breaker=CircuitBreaker(failures=3, cooldown_s=60),
    )
    start = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="fcache.cache.remote"):
        for n in range(20):
            with pytest.raises(StoreUnavailable):
                store.get(key_of(n))
        with pytest.raises(StoreUnavailable, match="circuit open"):
            store.put(key_of(99), envelope(10))
        with pytest.raises(StoreUnavailable, match="circuit open"):
            store.acquire(key_of(99), 10.0)
    assert time.monotonic() - start < 2  # 3 refused connections, then no calls at all
    # 3 calls failed, 19 were skipped by the open breaker: none answered, all are errors.
    assert stats.tier("remote").errors == 22
    # One warning within the minute; test_failures_visible checks that it repeats.
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "nobody.sock" in warnings[0].getMessage()


def test_the_breaker_lets_a_recovered_server_back_in(start_server: Launcher) -> None:
    sock = start_server.socket("later")
    stats = CacheStats()
    store = client(f"unix:{sock}", stats, breaker=CircuitBreaker(failures=2, cooldown_s=0.3))
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            store.get(key_of(1))
    with pytest.raises(StoreUnavailable, match="circuit open"):
        store.get(key_of(1))
    start_server(name="later")  # listens on exactly that socket
    time.sleep(0.35)
    assert store.get(key_of(1)) is None  # a real miss from a live server
    assert stats.tier("remote").errors == 3  # two failed, one skipped while open
    assert stats.tier("remote").misses == 0  # the miss is TieredCache's to count


def test_the_breaker_opens_and_closes() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=2, cooldown_s=10, clock=lambda: now[0])
    assert breaker.failed() == 1 and breaker.allows()
    assert breaker.failed() == 2 and not breaker.allows()
    now[0] = 10.0
    assert breaker.allows()
    assert breaker.failed() == 3 and not breaker.allows()  # one more failure: open again
    now[0] = 20.0
    assert breaker.succeeded() == 3 and breaker.allows()
    assert breaker.failed() == 1 and breaker.allows()


def test_the_channel_is_reopened_after_fork(shared_server: ServerProcess) -> None:
    key, data = key_of(1), envelope(1000)
    store = client(shared_server.tcp)
    store.put(key, data)  # the parent's channel is open now
    pid = os.fork()
    if pid == 0:
        ok = store.get(key) == data
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get(key) == data  # and the parent's still works


def test_connect_reads_token_and_ca_from_settings(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    store = RemoteStore.connect(Settings(server="unix:/x.sock", token_file=token), CacheStats())
    assert store.address == "unix:/x.sock"
    token.write_text("two words\n")
    with pytest.raises(ConfigError, match="token_file"):
        RemoteStore.connect(Settings(server="unix:/x.sock", token_file=token), CacheStats())
    with pytest.raises(ConfigError, match="server"):
        RemoteStore.connect(Settings(), CacheStats())


def test_fetch_server_stats_of_a_dead_server_is_store_unavailable(tmp_path: Path) -> None:
    from fcache.cache.remote import fetch_server_stats

    with pytest.raises(StoreUnavailable):
        fetch_server_stats(f"unix:{tmp_path / 'none.sock'}", Settings(server_timeout_s=2))


def test_import_fcache_loads_neither_grpc_nor_the_stubs() -> None:
    code = (
        "import sys, fcache, fcache.cache.tiered\n"
        "loaded = [m for m in sys.modules if m == 'grpc' or m.startswith('fcache.protocol._gen')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- transfers are verified before anything is returned -----------------------------------


def _info(key: str, data: bytes, **overrides: object) -> pb.BlobInfo:
    info = wire.blob_info(key, data)
    for name, value in overrides.items():
        setattr(info, name, value)
    return info


def _assemble(info: pb.BlobInfo, data: bytes, expected_key: str | None = None) -> bytes:
    assembler = wire.Assembler(info, expected_key)
    for chunk in wire.chunks(data):
        assembler.add(chunk)
    return assembler.finish()


def test_an_intact_transfer_reassembles() -> None:
    data = os.urandom(wire.CHUNK_BYTES * 2 + 5)
    assert len(list(wire.chunks(data))) == 3
    assert _assemble(_info(key_of(1), data), data, key_of(1)) == data
    assert _assemble(_info(key_of(1), b""), b"") == b""


@pytest.mark.parametrize(
    ("overrides", "expected_key", "message"),
    [
        ({"checksum": checksum(b"x")}, None, "checksum mismatch"),
        ({"checksum": b"short"}, None, "5 bytes"),
        ({"size": 99}, None, "received 100 of 99|more than the declared 99"),
        ({"size": 101}, None, "received 100 of 101"),
        ({}, key_of(2), "asked for"),
    ],
)
def test_a_transfer_that_contradicts_its_info_is_corrupt(
    overrides: dict[str, object], expected_key: str | None, message: str
) -> None:
    data = os.urandom(100)
    with pytest.raises(CorruptArtifact, match=message):
        _assemble(_info(key_of(1), data, **overrides), data, expected_key)
