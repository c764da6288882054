"""The distributed benchmark: torchrun jobs of N ranks under DDP and FSDP2, torch.compile against
fcache, cold and warm, each job in fresh processes (issue #44).

    python -m bench.distributed --nproc 2                     # 2 GPUs: Llama and GPT-2, 16 layers
    python -m bench.distributed --nproc 4 --families hf-llama --wraps fsdp2
    python -m bench.distributed --nproc 2 --smoke             # CPU, gloo, tiny: under 2 minutes

For each family x wrap x system it runs two `torchrun --standalone --nproc-per-node N -m
bench.dist_rank` jobs (bench/dist_rank.py: what each rank does and reports):

- cold: empty caches. torch.compile: one empty Inductor directory for the node's ranks
  (where they would all write by default). fcache: a fresh `fcache-server` for the node
  (the node's one, with the node's one signing key, which the ranks get too), each rank
  its own empty local cache, so that all sharing goes through the server;
- warm: a second job on the same caches (and server); fcache's ranks get an empty
  Inductor directory, to show they need none.

Reported per rank: start (the compile call to the end of the first step), steady step
(median), when the first step ended; per job: the slowest rank's start, the spread of the
first step's end across ranks, and compiles per node against unique regions (fcache:
the ranks' compiles summed, and the distinct region keys among them; torch.compile:
Inductor's graph compiles summed, which count graphs, not regions). With --check (on by
default) each rank compares one more step with the same job without compiling.

On CUDA every rank gets one GPU (LOCAL_RANK) and NCCL, with NVLink multicast off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), as the
project's GPU hosts require. Writes PREFIX.json (rewritten after every job) and PREFIX.md
(bench/dist_report.py); progress goes to stderr, the markdown to stdout. Where a command
has a time limit, run the suite in pieces (--families, --wraps, --systems) and bound each
with --budget: no job starts after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import dist_report, hf, launch, machine
from bench.launch import Caches

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("torch.compile", "fcache", "eager")
WRAPS = ("ddp", "fsdp2")
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
_STDERR_TAIL = 3000


@dataclass(frozen=True)
class Shape:
    layers: int
    dim: int
    heads: int
    vocab: int
    batch: int
    seq: int
    dtype: str
    steps: int

    def argv(self) -> list[str]:
        return [
            arg
            for f in dataclasses.fields(self)
            for arg in (f"--{f.name}", str(getattr(self, f.name)))
        ]


# The shape on the GPU (16 layers, hidden 1024, bf16, 2x2048 tokens per rank); the
# smoke run's on the CPU: nothing in it costs more than process start-up.
SHAPES = {
    "cuda": Shape(16, 1024, 16, 32000, 2, 2048, "bfloat16", 10),
    "cpu": Shape(2, 64, 4, 256, 2, 32, "float32", 3),
    "smoke": Shape(2, 32, 4, 128, 2, 16, "float32", 2),
}


@dataclass(frozen=True)
class Suite:
    nproc: int
    device: str
    shape: Shape
    families: tuple[str, ...]
    wraps: tuple[str, ...]
    systems: tuple[str, ...]
    executors: str | None  # fcache's, e.g. "inductor,eager"; None: fcache's default
    backend: str  # torch.compile's
    check: bool
    timeout_s: float
    budget_s: float | None  # no job starts after it (a device command has 10 minutes)


class Bench:
    """Runs a Suite's jobs and keeps their rows in a document saved after each."""

    def __init__(self, suite: Suite, out: Path, work: Path, command: str) -> None:
        self.suite, self.out, self.work = suite, out, work
        self.started = time.monotonic()
        self.doc: dict[str, Any] = {
            "schema": 1,
            "kind": "distributed",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "run_id": uuid.uuid4().hex[:12],
            "config": dataclasses.asdict(suite),
            "machine": machine.machine(),
            "versions": machine.versions(),
            "complete": False,
            "rows": [],
        }
        self.save()

    def run(self) -> None:
        for family in self.suite.families:
            for wrap in self.suite.wraps:
                for system in self.suite.systems:
                    cell = self.work / f"{family}-{wrap}-{system}"
                    self.system(family, wrap, system, cell)
                    shutil.rmtree(cell, ignore_errors=True)

    def system(self, family: str, wrap: str, system: str, cell: Path) -> None:
        """The cold job, then the warm one on its caches (module docstring)."""
        if system == "fcache":
            key = cell / "signing.key"  # the node's one key: the server's and the ranks'
            cell.mkdir(parents=True, exist_ok=True)
            key.write_bytes(os.urandom(32))
            key.chmod(0o600)
            try:
                with launch.server(cell / "server", ("--signing-key-file", str(key))) as address:
                    for phase in ("cold", "warm"):
                        caches = Caches(cell / "fcache", cell / f"inductor-{phase}", address)
                        extra = {"FCACHE_SIGNING_KEY_FILE": str(key)}
                        if not self.job(family, wrap, system, phase, caches, extra):
                            break
            except RuntimeError as exc:  # the server did not start
                self.record(self.row(family, wrap, system, "cold") | {"error": str(exc)})
            return
        caches = Caches(cell / "fcache", cell / "inductor")
        for phase in ("cold", "warm") if system != "eager" else ("run",):
            if not self.job(family, wrap, system, phase, caches, {}):
                break

    def job(
        self,
        family: str,
        wrap: str,
        system: str,
        phase: str,
        caches: Caches,
        extra: dict[str, str],
    ) -> bool:
        """One torchrun job; its row recorded; whether every rank reported."""
        s = self.suite
        row = self.row(family, wrap, system, phase)
        if s.budget_s is not None and time.monotonic() - self.started > s.budget_s:
            self.record(row | {"error": "skipped: --budget spent"})
            return False
        out = caches.inductor.parent / f"out-{phase}"
        argv = [
            "--system", system, "--wrap", wrap, "--family", family, "--device", s.device,
            "--backend", s.backend, "--out", os.fspath(out), *s.shape.argv(),
        ]  # fmt: skip
        if system == "fcache":
            argv += ["--fcache-root", os.fspath(caches.fcache)]
            if s.executors:
                argv += ["--executors", s.executors]
        if s.check:
            argv.append("--check")
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(s.nproc), "-m", "bench.dist_rank", *argv,
        ]  # fmt: skip
        row["command"] = shlex.join(["torchrun", *command[3:]])
        env = launch.environment(caches) | extra
        if s.device == "cuda":
            env |= MULTICAST_OFF
        logs = self.work / "logs" / f"{len(self.doc['rows']):03d}-{family}-{wrap}-{system}-{phase}"
        ranks, error = _run(command, env, logs, out, s.nproc, s.timeout_s)
        row.update(dist_report.summarize(ranks))
        if error:
            row["error"] = error
        self.record(row)
        return error is None

    def row(self, family: str, wrap: str, system: str, phase: str) -> dict[str, Any]:
        return {
            "kind": "distributed",
            "family": family,
            "wrap": wrap,
            "system": system,
            "phase": phase,
            "nproc": self.suite.nproc,
            "executors": self.suite.executors if system == "fcache" else None,
            "run_id": self.doc["run_id"],
        }

    def record(self, row: dict[str, Any]) -> None:
        self.doc["rows"].append(row)
        self.save()
        print(f"bench: {dist_report.line(row)}", file=sys.stderr, flush=True)

    def save(self) -> None:
        self.doc["ratios"] = dist_report.ratios(self.doc["rows"])
        path = self.out.with_name(self.out.name + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, path)

    def finish(self, complete: bool) -> list[Path]:
        self.doc["complete"] = complete
        self.save()
        md = self.out.with_name(self.out.name + ".md")
        md.write_text(dist_report.markdown(self.doc))
        return [self.out.with_name(self.out.name + ".json"), md]


