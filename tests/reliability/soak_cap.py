"""The storage soak of issue #42: writers and readers killed with SIGKILL, again and again,
against one shared local LMDB store and one fcache-server, both with a small cap. Every
store's data.mdb must stay within 1.5x its cap, and no acknowledged write may be lost.

    python -m tests.reliability.soak_cap --seconds 300 --out DIR   # writes DIR/soak.json

`make test` runs a short version (test_bounds.py::test_short_soak); the 5-minute run's
result is committed under bench/results/.

The two stores are checked differently, each as strictly as its semantics allow:

- local: each writer owns 16 keys and overwrites them (the working set, 48 keys x 64-256
  KiB, fits the cap: no eviction is allowed at all). A writer logs "intent" before a put
  and "ack" after it returns; at the end each key must hold its writer's last acknowledged
  value or a later intended one (a writer killed between commit and log).
- server: fresh keys (first write wins there), so the cap evicts; every acknowledged key
  must read back identical, or be missing by one of the evictions the server counted.

Readers: every two seconds a batch of processes open the local store's environment, begin
a read transaction each, and are SIGKILLed together up to 0.2 s later; their slots are
left for the store to find. A writer is SIGKILLed and replaced at the same pace.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from fcache.cache.lmdb import LAYOUT, LmdbStore
from fcache.cache.remote import RemoteStore
from fcache.stats import CacheStats
from tests.reliability.support import STALE_READERS
from tests.service.support import Launcher

ROOT = Path(__file__).resolve().parents[2]
CAP = 16 << 20
KEYS_PER_WRITER = 16

WRITER = """
import os, random, sys, time
from pathlib import Path
from fcache.cache.artifact import Artifact, encode
from fcache.cache.lmdb import LmdbStore
from fcache.cache.remote import RemoteStore
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats

cache_dir, server, log_path, writer, cap = sys.argv[1:6]
writer, cap = int(writer), int(cap)
rng = random.Random(os.getpid())
local = LmdbStore(Path(cache_dir), cap)
remote = RemoteStore(server, CacheStats(), timeout_s=20)
log = open(log_path, "a", buffering=1)
n = 0
while True:
    key = f"{writer:08x}{rng.randrange(16):024x}"
    data = encode(Artifact("text", "1", os.urandom(rng.randrange(64 << 10, 256 << 10))))
    digest = __import__("hashlib").sha256(data).hexdigest()
    log.write(f"intent L {key} {digest}\\n")
    try:
        local.put(key, data)
        log.write(f"ack L {key} {digest}\\n")
    except StoreUnavailable as exc:
        log.write(f"refused L {key} {exc}\\n")
    fresh = f"{writer + 1000:08x}{os.getpid():08x}{n:016x}"
    try:
        remote.put(fresh, data)
        log.write(f"ack R {fresh} {digest}\\n")
    except StoreUnavailable as exc:
        log.write(f"refused R {fresh} {exc}\\n")
    n += 1
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


def _size(db: Path) -> int:
    try:
        return (db / LAYOUT / "data.mdb").stat().st_size
    except OSError:
        return 0


def run(seconds: float, work: Path, writers: int = 3, readers: int = 8) -> dict[str, object]:
    """Run the soak for `seconds` in `work` (a new directory); the report (see module doc).
    Raises AssertionError when a store outgrew 1.5x its cap or an acknowledged write is
    lost."""
    work.mkdir(parents=True, exist_ok=True)
    launcher = Launcher(work)
    server = launcher("--max-bytes", str(CAP))
    cache_dir = work / "node"
    LmdbStore(cache_dir, CAP).close()  # the environment exists before readers open it
    logs = work / "logs"
    logs.mkdir()
    env = _env()

    def writer(w: int) -> subprocess.Popen[bytes]:
        args = [str(cache_dir), server.unix, str(logs / f"w{w}.log"), str(w), str(CAP)]
        return subprocess.Popen([sys.executable, "-c", WRITER, *args], env=env,
                                stderr=(logs / f"w{w}.err").open("ab"))  # fmt: skip

    def readers_killed(n: int) -> None:
        command = [sys.executable, "-c", STALE_READERS, str(cache_dir / LAYOUT), str(n), "--jitter"]
        subprocess.run(command, env=env, check=True, timeout=60, stdout=subprocess.DEVNULL)

    rng = random.Random(42)
    procs = [writer(w) for w in range(writers)]
    peak = {"local": 0, "server": 0}
    kills = {"writers": 0, "readers": 0}
    end = time.monotonic() + seconds
    next_round = 0.0
    try:
        while time.monotonic() < end:
            now = time.monotonic()
            peak["local"] = max(peak["local"], _size(cache_dir))
            peak["server"] = max(peak["server"], _size(server.db))
            if now >= next_round:
                next_round = now + 2.0
                # A batch of readers inside read transactions, SIGKILLed together.
                readers_killed(readers)
                kills["readers"] += readers
                victim = rng.randrange(writers)  # a writer killed mid-write, most likely
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                procs[victim] = writer(victim)
                kills["writers"] += 1
            time.sleep(0.05)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    peak["local"] = max(peak["local"], _size(cache_dir))
    peak["server"] = max(peak["server"], _size(server.db))
    report = _check(cache_dir, server.unix, logs)
    launcher.stop_all()
    report.update(
        seconds=seconds,
        cap_bytes=CAP,
        peak_bytes=peak,
        peak_over_cap={k: round(v / CAP, 3) for k, v in peak.items()},
        kills=kills,
    )
    assert all(v <= 1.5 * CAP for v in peak.values()), report
    return report


def _check(cache_dir: Path, server: str, logs: Path) -> dict[str, object]:
    local_intents: dict[str, list[str]] = {}
    local_acked: dict[str, str] = {}
    remote_acked: dict[str, str] = {}
    refused = {"L": 0, "R": 0}
    for path in sorted(logs.glob("w*.log")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue  # a line cut by the kill
            kind, tier, key = parts[:3]
            if kind == "refused":
                refused[tier] += 1
            elif len(parts) != 4 or len(parts[3]) != 64:
                continue
            elif kind == "intent":
                local_intents.setdefault(key, []).append(parts[3])
            elif tier == "L":
                local_acked[key] = parts[3]
                local_intents[key] = [parts[3]]  # later intents follow this ack
            else:
                remote_acked[key] = parts[3]
    store = LmdbStore(cache_dir, CAP)
    lost_local = []
    for key, digest in local_acked.items():
        data = store.get(key)
        allowed = {digest, *local_intents.get(key, [])}
        if data is None or hashlib.sha256(data).hexdigest() not in allowed:
            lost_local.append(key)
    local_entries = len(store.entries())
    store.close()
    stats = CacheStats()
    remote = RemoteStore(server, stats, timeout_s=20)
    missing = [k for k in remote_acked if remote.get(k) is None]
    wrong = [
        k
        for k in remote_acked
        if k not in missing and hashlib.sha256(remote.get(k) or b"").hexdigest() != remote_acked[k]
    ]
    evictions = int(remote.server_stats()["counters"]["evictions"])  # type: ignore[index]
    remote.close()
    report: dict[str, object] = {
        "local": {"acknowledged_keys": len(local_acked), "entries": local_entries,
                  "lost": len(lost_local), "refused": refused["L"]},
        "server": {"acknowledged": len(remote_acked), "missing": len(missing),
                   "evictions": evictions, "wrong": len(wrong), "refused": refused["R"]},
    }  # fmt: skip
    assert not lost_local, (report, lost_local[:5])
    assert not wrong and len(missing) <= evictions, report
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fcache-soak-") as work:
        report = run(args.seconds, Path(work) / "run")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
