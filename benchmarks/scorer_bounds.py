"""Bounded benchmark of reasoning-gym scoring: the cost of the hostile answers of docs/scorers.md ("Bounds")
and the scoring throughput of the common case (stops by itself).

Part 1 (hostile answers). Each answer is scored once through ``ReasoningGymEnvironment`` (reset + step) in a
fresh Python process, while a heartbeat thread in that process wakes every 10 ms; the process is killed after
``--cap`` seconds. Printed per answer: the wall time of the step, the reward (or the error), the worst gap
between two heartbeats (how long the scoring stalled the caller's other threads) and the peak resident memory
of the calling process. The goal: every answer of at most
``MAX_ANSWER_CHARS`` characters is scored within 10 s and 1 GiB, and no heartbeat gap exceeds 1 s.

Part 2 (throughput). ``--tasks`` tasks per dataset of the 51 ``DEFAULT_DATASETS`` are scored with their
reference answer and with a wrong answer through ``score_task_answer`` (items regenerated from their specs,
as a trainer scores) and through the environment (``reset`` then ``step``), twice: the first pass builds
each dataset (tier) where it is scored, the second finds it built; printed: answers per second and the median
and 99th-percentile time of one answer.

    python benchmarks/scorer_bounds.py                    # both parts
    python benchmarks/scorer_bounds.py --part hostile --cap 60
    python benchmarks/scorer_bounds.py --part throughput --tasks 10

Measurements on a shared, loaded machine are noisy; the figures are what this run saw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

#: (dataset, label, Python expression of the answer): the reproducers of the audit, and a few more.
HOSTILE: list[tuple[str, str, str]] = [
    ("coin_flip", "1e99999999", "'1e99999999'"),
    ("coin_flip", "1e9999999,9", "'1e9999999,9'"),
    ("coin_flip", "1e-99999999", "'1e-99999999'"),
    ("coin_flip", "1e-2999999", "'1e-2999999'"),
    ("coin_flip", "1e999", "'1e999'"),
    ("propositional_logic", "1 MB of 'P v Q ^ '", "'P \u2228 Q \u2227 ' * 111_111"),
    ("propositional_logic", "100,000 nested parentheses", "'(' * 100_000 + 'P' + ')' * 100_000"),
    ("propositional_logic", "1 MB of negations", "'\u00ac' * 999_999 + 'P'"),
    ("rubiks_cube", "1 MB of moves", "'U ' * 500_000"),
    ("rubiks_cube", "U9999999", "'U9999999'"),
    ("complex_arithmetic", "1 MB of brackets", "'(' * 500_000 + ')' * 500_000"),
    ("complex_arithmetic", "nan", "'nan'"),
    ("prime_factorization", "text", "'zzz'"),
    ("game_of_life_halting", "banana", "'banana'"),
    ("sokoban", "a move", "'U'"),
]

_CHILD = r"""
import json, resource, sys, threading, time
from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool
name, answer = sys.argv[1], eval(sys.argv[2])
spec = build_reasoning_gym_pool([name], tasks_per_dataset=1, seed=3)[0]
env = ReasoningGymEnvironment()
env.reset(spec)
env.reset(spec)
gap, stop = [0.0], []
def beat():
    last = time.monotonic()
    while not stop:
        time.sleep(0.01)
        now = time.monotonic()
        gap[0] = max(gap[0], now - last)
        last = now
t = threading.Thread(target=beat, daemon=True)
t.start()
time.sleep(0.05)
print("ready", flush=True)
started = time.monotonic()
result = env.step(answer)
took = time.monotonic() - started
stop.append(1)
t.join()
kib = lambda who: resource.getrusage(who).ru_maxrss
print(json.dumps({"took_s": took, "reward": result.reward, "info": {k: str(v)[:90] for k, v in result.info.items()},
                  "gap_s": gap[0], "rss_mib": kib(resource.RUSAGE_SELF) >> 10}))
"""


def _peak_mib(pid: int) -> int:
    """VmHWM (peak resident size) of a live process, in MiB (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return next(int(line.split()[1]) >> 10 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0


def _one(name: str, expr: str, cap_s: float, setup_s: float = 180.0) -> dict | str:
    """Run one hostile answer in a fresh process: its JSON result, or why there is none."""
    import select

    proc = subprocess.Popen([sys.executable, "-c", _CHILD, name, expr], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + setup_s
        stepping = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                peak = _peak_mib(proc.pid)
                what = f"the {cap_s:g} s cap" if stepping else f"setup (over {setup_s:g} s)"
                return f"killed at {what}, peak RSS {peak} MiB"
            line = proc.stdout.readline()
            if not line:
                return f"failed: {proc.stderr.read()[-300:]}"
            if line.strip() == "ready":
                stepping, deadline = True, time.monotonic() + cap_s
            elif line.startswith("{"):
                return json.loads(line)
    finally:
        proc.kill()
        proc.wait()


def hostile(cap_s: float) -> None:
    print(f"{'dataset':20s} {'answer':28s} {'step s':>8s} {'gap s':>7s} {'RSS MiB':>8s}  reward")
    for name, label, expr in HOSTILE:
        r = _one(name, expr, cap_s)
        if isinstance(r, str):
            print(f"{name:20s} {label:28s} {'>' + format(cap_s, 'g'):>8s}  {r}")
            continue
        reward = r["reward"] if r["reward"] is not None else f"None {r['info']}"
        note = f" {r['info'].get('scoring', '')}" if r["info"].get("scoring") else ""
        print(f"{name:20s} {label:28s} {r['took_s']:8.2f} {r['gap_s']:7.2f} {r['rss_mib']:8d}  {reward}{note}")


def throughput(tasks: int) -> None:
    from envsched.envs.reasoning_gym import (
        DEFAULT_DATASETS,
        ReasoningGymEnvironment,
        build_reasoning_gym_pool,
        regenerate_item,
        score_task_answer,
    )

    specs = build_reasoning_gym_pool(list(DEFAULT_DATASETS), tasks_per_dataset=tasks, seed=1)
    answers = [(s, str(regenerate_item(s)["answer"])) for s in specs]
    score_task_answer(specs[0], answers[0][1])  # start (a worker, if any) before timing

    def run(label: str, one) -> None:
        times = []
        started = time.perf_counter()
        for spec, ref in answers:
            for answer in (ref, "not the answer 0.123"):
                t0 = time.perf_counter()
                one(spec, answer)
                times.append(time.perf_counter() - t0)
        total = time.perf_counter() - started
        times.sort()
        print(f"{label:46s} {len(times):6d} answers  {len(times) / total:8.0f} /s  median "
              f"{statistics.median(times) * 1e3:7.2f} ms  p99 {times[int(0.99 * (len(times) - 1))] * 1e3:8.2f} ms")

    env = ReasoningGymEnvironment()

    def episode(spec, answer):
        env.reset(spec)
        env.step(answer)

    for attempt in ("first pass", "second pass"):  # the first builds each dataset where it is scored
        run(f"score_task_answer, {attempt}", lambda spec, answer: score_task_answer(spec, answer))
        run(f"environment reset+step, {attempt}", episode)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["hostile", "throughput", "both"], default="both")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds before a hostile answer's process is killed")
    parser.add_argument("--tasks", type=int, default=10, help="tasks per dataset for the throughput part")
    args = parser.parse_args(argv)
    if args.part in ("hostile", "both"):
        hostile(args.cap)
    if args.part in ("throughput", "both"):
        throughput(args.tasks)


if __name__ == "__main__":
    main()
