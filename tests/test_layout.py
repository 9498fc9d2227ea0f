"""The package's shape: the library never imports the command line or the lab, and no two
modules import each other, directly or round a loop (module-level and function-level imports
alike, read from the source with ``ast``, so an import hidden inside a function counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import idemcrawl

PACKAGE = Path(idemcrawl.__file__).resolve().parent
#: Modules that may use the command line and the lab: they are the top of the house.
TOP = {"idemcrawl.cli", "idemcrawl.__main__"}
#: C extension modules (setup.py): leaves that import nothing of the package. Listed rather than
#: found on disk, since an install without a C compiler has none and must pass all the same.
EXTENSIONS = {"idemcrawl._simhash", "idemcrawl._links", "idemcrawl._warc"}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source."""
    modules = _modules()
    leaves = modules.keys() | EXTENSIONS

    def known(name: str) -> str | None:
        while name and name not in leaves:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in EXTENSIONS}
    for name, (path, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                prefix = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:  # "from . import url" imports the module idemcrawl.url
                    full = f"{prefix}.{alias.name}"
                    targets.add(full if full in leaves else prefix)
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets.add(node.args[0].value)
        graph[name] = {
            t for t in map(known, targets) if t is not None and t != name and t in leaves
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "idemcrawl.frontier.base" in graph["idemcrawl.config"]
    assert "idemcrawl.url" in graph["idemcrawl.fetch"]  # from . import url as urls
    assert "idemcrawl.status" in graph["idemcrawl.serve"]
    assert "idemcrawl._simhash" in graph["idemcrawl.dedup"]  # from . import _simhash (C)
    assert "idemcrawl._links" in graph["idemcrawl.url"]  # from . import _links (C)
    assert "idemcrawl._warc" in graph["idemcrawl.warc_records"]  # from . import _warc (C)
    assert "idemcrawl.lab.bench.crawl" in graph["idemcrawl.lab.commands"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_the_library_never_imports_the_cli_or_the_lab() -> None:
    offenders = {
        module: sorted(t for t in targets if t in TOP or t.startswith("idemcrawl.lab"))
        for module, targets in import_graph().items()
        if module not in TOP and not module.startswith("idemcrawl.lab")
    }
    assert {m: t for m, t in offenders.items() if t} == {}
