"""Signed entries: which writers' artifacts a reader will load.

A cached kernel is code: a process that loads an artifact runs it (a shared library's
constructors, cubins, generated code). A content checksum cannot tell who wrote an entry,
and the key is not a hash of the artifact (it names the region the artifact was compiled
from), so without more, anyone who can write to a store can make every reader of one of
its keys run their code. Signing closes that: the trusted producers share a signing key
and sign each artifact together with the key it is stored under; a reader loads nothing
whose signature does not verify.

On by default (issue #42): a process with no key file set uses `default_key_path`, the
file `signing.key` in its cache directory, and creates it on first use (`load_or_create`:
32 random bytes, mode 0600, or 0640 owned by the cache's group when the directory is
shared with one). The ranks of one user on one machine therefore share a key with no
step of theirs; other users and other machines need the key file to write anything a
reader will run. Turning verification off takes an explicit setting (FCACHE_VERIFY=0),
which `signer_for` reports loudly.

The signature is HMAC-SHA256 over `fcache.cache.artifact.signed_message`: the cache key,
the envelope format, the executor's name and version, and SHA-256 digests of the payload
and of every other header field. So an artifact planted under another key, or with any
byte of it changed, does not verify, however valid its envelope and checksum are.

HMAC is symmetric: whoever can verify can also sign. Give the key only to processes
trusted to produce kernels (training jobs, compile workers, the node server).

The key file (`FCACHE_SIGNING_KEY_FILE`, `fcache-server --signing-key-file`): its whole
contents are the key, at least 32 bytes, e.g. `head -c 32 /dev/urandom > key`. It must be
a regular file that nobody but its owner can write and that only its owner and its group
can read (0600, 0400, or 0640/0440 for a node's key shared by the server's user and the
training users through one group): a key that other users can read protects nothing, so a
looser mode is refused (ConfigError) rather than used.

`Signer` is immutable and thread-safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import stat
import warnings
from pathlib import Path

from fcache.cache.artifact import Artifact, Signature, signed_message
from fcache.config import Settings, group_id
from fcache.errors import ConfigError, Unverified

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32
ALG = "hmac-sha256"
DEFAULT_KEY_NAME = "signing.key"
# Group write, group execute, anything for others: what a key file must not allow.
_LOOSE = 0o037
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
        file, is writable by others than its owner or readable beyond its group, or is
        too short."""
        try:
            with open(path, "rb") as f:
                info = os.fstat(f.fileno())
                secret = f.read()
        except OSError as exc:
            raise ConfigError(setting, str(path), f"a readable key file ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(setting, str(path), "a regular file")
        if info.st_mode & _LOOSE:
            raise ConfigError(
                setting,
                str(path),
                f"a key file only its owner (and at most its group) can read (mode 0600, "
                f"0400, 0640 or 0440, not {stat.S_IMODE(info.st_mode):04o}; chmod 600 {path})",
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


def default_key_path(settings: Settings) -> Path:
    """The key file a process uses: FCACHE_SIGNING_KEY_FILE, else `signing.key` in the
    cache directory (next to the store, lmdb.v1)."""
    if settings.signing_key_file is not None:
        return settings.signing_key_file
    return settings.cache_dir / DEFAULT_KEY_NAME


def load_or_create(path: Path, group: int | None = None) -> Signer:
    """The key in `path`, made first if there is none: 32 random bytes, mode 0600 (0640
    with `group`, a gid). Racing processes agree on one key: each writes a private
    temporary file and links it into place, which fails for all but the first; the others
    read the winner's. ConfigError if the key cannot be read or made."""
    if not os.path.lexists(path):
        _create(path, group)
    return Signer.from_file(path)


def _create(path: Path, group: int | None) -> None:
    mode = 0o600 if group is None else 0o640
    try:
        path.parent.mkdir(mode=0o700 if group is None else 0o2770, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.write(fd, os.urandom(MIN_KEY_BYTES))
            if group is not None:
                os.fchown(fd, -1, group)
            os.fchmod(fd, mode)  # the umask may have narrowed the group's read
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            log.info("fcache: created the signing key %s (mode %04o)", path, mode)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise ConfigError(
            "FCACHE_SIGNING_KEY_FILE", str(path), f"a key file fcache can create ({exc})"
        ) from None


def signer_for(settings: Settings) -> Signer:
    """The signer of a process with these settings: the key file set, else the default one,
    created on first use. Where no key can be had (the cache directory is unusable and no
    key file is set), a key of this process alone: everything it reads is refused, so
    nothing unverified runs. With verification off (settings.verify False) a warning
    says so, loudly: the caller signs what it writes but checks nothing it reads."""
    if not settings.verify:
        warnings.warn(
            "fcache: FCACHE_VERIFY=0: artifacts read from the caches are NOT verified; "
            "anyone who can write to the cache directory or the server can run code in "
            "this process",
            RuntimeWarning,
            stacklevel=3,
        )
        log.warning("signature verification is off (FCACHE_VERIFY=0)")
    if settings.signing_key_file is not None:
        return Signer.from_file(settings.signing_key_file)
    group = group_id(settings.cache_group) if settings.cache_group else None
    try:
        return load_or_create(default_key_path(settings), group)
    except ConfigError as exc:
        # Logged, not warned: the unusable cache directory behind it has its own warning.
        log.warning(
            "no signing key (%s); using a key of this process only: no stored artifact "
            "verifies, every region compiles here",
            exc,
        )
        return Signer(os.urandom(MIN_KEY_BYTES))
