"""The rows of tests/reliability/README.md about the wire: garbage from the remote (7),
uploads with a bad digest or size (8), size boundaries (9), a blackholed store (13), the
daemon absent or killed (14), fuzzing (19), cancellation and overload (20), SIGTERM under
load (23).

Real servers and real gRPC; faults from a server that answers garbage and a TCP proxy
that drops everything on command (tests/reliability/net.py).
"""

from __future__ import annotations

import json
import os
import random
import resource
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from fcache.cache.artifact import Artifact
from fcache.cache.lmdb import LmdbStore
from fcache.cache.remote import CircuitBreaker
from fcache.cache.signing import Signer
from fcache.cache.tiered import TieredCache
from fcache.errors import StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats
from tests.reliability.net import FakeServer, Proxy
from tests.reliability.support import Ledger, MiB, key_of, run_rank, signed, start_rank
from tests.service.support import RawStub, StartServer, client, health_check


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


# -- row 7 -----------------------------------------------------------------------------


def _garbage(signer: Signer, other: Signer) -> dict[str, list[pb.Transfer]]:
    key = key_of(1)
    good = signed(signer, key, 300_000, seed=1)
    info = wire.blob_info(key, good)

    def sent(data: bytes) -> list[pb.Transfer]:  # a whole, checksummed transfer of data
        return list(wire.transfer(wire.blob_info(key, data), data))

    huge = pb.BlobInfo(key=key, size=1 << 40, checksum=b"x" * 16)
    return {
        "truncated": list(wire.transfer(info, good[:-1000]))[:-1],
        "wrong bytes": list(wire.transfer(info, good[:-1] + b"\0")),
        "empty answer": [],
        "chunks before info": list(wire.transfer(info, good))[1:],
        "another key": list(wire.transfer(wire.blob_info(key_of(2), good), good)),
        "declares 1 TiB": [pb.Transfer(info=huge)],
        "not an envelope": sent(b"junk" * 100),
        "signed by another key": sent(signed(other, key, 300_000, seed=1)),
        "signed for another key": sent(signed(signer, key_of(2), 300_000, seed=1)),
    }


def test_garbage_from_the_remote_is_refused_before_any_local_store(
    tmp_path: Path, signer: Signer
) -> None:
    """Row 7: truncated, wrong, empty, misdirected, oversized, unsigned answers. Each is
    refused before anything reaches the local tier, counted, and costs no memory."""
    cases = _garbage(signer, Signer(os.urandom(32)))
    current: list[list[pb.Transfer]] = [[]]
    fake = FakeServer(lambda key: current[0])
    stats = CacheStats()
    local = LmdbStore(tmp_path, 1 << 30, stats)
    remote = client(fake.address, stats, breaker=CircuitBreaker(failures=1000))
    cache = TieredCache([local, remote], remote, stats, signer=signer)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for name, messages in cases.items():
            current[0] = messages
            start = time.monotonic()
            assert cache.get(key_of(1)) is None, name
            with cache.compile_lease(key_of(1)) as ready:  # the lease path too
                assert ready is None, name
            assert time.monotonic() - start < 5, name
    finally:
        fake.stop()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 64, f"the client grew by {grown_mib:.0f} MiB"
    assert local.entries() == []  # nothing reached the local tier
    counted = stats.tier("remote")
    # Each broken transfer on Get and on Lease (an empty Lease answer is a wait that ran
    # out, not a fault); each artifact without a valid signature for the key, on both.
    assert counted.corrupt == 7 * 2 - 1
    assert counted.unverified == 2 * 2
    assert counted.hits == 0
    local.close()


# -- row 8 -----------------------------------------------------------------------------


