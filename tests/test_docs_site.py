"""The documentation site builds with warnings as errors (``mkdocs build --strict``: broken links and anchors,
pages left out of the nav, docstrings the API handler cannot read), and its API reference has an entry for
every public name of ``envsched.__all__``. About 5-10 s for the full build on a loaded 2-core machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import envsched

ROOT = Path(__file__).resolve().parents[1]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=config.parent)


@pytest.mark.slow
def test_the_site_builds_strict_and_documents_every_public_name(tmp_path: Path) -> None:
    out = build(ROOT / "mkdocs.yml", tmp_path / "site")
    log = out.stdout + out.stderr
    assert out.returncode == 0 and "WARNING" not in log, log[-5000:]
    html = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'id="(envsched\.[\w.]+)"', html))
    documented = {a.rsplit(".", 1)[-1] for a in anchors}
    missing = sorted(set(envsched.__all__) - documented)
    assert not missing, f"no API reference entry for {missing}: add them to docs/reference/api.md"
    # the entries are the defining objects, with their docstrings rendered
    assert "envsched.testing.check_sampler" in anchors and "envsched.store.DurableSampler" in anchors
    assert "the first rule broken, by name" in html
    # every page of docs/ is a page of the site (strict mode refuses a page left out of the nav)
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    assert all((tmp_path / "site" / ("" if p == "index" else p) / "index.html").is_file() for p in pages)


def test_strict_mode_refuses_a_broken_link_and_a_page_left_out(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[a page that does not exist](nope.md)\n")
    (docs / "orphan.md").write_text("# Not in the nav\n")
    config = tmp_path / "mkdocs.yml"
    site_config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    head = site_config.split("\nnav:", 1)[0].replace("paths: [src]", f"paths: [{ROOT / 'src'}]")
    config.write_text(head + "\nnav:\n  - Home: index.md\n")
    out = build(config, tmp_path / "site")
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    assert "'nope.md'" in log and "orphan.md" in log, log[-3000:]
