"""Helpers for the fault tests: signing keys, signed artifacts, the ledger of acknowledged
writes, a size-limited file system, and fresh fcache processes.

"Nothing lost" is checked the same way everywhere: every write a store or server
acknowledged is recorded in a `Ledger`, and at the end each is either read back whole and
verified (envelope, checksum, signature for its key), or its absence is accounted for by a
counted eviction. "Nothing unverified executed": every byte a test reads goes through
`verified`, and the processes that load kernels log the digest of each payload they load.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fcache.cache import artifact
from fcache.cache.signing import Signer
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]

# `python -c STALE_READERS PATH N [--hold | --jitter]`: N processes open the LMDB
# environment at PATH and are SIGKILLed inside a read transaction, leaving stale reader
# slots; prints "killed N". --hold prints "ready" once all are reading and kills them at
# the next line on stdin (then waits for one more); --jitter kills after 0-0.2 s.
STALE_READERS = """
import os, random, signal, sys, time
import lmdb

path, n, mode = sys.argv[1], int(sys.argv[2]), (sys.argv[3:] or [""])[0]
ready_r, ready_w = os.pipe()
children = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        env = lmdb.open(path, max_dbs=8, map_size=1 << 40)
        txn = env.begin()  # inside a read transaction...
        txn.get(b"x")
        os.write(ready_w, b"r")
        time.sleep(3600)  # ...until SIGKILL
        os._exit(0)
    children.append(pid)
for _ in children:
    os.read(ready_r, 1)
if mode == "--hold":
    print("ready", flush=True)
    sys.stdin.readline()
elif mode == "--jitter":
    time.sleep(random.random() * 0.2)
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
print("killed", len(children), flush=True)
if mode == "--hold":
    sys.stdin.readline()
"""
MiB = 1 << 20


def key_of(n: int) -> str:
    return f"{n:032x}"


def key_file(directory: Path, name: str = "signing.key") -> Path:
    """A fresh signing key, as the README says to make one: 32 random bytes, mode 0600."""
    path = directory / name
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def signed(signer: Signer | None, key: str, size: int, seed: int = 0, **fields: object) -> bytes:
    """An envelope of `size` payload bytes (deterministic per seed), signed for `key`."""
    payload = random.Random(seed).randbytes(size)
    fields.setdefault("compile_seconds", 1.0)
    found = artifact.Artifact("text", "1", payload, **fields)  # type: ignore[arg-type]
    if signer is not None:
        found = signer.sign(key, found)
    return artifact.encode(found)


def verified(signer: Signer | None, key: str, data: bytes) -> artifact.Artifact:
    """Decode and, with a signer, check the signature for key: what a reader must do."""
    found = artifact.decode(data)
    if signer is not None:
        signer.verify(key, found)
    return found


@dataclass
class Ledger:
    """Writes that were acknowledged, by key: the bytes the writer was told are stored."""

    acked: dict[str, bytes] = field(default_factory=dict)

    def ack(self, key: str, data: bytes) -> None:
        self.acked.setdefault(key, data)  # first write wins: later ones were duplicates

    def check(self, read: object, signer: Signer | None, evictions: int = 0) -> tuple[int, int]:
        """Every acknowledged key reads back identical and verified, or is missing; at most
        `evictions` may be missing (those the store counted). (present, missing)."""
        missing = 0
        for key, data in self.acked.items():
            got = read(key)  # type: ignore[operator]
            if got is None:
                missing += 1
                continue
            assert got == data, f"{key}: other bytes than acknowledged"
            verified(signer, key, got)
        assert missing <= evictions, f"{missing} acknowledged entries lost, {evictions} evicted"
        return len(self.acked) - missing, missing


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at path (root only); skips the test where the machine does
    not allow mounting one (not root, no tmpfs, a container without the capability)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a size-limited file system needs root to mount a tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "fcache-test", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path, leave: int = 0) -> Path:
    """Write a ballast file until the file system has at most `leave` bytes free."""
    ballast = directory / "ballast"
    with open(ballast, "ab") as f:
        chunk = b"\0" * MiB
        while True:
            free = shutil.disk_usage(directory).free
            if free <= leave:
                break
            try:
                f.write(chunk[: max(1, min(len(chunk), free - leave))])
                f.flush()
            except OSError:
                break
    return ballast


def start_rank(*args: str) -> Any:
    """One fresh fcache process (tests/reliability/rank.py), left running: its stdout and
    stderr are pipes."""
    return fresh.popen(
        [sys.executable, "-m", "tests.reliability.rank", *args],
        cwd=ROOT,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_rank(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    """One fresh fcache process (tests/reliability/rank.py); its JSON summary."""
    done = fresh.run(
        [sys.executable, "-m", "tests.reliability.rank", *args],
        cwd=ROOT,
        env={**_clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
