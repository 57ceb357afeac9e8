"""docs/trainers.md shows only code that runs:

* a code block marked ``<!-- from: tests/... -->``: every line (whitespace-trimmed) is in that test file, which
  runs it;
* a ``--8<-- "examples/NAME.py:SECTION"`` line (mkdocs snippets, which the docs site expands): the example
  exists and has that section (``# --8<-- [start:SECTION]`` ... ``[end:SECTION]``), and tests/examples runs it.
  The TRL, prime-rl and verl sections show their examples this way, never copied lines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trainers.md"
BLOCK = re.compile(r"<!-- from: (?P<test>\S+) -->\s*```[a-z]*\n(?P<code>.*?)```", re.S)
SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"$', re.M)


def test_every_marked_doc_line_is_in_its_test():
    text = DOC.read_text()
    missing = []
    for m in BLOCK.finditer(text):
        source = (ROOT / m["test"]).read_text()
        for line in m["code"].splitlines():
            if line.strip() and line.strip() not in source:
                missing.append(f"{m['test']}: {line.strip()}")
    assert not missing, "doc lines not found in their tests:\n" + "\n".join(missing)


def test_included_example_sections_exist_and_each_integration_shows_its_example():
    text = DOC.read_text()
    included = [(m["file"], m["section"]) for m in SNIPPET.finditer(text)]
    for file, section in included:
        path = ROOT / file
        assert path.is_file() and file.startswith("examples/"), file
        assert (ROOT / "tests" / "examples" / f"test_{path.stem}.py").is_file(), f"no test runs {file}"
        if section:
            source = path.read_text()
            assert f"--8<-- [start:{section}]" in source and f"--8<-- [end:{section}]" in source, \
                f"{file} has no section {section!r}"
    files = {f for f, _ in included}
    assert {"examples/trl_grpo.py", "examples/verl_grpo.py", "examples/prime_rl_orchestrator.py"} <= files
    for section in ("## TRL (`GRPOTrainer`)", "## prime-rl", "## verl 0.9.1"):  # no lines lifted from tests
        body = text.split(section, 1)[1].split("\n## ", 1)[0]
        assert "<!-- from:" not in body, section
