"""The architecture survey: does fcache train each Hugging Face architecture right, store
it whole, and start a second process without compiling?

    python -m bench.survey                                  # every family, CPU, Inductor
    python -m bench.survey --executors text --out DIR       # every family, in minutes
    python -m bench.survey --families hf-llama,hf-bert --device cuda --layers 4 --dim 512 \\
        --heads 8 --vocab 32000 --seq 1024

Each family of bench/hf.py (`--families all`, the default: the matrix's and the survey's
architectures, random weights from configs) runs in two fresh processes, one after the
other (bench.launch's environment: no FCACHE_* variable of the caller's, OMP_NUM_THREADS
from --threads, one thread by default on a CPU): *cold*, on an empty fcache directory of
its own, then *warm*, on the same fcache directory; each process has an empty Inductor
directory of its own, so only fcache's store can make the warm one warm. Each process:

- builds the model twice (train mode, dropout off, the same weights), at `--layers`,
  `--dim`, `--heads`, `--vocab`, `--seq` (tokens; an image of about that many patches; audio
  of that many frames), batch `--batch`, in `--dtype` (float32 by default);
- `fcache.jit(model, executors=...)`, then two training steps (the loss: the logits'
  mean square, as tests/models/test_matrix.py's) against the eager copy: the loss of each
  step and every parameter's gradient (relative to its norm, or to 1e-3 of the largest
  gradient's norm: test_matrix's `grad_error`);
- then `eval()` and `torch.no_grad()`: the logits against eager's;
- prints one JSON line: `fcache.stats` after the training steps and after inference,
  Dynamo's graph breaks (distinct reasons), and what fcache logged at INFO and above
  (whether the function was stored whole, as Dynamo's package of its frames, or declined,
  and why).

`--executors`: fcache's executors, comma-separated (`default`: fcache's order for the
device). `text` is the test suite's text executor (tests/text_executor.py, imported into
the measured processes only when named): each region runs op by op but is stored like a
compiled artifact, so everything but code generation is exercised (capture, canonical
forms, keys, the store, validation, stitching, whole functions) in seconds per model;
`--executors text` surveys every family on 2 CPU cores in about half an hour.
`--timeout` bounds each process (a Mamba on its pure-torch scan can be slow); `--jobs N`
runs N families at once (the timings then share the machine). Progress, one line per
family, goes to stderr.

Columns (one row per family):

- **grad error**: the largest gradient error of the two steps, cold or warm;
- **correct?**: the loss (relative 1e-5), every gradient (1e-4) and the inference logits
  (relative to their largest, 1e-4) within tolerance in both processes (5e-2 in bfloat16),
  or what was not;
- **compiles / unique / instances**: the cold process's training steps: regions compiled,
  distinct region keys, region instances in its graphs;
- **fallbacks**: regions run in eager although an executor was asked for, with reasons,
  and validation failures (the cold process, training and inference);
- **graph breaks**: distinct Dynamo graph-break reasons in the cold process (listed under
  the table);
- **whole: stored / loaded**: what the cold process stored of the training function:
  `function` (captured whole), `package` (graph-broken: Dynamo's package of its frames) or
  `declined` (a marker: later processes take torch.compile's route; why, under the table);
  and whether the warm process loaded it (`loaded`: no Dynamo, `traced`: it ran Dynamo);
- **warm compiles**: regions and dynamic graphs the warm process compiled, training and
  inference (0 is the bar);
- **warm functions loaded**, **warm programs loaded**: whole functions (or packages) and
  graphs rebuilt from stored programs in the warm process;
- **warm first step s**, **cold first step s**: from the `fcache.jit` call to the end of
  the first training step.

Writes `survey.json` (the command, config, machine, versions, fcache's commit, every
process's report) and `survey.md` (the same header and the table) to `--out`, and prints
the table. Exit status 1 when a family is incorrect, a process failed, or a warm process
compiled anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import hf, launch, machine

FLOOR = 1e-3  # gradient errors are relative to max(norm, FLOOR x the largest norm)
TOLERANCE = {  # dtype: (loss, gradient, inference)
    "float32": (1e-5, 1e-4, 1e-4),
    "bfloat16": (2e-2, 5e-2, 5e-2),
    "float16": (2e-2, 5e-2, 5e-2),
}
# What fcache's whole route logs (fcache.engine.whole) when it does not store a function.
_DECLINED = (
    "not stored whole",
    "compiled function not stored",
    "graph-broken function not stored",
    "taking torch.compile's route",
)
_PACKAGE = "storing Dynamo's package"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.survey", description=__doc__.split("\n")[0])
    p.add_argument("--families", default="all", help="comma list of bench/hf.py families")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", choices=tuple(TOLERANCE), default="float32")
    p.add_argument("--executors", default="default",
                   help="fcache's executors, comma-separated (text: the tests' text "
                        "executor); default: fcache's order for the device")  # fmt: skip
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of each process (default: 1 on a CPU)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    p.add_argument("--jobs", type=int, default=1, help="families run at once")
    p.add_argument("--out", type=Path, default=None, help="directory (default: survey-DEVICE)")
    p.add_argument("--child", choices=("cold", "warm"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--family", default=None, help=argparse.SUPPRESS)
    return p


# -- the measured process ------------------------------------------------------------------


class _Kept(logging.Handler):
    """fcache's messages at INFO and above, kept for the report."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.getMessage()[:500]}")


