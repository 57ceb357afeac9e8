"""The method's modules number the paper's stages one way: 1 features and graph (``graph/``), 2 history and
prediction (``history/``), 3 batch scheduling (``scheduling/``); nothing else in ``method/`` claims a stage."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import envsched.method

ROOT = Path(envsched.method.__file__).parent
STAGES = {"graph": 1, "history": 2, "scheduling": 3}


def _claims() -> dict[str, list[int]]:
    """Every ``Stage N`` that a module docstring of ``method/`` states, by module path."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        out[str(path.relative_to(ROOT))] = [int(n) for n in re.findall(r"\bStage (\d+)\b", doc, re.IGNORECASE)]
    return out


def test_each_stage_package_says_its_number():
    claims = _claims()
    for package, n in STAGES.items():
        assert claims[f"{package}/__init__.py"][:1] == [n], package


def test_no_module_claims_another_stage_than_its_package():
    wrong = {module: found for module, found in _claims().items()
             if found and set(found) != {STAGES.get(module.split("/")[0])}}
    assert wrong == {}
