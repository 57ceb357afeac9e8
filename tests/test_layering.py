"""The package's layers (docs/development.md): a module imports envsched code only from its own layer and
the layers below it, deferred imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import envsched

PACKAGE = Path(envsched.__file__).resolve().parent

#: layer of each top-level part of the package, lowest first
LAYERS: dict[str, int] = {
    "_version": 0, "llm_http": 0, "errors": 0, "validation": 0,
    "pool": 1,
    "samplers": 2, "envs": 2, "testing": 2,
    "method": 3,
    "store": 4, "evaluation": 4, "integrations": 4, "ray": 4, "distributed": 4, "simulation": 4,
    "dashboard": 5,
    "cli": 6,
}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "envsched" else None


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``envsched.*`` import in ``path`` (top level and inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("envsched.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "envsched":  # from envsched import X: the top level (above everything)
                found += [(node.lineno, "envsched.__init__")]
            elif node.module.startswith("envsched."):
                found.append((node.lineno, node.module))
    return found


def violations(package: Path = PACKAGE) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if len(rel.parts) == 1:  # __init__.py (lazy re-exports) is the top; ray.py is a part of its own
            if rel.stem == "__init__":
                continue
            part = rel.stem
        else:
            part = rel.parts[0]
        own = LAYERS.get(part)
        assert own is not None, f"{rel}: {part!r} has no layer in tests/test_layering.py (and docs/development.md)"
        for line, module in imports(path):
            if module == "envsched.__init__":
                if own < LAYERS["cli"]:
                    out.append(f"{rel}:{line} imports the top-level package (only cli may)")
                continue
            target = _part(module)
            if target is None or target == "__init__":
                continue
            if target not in LAYERS:
                continue  # e.g. a version attribute; not a layer
            if LAYERS[target] > own:
                out.append(f"{rel}:{line} ({part}, layer {own}) imports {module} (layer {LAYERS[target]})")
    return out


def test_pool_is_the_lowest_layer():
    # above layer 0 (the version string, envsched.errors, the exceptions, and envsched.validation, the checks)
    pool_imports = {m for p in (PACKAGE / "pool").rglob("*.py") for _, m in imports(p)}
    layer0 = {f"envsched.{name}" for name, layer in LAYERS.items() if layer == 0}
    assert pool_imports and all(m.startswith("envsched.pool") or m in layer0 for m in pool_imports), pool_imports
    assert {"envsched.errors", "envsched.validation"} <= pool_imports


def test_no_module_imports_a_higher_layer():
    assert violations() == []


@pytest.mark.slow
def test_version_lives_in_its_own_module():
    """Below the CLI nothing imports the package root, not even for the version (envsched/_version.py), and
    the version agrees with pyproject.toml's."""
    import tomllib

    from envsched._version import __version__

    below_cli = [f"{p.relative_to(PACKAGE)}:{line}" for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).parts[0] not in ("cli", "__init__.py")
                 for line, m in imports(p) if m == "envsched.__init__"]
    assert below_cli == []
    pyproject = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
    assert envsched.__version__ == __version__ == pyproject["project"]["version"]


def test_the_check_finds_an_upward_import(tmp_path):
    pkg = tmp_path / "envsched"
    (pkg / "pool").mkdir(parents=True)
    (pkg / "pool" / "default.py").write_text("def f():\n    from envsched.envs.builders import build_combined_pool\n")
    assert violations(pkg) == ["pool/default.py:2 (pool, layer 1) imports envsched.envs.builders (layer 2)"]


def lab_imports(package: Path = PACKAGE) -> list[str]:
    """``file:line`` of every import of the benchmark lab (``envsched_lab``) inside the library."""
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "envsched_lab" or n.startswith("envsched_lab.") for n in names):
                out.append(f"{path.relative_to(package)}:{node.lineno}")
    return out


def test_the_library_never_imports_the_lab():
    """The lab (envsched_lab) sits above the library: the CLI names its `bench` command by a string, loaded
    only when that command runs."""
    assert lab_imports() == []


def test_the_lab_check_finds_an_import(tmp_path):
    pkg = tmp_path / "envsched"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "x.py").write_text("def f():\n    from envsched_lab.runner import run_one\n")
    assert lab_imports(pkg) == ["cli/x.py:2"]


@pytest.mark.slow
def test_importing_the_library_loads_neither_torch_nor_the_lab():
    """Every public name of the package resolved, in a fresh interpreter: torch and envsched_lab stay out."""
    import subprocess
    import sys

    code = ("import sys, envsched\n"
            "[getattr(envsched, name) for name in envsched.__all__]\n"
            "loaded = sorted(m for m in ('torch', 'envsched_lab') if m in sys.modules)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
