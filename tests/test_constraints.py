"""The pins in constraints/ and pyproject.toml resolve from plain PyPI: no local version labels (``+cpu``).

A local label (``torch==2.13.0+cpu``) names a build only a vendor index serves; ``torch==2.13.0`` still takes
a local CPU wheel where one is offered (PEP 440: a specifier without a label matches labelled versions).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _constraint_lines() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted((ROOT / "constraints").glob("*.txt")):
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            text = line.split("#", 1)[0].strip()
            if text and not text.startswith("-"):
                out.append((path.name, lineno, text))
    return out


def _pyproject_requirements() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"]["optional-dependencies"].values():
        reqs += extra
    return reqs


def local_labels(requirement: str) -> list[str]:
    """The pinned versions of ``requirement`` that carry a local label (``+...``)."""
    req = Requirement(requirement)
    return [str(spec) for spec in req.specifier if "+" in spec.version]


def test_local_labels_are_detected():
    assert local_labels("torch==2.13.0+cpu") == ["==2.13.0+cpu"]
    assert local_labels("torch==2.13.0") == []
    assert local_labels("psycopg[binary]>=3.1") == []


def test_constraints_are_plain_pypi_pins():
    lines = _constraint_lines()
    assert len(lines) > 100  # the file is read (not an empty glob)
    bad = [f"{name}:{lineno}: {text}" for name, lineno, text in lines if local_labels(text)]
    assert not bad, "local version labels are not on PyPI; pin the plain version:\n" + "\n".join(bad)
    for _name, _lineno, text in lines:
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[^\s+]+", text), text


def test_pyproject_pins_have_no_local_label():
    reqs = _pyproject_requirements()
    assert any(r.startswith("torch==") for r in reqs)
    assert [r for r in reqs if local_labels(r)] == []
