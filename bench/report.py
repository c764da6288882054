"""Render benchmark results: ratios, a markdown table and a PNG plot, from the JSON that
`python -m bench.run` writes. Also merges the JSONs of a suite run in pieces.

    python -m bench.report bench/results/gpu-l16.json                 # .md and .png beside it
    python -m bench.report a.json b.json --out bench/results/gpu-h200 # merged .json, .md, .png
    python -m bench.report bench/results/gpu-h200.json --readme README.md  # and into README

Every number comes from the rows; nothing is computed that the rows do not hold. A ratio
is formed only from two successful rows of the same cell (family, mode, layers) and says
whether both came from one invocation of the harness (`same_run`). The plot needs
matplotlib; without it the PNG is skipped and `write` says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Doc = dict[str, Any]

# (name, numerator system, denominator system, metric); fcache systems per executor set.
# "start" is start_s (from the torch.compile / fcache.jit call to the end of the first step)
# where the rows have it; rows from before it existed have only first_step_s (see start_metric).
SINGLE_RATIOS: tuple[tuple[str, str, str, str], ...] = (
    ("fcache cold / torch.compile cold", "fcache-cold", "torch.compile-cold", "start"),
    ("fcache warm / torch.compile warm", "fcache-warm", "torch.compile-warm", "start"),
    (
        "fcache server-warm / torch.compile warm",
        "fcache-server",
        "torch.compile-warm",
        "start",
    ),
    (
        "fcache steady / torch.compile steady",
        "fcache-cold",
        "torch.compile-cold",
        "steady_step_s",
    ),
    (
        "fcache cold / torch.compile-regional",
        "fcache-cold",
        "torch.compile-regional",
        "start",
    ),
    ("fcache cold / torch.compile-nested", "fcache-cold", "torch.compile-nested", "start"),
    (
        "torch.compile-nested / torch.compile cold",
        "torch.compile-nested",
        "torch.compile-cold",
        "start",
    ),
    (
        "torch.compile-nested steady / torch.compile steady",
        "torch.compile-nested",
        "torch.compile-cold",
        "steady_step_s",
    ),
    ("fcache cold / thunder", "fcache-cold", "thunder", "start"),
    ("fcache-blocks / torch.compile cold", "fcache-blocks", "torch.compile-cold", "start"),
    ("fcache-blocks / torch.compile-regional", "fcache-blocks", "torch.compile-regional", "start"),
    (
        "fcache-blocks steady / torch.compile steady",
        "fcache-blocks",
        "torch.compile-cold",
        "steady_step_s",
    ),
    ("fcache warm / fcache cold", "fcache-warm", "fcache-cold", "start"),
    # Issue #16's steady steps: a warm process's, and CUDA graphs against torch's own.
    (
        "fcache warm steady / torch.compile steady",
        "fcache-warm",
        "torch.compile-cold",
        "steady_step_s",
    ),
    ("fcache warm steady / fcache cold steady", "fcache-warm", "fcache-cold", "steady_step_s"),
    (
        "fcache-cudagraphs steady / torch.compile-reduce-overhead steady",
        "fcache-cudagraphs",
        "torch.compile-reduce-overhead",
        "steady_step_s",
    ),
    (
        "torch.compile-reduce-overhead steady / torch.compile steady",
        "torch.compile-reduce-overhead",
        "torch.compile-cold",
        "steady_step_s",
    ),
    ("fcache server-warm / fcache cold", "fcache-server", "fcache-cold", "start"),
    ("fcache steady / eager steady", "fcache-cold", "eager", "steady_step_s"),
)
# (name, numerator variant, denominator variant) of multi-process wall times.
MULTI_RATIOS: tuple[tuple[str, str, str], ...] = (
    ("fcache-server / torch.compile-independent", "fcache-server", "torch.compile-independent"),
    ("fcache-shared / torch.compile-independent", "fcache-shared", "torch.compile-independent"),
    (
        "fcache-independent / torch.compile-independent",
        "fcache-independent",
        "torch.compile-independent",
    ),
    ("fcache-server / fcache-independent", "fcache-server", "fcache-independent"),
    ("fcache-shared / fcache-independent", "fcache-shared", "fcache-independent"),
)


def label(row: Row) -> str:
    """A row's system as shown: fcache systems carry their executor set."""
    system = str(row.get("system") or row.get("variant"))
    return f"{system}[{row['executors']}]" if row.get("executors") else system


def _ok(row: Row) -> bool:
    return "error" not in row and row.get("role", "measure") == "measure"


