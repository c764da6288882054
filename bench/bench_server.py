"""Get and Put latency and throughput of fcache-server, over a Unix socket and over TCP.

    python -m bench.bench_server            # the full run, saved under bench/results/
    python -m bench.bench_server --quick    # a smoke run (a few seconds), not saved

One real server process (`python -m service.main`, what `fcache-server` runs) on a
fresh LMDB store. For each transport x artifact size (64 KiB, 1 MiB, 16 MiB) x clients
(1, 16), every client -- a process of its own, as ranks are -- puts its own artifacts,
then all clients get them back. Clients start each phase together (a barrier).

- latency: one call as the client sees it, through fcache's own client (RemoteStore):
  chunking, the checksum on both sides, the server's envelope check and its LMDB commit
  (fsync) for a Put; the server's envelope check and the client's checksum for a Get.
- throughput: the bytes all clients moved in a phase, divided by the phase's wall time
  (first start to last end across clients).

Results: a table on stdout, and bench_server.json / bench_server.md in --out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import fcache
from fcache.cache.artifact import Artifact, encode
from fcache.cache.remote import RemoteStore
from fcache.stats import CacheStats

ROOT = Path(__file__).resolve().parents[1]
KiB, MiB = 1 << 10, 1 << 20
SIZES = (64 * KiB, 1 * MiB, 16 * MiB)
CLIENTS = (1, 16)


@dataclass(frozen=True)
class Plan:
    budget_bytes: int  # bytes per phase and cell, before the bounds below
    min_ops: int  # per client: enough calls for a p99 in the small cells
    max_ops: int

    def ops(self, size: int, clients: int) -> int:
        return max(self.min_ops, min(self.max_ops, self.budget_bytes // (size * clients)))


FULL = Plan(budget_bytes=512 * MiB, min_ops=4, max_ops=200)
QUICK = Plan(budget_bytes=16 * MiB, min_ops=2, max_ops=10)


@dataclass(frozen=True)
class Row:
    transport: str
    size: int
    clients: int
    op: str
    calls: int
    p50_ms: float
    p99_ms: float
    mib_per_s: float
    calls_per_s: float


# -- the server ------------------------------------------------------------------------


@contextmanager
def running_server(workdir: Path) -> Iterator[dict[str, str]]:
    """A fresh fcache-server; yields {"tcp": addr, "unix": addr}; SIGTERM at the end."""
    ready = workdir / "ready.json"
    args = [
        sys.executable, "-m", "service.main",
        "--db", str(workdir / "db"),
        "--listen", "127.0.0.1:0",
        "--listen", f"unix:{workdir / 'fcache.sock'}",
        "--insecure",  # an open loopback listener for the benchmark's own clients
        "--max-bytes", "8G",
        "--ready-file", str(ready),
        "--log-level", "WARNING",
    ]  # fmt: skip
    server = subprocess.Popen(args, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("fcache-server did not start")
            time.sleep(0.05)
        tcp, unix = json.loads(ready.read_text())["addresses"]
        yield {"tcp": tcp, "unix": unix}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


# -- one client process ----------------------------------------------------------------


def _client(
    address: str, keys: list[str], size: int, barrier: mp.synchronize.Barrier, out: mp.Queue
) -> None:
    store = RemoteStore(address, CacheStats(), timeout_s=120)
    data = encode(Artifact("bench", "1", os.urandom(size)))
    store.find_missing(keys[:1])  # connect before the clock starts
    result: dict[str, object] = {}
    for op in ("put", "get"):
        barrier.wait()
        latencies = []
        start = time.perf_counter()
        for key in keys:
            began = time.perf_counter()
            if op == "put":
                store.put(key, data)
            elif store.get(key) != data:
                raise RuntimeError(f"get {key} returned other bytes")
            latencies.append(time.perf_counter() - began)
        result[op] = {"latencies": latencies, "span": (start, time.perf_counter())}
    result["bytes"] = len(data)
    out.put(result)


def run_cell(address: str, size: int, clients: int, ops: int, cell: int) -> list[dict]:
    """Every client's latencies and spans for one transport x size x clients."""
    ctx = mp.get_context("fork")  # the parent holds no gRPC channel, so forking is safe
    barrier, out = ctx.Barrier(clients), ctx.Queue()
    procs = []
    for c in range(clients):
        keys = [f"{cell:08x}{c:08x}{n:016x}" for n in range(ops)]
        procs.append(ctx.Process(target=_client, args=(address, keys, size, barrier, out)))
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a client exited with {p.exitcode}")
    return results


