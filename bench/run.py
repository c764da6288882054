"""The benchmark suite: fcache against eager, torch.compile and Thunder, every measurement in
a fresh process, every system on the same model, inputs and machine in one run.

    python -m bench.run --smoke                               # CI: tiny model, < 1 minute
    python -m bench.run --device cpu --depths 2,4 --family llama --mode train
    python -m bench.run --device cuda --depths 16 --systems torch.compile-cold,fcache-cold

What one run measures (each a process of `python -m bench.measure`, which reports):

- Single runs, for each family x mode x depth, each system in turn with its own caches:
  eager; torch.compile-cold (empty Inductor directory); torch.compile-warm (the same
  directory again); torch.compile-regional (each block compiled, empty directory);
  torch.compile-nested (the whole model, each block a nested compile region: torch's
  hierarchical compilation, empty directory);
  fcache-cold (empty FCACHE_DIR and Inductor directory); fcache-warm (the same FCACHE_DIR,
  a fresh Inductor directory); fcache-cudagraphs (as fcache-warm, with FCACHE_CUDA_GRAPHS=1);
  fcache-server (empty FCACHE_DIR and Inductor directory, a fresh fcache-server that one
  earlier `prime` run filled); fcache-blocks (`fcache.jit(model, blocks=True)`: the
  repeated blocks only, empty directories); torch.compile-reduce-overhead
  (mode="reduce-overhead", its own empty directory); thunder (`thunder.jit`). Families:
  the example models (llama, gpt) and Hugging Face ones (hf-llama, hf-gpt2; bench/hf.py).
  fcache systems run once per executor set (--executors). A warm system whose cold run is
  not selected gets a `prime` run first, kept in the JSON with role "prime".
- Multi-process runs: N copies of the same job (--multiproc-depth layers, first family and
  mode, first executor set) started at once, stopped after their first step. Variants:
  fcache-server (a fresh server, each process its own empty local store), fcache-shared
  (one shared empty FCACHE_DIR: LMDB leases are the single flight), fcache-independent and
  torch.compile-independent (each process its own empty directories), torch.compile-shared
  (one shared empty Inductor directory). On CUDA, process i runs on GPU i % gpus. Each is
  told that N processes share the machine, as torchrun tells its ranks (LOCAL_WORLD_SIZE).

A process that fails or passes --timeout becomes a row with an "error"; the suite goes on.
--budget bounds the whole run (for a device command limited to 10 minutes): runs that
would start after it are skipped as error rows, and a running one is stopped at it.
The JSON (machine, versions, command, config, rows, ratios) is rewritten after every row,
so a run that is cut off still leaves its results; the markdown table and PNG plot are
written at the end (`python -m bench.report` renders them again, or merges pieces).
Progress goes to stderr, the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench import hf, launch, machine, report
from bench.launch import Caches

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = (
    "eager",
    "torch.compile-cold",
    "torch.compile-warm",
    "torch.compile-regional",
    "torch.compile-nested",
    "torch.compile-reduce-overhead",
    "fcache-cold",
    "fcache-warm",
    "fcache-cudagraphs",
    "fcache-server",
    "fcache-blocks",
    "thunder",
)
FAMILIES = ("llama", "gpt", *hf.FAMILIES)
VARIANTS = (
    "fcache-server",
    "fcache-shared",
    "fcache-independent",
    "torch.compile-independent",
    "torch.compile-shared",
)
DEFAULT_VARIANTS = VARIANTS[:4]
# The system bench.measure runs for each benchmark system.
_RUNNER_SYSTEM = {
    "eager": "eager",
    "torch.compile-cold": "torch.compile",
    "torch.compile-warm": "torch.compile",
    "torch.compile-regional": "torch.compile-regional",
    "torch.compile-nested": "torch.compile-nested",
    "torch.compile-reduce-overhead": "torch.compile-reduce-overhead",
    "fcache-cold": "fcache",
    "fcache-warm": "fcache",
    "fcache-cudagraphs": "fcache",
    "fcache-server": "fcache",
    "fcache-blocks": "fcache-blocks",
    "thunder": "thunder",
}
# Settings a benchmark system gives fcache on top of its caches.
_SYSTEM_ENV = {"fcache-cudagraphs": {"FCACHE_CUDA_GRAPHS": "1"}}


@dataclass(frozen=True)
class Shape:
    """Model and input size, and how many steady steps to time."""

    dim: int
    heads: int
    vocab: int
    batch: int
    seq: int
    dtype: str
    steps: int

    def argv(self) -> list[str]:
        return [
            "--dim", str(self.dim), "--heads", str(self.heads), "--vocab", str(self.vocab),
            "--batch", str(self.batch), "--seq", str(self.seq), "--dtype", self.dtype,
        ]  # fmt: skip


# GPU: the reference model the project measures against (hidden 1024, bf16, 2x2048
# tokens). CPU: small enough that a cold Inductor compile of a few layers takes about a
# minute on 2 cores. Smoke: nothing real compiles (eager executor).
SHAPES = {
    "cuda": Shape(dim=1024, heads=16, vocab=32000, batch=2, seq=2048, dtype="bfloat16", steps=20),
    "cpu": Shape(dim=64, heads=4, vocab=256, batch=2, seq=64, dtype="float32", steps=10),
    "smoke": Shape(dim=16, heads=2, vocab=32, batch=2, seq=8, dtype="float32", steps=2),
}


@dataclass(frozen=True)
class Suite:
    """Everything one invocation runs."""

    device: str
    shape: Shape
    depths: tuple[int, ...]
    families: tuple[str, ...]
    modes: tuple[str, ...]
    systems: tuple[str, ...]
    executors: tuple[str, ...]  # fcache executor sets, each like "nvfuser" or "inductor,eager"
    multiproc: tuple[int, ...]
    variants: tuple[str, ...]
    multiproc_depth: int
    multiproc_gpus: tuple[int, ...]
    timeout_s: float
    budget_s: float | None
    check: bool
    compile_workers: int | None  # FCACHE_COMPILE_WORKERS of measured processes; None: fcache's
    threads: int | None  # OMP_NUM_THREADS of measured processes; None: inherited


@dataclass(frozen=True)
class Cell:
    family: str
    mode: str
    layers: int

    def __str__(self) -> str:
        return f"{self.family}/{self.mode} L={self.layers}"


class Budget:
    """Deadlines: a run's own timeout, cut short by the whole suite's budget."""

    def __init__(self, timeout_s: float, budget_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.start = time.monotonic()
        self.end = None if budget_s is None else self.start + budget_s

    def deadline(self) -> float | None:
        """time.monotonic() by which the next run must end; None if the budget is spent."""
        now = time.monotonic()
        if self.end is not None and self.end - now < 1.0:
            return None
        own = now + self.timeout_s
        return own if self.end is None else min(own, self.end)

    def spent(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end - 1.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Bench:
    """Runs a Suite, recording rows into a document saved after every row."""

    def __init__(self, suite: Suite, out: Path, work: Path, command: str) -> None:
        self.suite = suite
        self.out = out
        self.work = work
        self.budget = Budget(suite.timeout_s, suite.budget_s)
        self.run_id = uuid.uuid4().hex[:12]
        self.doc: dict[str, Any] = {
            "schema": 1,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "run_id": self.run_id,
            "config": _jsonable(suite),
            "machine": machine.machine(),
            "versions": machine.versions(),
            "complete": False,
            "rows": [],
        }
        report.save_json(self.doc, out)

    # Single runs ---------------------------------------------------------------------------

    def run_singles(self) -> None:
        s = self.suite
        for family in s.families:
            for mode in s.modes:
                for layers in s.depths:
                    cell = Cell(family, mode, layers)
                    celldir = self.work / f"{family}-{mode}-L{layers}"
                    for system in s.systems:
                        for executors in s.executors if system.startswith("fcache") else [None]:
                            self._system(cell, system, executors, celldir)
                    shutil.rmtree(celldir, ignore_errors=True)

    def _system(self, cell: Cell, system: str, executors: str | None, celldir: Path) -> None:
        """One system in one cell, with the cache directories its name promises."""
        tc = celldir / "torch.compile"  # torch.compile-cold fills it, -warm reads it
        fc = celldir / f"fcache-{executors}"  # fcache-cold fills fcache/, -warm reads it
        if system == "torch.compile-warm":
            caches = Caches(tc / "fcache", tc / "inductor")
            self._after_cold(cell, system, None, caches, caches)
        elif system == "torch.compile-cold":
            self._single(cell, system, None, Caches(tc / "fcache", tc / "inductor"))
        # fcache's warm process gets an empty Inductor (and Triton) directory, to show that
        # it needs none, but the CUDA driver's cache its cold twin left, as torch.compile's
        # warm process has in its reused directory: a machine's driver cache outlives a
        # process whichever compiler it runs (cuDNN's attention kernels, seconds to build).
        elif system == "fcache-cold":
            caches = Caches(fc / "fcache", fc / "inductor-1", cuda=fc / "cuda")
            self._single(cell, system, executors, caches)
        elif system in ("fcache-warm", "fcache-cudagraphs"):
            cold, warm = (
                Caches(fc / "fcache", fc / f"inductor-{i}", cuda=fc / "cuda") for i in (1, 2)
            )
            self._after_cold(cell, system, executors, cold, warm)
        elif system == "fcache-server":
            self._server_warm(cell, executors, celldir / f"server-{executors}")
        elif system == "fcache-blocks":  # its own empty directories: a cold start
            own = celldir / f"fcache-blocks-{executors}"
            self._single(cell, system, executors, Caches(own / "fcache", own / "inductor"))
        elif system in (
            "torch.compile-regional",
            "torch.compile-nested",
            "torch.compile-reduce-overhead",
            "eager",
            "thunder",
        ):
            own = celldir / system
            self._single(cell, system, None, Caches(own / "fcache", own / "inductor"))
        else:
            raise ValueError(f"unknown system {system!r}")
        return None

    def _after_cold(
        self, cell: Cell, system: str, executors: str | None, cold: Caches, warm: Caches
    ) -> None:
        """A "-warm" system: its "-cold" twin fills `cold` first (the suite's own run of it
        in this cell, or a prime run), then the measured run reads `warm`."""
        twin = (
            "fcache-cold"
            if system == "fcache-cudagraphs"
            else system.removesuffix("-warm") + "-cold"
        )
        primed = self._has(cell, twin, executors) or self._single(
            cell, twin, executors, cold, role="prime"
        )
        if not primed:
            return self._skip(cell, system, executors, "its cold run failed")
        self._single(cell, system, executors, warm)
        return None

    def _server_warm(self, cell: Cell, executors: str | None, workdir: Path) -> None:
        """A fresh server, filled by one prime run; then the measured run, local store empty."""
        if self.budget.deadline() is None:
            return self._skip(cell, "fcache-server", executors, "budget spent")
        try:
            with launch.server(workdir / "server") as address:
                prime = Caches(workdir / "fcache-prime", workdir / "inductor-prime", address)
                if not self._single(cell, "fcache-server", executors, prime, role="prime"):
                    return self._skip(cell, "fcache-server", executors, "its prime run failed")
                caches = Caches(workdir / "fcache", workdir / "inductor", address)
                self._single(cell, "fcache-server", executors, caches)
        except RuntimeError as exc:  # the server did not start
            self._skip(cell, "fcache-server", executors, str(exc))
        return None

    def _has(self, cell: Cell, system: str, executors: str | None) -> bool:
        """Whether `system` already ran successfully in this cell, filling its caches."""
        return any(
            r.get("kind") == "single"
            and (r["family"], r["mode"], r["layers"]) == (cell.family, cell.mode, cell.layers)
            and r["system"] == system
            and r.get("executors") == executors
            and "error" not in r
            for r in self.doc["rows"]
        )

    def _single(
        self,
        cell: Cell,
        system: str,
        executors: str | None,
        caches: Caches,
        role: str = "measure",
    ) -> bool:
        """One measured process; True if it reported without error."""
        argv = self._argv(cell, _RUNNER_SYSTEM[system], executors, self.suite.shape.steps)
        if self.suite.check:
            argv.append("--check")
        row = self._row(cell, system, executors, role)
        row["argv"] = launch.shown_command(argv)
        deadline = self.budget.deadline()
        if deadline is None:
            row["error"] = "skipped: budget spent"
        else:
            logs = self.work / "logs" / f"{len(self.doc['rows']):03d}-{system}"
            env = launch.environment(caches, **self._knobs()) | _SYSTEM_ENV.get(system, {})
            row["loadavg_1m"] = _load()
            running = launch.launch(argv, env, logs)
            result = launch.collect([running], deadline)[0]
            if "error" in result and self.budget.spent():
                result["error"] += " (stopped at the --budget)"
            # The report's "executors" is fcache's count of regions per executor used.
            if isinstance(used := result.pop("executors", None), dict):
                row["executors_used"] = used
            row.update({k: v for k, v in result.items() if k not in _CONFIG_KEYS})
        self._record(row, f"{cell} {report.label(row)}" + (" (prime)" if role == "prime" else ""))
        return "error" not in row

    def _skip(self, cell: Cell, system: str, executors: str | None, why: str) -> None:
        row = self._row(cell, system, executors, "measure")
        row["error"] = f"skipped: {why}"
        self._record(row, f"{cell} {report.label(row)}")

    def _row(self, cell: Cell, system: str, executors: str | None, role: str) -> dict[str, Any]:
        """The identifying fields of a single run's row."""
        return {
            "kind": "single",
            "family": cell.family,
            "mode": cell.mode,
            "layers": cell.layers,
            "system": system,
            "executors": executors,
            "role": role,
            "run_id": self.run_id,
        }

    def _argv(self, cell: Cell, system: str, executors: str | None, steps: int) -> list[str]:
        argv = [
            "--system", system, "--family", cell.family, "--mode", cell.mode,
            "--layers", str(cell.layers), "--device", self.suite.device,
            "--steps", str(steps), *self.suite.shape.argv(),
        ]  # fmt: skip
        if executors and executors != "default" and system == "fcache":
            argv += ["--executors", executors]
        return argv

    # Multi-process runs ----------------------------------------------------------------------

    def run_multiproc(self) -> None:
        s = self.suite
        if not s.multiproc:
            return
        cell = Cell(s.families[0], s.modes[0], s.multiproc_depth)
        executors = s.executors[0] if s.executors else None
        for n in s.multiproc:
            for gpus in s.multiproc_gpus:
                for variant in s.variants:
                    ex = executors if variant.startswith("fcache") else None
                    workdir = self.work / f"mp-{variant}-{n}-{gpus}"
                    self._batch(cell, variant, ex, n, gpus, workdir)
                    shutil.rmtree(workdir, ignore_errors=True)

    def _batch(
        self, cell: Cell, variant: str, executors: str | None, n: int, gpus: int, workdir: Path
    ) -> None:
        row: dict[str, Any] = {
            "kind": "multiproc",
            "family": cell.family,
            "mode": cell.mode,
            "layers": cell.layers,
            "variant": variant,
            "executors": executors,
            "n": n,
            "gpus": gpus,
            "run_id": self.run_id,
        }
        try:
            if variant == "fcache-server" and self.budget.deadline() is not None:
                with launch.server(workdir / "server") as address:
                    self._start_batch(row, cell, executors, n, gpus, workdir, address)
            else:
                self._start_batch(row, cell, executors, n, gpus, workdir, None)
        except RuntimeError as exc:  # the server did not start
            row["error"] = str(exc)
        self._record(row, f"{cell} N={n} gpus={gpus} {report.label(row)}")

    def _start_batch(
        self,
        row: dict[str, Any],
        cell: Cell,
        executors: str | None,
        n: int,
        gpus: int,
        workdir: Path,
        address: str | None,
    ) -> None:
        """Start N processes at once; the wall time until the last one's first step ended."""
        variant = row["variant"]
        system = "fcache" if variant.startswith("fcache") else "torch.compile"
        shared = variant.endswith("-shared")
        argv = self._argv(cell, system, executors, steps=0)
        row["argv"] = launch.shown_command(argv)
        deadline = self.budget.deadline()
        if deadline is None:
            row["error"] = "skipped: budget spent"
            return
        runs = []
        row["loadavg_1m"] = _load()
        start = time.time()
        for i in range(n):
            own = workdir / ("shared" if shared else f"p{i}")
            # Shared variants share only the cache under test; Inductor stays per process for
            # fcache, and fcache's directory is unused by torch.compile.
            caches = Caches(
                fcache=own / "fcache",
                inductor=(own if system == "torch.compile" else workdir / f"p{i}") / "inductor",
                server=address,
            )
            env = launch.environment(
                caches, cuda_device=i % gpus if gpus else None, local_ranks=n, **self._knobs()
            )
            runs.append(launch.launch(argv, env, self.work / "logs" / f"mp-{variant}-{n}-{i}"))
        results = launch.collect(runs, deadline)
        row.update(_batch_summary(results, start))
        if "error" in row and self.budget.spent():
            row["error"] += " (stopped at the --budget)"

    # Bookkeeping ---------------------------------------------------------------------------

    def _knobs(self) -> dict[str, int | None]:
        return {"compile_workers": self.suite.compile_workers, "threads": self.suite.threads}

    def _record(self, row: dict[str, Any], what: str) -> None:
        self.doc["rows"].append(row)
        report.save_json(self.doc, self.out)
        _progress(self.budget.elapsed(), what, row)

    def finish(self, complete: bool) -> list[Path]:
        self.doc["complete"] = complete
        paths = [report.save_json(self.doc, self.out), *report.write(self.doc, self.out)]
        for r in report.ratios(self.doc["rows"]):
            print(report._ratio_line(r), file=sys.stderr)
        return paths


