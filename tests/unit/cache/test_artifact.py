"""The artifact envelope: a round trip is exact, and every kind of damage is CorruptArtifact."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
import xxhash

from fcache.cache.artifact import (
    FORMAT_VERSION,
    MAGIC,
    PREAMBLE_SIZE,
    Artifact,
    Signature,
    decode,
    encode,
    signed_message,
)
from fcache.errors import CorruptArtifact, NewerFormat
from fcache.protocol.wire import checksum

ARTIFACT = Artifact(
    executor="inductor",
    executor_version="2.13.0",
    payload=bytes(range(256)) * 4,
    compile_seconds=1.25,
    producer={"torch": "2.13.0", "triton": "3.6.0"},
    key=(("format", "fcache-key-1"), ("region", "0" * 32), ("target", "cpu:avx2")),
    region='{"inputs":[],"nodes":[],"outputs":[],"version":1}',
    meta={"entry": "call", "note": "ünïcode"},
)


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


def test_round_trip_is_exact() -> None:
    assert decode(encode(ARTIFACT)) == ARTIFACT


def test_an_envelope_from_before_the_key_field_reads_with_an_empty_key() -> None:
    import json

    header = json.dumps(
        {"executor": "eager", "executor_version": "1", "compile_seconds": 0.0, "producer": {},
         "meta": {}},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip
    body = header + b"payload"
    preamble = struct.pack(
        "<4sHHIQ16s", MAGIC, FORMAT_VERSION, 0, len(header), 7, xxhash.xxh3_128(body).digest()
    )
    old = decode(preamble + body)
    assert (old.key, old.region, old.payload) == ((), "", b"payload")


def test_round_trip_of_empty_payload_and_maps() -> None:
    bare = Artifact(executor="eager", executor_version="0", payload=b"")
    assert decode(encode(bare)) == bare


def test_encoding_is_deterministic() -> None:
    reordered = Artifact(
        executor=ARTIFACT.executor,
        executor_version=ARTIFACT.executor_version,
        payload=ARTIFACT.payload,
        compile_seconds=ARTIFACT.compile_seconds,
        producer=dict(reversed(list(ARTIFACT.producer.items()))),
        key=ARTIFACT.key,
        region=ARTIFACT.region,
        meta=dict(reversed(list(ARTIFACT.meta.items()))),
    )
    assert encode(reordered) == encode(ARTIFACT)


def test_decode_accepts_a_memoryview() -> None:
    assert decode(memoryview(encode(ARTIFACT))) == ARTIFACT


def test_checksum_tells_envelopes_apart() -> None:
    data = encode(ARTIFACT)
    assert checksum(data) == checksum(bytes(data))
    assert checksum(data) != checksum(_flip(data, len(data) - 1))


def test_preamble_layout_matches_the_docstring() -> None:
    data = encode(ARTIFACT)
    magic, version, reserved, hlen, plen = struct.unpack_from("<4sHHIQ", data)
    assert (magic, version, reserved) == (MAGIC, FORMAT_VERSION, 0)
    assert plen == len(ARTIFACT.payload)
    assert len(data) == PREAMBLE_SIZE + hlen + plen
    assert data[-plen:] == ARTIFACT.payload


def _damaged() -> dict[str, bytes]:
    data = encode(ARTIFACT)
    version_zero = data[:4] + struct.pack("<H", 0) + data[6:]
    return {
        "empty": b"",
        "shorter than the preamble": data[: PREAMBLE_SIZE - 1],
        "truncated payload": data[:-1],
        "truncated to the header": data[: PREAMBLE_SIZE + 10],
        "extra bytes": data + b"\x00",
        "flipped payload bit": _flip(data, len(data) - 7),
        "flipped header bit": _flip(data, PREAMBLE_SIZE + 3),
        "flipped checksum bit": _flip(data, 20),
        "flipped length bit": _flip(data, 8),
        "wrong magic": b"FCB\x01" + data[4:],
        "version 0": version_zero,
    }


@pytest.mark.parametrize("kind", sorted(_damaged()))
def test_damage_is_corrupt_artifact(kind: str) -> None:
    with pytest.raises(CorruptArtifact):
        decode(_damaged()[kind])


def test_valid_checksum_over_an_unreadable_header_is_corrupt() -> None:
    # A writer bug rather than bit rot: the checksum matches, the header is not JSON.
    header, payload = b"not json", b"x"
    digest = xxhash.xxh3_128(header + payload).digest()
    preamble = struct.pack("<4sHHIQ16s", MAGIC, FORMAT_VERSION, 0, len(header), 1, digest)
    with pytest.raises(CorruptArtifact, match="unreadable header"):
        decode(preamble + header + payload)


def test_a_newer_format_is_not_corrupt() -> None:
    # A newer fcache's entry: a miss to this one, never "corrupt" (which would delete it).
    data = encode(ARTIFACT)
    newer = data[:4] + struct.pack("<H", FORMAT_VERSION + 1) + data[6:]
    with pytest.raises(NewerFormat, match="version 2"):
        decode(newer)
    assert not issubclass(NewerFormat, CorruptArtifact)


def test_a_signed_envelope_round_trips_and_older_readers_ignore_the_signature() -> None:
    import json

    signed = replace(ARTIFACT, signature=Signature(key_id="ab" * 8, mac="cd" * 32))
    data = encode(signed)
    assert decode(data) == signed
    # The same format version: the signature is one more header field, which a reader that
    # does not know it skips (decode reads the fields it knows by name).
    _, version, _, hlen, _ = struct.unpack_from("<4sHHIQ", data)
    assert version == FORMAT_VERSION
    header = json.loads(data[PREAMBLE_SIZE : PREAMBLE_SIZE + hlen])
    assert header["signature"] == {"alg": "hmac-sha256", "key_id": "ab" * 8, "mac": "cd" * 32}
    unsigned = encode(ARTIFACT)
    unsigned_hlen = struct.unpack_from("<I", unsigned, 8)[0]
    others = {k: v for k, v in header.items() if k != "signature"}
    assert others == json.loads(unsigned[PREAMBLE_SIZE : PREAMBLE_SIZE + unsigned_hlen])


def test_signed_message_covers_key_payload_executor_and_every_header_field() -> None:
    base = signed_message("a" * 32, ARTIFACT)
    variants = [
        signed_message("b" * 32, ARTIFACT),
        signed_message("a" * 32, replace(ARTIFACT, payload=ARTIFACT.payload + b"x")),
        signed_message("a" * 32, replace(ARTIFACT, executor="nvfuser")),
        signed_message("a" * 32, replace(ARTIFACT, executor_version="other")),
        signed_message("a" * 32, replace(ARTIFACT, restride=((0, (1,)),))),
        signed_message("a" * 32, replace(ARTIFACT, meta={"entry": "other"})),
        signed_message("a" * 32, replace(ARTIFACT, compile_seconds=9.0)),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # ...and not the signature itself, which is what it is computed for.
    assert signed_message("a" * 32, replace(ARTIFACT, signature=Signature("x", "y"))) == base
