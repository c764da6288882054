"""The distributed benchmark's numbers (bench/distributed.py): a job's row from its ranks'
reports, the ratios of fcache to torch.compile, and the markdown, in bench/report.py's style.

Every number comes from the ranks' reports (bench/dist_rank.py). A job's start is its
slowest rank's (the job waits for it); its steady step the median of the ranks' medians;
its first-step spread the time between the first and the last rank ending their first
step. A ratio is formed only from two successful rows of one family and wrap.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.report import _s, _table

Row = dict[str, Any]

# (name, numerator (system, phase), denominator (system, phase), metric)
RATIOS = (
    ("fcache cold / torch.compile cold", ("fcache", "cold"), ("torch.compile", "cold"), "start_s"),
    ("fcache warm / torch.compile warm", ("fcache", "warm"), ("torch.compile", "warm"), "start_s"),
    (
        "fcache steady / torch.compile steady",
        ("fcache", "cold"),
        ("torch.compile", "cold"),
        "steady_step_s",
    ),
)
_RANK_KEYS = (
    "rank", "start_s", "wrap_s", "first_step_s", "first_step_done_unix", "steady_step_s",
    "steady_steps_s", "compiles", "graph_cache_hits", "unique_regions", "regions", "graphs",
    "programs_loaded", "functions_loaded", "fallbacks", "hits", "misses", "errors",
    "compile_seconds", "graph_seconds", "loss_error", "max_grad_error", "peak_memory_bytes",
    "profiled",
)  # fmt: skip


def summarize(ranks: Sequence[Row]) -> Row:
    """A job's numbers from its ranks' reports (none when no rank reported)."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    if not ranks:
        return {}
    row: Row = {"ranks": [{k: r[k] for k in _RANK_KEYS if k in r} for r in ranks]}
    row["start_s"] = max(r["start_s"] for r in ranks)
    row["fastest_start_s"] = min(r["start_s"] for r in ranks)
    ends = [r["first_step_done_unix"] for r in ranks]
    row["first_step_spread_s"] = round(max(ends) - min(ends), 4)
    if any(r.get("profiled") for r in ranks):
        row["profiled"] = True  # its start and first step include cProfile's cost
    steady = [r["steady_step_s"] for r in ranks if r.get("steady_step_s") is not None]
    row["steady_step_s"] = statistics.median(steady) if steady else None
    if all("compiles" in r for r in ranks):
        row["node_compiles"] = sum(r["compiles"] for r in ranks)
    if any("region_keys" in r for r in ranks):
        row["unique_regions"] = len({k for r in ranks for k in r.get("region_keys", ())})
    for key in ("loss_error", "max_grad_error"):
        if all(key in r for r in ranks):
            row[key] = max(r[key] for r in ranks)
    return row


def ratios(rows: Sequence[Row]) -> list[Row]:
    found = []
    cells = sorted({(r["family"], r["wrap"]) for r in rows})
    for family, wrap in cells:
        for name, num, den, metric in RATIOS:
            a, b = _pick(rows, family, wrap, *num), _pick(rows, family, wrap, *den)
            if a is None or b is None or not a.get(metric) or not b.get(metric):
                continue
            value = a[metric] / b[metric]
            found.append({"family": family, "wrap": wrap, "ratio": name, "value": value})
    return found


def _pick(rows: Sequence[Row], family: str, wrap: str, system: str, phase: str) -> Row | None:
    matches = [
        r
        for r in rows
        if (r["family"], r["wrap"], r["system"], r["phase"]) == (family, wrap, system, phase)
        and "error" not in r
    ]
    return matches[-1] if matches else None


def line(row: Row) -> str:
    """One job as a progress line."""
    what = f"{row['family']} {row['wrap']} {row['system']} {row['phase']} x{row['nproc']}"
    if "error" in row:
        return f"{what}: {row['error']}"
    return (
        f"{what}: start {_s(row.get('start_s'))} (slowest rank), spread "
        f"{_s(row.get('first_step_spread_s'))}, steady {_ms(row.get('steady_step_s'))}, "
        f"compiles {_compiles(row)}"
    )