_CONFIG_KEYS = frozenset(
    {"system", "family", "layers", "mode", "executors_requested", "check", "device", "steps"}
    | {"dim", "heads", "vocab", "batch", "seq", "dtype"}
)


def _batch_summary(results: Sequence[dict[str, Any]], start: float) -> dict[str, Any]:
    """Wall times from the launch of the first process, and what the processes compiled."""
    ok = [r for r in results if "error" not in r]
    summary: dict[str, Any] = {
        "processes": [
            {
                k: r.get(k)
                for k in ("first_step_s", "compiles", "unique_regions", "hits", "error")
                if r.get(k) is not None
            }
            for r in results
        ],
        "failed": len(results) - len(ok),
        "wall_exit_s": round(max(r["exit_unix"] for r in results) - start, 3),
    }
    if ok:
        summary["total_compiles"] = sum(int(r.get("compiles") or 0) for r in ok)
        summary["max_first_step_s"] = max(r["first_step_s"] for r in ok)
    if ok and len(ok) == len(results):
        summary["wall_first_step_s"] = round(max(r["first_step_done_unix"] for r in ok) - start, 3)
    else:
        summary["error"] = f"{len(results) - len(ok)} of {len(results)} processes failed"
    return summary


def _load() -> float:
    """The 1-minute load average as a run starts: other work on the machine shows here."""
    return round(os.getloadavg()[0], 2)


