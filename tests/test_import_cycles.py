"""No import circles in src/: the graph of imports between the modules of ``envsched`` and ``envsched_lab``,
read with ``ast`` from every import statement -- at the top of a module, inside functions, under
``if TYPE_CHECKING`` --, has no cycle.

An import names the module it loads: ``import a.b`` and ``from a import b`` name ``a.b`` when that is a
module, ``from a.b import name`` names ``a.b`` otherwise; relative imports are resolved. The parent packages
that Python initialises first are not edges of their own (their ``__init__`` imports are, like any other).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import envsched

SRC = Path(envsched.__file__).resolve().parents[1]
PACKAGES = ("envsched", "envsched_lab")


def modules(src: Path = SRC, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted name -> file of every module of ``packages`` under ``src`` (a package is its ``__init__.py``)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((src / package).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def import_graph(src: Path = SRC, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, int]]:
    """Module -> {imported module of ``packages``: line of the first import of it}."""
    files = modules(src, packages)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            for target in targets:
                if target in files and target != module:
                    graph[module].setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest circle through the component's first module, as the modules passed (first one repeated)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    return paths[node] + [start]
                if child in members and child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # pragma: no cover - a component always has one


def cycles(src: Path = SRC, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """One line per import circle: ``a (a.py:3) -> b (b.py:7) -> a  [component: a, b]``."""
    graph = import_graph(src, packages)
    files = modules(src, packages)
    out = []
    for component in strongly_connected(graph):
        circle = one_cycle(graph, component)
        steps = [f"{a} ({files[a].relative_to(src)}:{graph[a][b]})" for a, b in itertools.pairwise(circle)]
        out.append(" -> ".join([*steps, circle[0]]) + f"  [component: {', '.join(component)}]")
    return sorted(out)


def test_no_import_cycles_in_src():
    """No exceptions: a circle is broken (a shared lower module, a class passed as a parameter), never listed."""
    assert cycles() == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_finds_constructed_cycles(tmp_path):
    src = _package(tmp_path, {
        "pkg/__init__.py": "from pkg.e import E\n",
        # a circle through a deferred import
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "def f():\n    from pkg import a\n    return a\n",
        # a circle through a relative import and an import for type checking only
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from .d import x\n",
        "pkg/sub/d.py": "from typing import TYPE_CHECKING\nx = 1\nif TYPE_CHECKING:\n    from ..sub.c import x as y\n",
        # a package's __init__ re-exporting its modules is no circle...
        "pkg/e.py": "from pkg.f import F\nE = F\n",
        "pkg/f.py": "F = 1\n",
        # ...but a module importing a name back from its package's __init__ is
        "other/__init__.py": "from other.g import G\n",
        "other/g.py": "def G():\n    from other import H\n    return H\n",
    })
    found = cycles(src, ("pkg", "other"))
    assert found == [
        "other (other/__init__.py:1) -> other.g (other/g.py:2) -> other  [component: other, other.g]",
        "pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:2) -> pkg.a  [component: pkg.a, pkg.b]",
        "pkg.sub.c (pkg/sub/c.py:1) -> pkg.sub.d (pkg/sub/d.py:4) -> pkg.sub.c  [component: pkg.sub.c, pkg.sub.d]",
    ]
    # a circle across the two packages is found too
    (src / "pkg" / "f.py").write_text("def g():\n    import other.g\nF = 1\n")
    (src / "other" / "g.py").write_text("import pkg\nG = 1\n")
    assert cycles(src, ("pkg", "other")) == [
        "other.g (other/g.py:1) -> pkg (pkg/__init__.py:1) -> pkg.e (pkg/e.py:1) -> pkg.f (pkg/f.py:2) -> other.g"
        "  [component: other.g, pkg, pkg.e, pkg.f]", *found[1:]]