def markdown(doc: Row) -> str:
    rows: list[Row] = doc["rows"]
    parts = [_title(doc), "### Jobs: the slowest rank's start, the ranks' spread\n"]
    parts.append(_table(_JOB_COLUMNS, rows))
    if found := ratios(rows):
        parts.append("### Ratios (< 1: fcache is faster)\n")
        parts.append(_table(_RATIO_COLUMNS, found))
    per_rank = [{**row, **rank} for row in rows for rank in row.get("ranks", [])]
    if per_rank:
        parts.append("### Per rank\n")
        parts.append(_table(_RANK_COLUMNS, per_rank))
    parts.append(
        "*start*: the compile call to the end of the first step; *spread*: between the first "
        "and the last rank ending their first step; *compiles / unique*: per node (fcache: "
        "regions compiled by all ranks / distinct region keys; torch.compile: Inductor's graph "
        "compiles, all ranks); *check*: largest loss and gradient differences from the same "
        "job without compiling.\n"
    )
    return "\n".join(parts)


def _title(doc: Row) -> str:
    machine, versions, config = doc.get("machine", {}), doc.get("versions", {}), doc["config"]
    gpus = ", ".join(str(g.get("name")) for g in machine.get("gpus", []))
    shape = config["shape"]
    return (
        "\n".join(
            [
                f"## fcache distributed benchmark: {config['nproc']} ranks, {config['device']}, "
                f"{doc.get('created', '')}\n",
                f"- machine: {machine.get('cpu')}, {machine.get('cores')} cores"
                + (f"; GPUs: {gpus}" if gpus else "; no GPU"),
                f"- versions: Python {versions.get('python')}, torch {versions.get('torch')}, "
                f"fcache {versions.get('fcache_commit')}",
                f"- model: {shape['layers']} layers, d={shape['dim']}, {shape['heads']} heads, "
                f"vocab {shape['vocab']}, batch {shape['batch']}x{shape['seq']} tokens per rank, "
                f"{shape['dtype']}; steady step = median of {shape['steps']}",
                f"- fcache executors: {config.get('executors') or 'default'}; torch.compile "
                f"backend: {config.get('backend')}",
                f"- command: `{doc.get('command', '')}`",
            ]
        )
        + "\n"
    )


Column = tuple[str, Callable[[Row], str]]


def _ms(value: Any) -> str:
    return f"{value * 1e3:.2f} ms" if isinstance(value, (int, float)) else "–"


def _compiles(row: Row) -> str:
    compiles = row.get("node_compiles", row.get("compiles"))
    if compiles is None:
        return "–"
    unique = row.get("unique_regions")
    return (
        f"{compiles} / {unique}" if unique is not None and "node_compiles" in row else f"{compiles}"
    )


def _check(row: Row) -> str:
    if "max_grad_error" not in row:
        return "–"
    return f"{row['loss_error']:.1e} / {row['max_grad_error']:.1e}"


def _ended(row: Row) -> str:
    """When this rank's first step ended, after the job's earliest rank's."""
    ends = [r["first_step_done_unix"] for r in row.get("ranks", [])]
    if not ends or "first_step_done_unix" not in row:
        return "–"
    return f"+{_s(row['first_step_done_unix'] - min(ends))}"


_JOB_COLUMNS: tuple[Column, ...] = (
    ("model", lambda r: r["family"]),
    ("wrap", lambda r: r["wrap"]),
    ("system", lambda r: r["system"] + (f"[{r['executors']}]" if r.get("executors") else "")),
    ("job", lambda r: r["phase"] + (" (profiled)" if r.get("profiled") else "")),
    ("start", lambda r: r.get("error", "").replace("|", "/") or _s(r.get("start_s"))),
    ("spread", lambda r: _s(r.get("first_step_spread_s"))),
    ("steady step", lambda r: _ms(r.get("steady_step_s"))),
    ("compiles / unique", _compiles),
    ("check", _check),
)
_RATIO_COLUMNS: tuple[Column, ...] = (
    ("model", lambda r: r["family"]),
    ("wrap", lambda r: r["wrap"]),
    ("ratio", lambda r: r["ratio"]),
    ("value", lambda r: f"{r['value']:.2f}x"),
)
_RANK_COLUMNS: tuple[Column, ...] = (
    ("model", lambda r: r["family"]),
    ("wrap", lambda r: r["wrap"]),
    ("system", lambda r: r["system"]),
    ("job", lambda r: r["phase"]),
    ("rank", lambda r: str(r["rank"])),
    ("start", lambda r: _s(r.get("start_s"))),
    ("first step ended", _ended),
    ("steady step", lambda r: _ms(r.get("steady_step_s"))),
    ("compiles", lambda r: str(r.get("compiles", "–"))),
)
