"""Signed entries: which writers' artifacts a reader will load.

A cached kernel is code: a process that loads an artifact runs it (a shared library's
constructors, cubins, generated code). A content checksum cannot tell who wrote an entry,
and the key is not a hash of the artifact (it names the region the artifact was compiled
from), so without more, anyone who can write to a store can make every reader of one of
its keys run their code. Signing closes that: the trusted producers share a signing key
and sign each artifact together with the key it is stored under; a reader that holds the
key loads nothing whose signature does not verify.

The signature is HMAC-SHA256 over `fcache.cache.artifact.signed_message`: the cache key,
the envelope format, the executor's name and version, and SHA-256 digests of the payload
and of every other header field. So an artifact planted under another key, or with any
byte of it changed, does not verify, however valid its envelope and checksum are.

HMAC is symmetric: whoever can verify can also sign. Give the key only to processes
trusted to produce kernels (training jobs, compile workers, the node server); processes
that must not publish should not hold it (they can still use the cache unsigned, and then
trust whatever is in it, or use a server that holds the key and verifies for them).

The key file (`FCACHE_SIGNING_KEY_FILE`, `fcache-server --signing-key-file`): its whole
contents are the key, at least 32 bytes, e.g. `head -c 32 /dev/urandom > key`. It must be
a regular file readable by its owner only (mode 0600 or 0400): a key that other users can
read protects nothing, so a looser mode is refused (ConfigError) rather than used.

`Signer` is immutable and thread-safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import stat
from pathlib import Path

from fcache.cache.artifact import Artifact, Signature, signed_message
from fcache.errors import ConfigError, Unverified

MIN_KEY_BYTES = 32
ALG = "hmac-sha256"
_KEY_ID_DOMAIN = b"fcache-key-id-v1\x00"


class Signer:
    """Signs and verifies artifacts with one secret key."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(f"a signing key needs at least {MIN_KEY_BYTES} bytes")
        self._secret = bytes(secret)
        # Names the key without revealing it: a reader can tell "signed with another key"
        # from "tampered with" in its log.
        self.key_id = hashlib.sha256(_KEY_ID_DOMAIN + self._secret).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id})"

    @classmethod
    def from_file(cls, path: Path, setting: str = "FCACHE_SIGNING_KEY_FILE") -> Signer:
        """The key in `path`; ConfigError (naming `setting`) if the file is not a regular
        file, is readable or writable by others than its owner, or is too short."""
        try:
            with open(path, "rb") as f:
                info = os.fstat(f.fileno())
                secret = f.read()
        except OSError as exc:
            raise ConfigError(setting, str(path), f"a readable key file ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(setting, str(path), "a regular file")
        if info.st_mode & 0o077:
            raise ConfigError(
                setting,
                str(path),
                f"a key file only its owner can read (mode 0600 or 0400, not "
                f"{stat.S_IMODE(info.st_mode):04o}; chmod 600 {path})",
            )
        if len(secret) < MIN_KEY_BYTES:
            raise ConfigError(
                setting,
                str(path),
                f"a key of at least {MIN_KEY_BYTES} bytes (head -c 32 /dev/urandom > {path})",
            )
        return cls(secret)

    def sign(self, key: str, artifact: Artifact) -> Artifact:
        """The artifact with this key's signature over it stored under `key`."""
        mac = hmac.new(self._secret, signed_message(key, artifact), hashlib.sha256).hexdigest()
        return dataclasses.replace(artifact, signature=Signature(self.key_id, mac, ALG))

    def verify(self, key: str, artifact: Artifact) -> None:
        """Return if `artifact` carries this key's valid signature for `key`; else raise
        Unverified, saying why (unsigned, another key, or a mismatch)."""
        sig = artifact.signature
        if sig is None:
            raise Unverified(f"entry {key} is not signed")
        if sig.alg != ALG:
            raise Unverified(f"entry {key} is signed with {sig.alg!r}, not {ALG}")
        if sig.key_id != self.key_id:
            raise Unverified(f"entry {key} is signed with key {sig.key_id}, not {self.key_id}")
        expected = hmac.new(self._secret, signed_message(key, artifact), hashlib.sha256)
        if not hmac.compare_digest(expected.hexdigest(), sig.mac):
            raise Unverified(f"entry {key}: the signature does not match the key or contents")
