"""Signer: keys from files (strict modes), signatures that bind an artifact to its key."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from fcache.cache.artifact import Artifact, decode, encode
from fcache.cache.signing import MIN_KEY_BYTES, Signer
from fcache.errors import ConfigError, Unverified

KEY_A = "a" * 32
KEY_B = "b" * 32
ARTIFACT = Artifact("inductor", "aoti-1", b"\x7fELF kernel", compile_seconds=3.0)


def key_file(tmp_path: Path, data: bytes | None = None, mode: int = 0o600) -> Path:
    path = tmp_path / "signing.key"
    path.write_bytes(os.urandom(32) if data is None else data)
    path.chmod(mode)
    return path


def test_sign_then_verify_survives_the_envelope(tmp_path: Path) -> None:
    signer = Signer.from_file(key_file(tmp_path))
    signed = signer.sign(KEY_A, ARTIFACT)
    assert signed.signature is not None and signed.signature.key_id == signer.key_id
    signer.verify(KEY_A, decode(encode(signed)))


def test_an_unsigned_entry_is_refused() -> None:
    with pytest.raises(Unverified, match="not signed"):
        Signer(os.urandom(32)).verify(KEY_A, ARTIFACT)


def test_a_signed_artifact_moved_to_another_key_is_refused() -> None:
    # The poisoning case: a real, well-signed artifact planted under a victim's key.
    signer = Signer(os.urandom(32))
    with pytest.raises(Unverified, match="does not match"):
        signer.verify(KEY_B, signer.sign(KEY_A, ARTIFACT))


def test_another_keys_signature_is_refused() -> None:
    mine, theirs = Signer(os.urandom(32)), Signer(os.urandom(32))
    with pytest.raises(Unverified, match="signed with key"):
        mine.verify(KEY_A, theirs.sign(KEY_A, ARTIFACT))


@pytest.mark.parametrize(
    "change",
    [
        {"payload": b"\x7fELF other kernel"},
        {"executor": "nvfuser"},
        {"executor_version": "aoti-2"},
        {"restride": ((0, (4, 1)),)},
        {"meta": {"entry": "x"}},
        {"key": (("format", "other"),)},
    ],
)
def test_any_change_after_signing_is_refused(change: dict[str, object]) -> None:
    signer = Signer(os.urandom(32))
    forged = dataclasses.replace(signer.sign(KEY_A, ARTIFACT), **change)
    with pytest.raises(Unverified):
        signer.verify(KEY_A, forged)


def test_a_key_file_others_can_read_or_the_group_write_is_refused(tmp_path: Path) -> None:
    for mode in (0o604, 0o660, 0o644, 0o620):
        with pytest.raises(ConfigError, match="only its owner"):
            Signer.from_file(key_file(tmp_path, mode=mode))
    Signer.from_file(key_file(tmp_path, mode=0o400))  # stricter is fine
    # A node's key, read by the server's user and the training users through one group
    # (issue #42: the systemd unit's user must read the key its ranks sign with).
    for mode in (0o640, 0o440):
        Signer.from_file(key_file(tmp_path, mode=mode))


def test_a_short_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"at least {MIN_KEY_BYTES} bytes"):
        Signer.from_file(key_file(tmp_path, b"x" * (MIN_KEY_BYTES - 1)))


def test_a_missing_key_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FCACHE_SIGNING_KEY_FILE"):
        Signer.from_file(tmp_path / "absent")
    with pytest.raises(ConfigError, match="--signing-key-file"):
        Signer.from_file(tmp_path / "absent", setting="--signing-key-file")


def test_the_key_id_names_the_key_without_revealing_it(tmp_path: Path) -> None:
    secret = os.urandom(32)
    assert Signer(secret).key_id == Signer(secret).key_id != Signer(os.urandom(32)).key_id
    assert secret.hex()[:16] != Signer(secret).key_id