def _progress(elapsed: float, what: str, row: dict[str, Any]) -> None:
    if "error" in row:
        detail = f"ERROR {row['error']}"
    elif row["kind"] == "multiproc":
        detail = (
            f"wall {row['wall_first_step_s']:.2f} s until all first steps, "
            f"{row.get('total_compiles')} compiles"
        )
    else:
        steady = row.get("steady_step_s")
        detail = f"first {row['first_step_s']:.2f} s"
        if "start_s" in row:
            detail = f"start {row['start_s']:.2f} s (call {row['wrap_s']:.2f}), " + detail
        if "compile_load_s" in row:
            detail += f" (capture {row['capture_s']:.2f}, compile/load {row['compile_load_s']:.2f})"
        if steady is not None:
            detail += f", steady {steady * 1e3:.2f} ms"
        if row.get("compiles") is not None:
            detail += f", compiles {row['compiles']}"
    load = f" [load {row['loadavg_1m']}]" if "loadavg_1m" in row else ""
    print(f"[bench +{elapsed:6.0f}s] {what}: {detail}{load}", file=sys.stderr, flush=True)


def _jsonable(suite: Suite) -> dict[str, Any]:
    return dataclasses.asdict(suite)


# --- command line ---------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= 1")
    return values


def _choices(allowed: Sequence[str]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(part.strip() for part in text.split(",") if part.strip())
        unknown = [v for v in values if v not in allowed]
        if not values or unknown:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose from {', '.join(allowed)} (comma-separated)"
            )
        return values

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Columns and GPU commands: bench/README.md.",
    )
    p.add_argument("--smoke", action="store_true", help="a tiny run for CI (under a minute)")
    p.add_argument("--device", default=None, help="cpu (default), cuda")
    p.add_argument("--depths", type=_ints, help="layers, e.g. 2,8,16 (cuda) / 2,4,8 (cpu)")
    p.add_argument(
        "--family", type=_choices(FAMILIES), help=f"{','.join(FAMILIES)} (default: llama,gpt)"
    )
    p.add_argument("--mode", type=_choices(("train", "infer")), help="train,infer (default: both)")
    p.add_argument(
        "--systems",
        type=_choices(SYSTEMS),
        help=f"single-run systems (default: all; CUDA graphs and thunder only on cuda): "
        f"{', '.join(SYSTEMS)}",
    )
    p.add_argument(
        "--executors",
        nargs="+",
        help="fcache executor sets, each run separately: e.g. nvfuser inductor, or default "
        "(fcache's own order) (default: cuda nvfuser inductor; cpu inductor)",
    )
    p.add_argument("--multiproc", type=_ints, help="process counts N, e.g. 2,4,8 (default)")
    p.add_argument("--no-multiproc", action="store_true", help="single runs only")
    p.add_argument(
        "--variants",
        type=_choices(VARIANTS),
        help=f"multi-process variants (default: {', '.join(DEFAULT_VARIANTS)})",
    )
    p.add_argument("--multiproc-depth", type=int, help="layers of the multi-process job")
    p.add_argument(
        "--multiproc-gpus", type=_ints, help="GPUs to spread N processes over (default 1[,2])"
    )
    p.add_argument("--no-singles", action="store_true", help="multi-process runs only")
    p.add_argument("--dim", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--steps", type=int, help="steady steps timed after the first")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with eager")
    p.add_argument(
        "--compile-workers",
        type=int,
        help="FCACHE_COMPILE_WORKERS for measured processes (default: fcache's, min(4, cores))",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="OMP_NUM_THREADS for measured processes (default: inherited; torch uses all cores)",
    )
    p.add_argument("--timeout", type=float, help="seconds one process (or batch) may take")
    p.add_argument("--budget", type=float, help="seconds the whole run may take")
    p.add_argument("--out", type=Path, help="PREFIX of PREFIX.json/.md/.png")
    p.add_argument("--work", type=Path, help="directory for caches and logs (default: temp)")
    p.add_argument("--keep-work", action="store_true", help="keep --work (logs) at the end")
    p.add_argument("--dry-run", action="store_true", help="print the suite and exit")
    return p


