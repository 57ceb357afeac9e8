"""Coverage-guided fuzzing of the pool loader with atheris (https://github.com/google/atheris).

    pip install atheris
    python fuzz/fuzz_pool_loader.py -max_total_time=60 [corpus_dir]

The property: ``TaskPool.from_file`` on any bytes either returns a valid pool (unique string ids, non-empty
envs, and a JSONL round trip with the same fingerprint) or raises ``TaskSpecError`` naming the file. Any
other exception is a crash atheris reports with the input that caused it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from envsched.pool import TaskPool, TaskSpecError

_DIR = Path(tempfile.mkdtemp(prefix="envsched-fuzz-"))


def test_one_input(data: bytes) -> None:
    suffix = ".json" if data[:1] == b"[" or (data[:1] and data[0] % 4 == 0) else ".jsonl"
    path = _DIR / f"pool{suffix}"
    path.write_bytes(data)
    try:
        pool = TaskPool.from_file(path, max_line_bytes=1 << 16)
    except TaskSpecError as exc:
        if str(path) not in str(exc):
            raise AssertionError(f"error does not name the file: {exc}") from None
        return
    ids = pool.ids
    if len(set(ids)) != len(ids):
        raise AssertionError("duplicate ids in a loaded pool")
    if not all(isinstance(s["env"], str) and s["env"].strip() for s in pool):
        raise AssertionError("a loaded task has no environment")
    out = _DIR / "roundtrip.jsonl"
    pool.to_jsonl(out)
    again = TaskPool.from_file(out, reward_range=pool.reward_range)
    if again.fingerprint() != pool.fingerprint():
        raise AssertionError("JSONL round trip changed the pool")


def main() -> None:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
