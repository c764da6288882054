"""share_torch_compile's storage contract, without compiling: torch's keys in a namespace
of their own, torch's bytes opaque inside fcache's envelope, every read verified, and a
store that fails or holds the wrong entry is a miss, never an exception in torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fcache.cache.artifact import Artifact, decode, encode
from fcache.cache.signing import Signer
from fcache.cache.torch_entries import artifact, cache_name, fcache_key, unwrap, wrap
from fcache.config import Settings
from fcache.errors import StoreUnavailable
from fcache.protocol.limits import is_valid_key
from fcache.share import TorchCacheBackend, TorchCacheSharing, share_torch_compile

KEY = "pt2:fx-graph-v1::fabc123:c1"
VALUE = json.dumps({"data": "AAAA", "time_taken_ms": 2500}).encode()


class FakeStore:
    address = "unix:/fake"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.reported: list[str] = []
        self.down = False

    def get(self, key: str) -> bytes | None:
        if self.down:
            raise StoreUnavailable("down")
        return self.data.get(key)

    def put(self, key: str, data: bytes) -> None:
        if self.down:
            raise StoreUnavailable("down")
        self.data[key] = data

    def report_bad(self, key: str, data: bytes, why: str) -> None:
        self.reported.append(key)

    def close(self) -> None:
        pass


@pytest.fixture
def sharing(tmp_path: Path) -> TorchCacheSharing:
    store = FakeStore()
    settings = Settings(server="unix:/fake", cache_dir=tmp_path)  # its key: tmp_path/signing.key
    return TorchCacheSharing(settings, store)  # type: ignore[arg-type]


def test_keys_are_fcache_keys_in_a_namespace_of_their_own() -> None:
    key = fcache_key(KEY)
    assert is_valid_key(key)
    assert key != fcache_key("pt2:autograd-experimental::fabc123:c1")
    assert cache_name(KEY) == "fx-graph-v1"
    assert cache_name("pt2:autograd-experimental::a1:c1") == "autograd-experimental"
    assert cache_name("something else") == "unknown"


def test_values_travel_opaque_in_the_envelope() -> None:
    data = wrap(KEY, VALUE, "2.13.0")
    artifact = decode(data)
    assert artifact.payload == VALUE and artifact.executor == "torch"
    assert artifact.meta == {"torch_key": KEY, "cache": "fx-graph-v1"}
    assert artifact.compile_seconds == 2.5
    assert unwrap(KEY, data) == VALUE


def test_a_round_trip_through_the_backend(sharing: TorchCacheSharing) -> None:
    backend = TorchCacheBackend(sharing)
    assert backend.get(KEY) is None
    backend.put(KEY, VALUE)
    assert backend.get(KEY) == VALUE
    counters = sharing.counters()["torch:fx-graph-v1"]
    assert (counters.hits, counters.misses, counters.puts) == (1, 1, 1)
    assert counters.bytes_read == counters.bytes_written == len(VALUE)


def test_an_entry_for_another_key_or_a_corrupt_one_is_a_counted_miss(
    sharing: TorchCacheSharing,
) -> None:
    store: FakeStore = sharing.store  # type: ignore[assignment]
    signer = Signer.from_file(sharing.settings.cache_dir / "signing.key")
    key = fcache_key(KEY)
    other = "pt2:fx-graph-v1::fother:c1"
    store.data[key] = encode(signer.sign(key, artifact(other, VALUE, "2.13.0")))
    assert sharing.get(KEY) is None
    store.data[key] = encode(signer.sign(key, Artifact("inductor", "1", VALUE)))
    assert sharing.get(KEY) is None
    flipped = bytearray(encode(signer.sign(key, artifact(KEY, VALUE, "2.13.0"))))
    flipped[-1] ^= 1
    store.data[key] = bytes(flipped)
    assert sharing.get(KEY) is None
    assert sharing.counters()["torch:fx-graph-v1"].corrupt == 3


def test_an_unsigned_entry_is_refused_reported_and_never_handed_to_torch(
    sharing: TorchCacheSharing,
) -> None:
    # Issue #42: torch unpickles what it gets, so this route verifies signatures too.
    store: FakeStore = sharing.store  # type: ignore[assignment]
    store.data[fcache_key(KEY)] = wrap(KEY, VALUE, "2.13.0")  # well-formed, unsigned
    assert sharing.get(KEY) is None
    assert sharing.counters()["torch:fx-graph-v1"].unverified == 1
    assert store.reported == [fcache_key(KEY)]
    sharing.put(KEY, VALUE)  # our own, signed: read back
    assert sharing.get(KEY) == VALUE


def test_a_server_that_fails_is_a_miss_and_a_dropped_write(sharing: TorchCacheSharing) -> None:
    store: FakeStore = sharing.store  # type: ignore[assignment]
    store.down = True
    assert sharing.get(KEY) is None
    sharing.put(KEY, VALUE)  # no exception reaches torch
    assert sharing.counters()["torch:fx-graph-v1"].puts == 0


def test_a_server_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FCACHE_SERVER", raising=False)
    with pytest.raises(Exception, match="fcache-server address"):
        share_torch_compile()