def ratios(rows: Sequence[Row]) -> list[Row]:
    """Every ratio of SINGLE_RATIOS and MULTI_RATIOS that two successful rows support."""
    out: list[Row] = []
    singles = [r for r in rows if r.get("kind") == "single" and _ok(r)]
    start = start_metric(singles)
    cells: dict[tuple[Any, ...], dict[tuple[str, str | None], Row]] = {}
    for r in singles:
        cell = cells.setdefault((r["family"], r["mode"], r["layers"]), {})
        cell[(r["system"], r.get("executors"))] = r
    for (family, mode, layers), found in cells.items():
        executor_sets: list[str | None] = [*sorted({ex for (_, ex) in found if ex})] or [None]
        for executors in executor_sets:
            for name, num_sys, den_sys, metric in SINGLE_RATIOS:
                metric = start if metric == "start" else metric
                num = _pick(found, num_sys, executors)
                den = _pick(found, den_sys, executors)
                ratio = _ratio(num, den, metric)
                if ratio is not None:
                    out.append(
                        {
                            "kind": "single",
                            "family": family,
                            "mode": mode,
                            "layers": layers,
                            "executors": executors,
                            "ratio": name,
                            "metric": metric,
                            **ratio,
                        }
                    )
    multis = [r for r in rows if r.get("kind") == "multiproc" and r.get("wall_first_step_s")]
    groups: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in multis:
        key = (r["family"], r["mode"], r["layers"], r["n"], r["gpus"])
        groups.setdefault(key, {})[r["variant"]] = r
    for (family, mode, layers, n, gpus), found_mp in groups.items():
        for name, num_v, den_v in MULTI_RATIOS:
            ratio = _ratio(found_mp.get(num_v), found_mp.get(den_v), "wall_first_step_s")
            if ratio is not None:
                out.append(
                    {
                        "kind": "multiproc",
                        "family": family,
                        "mode": mode,
                        "layers": layers,
                        "n": n,
                        "gpus": gpus,
                        "executors": found_mp[num_v].get("executors"),
                        "ratio": name,
                        "metric": "wall_first_step_s",
                        **ratio,
                    }
                )
    return out


def start_metric(rows: Sequence[Row]) -> str:
    """start_s, the time a user waits from the compile call to the end of the first step,
    when every row has it; first_step_s for results from before start_s was measured (their
    first step left out the torch.compile / fcache.jit call, which imports the compiler)."""
    return "start_s" if rows and all("start_s" in r for r in rows) else "first_step_s"


def _pick(
    found: dict[tuple[str, str | None], Row], system: str, executors: str | None
) -> Row | None:
    if system.startswith("fcache"):
        return found.get((system, executors))
    return found.get((system, None))


def _ratio(num: Row | None, den: Row | None, metric: str) -> Row | None:
    if num is None or den is None:
        return None
    a, b = num.get(metric), den.get(metric)
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return None
    return {
        "value": round(a / b, 4),
        "numerator": a,
        "denominator": b,
        "same_run": num.get("run_id") == den.get("run_id"),
    }


# --- markdown -----------------------------------------------------------------------------


def markdown(doc: Doc) -> str:
    """The results as markdown: what ran where, then single runs, ratios, multi-process."""
    rows: list[Row] = doc["rows"]
    parts = [_title(doc)]
    singles = [r for r in rows if r.get("kind") == "single" and r.get("role") != "prime"]
    if singles:
        parts.append("### First step and steady step, each a fresh process\n")
        parts.append(_table(_SINGLE_COLUMNS, singles))
    all_ratios = ratios(rows)
    single_ratios = [r for r in all_ratios if r["kind"] == "single"]
    if single_ratios:
        parts.append("### Ratios (< 1: fcache is faster)\n")
        parts.append(_table(_RATIO_COLUMNS, single_ratios))
    multis = [r for r in rows if r.get("kind") == "multiproc"]
    if multis:
        parts.append("### N processes starting the same job at once\n")
        parts.append(_table(_MULTI_COLUMNS, multis))
    multi_ratios = [r for r in all_ratios if r["kind"] == "multiproc"]
    if multi_ratios:
        parts.append("### Multi-process wall-time ratios (< 1: the first variant is faster)\n")
        parts.append(_table(_MULTI_RATIO_COLUMNS, multi_ratios))
    parts.append(
        "Columns are explained in bench/README.md. Rows with an error show it instead of"
        " numbers; `prime` runs that only fill a cache are in the JSON, not here.\n"
    )
    return "\n".join(parts)


