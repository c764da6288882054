"""Row 18 of tests/reliability/README.md, the poisoning test: a writer without the signing
key plants a real, well-formed artifact (taken from another key) under a victim's key. The
victim process computes correct results, runs no code from the plant, and counts the
refusal; the server, when it holds the key, refuses the plant outright. And no pickle on a
cache path but the one named in PICKLE_ALLOWED, behind those checks."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import grpc
import pytest

from fcache.cache.artifact import decode, encode
from fcache.cache.lmdb import LmdbStore
from fcache.cache.signing import Signer
from tests.reliability.support import ROOT, key_of, run_rank, sha256, signed
from tests.service.support import RawStub, StartServer


def _plant(server_tcp: str, source: str, victim: str) -> bytes:
    """What the attacker does: read an entry anyone may read, put it under another key."""
    stub = RawStub(server_tcp)
    try:
        messages = stub.get(source)
        data = b"".join(m.chunk for m in messages[1:])
        assert decode(data).signature is not None  # a real producer's signed artifact
        response = stub.put(stub.upload(victim, data))
        assert response.stored
        return data
    finally:
        stub.close()


def test_a_planted_artifact_is_refused_and_the_victim_is_right(
    start_server: StartServer, signing_key: Path, tmp_path: Path
) -> None:
    # The server holds no key: it cannot tell a plant (the worst case for the clients).
    server = start_server()
    producer = run_rank(
        "double", str(tmp_path / "producer"), "--server", server.unix, "--key", str(signing_key),
        "--keys-of", "triple",
    )  # fmt: skip
    assert producer["correct"] and producer["compiles"] == 1
    (source,), (victim,) = producer["keys"], producer["other_keys"]
    plant = _plant(server.tcp, source, victim)

    loaded = tmp_path / "victim-loaded.log"
    report = run_rank(
        "triple", str(tmp_path / "victim"), "--server", server.unix, "--key", str(signing_key),
        "--loaded", str(loaded),
    )  # fmt: skip
    assert report["correct"]  # its own compile, not the plant's "double"
    assert report["compiles"] == 1
    runs = loaded.read_text().split()
    assert sha256(decode(plant).payload) not in runs  # no code from the plant ran
    assert len(runs) == 1  # its own artifact, loaded once
    remote = report["tiers"]["remote"]
    assert remote["unverified"] >= 1  # the refusal, counted
    # Issue #42: the victim reported the plant, the server dropped it, and the victim's
    # own put was stored rather than refused as a conflict (the plant took no hostage).
    assert remote["conflicts"] == 0
    assert report["keys"] == [victim]  # the local tier holds its own artifact only
    local = LmdbStore(tmp_path / "victim", 1 << 30)
    try:
        own = local.get(victim)
        assert own is not None and decode(own).payload != decode(plant).payload
    finally:
        local.close()
    stats = RawStub(server.tcp).stats()
    assert stats.counters["reported"] == 1 and stats.counters["conflicts"] == 0
    assert "a reader refused it" in server.output()  # the alert, in the log
    served = b"".join(m.chunk for m in RawStub(server.tcp).get(victim)[1:])
    assert served == own  # the server now serves the victim's artifact, not the plant


def test_a_server_with_the_key_refuses_the_plant(
    start_server: StartServer, signing_key: Path, signer: Signer
) -> None:
    server = start_server("--signing-key-file", str(signing_key))
    source, victim = key_of(1), key_of(2)
    stub = RawStub(server.tcp)
    assert stub.put(stub.upload(source, signed(signer, source, 10_000, seed=1))).stored
    data = b"".join(m.chunk for m in stub.get(source)[1:])  # a producer's, signed for source
    with pytest.raises(grpc.RpcError) as refused:
        stub.put(stub.upload(victim, data))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    unsigned = encode(dataclasses.replace(decode(data), signature=None))
    with pytest.raises(grpc.RpcError) as refused:  # nor unsigned bytes
        stub.put(stub.upload(victim, unsigned))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert stub.find_missing([victim]) == [victim]  # the store is unchanged
    assert stub.stats().counters["unverified"] == 2
    assert f"refused: entry {victim}" in server.output()  # the alert, in the log
    stub.close()


BANNED_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle"}
BANNED_CALLS = {"torch.load", "eval", "exec", "pickle.loads", "pickle.load"}
# The one exception: a CUDA Inductor payload carries Inductor's own kernel objects (its
# statically launchable autotuners, which Inductor's FX graph cache pickles too). They are
# code, as an AOTInductor package's library is, and only the executor's `load` unpickles
# them: after the envelope's checksum and, with a key, its signature verified (a plant like
# the one above is refused before any executor sees it). Its neighbour inductor_unchecked
# compiles the wrapper's `call` without its size asserts and device guard from that verified
# wrapper source (`exec` into the loaded wrapper's own namespace): no other code.
# A graph-broken function's stored CompilePackage (fcache/engine/whole/package_bytes.py) is
# Dynamo's own record, which torch pickles too; it is read, after the same verification,
# by an unpickler that names only torch's package record classes (its test below).
PICKLE_ALLOWED = {
    "fcache/executors/inductor_python.py",
    "fcache/executors/inductor_unchecked.py",
    "fcache/engine/whole/package_bytes.py",
}


def test_no_pickle_on_any_cache_path() -> None:
    found = []
    for base in ("fcache", "service"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if "_gen" in path.parts or path.relative_to(ROOT).as_posix() in PICKLE_ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Call):
                    names = [ast.unparse(node.func)]
                    if names[0] not in BANNED_CALLS:
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {names[0]}")
                    continue
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in BANNED_MODULES
                ]
    assert found == []
