"""The documentation runs: every code block of README.md and docs/*.md marked ``<!-- doctest: run -->`` is
executed, and the README's measured tables match the JSON they are generated from.

Marking: the line right before a fenced block says what the block is.

* ``<!-- doctest: run -->`` before a ```` ```python ```` block: executed; the runnable blocks of one document
  share a namespace, in document order (a later block may use an earlier block's names).
* ``<!-- doctest: run -->`` before a ```` ```bash ```` block: run with ``bash -euo pipefail``.
* ``<!-- doctest: fragment -->``: an excerpt that needs the reader's own objects; not run.

Each runnable README block also runs alone (its own process) in a fresh temporary folder, twice: a reader
may copy any one block and run it again. Blocks run in a fresh temporary folder holding a link to the
repository's ``examples/`` (so
``examples/tiny_pool.jsonl`` resolves) with ``ENVSCHED_CACHE_DIR`` pointing into it. Every Python block of
the README must be marked one way or the other, so a new snippet cannot silently go untested.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^(?:<!-- doctest: (?P<mark>run|fragment) -->\n)?```(?P<lang>[a-z]*)[^\n]*\n(?P<code>.*?)^```$",
                    re.M | re.S)


def blocks(path: Path) -> list[tuple[int, str, str | None, str]]:
    """(line, language, mark, code) of each fenced block in ``path``."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start("lang")) + 1
        out.append((line, m.group("lang"), m.group("mark"), m.group("code")))
    return out


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = [doc for doc in DOCUMENTS if any(mark == "run" for _, _, mark, _ in blocks(doc))]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_readme_python_blocks_are_all_marked():
    unmarked = [f"README.md line {line}" for line, lang, mark, _ in blocks(ROOT / "README.md")
                if lang == "python" and mark is None]
    assert not unmarked, "mark each block <!-- doctest: run --> or <!-- doctest: fragment -->: " + str(unmarked)


def test_the_readme_has_runnable_examples():
    kinds = {(lang, mark) for _, lang, mark, _ in blocks(ROOT / "README.md")}
    assert ("python", "run") in kinds and ("bash", "run") in kinds


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE, ids=[d.name for d in RUNNABLE])
def test_runnable_blocks(doc, workdir):
    namespace: dict[str, object] = {"__name__": f"doctest_{doc.stem}"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "120"}
    for line, lang, mark, code in blocks(doc):
        if mark != "run":
            continue
        where = f"{doc.name} line {line}"
        if lang == "python":
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(code, where, "exec"), namespace)
            except Exception as exc:
                pytest.fail(f"the ```python block at {where} failed: {type(exc).__name__}: {exc}\n{out.getvalue()}")
        elif lang == "bash":
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=workdir, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"the ```bash block at {where} failed:\n{proc.stdout}\n{proc.stderr}"
        else:
            pytest.fail(f"{where}: only python and bash blocks can be marked runnable, not {lang!r}")


README_BLOCKS = [(line, lang, code) for line, lang, mark, code in blocks(ROOT / "README.md") if mark == "run"]


@pytest.mark.slow
@pytest.mark.parametrize(("line", "lang", "code"), README_BLOCKS, ids=[f"line{b[0]}" for b in README_BLOCKS])
def test_readme_block_runs_alone_and_twice(line, lang, code, tmp_path):
    """A reader copies one block into a fresh folder and runs it, maybe twice: each runnable README block runs
    alone (in its own process, with no other block's names) in a fresh temporary folder, then again in the same
    folder, over what its first run left there."""
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "ENVSCHED_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "120",
           "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    for attempt in ("first", "second"):
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (f"the ```{lang} block at README.md line {line} failed on its {attempt} run "
                                      f"alone in a fresh folder:\n{proc.stdout}\n{proc.stderr}")


def _tables_module():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "benchmarks" / "readme_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_match_their_data():
    tables = _tables_module()
    marked = 0
    for doc in tables.documents():
        text = doc.read_text(encoding="utf-8")
        marked += text.count("<!-- table:")
        _, changed = tables.rewrite(text)
        assert not changed, f"{doc.name}: tables {changed} differ from docs/tables/*.json; run " \
                            "python benchmarks/readme_tables.py"
    assert marked >= 1


def test_table_rewrite_and_errors(tmp_path):
    tables = _tables_module()
    (tmp_path / "t.json").write_text('{"columns": ["a", "b"], "align": ["left", "right"], '
                                     '"records": [{"a": "x|y", "b": 0.12345}], "format": {"b": "{:.2f}"}}')
    text = "intro\n<!-- table:t -->\nold\n<!-- /table:t -->\nend\n"
    new, changed = tables.rewrite(text, tmp_path)
    assert changed == ["t"]
    assert new == "intro\n<!-- table:t -->\n| a | b |\n|---|---:|\n| x\\|y | 0.12 |\n<!-- /table:t -->\nend\n"
    assert tables.rewrite(new, tmp_path) == (new, [])
    with pytest.raises(tables.TableError, match=r"does not exist"):
        tables.rewrite("<!-- table:nope -->\n<!-- /table:nope -->", tmp_path)
    (tmp_path / "bad.json").write_text('{"columns": ["a", "b"], "rows": [["only one"]]}')
    with pytest.raises(tables.TableError, match=r"row 1 has 1 cells, expected 2"):
        tables.rewrite("<!-- table:bad -->\n<!-- /table:bad -->", tmp_path)


def test_ci_installs_exactly_the_readme_command_2():
    """.ci/run checks pip's output of the README's command 2 for ERROR lines: it must run the same installs, in
    the same order (the --no-deps packages last)."""
    command = next(code for _, lang, _, code in blocks(ROOT / "README.md") if lang == "bash" and "# 2." in code)
    installs = [part.strip() for part in command.splitlines()[-1].split("&&") if "pip install" in part]
    assert len(installs) == 2 and "--no-deps" in installs[1] and "--no-deps" not in installs[0]
    ci = re.sub(r"\\\n\s*", "", (ROOT / ".ci" / "run").read_text())
    found = [m.strip() for m in re.findall(r"(python -m pip install [^&;}|\n]+)", ci)]
    assert found == installs
    assert "grep -n 'ERROR'" in ci