def summarize(transport: str, size: int, clients: int, results: list[dict]) -> list[Row]:
    rows = []
    for op in ("put", "get"):
        latencies = sorted(x for r in results for x in r[op]["latencies"])
        start = min(r[op]["span"][0] for r in results)
        end = max(r[op]["span"][1] for r in results)
        moved = sum(len(r[op]["latencies"]) * r["bytes"] for r in results)
        rows.append(
            Row(
                transport=transport,
                size=size,
                clients=clients,
                op=op,
                calls=len(latencies),
                p50_ms=round(_percentile(latencies, 50) * 1e3, 3),
                p99_ms=round(_percentile(latencies, 99) * 1e3, 3),
                mib_per_s=round(moved / MiB / (end - start), 1),
                calls_per_s=round(len(latencies) / (end - start), 1),
            )
        )
    return rows


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[int(rank) - 1]


# -- report ----------------------------------------------------------------------------


def machine() -> dict[str, object]:
    model = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {"python": platform.python_version(), "fcache": fcache.__version__}
    for dist in ("grpcio", "protobuf", "lmdb", "xxhash"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "os": platform.platform(terse=True),
        "versions": versions,
    }


def _size_label(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


def table(rows: list[Row]) -> str:
    lines = [
        "| transport | size | clients | op | calls | p50 ms | p99 ms | MiB/s | calls/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.transport} | {_size_label(r.size)} | {r.clients} | {r.op} | {r.calls} "
            f"| {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.mib_per_s:.1f} | {r.calls_per_s:.1f} |"
        )
    return "\n".join(lines)


def save(out_dir: Path, command: str, rows: list[Row], info: dict[str, object]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    payload = {"command": command, "date": when, "machine": info, "rows": [asdict(r) for r in rows]}
    (out_dir / "bench_server.json").write_text(json.dumps(payload, indent=2) + "\n")
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())  # type: ignore[attr-defined]
    (out_dir / "bench_server.md").write_text(
        f"# fcache-server: Get and Put latency and throughput\n\n"
        f"`{command}`, {when}.\n\n"
        f"Machine: {info['cpus']} CPUs ({info['cpu_model']}), {info['os']}; "
        f"server and clients on the same machine, LMDB on local disk.\n"
        f"Versions: {versions}.\n\n"
        f"{table(rows)}\n\n"
        "Latency is one RemoteStore call as a client sees it (Put includes the server's\n"
        "checksum and envelope checks and its LMDB commit with fsync; Get includes the\n"
        "server's envelope check and the client's checksum). Throughput is the bytes all\n"
        "clients moved in the phase over its wall time. Each client is its own process.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; nothing saved")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    rows: list[Row] = []
    workdir = Path(tempfile.mkdtemp(prefix="fcache-bench-"))
    try:
        with running_server(workdir) as addresses:
            cell = 0
            for transport in ("unix", "tcp"):
                for size in SIZES:
                    for clients in CLIENTS:
                        cell += 1
                        ops = plan.ops(size, clients)
                        results = run_cell(addresses[transport], size, clients, ops, cell)
                        new = summarize(transport, size, clients, results)
                        rows.extend(new)
                        print("\n".join(table(new).splitlines()[2:]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(rows))
    if not args.quick:
        command = "python -m bench.bench_server" + (" " + " ".join(argv) if argv else "")
        save(args.out, command, rows, machine())
        print(f"\nsaved {args.out / 'bench_server.json'} and bench_server.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
