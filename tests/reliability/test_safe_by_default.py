"""Issue #42, findings 1 and 2, and "trust on by default": in the default set-up (no key
file set anywhere: each process uses its cache directory's own key, made on first use; a
server without a key), a writer lacking the key cannot make a reader run its code, by any
route an artifact takes to a reader, and a plant cannot take a key hostage.

Real fcache processes (tests/reliability/rank.py, which logs the digest of every payload
its executor loads), real fcache-server processes, plants made exactly as an attacker
would: a raw gRPC Put, or a write into the LMDB directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fcache.cache.artifact import decode, encode, refusal
from fcache.cache.lmdb import LmdbStore
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.executors.inductor_python import pack, split
from fcache.stats import CacheStats
from tests.reliability.support import ROOT, key_file, run_rank, sha256
from tests.service.support import RawStub, StartServer


def _put(address: str, key: str, data: bytes) -> None:
    """The attacker's raw gRPC Put (any client may call it: the default socket is open to
    the user's own processes, a TCP listener to anyone with a write token)."""
    stub = RawStub(address)
    try:
        assert stub.put(stub.upload(key, data)).stored
    finally:
        stub.close()


def test_a_planted_inductor_wrapper_runs_no_code_in_the_default_set_up(
    start_server: StartServer, tmp_path: Path
) -> None:
    """Finding 1: a raw gRPC Put of an Inductor wrapper whose source was edited to write a
    file, with a correct envelope and checksum, was loaded by a fresh reader
    (FCACHE_SERVER=unix:...) that had no key set, and the file appeared. Now that reader
    holds its own key by default and runs nothing of the plant; only a reader that turned
    verification off (FCACHE_VERIFY=0) would, which shows the plant is live."""
    server = start_server()  # the default: no key on the server either
    # The attacker compiles the victim's function itself (same code and machine: same
    # key), locally, and edits the wrapper's source.
    attacker = run_rank("double", str(tmp_path / "attacker"), "--executor", "inductor")
    assert attacker["correct"] and attacker["compiles"] == 1
    (key,) = attacker["keys"]
    store = LmdbStore(tmp_path / "attacker", 1 << 30)
    found = decode(store.get(key))  # type: ignore[arg-type]
    store.close()
    header, kernels = split(found.payload)
    marker = tmp_path / "pwned"
    header["source"] = f"open({str(marker)!r}, 'w').write('ran')\n" + header["source"]
    plant = encode(dataclasses.replace(found, payload=pack(header, kernels), signature=None))
    _put(server.unix, key, plant)

    # The control: a reader that turned verification off loads the plant and runs it.
    control = run_rank("double", str(tmp_path / "control"), "--server", server.unix,
                       "--executor", "inductor", "--verify", "0")  # fmt: skip
    assert marker.exists() and control["compiles"] == 0
    marker.unlink()

    victim = run_rank("double", str(tmp_path / "victim"), "--server", server.unix,
                      "--executor", "inductor")  # fmt: skip
    assert not marker.exists()  # no code of the plant ran
    assert victim["correct"] and victim["compiles"] == 1  # it compiled its own
    assert victim["tiers"]["remote"]["unverified"] >= 1  # the refusal, counted


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, str]:
    """What an attacker plants: its own real artifact of "double" (signed with its own
    default key, which no victim holds), the key "triple" gets on this machine, and the
    key of "square" (which the attacker compiled too)."""
    where = tmp_path_factory.mktemp("attacker")
    report = run_rank("double", str(where / "cache"), "--keys-of", "triple", "--also", "square")
    store = LmdbStore(where / "cache", 1 << 30)
    data = store.get(report["keys"][0])
    store.close()
    assert data is not None and decode(data).signature is not None
    (square,) = set(report["also"][0]["keys"]) - set(report["keys"])  # the store lists both
    return report["other_keys"][0], data, square


