"""The rows of tests/reliability/README.md about who and what: version skew (15), key
completeness (16), auth (17), fork (21), stats accuracy (25). Poisoning (18) is in
test_poisoning.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2
from torch._inductor import config

from fcache.cache.artifact import FORMAT_VERSION, Artifact, encode
from fcache.cache.lmdb import LAYOUT, LmdbStore
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.errors import StoreUnavailable
from fcache.executors.inductor import InductorExecutor
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.key import make_key
from fcache.frontend.partition import partition
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats, Counters
from fcache.target import Target
from tests import fresh
from tests.graphs import capture
from tests.reliability.net import FakeServer
from tests.reliability.support import ROOT, key_of, signed, verified
from tests.service.support import RawStub, StartServer, client, health_check
from tests.text_executor import TextExecutor


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _newer(data: bytes) -> bytes:
    """The same envelope as a newer fcache would write it (format version + 1)."""
    return data[:4] + (FORMAT_VERSION + 1).to_bytes(2, "little") + data[6:]


# -- row 15 ----------------------------------------------------------------------------


def test_version_skew(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path
) -> None:
    """Row 15: entries of a newer envelope format are misses (counted) and stay, locally and
    on the server; messages with fields this version does not know are read all the same,
    both ways; an LMDB of the previous release (loose modes, unsigned entries) opens, and
    its entries are refused by a reader holding a key but left in place."""
    # A previous release's store: same layout, 0644 files in a 0755 directory, unsigned.
    old_dir = tmp_path / "previous"
    old = LmdbStore(old_dir, 1 << 30)
    unsigned = encode(Artifact("text", "1", b"old kernel"))
    old.put(key_of(1), unsigned)
    old.put(key_of(2), _newer(signed(signer, key_of(2), 100, seed=2)))
    old.close()
    (old_dir / LAYOUT).chmod(0o755)
    (old_dir / LAYOUT / "data.mdb").chmod(0o644)
    stats = CacheStats()
    store = LmdbStore(old_dir, 1 << 30, stats)
    assert (old_dir / LAYOUT / "data.mdb").stat().st_mode & 0o077 == 0
    keyless = TieredCache([store], store, stats)
    assert keyless.get(key_of(1)) is not None  # without a key: as before
    keyed = TieredCache([store], store, stats, signer=signer)
    assert keyed.get(key_of(1)) is None and keyed.get(key_of(2)) is None
    counted = stats.tier("local")
    assert (counted.unverified, counted.incompatible, counted.corrupt) == (1, 1, 0)
    assert store.contains(key_of(1)) and store.contains(key_of(2))  # left in place
    store.close()

    # A newer-format entry on the server (written there by a newer fcache): a miss, kept.
    server = start_server("--signing-key-file", str(signing_key))
    newer = _newer(signed(signer, key_of(3), 100, seed=3))
    server.terminate()
    store = LmdbStore(server.db, 1 << 30)
    store.put(key_of(3), newer)
    store.close()
    server = start_server("--signing-key-file", str(signing_key), db=server.db,
                          name=server.db.parent.name)  # fmt: skip
    raw = RawStub(server.tcp)
    assert _code(lambda: raw.get(key_of(3))) == grpc.StatusCode.NOT_FOUND
    current = signed(signer, key_of(3), 100, seed=3)
    assert raw.put(raw.upload(key_of(3), current)).stored is False  # the newer one stays
    assert raw.stats().counters["incompatible"] >= 1
    # Unknown fields: a request from a newer client, an answer from a newer server.
    request = pb.GetRequest(key=key_of(4)).SerializeToString() + b"\xf8\x06\x01"  # field 111
    with grpc.insecure_channel(server.tcp) as channel:
        get = channel.unary_stream(wire.method_path("Get"))
        assert _code(lambda: list(get(request, timeout=5))) == grpc.StatusCode.NOT_FOUND
    good = signed(signer, key_of(5), 1000, seed=5)
    info = wire.blob_info(key_of(5), good)
    with_extra = pb.BlobInfo.FromString(info.SerializeToString() + b"\xa2\x06\x03new")
    fake = FakeServer(lambda key: list(wire.transfer(with_extra, good)))
    try:
        assert client(fake.address).get(key_of(5)) == good
    finally:
        fake.stop()


# -- row 16 ----------------------------------------------------------------------------


def _region():  # type: ignore[no-untyped-def]
    (gm,) = capture(lambda x: (x * 2 + 1).relu(), torch.randn(8), backward=False)
    (region,) = partition(gm.graph).regions
    return canonicalize(region)


# Another node: only what keying needs (no capture: the canonical text is given).
_NODE = """
import json, sys
from fcache.executors.inductor import InductorExecutor
from fcache.frontend.canonicalize import parse
from fcache.frontend.key import make_key
from fcache.target import Target
executor, target = InductorExecutor(), Target("cpu", "avx2")
region = parse(sys.stdin.buffer.read())
chain = executor.toolchain(target)
print(json.dumps(make_key(region, target, executor.name, executor.version, chain).digest))
"""


def _inductor_key(target, region=None):  # type: ignore[no-untyped-def]
    executor = InductorExecutor()
    return make_key(
        region or _region(), target, executor.name, executor.version, executor.toolchain(target)
    ).digest


def test_key_completeness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 16: the same region on another "node" (another process, hash seed, cache and
    temp directories, home) has the same key; another ISA or GPU architecture, torch or
    CUDA version, Inductor option or code-changing variable gives another one, so no hit
    crosses configurations; recompiles are byte-identical (sampled with the text executor).
    (The driver is no component: fcache stores cubins for one architecture, sm_XY, which
    any driver that runs that architecture loads.)"""
    canon = _region()
    base = _inductor_key(Target("cpu", "avx2"), canon)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "4242", "HOME": str(tmp_path),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"), "TMPDIR": str(tmp_path)}  # fmt: skip
    other_node = subprocess.run(
        [sys.executable, "-c", _NODE], cwd=tmp_path, env=env, input=canon.text,
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert other_node.returncode == 0, other_node.stderr[-3000:]
    assert json.loads(other_node.stdout.decode().strip().splitlines()[-1]) == base

    variants = {"isa": _inductor_key(Target("cpu", "avx512"))}
    variants["gpu arch"] = _inductor_key(Target("cuda", "sm_90"))
    assert _inductor_key(Target("cuda", "sm_80")) != variants["gpu arch"]
    with config.patch({"max_autotune": not config.max_autotune}):
        variants["option"] = _inductor_key(Target("cpu", "avx2"))
    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    variants["variable"] = _inductor_key(Target("cpu", "avx2"))
    monkeypatch.delenv("TORCHINDUCTOR_FREEZING")
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    variants["torch"] = _inductor_key(Target("cpu", "avx2"))
    monkeypatch.undo()
    monkeypatch.setattr(torch.version, "cuda", "99.0")
    variants["cuda"] = _inductor_key(Target("cuda", "sm_90"))
    monkeypatch.undo()
    assert len({base, *variants.values()}) == len(variants) + 1, variants
    assert _inductor_key(Target("cpu", "avx2")) == base  # and back

    # No hit crosses configurations: an entry under one key is no entry under another.
    stats = CacheStats()
    store = LmdbStore(tmp_path / "cache", 1 << 30, stats)
    cache = TieredCache([store], store, stats)
    cache.put(base, Artifact("inductor", "aoti-1", b"kernel"))
    assert all(cache.get(k) is None for k in variants.values())
    store.close()

    executor, canon = TextExecutor(), _region()
    first = executor.compile(canon, torch.device("cpu"))
    assert executor.compile(_region(), torch.device("cpu")).payload == first.payload


# -- row 17 ----------------------------------------------------------------------------

_OTHER_UID = r"""
import os, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
pid = os.fork()
if pid == 0:
    # A handle on the socket file taken while still root: the way in for a process that
    # could not walk the path itself (the test's directories are 0700): a passed-on file.
    handle = os.open(path, os.O_PATH)
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(f"/proc/self/fd/{handle}")
        # HTTP/2's client preface and an empty SETTINGS frame; gRPC answers with its own.
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        data = sock.recv(64)
        os._exit(3 if data else 4)  # 4: closed at once, refused
    except ConnectionError:
        os._exit(4)
    except OSError:
        os._exit(5)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(code)
"""


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_auth(start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path) -> None:
    """Row 17: a missing or wrong token is UNAUTHENTICATED, a read token cannot write,
    a client trusting another CA cannot connect, another user cannot connect to the Unix
    socket whatever its mode, health stays open; the store is unchanged by all of it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    (tmp_path / "read").write_text("read-token\n")
    (tmp_path / "write").write_text("write-token\n")
    cert, key = _self_signed(tmp_path, "server")
    other_ca, _ = _self_signed(tmp_path, "other")
    server = start_server(
        "--signing-key-file", str(signing_key), "--read-token-file", str(tmp_path / "read"),
        "--write-token-file", str(tmp_path / "write"), "--tls-cert", str(cert),
        "--tls-key", str(key), "--socket-mode", "0666",
    )  # fmt: skip
    writer = RawStub(server.unix, "write-token")
    data = signed(signer, key_of(1), 1000, seed=1)
    writer.put(writer.upload(key_of(1), data))
    before = writer.stats().entries

    attempts = {}
    for who, token in (("none", None), ("wrong", "nope"), ("read", "read-token")):
        stub = RawStub(server.unix, token)
        attempts[who] = (
            _code(lambda s=stub: s.get(key_of(1))) if token != "read-token" else None,
            _code(lambda s=stub: s.put(s.upload(key_of(2), signed(signer, key_of(2), 10)))),
        )
        stub.close()
    assert attempts["none"] == (grpc.StatusCode.UNAUTHENTICATED,) * 2
    assert attempts["wrong"] == (grpc.StatusCode.UNAUTHENTICATED,) * 2
    assert attempts["read"] == (None, grpc.StatusCode.PERMISSION_DENIED)
    assert RawStub(server.unix, "read-token").get(key_of(1))  # reading is what it may do

    # TLS: a client that trusts another CA fails the handshake; the right CA works.
    from fcache.cache.remote import CircuitBreaker, RemoteStore

    wrong = RemoteStore(server.tcp, CacheStats(), timeout_s=3, token="write-token",
                        tls_ca=other_ca.read_bytes(),
                        breaker=CircuitBreaker(failures=99))  # fmt: skip
    with pytest.raises(StoreUnavailable):
        wrong.get(key_of(1))
    right = RemoteStore(server.tcp, CacheStats(), timeout_s=5, token="write-token",
                        tls_ca=cert.read_bytes())  # fmt: skip
    assert right.get(key_of(1)) == data

    # Another uid on the Unix socket, reaching it through a file handle passed on (and the
    # file's mode, 0666 here, allowing it): refused on the kernel's word on who the peer
    # is. The server's own uid is admitted the same way (the control).
    if os.geteuid() == 0:
        path = server.unix.removeprefix("unix:")
        for uid, outcome in (("65534", "4"), ("0", "3")):
            done = subprocess.run([sys.executable, "-c", _OTHER_UID, path, uid],
                                  capture_output=True, text=True, timeout=60)  # fmt: skip
            assert done.stdout.strip() == outcome, (uid, done.stdout, done.stderr)

    with grpc.insecure_channel(server.unix) as channel:  # health: no token needed
        status = health_check(channel)(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    stats = writer.stats()
    assert stats.entries == before  # unchanged
    assert writer.find_missing([key_of(2)]) == [key_of(2)]
    assert stats.counters["rejected"] >= 5
    verified(signer, key_of(1), b"".join(m.chunk for m in writer.get(key_of(1))[1:]))


# -- row 21 ----------------------------------------------------------------------------

_FORK = """
import os, sys
from pathlib import Path
from fcache.cache.artifact import Artifact
from fcache.cache.lmdb import LmdbStore
from fcache.cache.remote import RemoteStore
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.stats import CacheStats

directory, server, key_path = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
signer = Signer.from_file(key_path)
stats = CacheStats()
local = LmdbStore(directory, 1 << 30, stats)
remote = RemoteStore(server, stats)
cache = TieredCache([local, remote], remote, stats, signer=signer)
parent_key, child_key = "a" * 32, "b" * 32
cache.put(parent_key, Artifact("text", "1", b"parent kernel"))
assert cache.get(parent_key)[1] == "local"
assert remote.get(parent_key) is not None  # the channel is open and used
pid = os.fork()
if pid == 0:
    ok = cache.get(parent_key) is not None and remote.get(parent_key) is not None
    cache.put(child_key, Artifact("text", "1", b"child kernel"))
    ok = ok and remote.get(child_key) is not None and local.get(child_key) is not None
    os._exit(0 if ok else 1)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
seen = cache.get(child_key)
print(code, seen[0].payload.decode() if seen else None, cache.get(parent_key)[0].payload.decode())
"""


def test_fork_after_opening_lmdb_and_grpc(
    start_server: StartServer, signing_key: Path, tmp_path: Path
) -> None:
    """Row 21: a process forks with its LMDB environment and gRPC channel open and in use.
    The child reopens both, reads the parent's entries and writes its own; the parent's
    data still verifies, and it sees the child's writes."""
    server = start_server("--signing-key-file", str(signing_key))
    done = fresh.run(
        [sys.executable, "-c", _FORK, str(tmp_path / "cache"), server.unix, str(signing_key)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "child", "kernel", "parent", "kernel"]


# -- row 25 ----------------------------------------------------------------------------

COUNTER_NAMES = {
    "hits", "misses", "puts", "bytes_read", "bytes_written", "evictions", "corrupt", "rejected",
    "errors", "lease_grants", "lease_waits", "compiles", "compile_seconds",
    "compile_seconds_saved", "failures", "invalid", "restrided", "unchecked", "fallbacks",
    "unverified", "conflicts", "duplicates", "incompatible", "stale_readers", "overloaded",
    "reported",
}  # fmt: skip
STATS_KEYS = {"cache_dir", "entries", "bytes", "max_bytes", "tiers", "executors", "fallbacks",
              "dynamic"}  # fmt: skip


def _cli(*args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fcache.cli", *args],
        env={**os.environ, "FCACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_stats_accuracy(
    start_server: StartServer, signing_key: Path, signer: Signer, tmp_path: Path
) -> None:
    """Row 25: a scripted workload; every counter, the client's persisted ones and the
    server's, is exactly what the script did; `fcache stats --json` keeps its schema, and
    `--zero` zeroes."""
    server = start_server("--signing-key-file", str(signing_key))
    stats = CacheStats()
    local = LmdbStore(tmp_path / "cache", 1 << 30, stats)
    remote = client(server.unix, stats)
    cache = TieredCache([local, remote], remote, stats, signer=signer)
    artifact = Artifact("text", "1", b"k" * 1000, compile_seconds=2.0)
    size = len(encode(signer.sign(key_of(1), artifact)))
    for n in range(3):  # 3 puts to both tiers
        cache.put(key_of(n), artifact)
    for n in range(3):  # 3 local hits
        assert cache.get(key_of(n)) is not None
    local.delete(key_of(0))
    assert cache.get(key_of(0))[1] == "remote"  # type: ignore[index]  # 1 local miss, 1 remote hit, 1 local put
    assert cache.get(key_of(9)) is None  # 1 miss in each tier
    local.put(key_of(8), encode(Artifact("text", "1", b"unsigned")))  # refused, counted
    assert cache.get(key_of(8)) is None  # local: 1 unverified miss; remote: 1 miss
    raw = RawStub(server.tcp)
    plant = signed(signer, key_of(1), 1000, seed=7)  # signed, but other contents
    assert _code(lambda: raw.put(raw.upload(key_of(1), plant))) == grpc.StatusCode.ALREADY_EXISTS
    again = raw.get(key_of(2))  # the server's own view: one more hit
    assert raw.put(raw.upload(key_of(2), b"".join(m.chunk for m in again[1:]))).stored is False
    cache.flush_stats()

    expected_local = Counters(hits=3, misses=3, puts=4, bytes_read=3 * size,
                              bytes_written=4 * size, unverified=1,
                              compile_seconds_saved=6.0)  # fmt: skip
    expected_remote = Counters(hits=1, misses=2, puts=3, bytes_read=size,
                               bytes_written=3 * size, compile_seconds_saved=2.0)  # fmt: skip
    assert stats.tier("local") == expected_local
    assert stats.tier("remote") == expected_remote
    counters = raw.stats().counters
    assert {k: counters[k] for k in ("hits", "misses", "puts", "duplicates", "conflicts")} == {
        "hits": 2, "misses": 2, "puts": 3, "duplicates": 1, "conflicts": 1,
    }  # fmt: skip
    assert set(counters) == COUNTER_NAMES
    cache.close()
    local.close()

    report = json.loads(_cli("stats", "--json", cache_dir=tmp_path / "cache").stdout)
    assert set(report) == STATS_KEYS
    assert Counters.from_dict(report["tiers"]["local"]) == expected_local
    assert Counters.from_dict(report["tiers"]["remote"]) == expected_remote
    assert set(report["tiers"]["local"]) == COUNTER_NAMES
    assert report["entries"] == 4  # three, one refilled from the server, the unsigned one
    assert _cli("stats", "--zero", cache_dir=tmp_path / "cache").returncode == 0
    zeroed = json.loads(_cli("stats", "--json", cache_dir=tmp_path / "cache").stdout)
    assert set(zeroed) == STATS_KEYS and zeroed["tiers"] == {} and zeroed["entries"] == 4