def _run(
    command: list[str], env: dict[str, str], logs: Path, out: Path, nproc: int, timeout_s: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Run a torchrun job (its own session, killed whole at the timeout); each rank's
    report, and what went wrong, if anything (a rank's last exception line)."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / "stdout.txt", logs / "stderr.txt"
    with stdout.open("wb") as o, stderr.open("wb") as e:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = process.wait(timeout_s)
        except BaseException:  # a timeout, or an interrupt: the job goes down whole
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    if code == 0 and len(ranks) == nproc:
        return ranks, None
    why = f"timeout after {timeout_s:.0f} s" if code is None else f"exit code {code}"
    text = stderr.read_text(errors="replace")
    # torchrun's own summary ends in ChildFailedError; the cause is the rank's exception above it.
    cause = launch._last_exception(
        "\n".join(line for line in text.splitlines() if "ChildFailedError" not in line)
    )
    return ranks, f"{why}, {len(ranks)}/{nproc} ranks reported" + (f": {cause}" if cause else "")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.distributed", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--nproc", type=int, required=True, help="ranks of the node (GPUs on cuda)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda")
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny Llama, text executor")
    p.add_argument("--families", default=None, help="default: hf-llama,hf-gpt2")
    p.add_argument("--wraps", default=",".join(WRAPS), help="ddp,fsdp2 (default: both)")
    p.add_argument("--systems", default="torch.compile,fcache", help=", ".join(SYSTEMS))
    for name in ("layers", "dim", "heads", "vocab", "batch", "seq", "steps"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--executors", help="fcache's executors (default: fcache's own order)")
    p.add_argument("--backend", help="torch.compile's backend (default: inductor)")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with eager")
    p.add_argument("--timeout", type=float, help="seconds one job may take")
    p.add_argument("--budget", type=float, help="seconds after which no job starts")
    p.add_argument("--out", type=Path, help="PREFIX of PREFIX.json and PREFIX.md")
    p.add_argument("--work", type=Path, help="caches and logs (default: a temporary directory)")
    return p


def suite_from(args: argparse.Namespace) -> Suite:
    device = args.device or ("cpu" if args.smoke else "cuda")
    base = SHAPES["smoke" if args.smoke else device]
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)}
    shape = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    families = _listed(args.families or ("hf-llama" if args.smoke else "hf-llama,hf-gpt2"))
    for name, values, allowed in (
        ("--families", families, hf.FAMILIES),
        ("--wraps", _listed(args.wraps), WRAPS),
        ("--systems", _listed(args.systems), SYSTEMS),
    ):
        if not values or set(values) - set(allowed):
            raise SystemExit(f"bench: {name} takes some of {', '.join(allowed)}")
    return Suite(
        nproc=args.nproc,
        device=device,
        shape=shape,
        families=families,
        wraps=_listed(args.wraps),
        systems=_listed(args.systems),
        executors=args.executors or ("text,eager" if args.smoke else None),
        # The smoke run checks the harness, not Inductor: torch.compile's capture only.
        backend=args.backend or ("aot_eager" if args.smoke else "inductor"),
        check=not args.no_check,
        timeout_s=args.timeout or (120.0 if device == "cpu" else 1200.0),
        budget_s=args.budget,
    )


def _listed(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    suite = suite_from(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / f"dist-{suite.device}-n{suite.nproc}-{stamp}"
    work = args.work or Path(tempfile.mkdtemp(prefix="fcache-dist-"))
    command = shlex.join(
        ["python", "-m", "bench.distributed", *(sys.argv[1:] if argv is None else argv)]
    )
    print(f"bench: {suite}\nbench: results -> {out}.json", file=sys.stderr)
    bench = Bench(suite, out, work, command)
    complete = False
    start = time.monotonic()
    try:
        bench.run()
        complete = True
    except KeyboardInterrupt:
        print("bench: interrupted; saving what ran", file=sys.stderr)
    finally:
        paths = bench.finish(complete)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(dist_report.markdown(bench.doc))
    print(
        f"bench: {time.monotonic() - start:.0f} s; wrote " + ", ".join(map(os.fspath, paths)),
        file=sys.stderr,
    )
    failed = any("error" in r for r in bench.doc["rows"])
    return 0 if complete and not failed else 1


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through _run(), which kills the running job


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