def test_uploads_with_a_bad_digest_or_size_are_refused_alone(
    start_server: StartServer, signing_key: Path, signer: Signer
) -> None:
    """Row 8: among concurrent uploads, each bad one gets INVALID_ARGUMENT (or, unsigned,
    FAILED_PRECONDITION), the good ones commit, nothing is stored under a bad key."""
    server = start_server("--signing-key-file", str(signing_key))
    raw = RawStub(server.tcp)
    good = {key_of(n): signed(signer, key_of(n), 100_000, seed=n) for n in range(8)}
    data = signed(signer, key_of(100), 100_000, seed=100)
    bad = {
        key_of(100): raw.upload(key_of(100), data, checksum=wire.checksum(b"other")),
        key_of(101): raw.upload(key_of(101), data, size=len(data) + 1),
        key_of(102): raw.upload(key_of(102), data, size=len(data) - 1),
        key_of(103): raw.upload(key_of(103), b"not an envelope"),
        key_of(104): raw.upload(key_of(104), signed(None, key_of(104), 1000)),
        key_of(105): raw.upload(key_of(105), data),  # signed for key_of(100)
    }
    outcomes: dict[str, object] = {}

    def put(key: str, messages: list[pb.Transfer]) -> None:
        try:
            outcomes[key] = raw.put(messages).stored
        except grpc.RpcError as exc:
            outcomes[key] = exc.code()

    threads = [threading.Thread(target=put, args=(k, raw.upload(k, d))) for k, d in good.items()]
    threads += [threading.Thread(target=put, args=item) for item in bad.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(outcomes[k] is True for k in good)
    codes = [outcomes[k] for k in bad]
    assert (
        codes == [grpc.StatusCode.INVALID_ARGUMENT] * 4 + [grpc.StatusCode.FAILED_PRECONDITION] * 2
    )
    assert raw.find_missing(list(bad)) == list(bad)
    ledger = Ledger(dict(good))
    ledger.check(client(server.tcp).get, signer)


# -- row 9 -----------------------------------------------------------------------------


def _envelope_of_size(signer: Signer, key: str, total: int) -> bytes:
    overhead = len(signed(signer, key, 0))
    data = signed(signer, key, total - overhead, seed=total)
    assert len(data) == total
    return data


def test_size_boundaries(start_server: StartServer, signing_key: Path, signer: Signer) -> None:
    """Row 9: 0 B, 4 MiB - 1, 4 MiB, 4 MiB + 1 (gRPC's default message limit) and 64 MiB
    round-trip byte-identical through 1 MiB chunks; an upload declared over the server's
    limit, or over 2 GiB, is refused before its bytes; the server's own limit is exact."""
    server = start_server("--signing-key-file", str(signing_key), "--max-upload-bytes", "65M")
    remote = client(server.unix, timeout_s=60)
    raw = RawStub(server.tcp)
    sizes = [4 * MiB - 1, 4 * MiB, 4 * MiB + 1, 64 * MiB]
    for n, size in enumerate(sizes):
        data = _envelope_of_size(signer, key_of(n), size)
        remote.put(key_of(n), data)
        assert remote.get(key_of(n)) == data
    empty = [pb.Transfer(info=pb.BlobInfo(key=key_of(50), size=0, checksum=wire.checksum(b"")))]
    assert _code(lambda: raw.put(empty)) == grpc.StatusCode.INVALID_ARGUMENT  # 0 B: no envelope
    for declared in (65 * MiB + 1, (2 << 30) + 1):
        info = pb.BlobInfo(key=key_of(51), size=declared, checksum=b"x" * 16)
        start = time.monotonic()
        assert _code(lambda i=info: raw.put([pb.Transfer(info=i)])) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        assert time.monotonic() - start < 5
    exact = _envelope_of_size(signer, key_of(60), 65 * MiB)
    assert raw.put(raw.upload(key_of(60), exact)).stored
    assert raw.find_missing([key_of(50), key_of(51)]) == [key_of(50), key_of(51)]


# -- row 13 ----------------------------------------------------------------------------


def test_a_blackholed_store(start_server: StartServer, signer: Signer, tmp_path: Path) -> None:
    """Row 13: the path to the server drops everything. Look-ups end at their deadline,
    the breaker opens and later calls fail fast, compiles go on (the local tier takes
    them), and use resumes once the path works again."""
    server = start_server()
    proxy = Proxy(server.tcp)
    stats = CacheStats()
    remote = client(proxy.address, stats, timeout_s=0.5,
                    breaker=CircuitBreaker(failures=2, cooldown_s=1.0))  # fmt: skip
    local = LmdbStore(tmp_path, 1 << 30, stats)
    cache = TieredCache([local, remote], remote, stats, signer=signer)
    artifact = Artifact("text", "1", b"kernel", compile_seconds=1.0)
    cache.put(key_of(1), artifact)  # reaches the server through the proxy
    proxy.mode = "blackhole"
    timings = []
    for n in range(2, 6):
        start = time.monotonic()
        assert cache.get(key_of(n)) is None  # a miss: the region compiles...
        cache.put(key_of(n), artifact)  # ...and is kept locally
        timings.append(time.monotonic() - start)
    assert all(t < 2.5 for t in timings)  # at most a deadline or two each
    assert timings[-1] < 0.1  # the breaker is open: no waiting at all
    assert stats.tier("remote").errors >= 2
    assert all(local.contains(key_of(n)) for n in range(2, 6))
    proxy.mode = "forward"
    time.sleep(1.1)  # the cooldown
    local.delete(key_of(1))
    found = cache.get(key_of(1))
    assert found is not None and found[1] == "remote"  # back in use
    proxy.close()
    local.close()


# -- row 14 ----------------------------------------------------------------------------


def test_the_daemon_absent_or_killed_mid_run(
    start_server: StartServer, signing_key: Path, tmp_path: Path
) -> None:
    """Row 14: a process loses its server mid-run (SIGKILL). What the node's LMDB holds it
    reads from there, compiling nothing; what nobody holds it compiles; no region fails
    and every result is right, with the server's absence counted."""
    server = start_server()
    node_cache = str(tmp_path / "node")
    key = ["--key", str(signing_key)]
    first = run_rank("double", node_cache, "--server", server.unix, *key)
    assert first["correct"] and first["compiles"] == 1
    go = tmp_path / "go"
    rank = start_rank(
        "triple", node_cache, "--server", server.unix, *key,
        "--pause", str(go), "--also", "double", "--also", "square",
    )  # fmt: skip
    assert rank.stdout is not None and rank.stdout.readline().strip() == "paused"
    server.kill()  # mid-run: the process has its channel open
    go.touch()
    out, err = rank.communicate(timeout=300)
    assert rank.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["correct"] and report["compiles"] == 1  # "triple", with the server
    warm, cold = report["also"]
    assert warm["correct"] and warm["compiles"] == 0 and warm["hits"] == {"local": 1}
    assert cold["correct"] and cold["compiles"] == 1  # compiled without the server
    assert cold["tiers"]["remote"]["errors"] >= 1  # counted


# -- row 19 ----------------------------------------------------------------------------


def _raw_call(channel: grpc.Channel, method: str, payload: bytes, streaming: bool) -> None:
    path = wire.method_path(method)
    if method == "Put":
        channel.stream_unary(path)(iter([payload]), timeout=10)
    elif streaming:
        list(channel.unary_stream(path)(payload, timeout=10))
    else:
        channel.unary_unary(path)(payload, timeout=10)


def test_fuzzing(start_server: StartServer, signing_key: Path) -> None:
    """Row 19: malformed protobuf, non-hex and `../` keys, a size of 2^64 - 1, a
    FindMissing of a million digests. Each gets INVALID_ARGUMENT (or, past gRPC's message
    limit, RESOURCE_EXHAUSTED), never INTERNAL or UNKNOWN; the server stays up and small."""
    server = start_server("--signing-key-file", str(signing_key))
    rng = random.Random(19)
    allowed = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
    with grpc.insecure_channel(server.tcp) as channel:
        for method, streaming in (("Get", True), ("Put", False), ("FindMissing", False),
                                  ("Lease", True), ("Stats", False)):  # fmt: skip
            for _ in range(60):
                junk = rng.randbytes(rng.randrange(1, 200))
                try:
                    _raw_call(channel, method, junk, streaming)
                except grpc.RpcError as exc:
                    assert exc.code() in allowed, (method, junk, exc.code(), exc.details())
    raw = RawStub(server.tcp)
    for key in ("../" + "0" * 29, "0" * 31 + "\n", "Z" * 32, "0" * 32 + "/..", ""):
        assert _code(lambda k=key: raw.get(k)) == grpc.StatusCode.INVALID_ARGUMENT
        assert _code(lambda k=key: raw.find_missing([k])) == grpc.StatusCode.INVALID_ARGUMENT
    huge = pb.Transfer(info=pb.BlobInfo(key=key_of(1), size=(1 << 64) - 1, checksum=b"x" * 16))
    assert _code(lambda: raw.put([huge])) == grpc.StatusCode.INVALID_ARGUMENT
    million = [f"{n:032x}" for n in range(1_000_000)]
    assert _code(lambda: raw.find_missing(million)) in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    stats = raw.stats()
    assert stats.counters["errors"] == 0  # no internal error among them
    with grpc.insecure_channel(server.tcp) as channel:
        status = health_check(channel)(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    rss_kib = int(Path(f"/proc/{server.pid}/status").read_text().split("VmRSS:")[1].split()[0])
    assert rss_kib < 512 * 1024


# -- row 20 ----------------------------------------------------------------------------


def test_cancellation_and_overload(
    start_server: StartServer, signing_key: Path, signer: Signer
) -> None:
    """Row 20: an upload cancelled halfway leaves nothing; a slow reader does not hold up
    others; past the bound of calls or of bytes in flight, calls get RESOURCE_EXHAUSTED
    (counted) and the server serves again once the load is gone."""
    server = start_server(
        "--signing-key-file", str(signing_key), "--max-concurrent-rpcs", "6",
        "--max-upload-bytes", "16M", "--max-inflight-bytes", "40M",
    )  # fmt: skip
    raw = RawStub(server.tcp)
    big = signed(signer, key_of(1), 12 * MiB, seed=1)
    raw.put(raw.upload(key_of(1), big))

    # Cancelled halfway.
    half = threading.Event()
    messages = raw.upload(key_of(2), signed(signer, key_of(2), 8 * MiB, seed=2))

    def stalled():  # type: ignore[no-untyped-def]
        yield from messages[:5]
        half.set()
        time.sleep(30)

    call = raw._put.future(stalled(), timeout=60)
    assert half.wait(10)
    time.sleep(0.2)
    call.cancel()
    assert raw.find_missing([key_of(2)]) == [key_of(2)]

    # A slow reader of 12 MiB while others are served.
    slow = raw._get(pb.GetRequest(key=key_of(1)), timeout=60)
    next(slow)
    start = time.monotonic()
    other = client(server.tcp)
    other.put(key_of(3), signed(signer, key_of(3), 1000, seed=3))
    assert other.get(key_of(3)) is not None
    assert time.monotonic() - start < 5
    assert b"".join(m.chunk for m in slow) == big  # and the slow one still gets it all

    # Bytes in flight: two stalled 16 MiB uploads hold 32 of 40 MiB; a third is refused.
    stalls = []
    for n in (10, 11):
        data = signed(signer, key_of(n), 16 * MiB - 2000, seed=n)
        first = raw.upload(key_of(n), data)[:2]

        def held(first=first):  # type: ignore[no-untyped-def]
            yield from first
            time.sleep(30)

        stalls.append(raw._put.future(held(), timeout=60))
    time.sleep(0.5)
    third = signed(signer, key_of(12), 16 * MiB - 2000, seed=12)
    assert _code(lambda: raw.put(raw.upload(key_of(12), third))) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert raw.stats().counters["overloaded"] == 1
    # Calls in flight: Lease streams have a bound of their own (issue #42), so that
    # waiters never take the slot their holder's Put needs. The holder and 5 waiters fill
    # the 6; the next Lease is refused and counted, while short calls are still answered.
    holder = client(server.tcp)
    assert holder.acquire(key_of(20), 30.0) is not None  # granted: held open (1 call)
    waiters = [
        raw._lease(pb.LeaseRequest(key=key_of(20), wait_seconds=30), timeout=60) for _ in range(5)
    ]
    for waiter in waiters:
        next(waiter)  # LeaseWaiting: each holds a stream
    extra = raw._lease(pb.LeaseRequest(key=key_of(21), wait_seconds=30), timeout=60)
    assert _code(lambda: next(extra)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raw.stats().counters["overloaded"] == 2  # the upload and the Lease
    for stall in stalls:
        stall.cancel()
    for waiter in waiters:
        waiter.cancel()
    holder.close()
    time.sleep(0.5)
    raw.put(raw.upload(key_of(12), third))  # served again
    assert client(server.tcp).get(key_of(12)) == third


# -- row 23 ----------------------------------------------------------------------------


def test_sigterm_under_load(start_server: StartServer, signing_key: Path, signer: Signer) -> None:
    """Row 23: SIGTERM while writers hammer the server. It drains within its grace and
    exits cleanly, every acknowledged write persists, and the writers' clients work again
    against the restarted server."""
    server = start_server("--signing-key-file", str(signing_key), "--grace", "5")
    ledger = Ledger()
    stop = threading.Event()
    stores = [
        client(server.unix, timeout_s=5.0, breaker=CircuitBreaker(failures=3, cooldown_s=0.5))
        for _ in range(4)
    ]

    def write(i: int) -> None:
        n = i * 100_000
        while not stop.is_set():
            key = key_of(n)
            data = signed(signer, key, 100_000, seed=n)
            try:
                stores[i].put(key, data)
                ledger.ack(key, data)
            except StoreUnavailable:
                time.sleep(0.05)
            n += 1

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    start = time.monotonic()
    assert server.terminate(timeout=20) == 0
    assert time.monotonic() - start < 5 + 3  # the grace, and a little
    acked_at_stop = dict(ledger.acked)
    restarted = start_server(
        "--signing-key-file", str(signing_key), db=server.db, name=server.db.parent.name
    )
    assert restarted.unix == server.unix  # the same socket path: clients reconnect
    deadline = time.monotonic() + 15
    while len(ledger.acked) <= len(acked_at_stop) + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert len(acked_at_stop) > 10
    reader = client(restarted.tcp)
    Ledger(acked_at_stop).check(reader.get, signer)
    assert len(ledger.acked) > len(acked_at_stop)  # the same clients wrote again
    Ledger(ledger.acked).check(reader.get, signer)