def grad_error(model: Any, reference: Any) -> tuple[float, str]:
    """tests/models/test_matrix.py's: the largest gradient error, each relative to its
    gradient's norm or to the floor; a gradient eager computes and fcache does not is an
    infinite error. With the parameter's name."""
    pairs = [
        (name, p.grad, q.grad)
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True)
        if q.grad is not None
    ]
    floor = FLOOR * max(q.norm().item() for _, _, q in pairs)
    worst, where = 0.0, ""
    for name, p, q in pairs:
        error = float("inf") if p is None else (p - q).norm().item() / max(q.norm().item(), floor)
        if error > worst:
            worst, where = error, name
    return worst, where


def _logits(output: Any) -> Any:
    return output.logits if hasattr(output, "logits") else output[0]


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from torch._dynamo.utils import counters

    import fcache

    names = None if args.executors == "default" else tuple(args.executors.split(","))
    if names and "text" in names:  # the tests' executor: only when asked for
        from tests.text_executor import register

        register()
    kept = _Kept()
    logging.getLogger("fcache").addHandler(kept)
    logging.getLogger("fcache").setLevel(logging.INFO)

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shape = (args.layers, args.dim, args.heads, args.vocab, args.seq)
    model = hf.build(args.family, *shape).to(device=device, dtype=dtype)
    reference = hf.build(args.family, *shape).to(device=device, dtype=dtype)
    reference.load_state_dict(model.state_dict())
    found = hf.inputs(args.family, model, args.batch, args.seq, torch.Generator().manual_seed(1))
    inputs = {
        k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        for k, v in found.items()
    }

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def loss(output: Any) -> Any:
        return _logits(output).float().pow(2).mean()

    sync()
    start = time.perf_counter()
    compiled = fcache.jit(model, executors=names)
    steps, losses, errors = [], [], []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        begun = time.perf_counter()
        got = loss(compiled(**inputs))
        got.backward()
        sync()
        steps.append(time.perf_counter() - (start if not steps else begun))
        expected = loss(reference(**inputs))
        expected.backward()
        losses.append((got.item(), expected.item()))
        errors.append(grad_error(model, reference))
    trained = fcache.stats(compiled).to_dict()
    training_log = list(kept.messages)

    model.eval()
    reference.eval()
    with torch.no_grad():
        got, expected = _logits(compiled(**inputs)).float(), _logits(reference(**inputs)).float()
    inference_error = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()
    error, worst = max(errors)
    return {
        "family": args.family,
        "role": args.child,
        "first_step_s": round(steps[0], 4),
        "second_step_s": round(steps[1], 4),
        "losses": losses,
        "loss_error": max(abs(a - b) / max(abs(b), 1e-12) for a, b in losses),
        "grad_error": error,
        "worst_parameter": worst,
        "inference_error": inference_error,
        "stats": trained,  # after the training steps
        "stats_total": fcache.stats(compiled).to_dict(),  # and after inference
        "graph_breaks": {str(k): v for k, v in counters["graph_break"].items()},
        "log": training_log[-40:],
        "log_inference": kept.messages[len(training_log) :][-20:],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


# -- the parent: a cold and a warm process per family --------------------------------------


def _argv(args: argparse.Namespace, family: str, role: str) -> list[str]:
    argv = ["-m", "bench.survey", "--child", role, "--family", family]
    for name in ("device", "layers", "dim", "heads", "vocab", "seq", "batch", "dtype"):
        argv += [f"--{name}", str(getattr(args, name))]
    return [*argv, "--executors", args.executors]


def _process(args: argparse.Namespace, argv: list[str], caches: launch.Caches, logs: Path) -> Any:
    """One measured process: its report, or {"error": ...} with its stderr's tail."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / "stdout.txt", logs / "stderr.txt"
    env = launch.environment(caches, threads=args.threads)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, *argv], cwd=launch.ROOT, env=env, stdout=stdout, stderr=stderr,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    run = launch.Launched(process, out, err, time.time())
    return launch.collect([run], time.monotonic() + args.timeout)[0]


def run_family(args: argparse.Namespace, family: str, work: Path) -> dict[str, Any]:
    """The cold process, then the warm one on its fcache directory (and CUDA driver cache:
    the machine's); an empty Inductor directory each."""
    result: dict[str, Any] = {"family": family}
    for role in ("cold", "warm"):
        if role == "warm" and "error" in result["cold"]:
            result[role] = {"error": "not run: the cold process failed"}
            continue
        caches = launch.Caches(
            fcache=work / family / "fcache",
            inductor=work / family / f"inductor-{role}",
            cuda=work / family / "cuda",
        )
        report = _process(args, _argv(args, family, role), caches, work / family / f"logs-{role}")
        result[role] = _scrubbed(report, work)
    result["verdict"] = verdict(result, args.dtype)
    return result


def _scrubbed(value: Any, work: Path) -> Any:
    """`value` without this machine's paths (the temporary directory, the checkout)."""
    if isinstance(value, str):
        for path, name in (
            (os.fspath(work), "<tmp>"),
            (sys.prefix, "<venv>"),
            (os.path.realpath(sys.prefix), "<venv>"),
            (os.fspath(launch.ROOT), "<repo>"),
        ):
            value = value.replace(path, name)
        return value
    if isinstance(value, dict):
        return {k: _scrubbed(v, work) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, work) for v in value]
    return value


def whole_stored(cold: dict[str, Any]) -> tuple[str, str | None]:
    """What the cold process stored of the training function, from fcache's log: function,
    package or declined, and why not. A graph-broken function's package is stored after a
    later call (the inference step's, here), so that call's log counts too."""
    log = [*cold.get("log", []), *cold.get("log_inference", [])]
    for message in log:
        if any(text in message for text in _DECLINED):
            return "declined", message.split(" ", 1)[1]
    if any(_PACKAGE in message for message in log):
        return "package", None
    return "function", None


def warm_compiles(warm: dict[str, Any]) -> int:
    stats = warm["stats_total"]
    return int(stats["compiles"]) + int(stats["dynamic_compiled"])


def _problems(report: dict[str, Any], dtype: str) -> list[str]:
    loss, grad, inference = TOLERANCE[dtype]
    found = []
    if report["loss_error"] > loss:
        found.append(f"loss {report['loss_error']:.1e}")
    if not report["grad_error"] <= grad:  # inf and nan too
        found.append(f"grad {report['grad_error']:.1e} ({report['worst_parameter']})")
    if not report["inference_error"] <= inference:
        found.append(f"inference {report['inference_error']:.1e}")
    return found


def verdict(result: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Correct in both processes, the warm one compiling nothing: `ok`; and what was not."""
    cold, warm = result["cold"], result["warm"]
    errors = [
        f"{role}: {r['error']}" for role, r in (("cold", cold), ("warm", warm)) if "error" in r
    ]
    if errors:
        return {"ok": False, "correct": False, "errors": errors}
    problems = [f"{role} {p}" for role in ("cold", "warm") for p in _problems(result[role], dtype)]
    compiled = warm_compiles(warm)
    return {
        "ok": not problems and compiled == 0,
        "correct": not problems,
        "problems": problems,
        "warm_compiles": compiled,
        "whole": whole_stored(cold)[0],
        "loaded": warm["stats"]["functions_loaded"] > 0,
    }


# -- the table -----------------------------------------------------------------------------

HEAD = (
    "family", "grad error", "correct?", "compiles / unique / instances", "fallbacks",
    "graph breaks", "whole: stored / loaded", "warm compiles", "warm functions loaded",
    "warm programs loaded", "warm first step s", "cold first step s",
)  # fmt: skip


def _fallbacks(stats: dict[str, Any]) -> str:
    text = str(stats["fallbacks"])
    if reasons := stats["fallback_reasons"]:
        text += " (" + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) + ")"
    if failed := stats["validation_failures"]:
        text += "; failed validation: " + ", ".join(f"{n} {e}" for e, n in sorted(failed.items()))
    return text


def row(result: dict[str, Any]) -> list[str]:
    cold, warm, v = result["cold"], result["warm"], result["verdict"]
    if "errors" in v:
        return [result["family"], "-", "error", *["-"] * (len(HEAD) - 3)]
    stats = cold["stats"]
    stored, _ = whole_stored(cold)
    loaded = "loaded" if warm["stats"]["functions_loaded"] else "traced"
    return [
        result["family"],
        f"{max(cold['grad_error'], warm['grad_error']):.1e}",
        "yes" if v["correct"] else "NO: " + "; ".join(v["problems"]),
        f"{stats['compiles']} / {stats['unique_regions']} / {stats['regions']}",
        _fallbacks(cold["stats_total"]),
        str(len(cold["graph_breaks"])),
        f"{stored} / {loaded}",
        str(v["warm_compiles"]),
        str(warm["stats"]["functions_loaded"]),
        str(warm["stats"]["programs_loaded"]),
        f"{warm['first_step_s']:.2f}",
        f"{cold['first_step_s']:.2f}",
    ]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines)


def notes(results: list[dict[str, Any]]) -> str:
    """Per family, what the table only counts: errors, graph-break reasons, declines,
    warnings fcache logged."""
    lines = []
    for r in results:
        said = []
        for error in r["verdict"].get("errors", []):
            said.append(f"error: {error}")
        for role in ("cold", "warm"):
            report = r[role]
            if "error" in report:
                continue
            if role == "cold":
                said += [f"graph break: {reason}" for reason in report["graph_breaks"]]
                _, why = whole_stored(report)
                if why:
                    said.append(f"declined: {why}")
            said += [f"{role}: {m}" for m in report["log"] if m.startswith(("WARNING", "ERROR"))]
        if said:  # first lines: Dynamo's explanations run to paragraphs
            said = [text.strip().splitlines()[0] for text in said]
            lines.append(f"- {r['family']}: " + "; ".join(dict.fromkeys(said)))
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> str:
    n = len(results)
    ok = sum(r["verdict"].get("correct", False) for r in results)
    warm_zero = sum(r["verdict"].get("warm_compiles") == 0 for r in results)
    loaded = sum(r["verdict"].get("loaded", False) for r in results)
    return (
        f"{ok} of {n} families correct cold and warm; {warm_zero} of {n} warm processes "
        f"compiled nothing; {loaded} of {n} loaded the stored function (no Dynamo)."
    )


def header(doc: dict[str, Any]) -> str:
    m, v = doc["machine"], doc["versions"]
    memory = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "?"
    gpus = ", ".join(g.get("name", "?") for g in m.get("gpus", [])) or "no GPU"
    return "\n".join(
        [
            f"`{doc['command']}`",
            "",
            f"- fcache {v['fcache_commit']}, torch {v['torch']}, transformers "
            f"{v['transformers']}, Python {v['python']}",
            f"- {m['cpu']}, {m['cores']} cores, {memory}, {gpus}; load average at the start "
            f"{m['loadavg'][0]}",
            f"- {doc['started']}, {doc['wall_s']:.0f} s",
        ]
    )


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads is None and not args.device.startswith("cuda"):
        args.threads = 1
    if args.child:
        result = child(args)
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (json.dumps(result) + "\n").encode())
        return 0
    families = hf.FAMILIES if args.families == "all" else tuple(args.families.split(","))
    unknown = [f for f in families if f not in hf.FAMILIES]
    if unknown:
        raise SystemExit(f"unknown families {unknown}: {', '.join(hf.FAMILIES)}")
    out = args.out or Path(f"survey-{args.device.split(':')[0]}")
    versions = machine.versions()
    try:
        versions["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        versions["transformers"] = None
    doc: dict[str, Any] = {
        "command": "python -m bench.survey " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine.machine(),
        "versions": versions,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    start = time.monotonic()
    done = [0]
    lock = threading.Lock()

    def one(family: str, work: Path) -> dict[str, Any]:
        result = run_family(args, family, work)
        with lock:
            done[0] += 1
            v = result["verdict"]
            said = (
                "ok"
                if v["ok"]
                else "; ".join(v.get("errors") or v["problems"])
                or (f"warm compiled {v['warm_compiles']}")
            )
            times = ", ".join(
                f"{role} {result[role]['process_wall_s']:.0f} s"
                for role in ("cold", "warm")
                if "process_wall_s" in result[role]
            )
            print(f"[{done[0]}/{len(families)}] {family}: {times}: {said}",
                  file=sys.stderr, flush=True)  # fmt: skip
        return result

    with (
        tempfile.TemporaryDirectory(prefix="fcache-survey-") as tmp,
        ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        results = list(pool.map(lambda f: one(f, Path(tmp)), families))
    doc["wall_s"] = round(time.monotonic() - start, 1)
    doc["results"] = results
    doc["complete"] = all("errors" not in r["verdict"] for r in results)
    text = table(results)
    print(text)
    print(summary(results))
    out.mkdir(parents=True, exist_ok=True)
    (out / "survey.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = [header(doc), "", text, "", summary(results)]
    if said := notes(results):
        md += ["", said]
    (out / "survey.md").write_text("\n".join(md) + "\n")
    return 0 if all(r["verdict"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