def _title(doc: Doc) -> str:
    machine, versions, config = doc.get("machine", {}), doc.get("versions", {}), doc["config"]
    gpus = ", ".join(
        f"{g.get('name')} (driver {g.get('driver_version')})" for g in machine.get("gpus", [])
    )
    shape = config.get("shape", {})
    lines = [
        f"## fcache benchmark: {config.get('device')}, {doc.get('created', '')}\n",
        f"- machine: {machine.get('cpu')}, {machine.get('cores')} cores"
        + (f"; GPUs: {gpus}" if gpus else "; no GPU"),
        f"- versions: Python {versions.get('python')}, torch {versions.get('torch')}, "
        f"triton {versions.get('triton')}, nvFuser {versions.get('nvfuser')}, "
        f"thunder {versions.get('lightning-thunder')}, fcache {versions.get('fcache_commit')}",
        f"- model: d={shape.get('dim')}, {shape.get('heads')} heads, vocab {shape.get('vocab')}, "
        f"batch {shape.get('batch')}x{shape.get('seq')} tokens, {shape.get('dtype')}; "
        f"steady step = median of {shape.get('steps')}",
    ]
    knobs = [
        f"{name}={config[key]}"
        for key, name in (
            ("threads", "OMP_NUM_THREADS"),
            ("compile_workers", "FCACHE_COMPILE_WORKERS"),
        )
        if config.get(key)
    ]
    if knobs:
        lines.append(f"- measured processes ran with {', '.join(knobs)}")
    if load := machine.get("loadavg"):
        lines.append(f"- load average (1, 5, 15 min) when the run started: {load}")
    if machine.get("bytecode_written") is False:
        lines.append(
            "- PYTHONDONTWRITEBYTECODE was set: every process compiled Python sources again "
            "(seconds in every start; see bench/README.md)"
        )
    for command in doc.get("commands") or [doc.get("command", "")]:
        lines.append(f"- command: `{command}`")
    return "\n".join(lines) + "\n"


Column = tuple[str, Callable[[Row], str]]


def _s(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    if abs(value) < 0.1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.1f} s" if abs(value) >= 10 else f"{value:.2f} s"


def _ms(value: Any) -> str:
    return f"{value * 1e3:.2f} ms" if isinstance(value, (int, float)) else "–"


def _bytes(row: Row) -> str:
    value = row.get("peak_memory_bytes", row.get("peak_rss_bytes"))
    if not isinstance(value, (int, float)):
        return "–"
    unit = "" if "peak_memory_bytes" in row else " RSS"
    return f"{value / 2**30:.2f} GiB{unit}" if value >= 2**30 else f"{value / 2**20:.0f} MiB{unit}"


def _num(value: Any) -> str:
    return "–" if value is None else str(value)


def _err(row: Row) -> str:
    if "error" in row:
        return str(row["error"]).replace("|", "/")
    err = row.get("max_abs_error")
    grad = row.get("max_grad_error")
    text = "" if err is None else f"{err:.1e}" + (f" / {grad:.1e}" if grad is not None else "")
    return text + _other_executors(row)


def _other_executors(row: Row) -> str:
    """fcache regions that ran under an executor outside the requested set (e.g. eager
    because nvFuser was missing or refused them): shown, so a label never overstates."""
    used: dict[str, int] = row.get("executors_used") or {}
    requested = set(str(row.get("executors") or "").split(","))
    other = {name: n for name, n in used.items() if name not in requested}
    if not other:
        return ""
    return " (regions also on " + ", ".join(f"{k}: {v}" for k, v in sorted(other.items())) + ")"