def suite_from(args: argparse.Namespace) -> Suite:
    device = args.device or "cpu"
    cuda = device.startswith("cuda")
    smoke = args.smoke
    base = SHAPES["smoke" if smoke else "cuda" if cuda else "cpu"]
    shape = Shape(
        dim=args.dim or base.dim,
        heads=args.heads or base.heads,
        vocab=args.vocab or base.vocab,
        batch=args.batch or base.batch,
        seq=args.seq or base.seq,
        dtype=args.dtype or base.dtype,
        steps=args.steps if args.steps is not None else base.steps,
    )
    depths = args.depths or ((1,) if smoke else (2, 8, 16) if cuda else (2, 4, 8))
    if smoke:
        systems: tuple[str, ...] = ("eager", "fcache-cold", "fcache-warm", "fcache-server")
        variants: tuple[str, ...] = ("fcache-server", "fcache-independent")
    else:
        gpu_only = ("thunder", "torch.compile-reduce-overhead", "fcache-cudagraphs")
        systems = tuple(s for s in SYSTEMS if cuda or s not in gpu_only)
        variants = DEFAULT_VARIANTS
    multiproc: tuple[int, ...] = args.multiproc or ((2,) if smoke else (2, 4, 8))
    if args.no_multiproc:
        multiproc = ()
    gpus = machine.gpu_count() if cuda else 0
    default_gpus = (1, 2) if gpus >= 2 else (1,)
    executors = args.executors or (
        ["eager"] if smoke else ["nvfuser", "inductor"] if cuda else ["inductor"]
    )
    return Suite(
        device=device,
        shape=shape,
        depths=depths,
        families=args.family or (("llama",) if smoke else ("llama", "gpt")),
        modes=args.mode or (("train",) if smoke else ("train", "infer")),
        systems=() if args.no_singles else _in_order(args.systems or systems, SYSTEMS),
        executors=tuple(executors),
        multiproc=multiproc,
        variants=_in_order(args.variants or variants, VARIANTS),
        multiproc_depth=args.multiproc_depth or max(depths),
        multiproc_gpus=(args.multiproc_gpus or default_gpus) if cuda else (0,),
        timeout_s=args.timeout or (120.0 if smoke else 600.0 if cuda else 900.0),
        budget_s=args.budget,
        check=not args.no_check,
        compile_workers=args.compile_workers,
        # Smoke: one thread, so that a busy CI machine does not stall OpenMP's barriers.
        threads=args.threads or (1 if smoke else None),
    )


