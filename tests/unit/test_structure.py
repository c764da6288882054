"""The layout's rules, checked on the source so they stay true (issue #12):

- imports only go down the layers below (no upward arrow, no cycle between modules);
- no Python file in fcache/ or service/ over 500 lines;
- no module-level mutable state outside fcache/process.py, and no fork or exit hook
  registered anywhere else.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("fcache/protocol/_gen",)

# A module may import its own component and the components of lower rank. Within a rank,
# components do not import each other.
RANKS = {
    "fcache.errors": 0,
    "fcache.process": 0,
    "fcache.heap": 0,  # glibc's heap settings for CPU steps
    "fcache.target": 0,
    "fcache.stats": 0,
    "fcache.version": 0,
    "fcache.executors.registry": 1,  # names and factories only; config validates with it
    "fcache.config": 2,
    "fcache.protocol": 3,
    "fcache.frontend": 3,
    "fcache.cache": 4,
    "fcache.executors": 5,
    "fcache.engine": 6,
    "fcache.api": 7,
    "fcache.share": 7,  # share_torch_compile: Inductor's remote caches on fcache-server
    "fcache.demo": 8,
    "fcache.entry": 8,  # the torch_dynamo_backends entry point: settings checked at lookup
    "fcache.tables": 8,  # what the fcache command prints
    "fcache.cli": 9,
    "fcache": 10,  # the package itself: re-exports of the public API
    "fcache.examples": 11,  # the built-in example model and its runner: users of the API
}
# fcache-server is a separate program: the wire contract, the stores, settings and stats.
SERVICE_MAY_IMPORT = (
    "fcache.protocol",
    "fcache.cache",
    "fcache.config",
    "fcache.errors",
    "fcache.stats",
    "fcache",
)
# What executors may take from the cache package: the envelope, nothing of the tiers.
EXECUTORS_FROM_CACHE = ("fcache.cache.artifact",)


def _sources() -> Iterator[tuple[str, Path]]:
    for base in ("fcache", "service"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(GENERATED):
                continue
            module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            yield module, path


def _component(module: str) -> str | None:
    best = None
    for name in RANKS:
        if (module == name or module.startswith(name + ".")) and (
            best is None or len(name) > len(best)
        ):
            best = name
    return best


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The fcache and service modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against the importing package
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
    return [n for n in names if n == "fcache" or n.startswith(("fcache.", "service"))]


def _all_imports(path: Path, module: str) -> list[str]:
    """Every import of the file, at any depth, except those only for type checking."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    return [
        name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only
        for name in _imported(node, module)
    ]


def _allowed(importer: str, imported: str) -> bool:
    if importer.startswith("service"):
        if imported.startswith("service"):
            return True
        return any(imported == p or imported.startswith(p + ".") for p in SERVICE_MAY_IMPORT)
    if imported.startswith("service"):
        return False
    mine, theirs = _component(importer), _component(imported)
    assert mine is not None and theirs is not None, (importer, imported)
    if mine == theirs:
        return True
    if mine == "fcache.executors" and theirs == "fcache.cache":
        return imported.startswith(EXECUTORS_FROM_CACHE)
    return RANKS[theirs] < RANKS[mine]


def test_imports_only_go_down_the_layers() -> None:
    wrong = [
        f"{module} imports {imported}"
        for module, path in _sources()
        for imported in _all_imports(path, module)
        if not _allowed(module, imported)
    ]
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_import_cycles_between_modules() -> None:
    graph = {
        module: {i for i in _all_imports(path, module) if i != module}
        for module, path in _sources()
    }
    # Tarjan's strongly connected components over module-to-module imports.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    # A package's __init__ re-exporting its own modules is not a cycle worth a failure.
    cycles = [c for c in cycles if not all(m.startswith(c[0]) for m in c)]
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("base", ["fcache", "service"])
def test_no_file_over_500_lines(base: str) -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for _, path in _sources()
        if path.relative_to(ROOT).parts[0] == base
        and (n := len(path.read_text().splitlines())) > 500
    ]
    assert not long, "\n".join(long)


_MUTABLE_FACTORIES = {
    "dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "WeakSet",
    "WeakValueDictionary", "WeakKeyDictionary", "ThreadPoolExecutor", "Lock", "RLock",
    "Condition", "Queue", "Event", "local", "count",
}  # fmt: skip
_HOOKS = ("register_at_fork", "atexit.register")


def _module_state(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is None:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
        if not names:
            continue
        constant = all(n.isupper() or n.lstrip("_").isupper() for n in names) and names
        display = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp))
        call = isinstance(value, ast.Call) and (
            getattr(value.func, "id", None) in _MUTABLE_FACTORIES
            or getattr(value.func, "attr", None) in _MUTABLE_FACTORIES
        )
        # UPPER_CASE displays are constant tables (never mutated); factories never are.
        if call or (display and not constant):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    source = path.read_text()
    found += [f"registers a hook: {hook}" for hook in _HOOKS if hook in source]
    return found


def test_no_module_level_mutable_state_outside_process() -> None:
    found = [
        f"{path.relative_to(ROOT)} {item}"
        for module, path in _sources()
        if module != "fcache.process"
        for item in _module_state(path)
    ]
    assert not found, "\n".join(found)


def test_the_readme_example_executor_is_the_tested_one() -> None:
    """The documented executor (docs/executors.md, linked from the README's "How it works")
    is tests/text_executor.py's class, verbatim."""
    readme = (ROOT / "docs" / "executors.md").read_text()
    section = readme[readme.index("# Adding an executor") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("\n\n\nregistry.register")]
    source = (ROOT / "tests" / "text_executor.py").read_text()
    assert code.startswith("class TextExecutor:") and code in source