@pytest.mark.parametrize("route", ["local", "server", "upstream"])
def test_every_route_refuses_a_plant_by_default(
    route: str, plant: tuple[str, bytes, str], start_server: StartServer, tmp_path: Path
) -> None:
    """Trust on by default, in every route an artifact takes to a reader: the shared local
    store (a plant written into the LMDB directory), fcache-server (a raw gRPC Put), and a
    node server reading through from its upstream. No key file is set anywhere."""
    victim_key, data, _ = plant
    cache = tmp_path / "victim"
    args = ["triple", str(cache), "--loaded", str(tmp_path / "loaded.log")]
    if route == "local":
        store = LmdbStore(cache, 1 << 30)
        store.put(victim_key, data)
        store.close()
    elif route == "server":
        server = start_server()
        _put(server.unix, victim_key, data)
        args += ["--server", server.unix]
    else:
        upstream = start_server(name="upstream")
        _put(upstream.unix, victim_key, data)
        node = start_server("--upstream", upstream.unix, name="node")
        args += ["--server", node.unix]
    report = run_rank(*args)
    assert report["correct"] and report["compiles"] == 1
    loaded = (tmp_path / "loaded.log").read_text().split()
    assert sha256(decode(data).payload) not in loaded and len(loaded) == 1  # its own only
    tier = "local" if route == "local" else "remote"
    assert report["tiers"][tier]["unverified"] >= 1


def test_a_plant_cannot_take_a_key_hostage(
    plant: tuple[str, bytes, str], start_server: StartServer, tmp_path: Path
) -> None:
    """Finding 2: with the clients holding a key and the server not, the legitimate Put
    after a plant got ALREADY_EXISTS, the server served the plant for good and every
    reader recompiled; a planted refusal forced the region into eager. Now the reader that
    refuses a plant reports it, the server drops it, the reader's own Put is stored, and
    the next reader hits."""
    victim_key, forged, square = plant  # signed with the attacker's key: no server can tell
    server = start_server()
    node_key = key_file(tmp_path, "node.key")  # the ranks' one key (docs/trust.md)
    # "square" gets an unsigned refusal: a reader trusting it would run square in eager.
    _put(server.unix, square, encode(refusal("text", "1", "compile-failed")))
    _put(server.unix, victim_key, forged)
    common = ["--server", server.unix, "--key", str(node_key), "--also", "square"]
    first = run_rank("triple", str(tmp_path / "first"), *common)
    assert first["compiles"] == 1 and first["also"][0]["compiles"] == 1  # not eager
    assert first["fallbacks"] == 0 and first["also"][0]["fallbacks"] == 0
    assert first["tiers"]["remote"]["conflicts"] == 0  # its Puts were stored
    second = run_rank("triple", str(tmp_path / "second"), *common)
    assert second["compiles"] == 0 and second["also"][0]["compiles"] == 0  # hits
    assert second["correct"] and second["also"][0]["correct"]
    counters = RawStub(server.tcp).stats().counters
    assert counters["reported"] >= 1 and counters["conflicts"] == 0
    signer = Signer.from_file(node_key)
    for key in (victim_key, square):  # the server now holds the ranks' signed artifacts
        served = b"".join(m.chunk for m in RawStub(server.tcp).get(key)[1:])
        signer.verify(key, decode(served))


def test_the_default_key_is_made_once_private_and_shared_by_the_users_ranks(
    tmp_path: Path,
) -> None:
    """The key a process uses by default: `signing.key` in its cache directory, 32 random
    bytes, mode 0600, made by whichever process comes first and then used by all."""
    settings = Settings(cache_dir=tmp_path / "cache")
    first = TieredCache.open(settings, CacheStats())
    path = tmp_path / "cache" / "signing.key"
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_size >= 32
    second = TieredCache.open(settings, CacheStats())
    assert first.signer is not None and second.signer is not None
    assert first.signer.key_id == second.signer.key_id
    first.close()
    second.close()
    # Reported where the settings are shown: path and id, never the key.
    shown = subprocess.run(
        [sys.executable, "-m", "fcache.cli", "config", "--json"],
        env={**os.environ, "FCACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = {row["name"]: row for row in json.loads(shown.stdout)}
    assert report["FCACHE_VERIFY"]["value"] == "1"
    assert report["signing key"]["value"] == str(path)
    assert report["signing key"]["id"] == first.signer.key_id
    assert path.read_bytes().hex() not in shown.stdout


def test_turning_verification_off_takes_an_explicit_setting_and_warns(tmp_path: Path) -> None:
    settings = Settings.from_env({"FCACHE_DIR": str(tmp_path), "FCACHE_VERIFY": "0"})
    assert settings.verify is False
    with pytest.warns(RuntimeWarning, match="NOT verified"):
        cache = TieredCache.open(settings, CacheStats())
    cache.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default says nothing: it is safe
        TieredCache.open(Settings(cache_dir=tmp_path), CacheStats()).close()
    assert Settings.from_env({"FCACHE_DIR": str(tmp_path)}).verify is True
    assert os.path.exists(tmp_path / "signing.key")
