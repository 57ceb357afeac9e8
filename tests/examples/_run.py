"""Runs an example script as a user does: ``python examples/NAME.py ARGS`` in a fresh folder (the test's
``tmp_path``), offline, with envsched's cache in that folder; returns the JSON summary the script prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, args: list[str], cwd: Path, timeout_s: float = 900,
                summary: bool = True) -> dict[str, Any] | None:
    """The JSON object the example prints last on stdout (its summary; ``summary=False``: ``None``, for an example
    that ends with a table). ``timeout_s`` only guards against a hang (a dead rollout child leaves TRL's async
    trainer waiting forever)."""
    env = {**os.environ, "ENVSCHED_CACHE_DIR": str(cwd / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"examples/{name}.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-6000:]}"
    if not summary:
        return None
    text = proc.stdout.strip()
    start = text.rfind("\n{") + 1  # the summary: the last JSON object, at the start of a line
    return json.loads(text[start:])