_SINGLE_COLUMNS: tuple[Column, ...] = (
    ("family", lambda r: str(r["family"])),
    ("mode", lambda r: str(r["mode"])),
    ("layers", lambda r: str(r["layers"])),
    ("system", label),
    ("start (call + first step)", lambda r: _s(r.get("start_s"))),
    ("first step", lambda r: _s(r.get("first_step_s"))),
    ("capture", lambda r: _s(r.get("capture_s"))),
    ("compile/load", lambda r: _s(r.get("compile_load_s"))),
    ("steady step", lambda r: _ms(r.get("steady_step_s"))),
    ("compiles", lambda r: _num(r.get("compiles"))),
    ("unique regions", lambda r: _num(r.get("unique_regions"))),
    ("peak memory", _bytes),
    ("max err out / grad, or error", _err),
)
_RATIO_COLUMNS: tuple[Column, ...] = (
    ("family", lambda r: str(r["family"])),
    ("mode", lambda r: str(r["mode"])),
    ("layers", lambda r: str(r["layers"])),
    ("executors", lambda r: _num(r.get("executors"))),
    ("ratio", lambda r: str(r["ratio"])),
    ("of", lambda r: str(r["metric"])),
    ("value", lambda r: f"{r['value']:.3f}"),
    ("from", lambda r: _from(r)),
)
_MULTI_COLUMNS: tuple[Column, ...] = (
    ("family", lambda r: str(r["family"])),
    ("mode", lambda r: str(r["mode"])),
    ("layers", lambda r: str(r["layers"])),
    ("N", lambda r: str(r["n"])),
    ("GPUs", lambda r: str(r["gpus"])),
    ("variant", label),
    ("wall until all first steps", lambda r: _s(r.get("wall_first_step_s"))),
    ("slowest first step", lambda r: _s(r.get("max_first_step_s"))),
    ("total compiles", lambda r: _num(r.get("total_compiles"))),
    ("failed", lambda r: _failed(r)),
)
_MULTI_RATIO_COLUMNS: tuple[Column, ...] = (
    ("family", lambda r: str(r["family"])),
    ("mode", lambda r: str(r["mode"])),
    ("layers", lambda r: str(r["layers"])),
    ("N", lambda r: str(r["n"])),
    ("GPUs", lambda r: str(r["gpus"])),
    ("ratio", lambda r: str(r["ratio"])),
    ("of", lambda r: str(r["metric"])),
    ("value", lambda r: f"{r['value']:.3f}"),
    ("from", lambda r: _from(r, "s")),
)


def _from(r: Row, unit: str = "") -> str:
    a, b = r["numerator"], r["denominator"]
    if r.get("metric") == "steady_step_s":
        text = f"{a * 1e3:.2f} ms / {b * 1e3:.2f} ms"
    else:
        text = f"{a:.2f} s / {b:.2f} s"
    return text if r.get("same_run", True) else text + " (different runs)"


def _failed(r: Row) -> str:
    errors = [p.get("error") for p in r.get("processes", []) if p.get("error")]
    if r.get("error"):
        errors.insert(0, r["error"])
    return "; ".join(str(e).replace("|", "/") for e in errors[:2]) if errors else "0"


def _table(columns: Sequence[Column], rows: Iterable[Row]) -> str:
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r) for _, fmt in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body]) + "\n"


# --- plot ---------------------------------------------------------------------------------


def plot(doc: Doc, path: Path) -> bool:
    """First-step time against depth, one line per system, one panel per (family, mode).
    False (and no file) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    singles = [r for r in doc["rows"] if r.get("kind") == "single" and _ok(r)]
    metric = start_metric(singles)
    rows = [r for r in singles if r.get(metric) is not None]
    families = sorted({r["family"] for r in rows})
    modes = sorted({r["mode"] for r in rows}, reverse=True)  # train, then infer
    if not rows:
        return False
    names = list(dict.fromkeys(label(r) for r in rows))  # in the order systems ran
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    fig, axes = plt.subplots(
        len(families),
        len(modes),
        figsize=(6.5 * len(modes), 4.5 * len(families)),
        squeeze=False,
        constrained_layout=True,
    )
    for row_axes, family in zip(axes, families, strict=True):
        for ax, mode in zip(row_axes, modes, strict=True):
            cell = [r for r in rows if (r["family"], r["mode"]) == (family, mode)]
            _panel(ax, cell, colors, metric)
            what = "compile call + first step" if metric == "start_s" else "first step"
            ax.set_title(f"{family}, {mode}: {what}, fresh process")
    config, machine = doc["config"], doc.get("machine", {})
    gpus = machine.get("gpus") or []
    cuda = str(config.get("device", "")).startswith("cuda")
    where = gpus[0].get("name") if gpus and cuda else machine.get("cpu")
    shape = config.get("shape", {})
    fig.suptitle(
        f"fcache benchmark on {where}: d={shape.get('dim')}, "
        f"{shape.get('batch')}x{shape.get('seq')} tokens, {shape.get('dtype')}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _panel(ax: Any, rows: Sequence[Row], colors: dict[str, str], metric: str) -> None:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        series.setdefault(label(r), []).append((r["layers"], r[metric]))
    for name, color in colors.items():
        points = sorted(series.get(name, []))
        if points:
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            ax.plot(xs, ys, marker="o", color=color, label=name)
    ax.set_xticks(sorted({r["layers"] for r in rows}))
    ax.set_yscale("log")
    ax.set_xlabel("layers")
    ax.set_ylabel(f"{metric} (s, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    if rows:
        ax.legend(fontsize=8)


# --- files --------------------------------------------------------------------------------


def write(doc: Doc, prefix: Path) -> list[Path]:
    """PREFIX.md and PREFIX.png (when matplotlib is present) from `doc`; the paths written."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md = prefix.with_name(prefix.name + ".md")
    md.write_text(markdown(doc))
    written = [md]
    png = prefix.with_name(prefix.name + ".png")
    if plot(doc, png):
        written.append(png)
    else:
        print(f"bench: no plot ({png.name}): matplotlib is not installed", file=sys.stderr)
    return written


