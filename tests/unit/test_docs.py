"""The documentation as a newcomer and an operator meet it (issue #46): a README read in
five minutes (under 250 lines, the two commands and how to run what they install, one
results table whose every figure is in the results file it cites, one line per
limitation), links that lead somewhere, the settings table against fcache/config.py, and
bench/README.md's index of every result in bench/results, newest first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fcache.config import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# Written on other branches (issue #46 links them; they exist once those are merged).
PENDING = {ROOT / "docs" / "trust.md", ROOT / "docs" / "redis.md"}
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "deploy" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip


def _section(text: str, heading: str) -> str:
    after = text.split(f"\n{heading}\n", 1)[1]
    return re.split(r"\n## ", after, maxsplit=1)[0]


def test_the_readme_is_a_five_minute_read() -> None:
    assert len(README.splitlines()) < 250
    headings = re.findall(r"^## (.+)$", README, re.MULTILINE)
    assert headings[:5] == ["Where it stands", "Try it", "Using it", "How it works", "Limitations"]
    start = _section(README, "## Try it")
    assert "make demo" in start and "make test" in start
    # What make installs is in .venv: commands as .venv/bin/..., or after activating it.
    assert ".venv/bin/fcache" in start and "source .venv/bin/activate" in start
    using = _section(README, "## Using it")
    for topic in ("fcache.jit", 'backend="fcache"', "share_torch_compile", "fcache-server",
                  "docs/trust.md", "docs/redis.md", "fcache config"):  # fmt: skip
        assert topic in using, topic
    assert _section(README, "## How it works").count("```") == 2  # one diagram


def _results_table() -> tuple[list[list[str]], Path]:
    stands = _section(README, "## Where it stands")
    tables = re.findall(r"((?:^\|.*\|\n)+)", stands, re.MULTILINE)
    assert len(tables) == 1, "one results table"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in tables[0].splitlines()]
    (source,) = re.findall(r"Source.*?\]\((bench/results/[^)]+)\)", stands, re.DOTALL)
    return rows, ROOT / source


def test_the_one_results_table_is_dated_and_against_torch_compile() -> None:
    rows, _ = _results_table()
    header = " ".join(rows[0])
    assert "torch.compile cold" in header and "fcache cold" in header and "fcache warm" in header
    assert "steady" in header
    intro = _section(README, "## Where it stands").split("|", 1)[0]
    assert re.search(r"\b(H100|H200|A100)\b", intro) and re.search(r"\d{4}-\d\d-\d\d", intro)


def test_every_figure_of_the_results_table_is_in_the_file_it_cites() -> None:
    """The README's numbers are copied, never made: each is in the cited results file."""
    rows, source = _results_table()
    cited = source.read_text().replace("x", "×")
    figures = 0
    for row in rows[2:]:
        for cell in row[2:]:
            for figure in re.findall(r"\d+\.\d+×?", cell):
                assert figure in cited, f"{figure} ({row[:2]}) is not in {source}"
                figures += 1
    assert figures >= 30


def _links(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text)


def _anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(doc: Path) -> None:
    for target, anchor in _links(doc):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (doc.parent / target).resolve() if target else doc
        if path in PENDING:
            continue
        assert path.exists(), f"{doc.name}: {target} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{doc.name}: no #{anchor} in {target}"


def test_each_limitation_is_one_line_with_a_link() -> None:
    items = [line for line in _section(README, "## Limitations").splitlines() if line[:2] == "- "]
    assert len(items) >= 5
    heads = _anchors(ROOT / "docs" / "limitations.md") - {"limitations"}
    linked = set()
    for item in items:
        (anchor,) = re.findall(r"\(docs/limitations\.md#([\w-]+)\)", item)
        linked.add(anchor)
    assert linked == heads  # every limitation in the README, in one line each


def test_the_settings_table_lists_exactly_the_variables_the_config_reads() -> None:
    table = _section((ROOT / "docs/settings.md").read_text(), "| variable | meaning | default |")
    documented = re.findall(r"^\| `(FCACHE_[A-Z_]+)`", "| variable |\n" + table, re.MULTILINE)
    assert sorted(documented) == sorted(v.name for v in VARIABLES)


def test_bench_readme_indexes_every_result_newest_first() -> None:
    index = _section((ROOT / "bench/README.md").read_text(), "## Results, newest first")
    entries = re.findall(r"^- (\d{4}-\d\d-\d\d) \[[^\]]+\]\(results/([^/)]+)", index, re.M)
    assert [d for d, _ in entries] == sorted((d for d, _ in entries), reverse=True)
    listed = {name for _, name in entries} | set(re.findall(r"\(results/([^/)#]+)", index))
    results = ROOT / "bench" / "results"
    for path in results.iterdir():
        if path.is_dir() or path.suffix == ".md":
            assert path.name in listed, f"bench/results/{path.name} is not in the index"
