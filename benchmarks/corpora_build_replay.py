"""Time building the BFCL pool, replaying every task's ground truth, and building the benchmark pool.

Usage: ``python benchmarks/corpora_build_replay.py`` (needs bfcl-eval installed with --no-deps).
Prints build/replay times, how many ground-truth replays score 1.0, and the benchmark pool's size.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from envsched.envs.bfcl import build_bfcl_pool, ground_truth_calls, replay_reward
from envsched.envs.default_pool import benchmark_pool


def main() -> None:
    t = time.perf_counter()
    specs = build_bfcl_pool()
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    rewards = [replay_reward(s, ground_truth_calls(s)) for s in specs]
    replay_s = time.perf_counter() - t
    t = time.perf_counter()
    pool = benchmark_pool()
    bench_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        path = pool.to_jsonl(Path(tmp) / "bench.jsonl")
        size = path.stat().st_size
    print(json.dumps({
        "bfcl_build_s": round(build_s, 2),
        "bfcl_replay_800_s": round(replay_s, 2),
        "bfcl_ms_per_episode": round(1000 * replay_s / len(specs), 2),
        "bfcl_full_marks": sum(r == 1.0 for r in rewards),
        "bfcl_unscored": sum(r is None for r in rewards),
        "bfcl_tasks": len(specs),
        "benchmark_build_s": round(bench_s, 2),
        "benchmark_tasks": len(pool),
        "benchmark_envs": len(pool.envs),
        "benchmark_jsonl_bytes": size,
    }, indent=2))


if __name__ == "__main__":
    main()