def save_json(doc: Doc, prefix: Path) -> Path:
    """PREFIX.json, replaced atomically (the harness saves after every row)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_name(prefix.name + ".json")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**doc, "ratios": ratios(doc["rows"])}, indent=1, default=str))
    os.replace(tmp, path)
    return path


def merge(docs: Sequence[Doc]) -> Doc:
    """One document from pieces of a suite: rows concatenated (each keeps its run_id), the
    first piece's config and machine, every piece's command. Pieces from different machines
    or versions are refused: their rows would not be comparable."""
    if not docs:
        raise ValueError("nothing to merge")
    first = docs[0]
    for doc in docs[1:]:
        for key in ("machine", "versions"):
            if _comparable(doc[key]) != _comparable(first[key]):
                raise ValueError(f"pieces differ in {key}: {doc[key]} vs {first[key]}")
        if doc["config"]["shape"] != first["config"]["shape"]:
            raise ValueError("pieces measured different model shapes")
    merged = dict(first)
    merged["rows"] = [row for doc in docs for row in doc["rows"]]
    merged["commands"] = [c for doc in docs for c in (doc.get("commands") or [doc["command"]])]
    merged["complete"] = all(doc.get("complete") for doc in docs)
    merged["created"] = max(doc.get("created", "") for doc in docs)
    return merged


def _comparable(info: dict[str, Any]) -> dict[str, Any]:
    # The host name may differ between leases of the same kind of machine; load varies.
    return {k: v for k, v in info.items() if k not in ("hostname", "loadavg")}


_README_START, _README_END = "<!-- results:start -->", "<!-- results:end -->"


def splice_readme(readme: Path, doc: Doc, prefix: Path) -> None:
    """Replace what lies between the README's results markers with this document's tables,
    its plot and how to reproduce them. Paths are written relative to the README."""
    text = readme.read_text()
    if _README_START not in text or _README_END not in text:
        raise ValueError(f"{readme} has no {_README_START} ... {_README_END} markers")
    base = readme.resolve().parent
    png = prefix.with_name(prefix.name + ".png").resolve()
    json_path = prefix.with_name(prefix.name + ".json").resolve()
    # One heading level down: the README's results section is itself a "##".
    body = markdown(doc).replace("\n### ", "\n#### ").replace("## ", "### ", 1)
    parts = [body]
    if png.exists():
        parts.insert(0, f"![start against depth]({png.relative_to(base)})\n")
    parts.append(
        f"Data: [{json_path.relative_to(base)}]({json_path.relative_to(base)}). "
        "To reproduce, run the commands above (bench/README.md lists the pieces of a GPU run "
        "and how to merge them).\n"
    )
    head, rest = text.split(_README_START, 1)
    _, tail = rest.split(_README_END, 1)
    section = "\n".join(parts)
    readme.write_text(f"{head}{_README_START}\n{section}\n{_README_END}{tail}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+", type=Path, help="JSON files written by bench.run")
    p.add_argument("--out", type=Path, help="PREFIX for the merged .json, .md and .png")
    p.add_argument(
        "--readme",
        type=Path,
        help="also put the tables and plot between the results markers of this README",
    )
    args = p.parse_args(argv)
    docs = [json.loads(path.read_text()) for path in args.inputs]
    if len(docs) > 1 and args.out is None:
        p.error("--out is needed to merge several inputs")
    doc = merge(docs)
    prefix = args.out or args.inputs[0].with_suffix("")
    if args.out is not None:
        save_json(doc, prefix)
    for path in write(doc, prefix):
        print(path)
    if args.readme is not None:
        splice_readme(args.readme, doc, prefix)
        print(args.readme)
    for r in ratios(doc["rows"]):
        print(_ratio_line(r), file=sys.stderr)


def _ratio_line(r: Row) -> str:
    where = f"{r['family']}/{r['mode']} L={r['layers']}"
    if r["kind"] == "multiproc":
        where += f" N={r['n']} gpus={r['gpus']}"
    executors = f" [{r['executors']}]" if r.get("executors") else ""
    return f"ratio {where}{executors}: {r['ratio']} = {r['value']:.3f} ({_from(r)})"


if __name__ == "__main__":
    main()
