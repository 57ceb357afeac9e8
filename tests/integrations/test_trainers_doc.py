"""docs/trainers.md shows only lines that a test runs: every line of a code block marked
``<!-- from: tests/... -->`` must appear (whitespace-trimmed) in that test file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trainers.md"
BLOCK = re.compile(r"<!-- from: (?P<test>\S+) -->\s*```[a-z]*\n(?P<code>.*?)```", re.S)


def test_every_marked_doc_line_is_in_its_test():
    text = DOC.read_text()
    blocks = list(BLOCK.finditer(text))
    assert {m["test"] for m in blocks} >= {"tests/integrations/test_trl_grpo.py", "tests/integrations/test_verl.py",
                                           "tests/integrations/test_prime_rl.py"}
    missing = []
    for m in blocks:
        source = (ROOT / m["test"]).read_text()
        for line in m["code"].splitlines():
            if line.strip() and line.strip() not in source:
                missing.append(f"{m['test']}: {line.strip()}")
    assert not missing, "doc lines not found in their tests:\n" + "\n".join(missing)