def _in_order(chosen: Sequence[str], order: Sequence[str]) -> tuple[str, ...]:
    """`chosen` in the canonical order, so that a cold run always precedes its warm one."""
    return tuple(x for x in order if x in chosen)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    suite = suite_from(args)
    if args.dry_run:
        print(_describe(suite))
        return 0
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    default_out = (
        Path(tempfile.mkdtemp(prefix="fcache-smoke-")) / "smoke"
        if args.smoke
        else ROOT / "bench" / "results" / f"{suite.device.split(':')[0]}-{stamp}"
    )
    out = args.out or default_out
    work = args.work or Path(tempfile.mkdtemp(prefix="fcache-bench-"))
    command = shlex.join(["python", "-m", "bench.run", *(sys.argv[1:] if argv is None else argv)])
    print(f"bench: {_describe(suite)}\nbench: results -> {out}.json", file=sys.stderr)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print(
            "bench: warning: PYTHONDONTWRITEBYTECODE is set, so every measured process compiles "
            "torch's Python sources again (seconds per start); see bench/README.md",
            file=sys.stderr,
        )
    signal.signal(signal.SIGTERM, _terminate)
    bench = Bench(suite, out, work, command)
    complete = False
    try:
        if suite.systems:
            bench.run_singles()
        bench.run_multiproc()
        complete = True
    except KeyboardInterrupt:
        print("bench: interrupted; saving what ran", file=sys.stderr)
    finally:
        paths = bench.finish(complete)
        if not args.keep_work and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(report.markdown(bench.doc))
    print("bench: wrote " + ", ".join(map(os.fspath, paths)), file=sys.stderr)
    return 0 if complete else 1


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through collect(), which kills the running processes


def _describe(suite: Suite) -> str:
    s = suite
    singles = len(s.families) * len(s.modes) * len(s.depths)
    per_cell = sum(len(s.executors) if x.startswith("fcache") else 1 for x in s.systems)
    batches = len(s.multiproc) * len(s.multiproc_gpus) * len(s.variants)
    return (
        f"{s.device}; model {dataclasses.asdict(s.shape)}; depths {list(s.depths)}, "
        f"families {list(s.families)}, modes {list(s.modes)}; systems {list(s.systems)}, "
        f"fcache executors {list(s.executors)}: {singles * per_cell} single runs (+ primes); "
        f"multi-process N={list(s.multiproc)} x GPUs {list(s.multiproc_gpus)} x "
        f"{list(s.variants)} at L={s.multiproc_depth}: {batches} batches; "
        f"timeout {s.timeout_s:.0f} s per process, budget "
        + (f"{s.budget_s:.0f} s" if s.budget_s else "none")
        + (f"; OMP_NUM_THREADS={s.threads}" if s.threads else "")
        + (f"; FCACHE_COMPILE_WORKERS={s.compile_workers}" if s.compile_workers else "")
    )


if __name__ == "__main__":
    sys.exit(main())
