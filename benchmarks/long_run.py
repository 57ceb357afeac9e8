"""Benchmark: the scheduling step, memory and checkpoint size over long runs and at scale (issue 18).

One step = ``update`` of 64 groups of 8 rewards + ``sample(64)``, timed with ``time.perf_counter`` (the reward
draws around it are not timed). The same loop drives every sampler. Two parts:

* **long** (``--sizes``, default 10,000 and 100,000 tasks; ``--presets``, default ``default`` =
  ``SchedulerConfig()`` and ``paper`` = ``SchedulerConfig.paper()``): one run per size and preset, and at each
  step of ``--at`` (default 50, 1,000 and 10,000) the median step time over the last ``--window`` steps (20),
  the process's **current** RSS (``/proc/self/statm``: resident pages x page size, after ``gc.collect()``),
  its peak RSS (``resource.getrusage(...).ru_maxrss``), ``len(json.dumps(sampler.state_dict()))`` and the
  times of that dump (``state_dict()`` + ``json.dumps``) and of the load back (``json.loads`` +
  ``load_state_dict`` into the same sampler, which continues as before). Baselines join only when named in
  ``--long-samplers``.
* **scale** (``--scale-sizes``, default 2,550, 100,000 and 1,000,000 tasks): the EnvSched presets and
  ``--samplers`` (default ``uniform``, ``mopps``, ``plr`` from ``envsched.samplers``), each timed in two
  states of one run: **benchmark** state (after ``--warmup`` = 10 steps, the median of ``--steps`` = 15
  timed steps) and **steady** state: the same run continued to ``--steady-steps`` steps in all (default
  ``min(max(ceil(N / 64), 200), 1000)``: 200 at 2,550 tasks, 1,000 = 64,000 observed groups at 100k and
  1M, where a full pass over the pool would take 15,625 steps), then ``--steps`` more timed. A run stops
  warming at ``--steady-budget-s`` (600 s) of warm-up and says how many steps it ran; each row reports
  the share of tasks observed at least once (``observed_fraction``).

Graphs: :func:`envsched.method.graph.synthetic.synthetic_graph` (50 tasks per environment), as
``benchmarks/bench_scheduler_step.py``; the baselines get the same task specs without building the graph.
Rewards: Bernoulli(p) per rollout; task ``i`` has ``logit p_i(t) = logit p0_i + DRIFT * t`` at step ``t``,
``p0_i ~ Beta(0.6, 0.6)`` and ``DRIFT = 2 / 10,000`` per step, so every task gets slowly easier (over
10,000 steps a task at p0 = 0.5 reaches 0.88) and the reference the scheduler centres on keeps moving.

Every (part, size, sampler) runs in a fresh subprocess (``--in-process`` to skip that), so a peak RSS never
mixes sizes; each prints progress lines on stderr as it goes, the summary goes to stdout and ``--json OUT``.
Run it in pieces on a shared machine, with nice::

    nice .venv/bin/python benchmarks/long_run.py --part long --sizes 10000 --at 50 1000 --json long-10k.json
    nice .venv/bin/python benchmarks/long_run.py --part scale --scale-sizes 2550 100000 --json scale.json
    nice .venv/bin/python benchmarks/long_run.py --quick      # 2,000 tasks, --at 20 100, a minute or less
    python benchmarks/long_run.py --markdown long-10k.json long-2550.json   # docs/performance.md's table
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH, GROUP = 64, 8
DRIFT = 2.0 / 10_000
TASKS_PER_ENV = 50
BASELINES = ("uniform", "mopps", "plr")
PRESETS = ("default", "paper")


# ---------------------------------------------------------------------------------------------- one run
def _rss_mib() -> tuple[float | None, float]:
    """(current RSS from /proc/self/statm or None where there is none, peak RSS from getrusage), in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    try:
        with open("/proc/self/statm") as fh:
            resident = int(fh.read().split()[1])
        current = resident * os.sysconf("SC_PAGE_SIZE") / 2**20
        return current, max(peak, current)  # the kernel updates its high-water mark lazily
    except (OSError, ValueError, IndexError):
        return None, peak


def _build(name: str, n: int, seed: int) -> Any:
    """``envsched-default`` / ``envsched-paper`` over a synthetic graph, or a baseline over the same task specs."""
    n_envs = max(1, n // TASKS_PER_ENV)
    if name.startswith("envsched-"):
        from envsched.method.config import SchedulerConfig
        from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
        from envsched.method.sampler import EnvSchedSampler

        graph = synthetic_graph(n, n_envs, seed=seed)
        config = SchedulerConfig.paper() if name == "envsched-paper" else SchedulerConfig()
        return EnvSchedSampler(synthetic_tasks(graph), graph, config, seed=seed)
    from envsched.samplers.registry import make_sampler

    tasks = [{"id": f"t{i}", "env": f"env{i % n_envs}"} for i in range(n)]  # synthetic_tasks' specs
    return make_sampler(name, tasks, seed=seed, group_size=GROUP)


class _Loop:
    """The shared training loop: drifting Bernoulli rewards for the pending batch, then one timed step."""

    def __init__(self, sampler: Any, n: int, seed: int) -> None:
        self.sampler = sampler
        self.rng = np.random.default_rng(seed + 1)
        p0 = np.clip(self.rng.beta(0.6, 0.6, size=n), 1e-4, 1 - 1e-4)
        self.logit0 = np.log(p0 / (1 - p0))
        self.seen = np.zeros(n, dtype=bool)
        self.pending = sampler.sample(BATCH)
        self.t = 0
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # process CPU time of each step: steadier than wall time on a loaded machine

    def step(self) -> float:
        pos = np.fromiter((self.sampler.position_of(t) for t in self.pending), dtype=np.int64, count=len(self.pending))
        p = 1.0 / (1.0 + np.exp(-(self.logit0[pos] + DRIFT * self.t)))
        rewards = (self.rng.random((len(pos), GROUP)) < p[:, None]).astype(float).tolist()
        self.seen[pos] = True
        t0, c0 = time.perf_counter(), time.process_time()
        for task, r in zip(self.pending, rewards, strict=True):
            self.sampler.update(task, r)
        self.pending = self.sampler.sample(BATCH)
        dt = time.perf_counter() - t0
        self.cpu_times.append(time.process_time() - c0)
        self.t += 1
        self.times.append(dt)
        return dt


def _state_figures(sampler: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    text = json.dumps(sampler.state_dict())
    dump = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampler.load_state_dict(json.loads(text))
    load = time.perf_counter() - t0
    return {"state_json_bytes": len(text), "state_dump_s": dump, "state_load_s": load}


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def run_long(name: str, n: int, at: list[int], window: int, seed: int) -> list[dict[str, Any]]:
    """One run of ``max(at)`` steps; a row at each step of ``at``."""
    t0 = time.perf_counter()
    sampler = _build(name, n, seed)
    init = time.perf_counter() - t0
    loop = _Loop(sampler, n, seed)
    print(f"[long {name} {n:,}] built in {init:.1f} s; running to step {max(at):,}", file=sys.stderr, flush=True)
    rows = []
    started = time.perf_counter()
    for k in range(1, max(at) + 1):
        loop.step()
        if k in at:
            last = loop.times[-min(window, k):]
            history = getattr(sampler, "history", None)
            gc.collect()
            current, peak = _rss_mib()
            row = {"part": "long", "sampler": name, "tasks": n, "step": k, "init_s": init,
                   "median_step_s": statistics.median(last), "min_step_s": min(last), "max_step_s": max(last),
                   "median_step_cpu_s": statistics.median(loop.cpu_times[-min(window, k):]),
                   # EnvSched: rows in its dispatch and observation logs (bounded by the live window in the decayed
                   # form, by the horizon in the bounded one)
                   "history_rows": (len(history.obs) + len(history.dispatch)) if history is not None else None,
                   "window": len(last), "rss_current_mib": current, "rss_peak_mib": peak,
                   "observed_fraction": float(loop.seen.mean()), **_state_figures(sampler),
                   "wall_s": time.perf_counter() - started}
            rows.append(row)
            cur = f"{current:.0f}" if current is not None else "n/a"
            print(f"[long {name} {n:,}] step {k:>6,}: median {_ms(row['median_step_s'])} over {len(last)} "
                  f"(CPU {_ms(row['median_step_cpu_s'])}, history rows {row['history_rows']}), "
                  f"RSS {cur} MiB (peak {peak:.0f}), state {row['state_json_bytes'] / 2**20:.2f} MiB "
                  f"(dump {_ms(row['state_dump_s'])}, load {_ms(row['state_load_s'])}), "
                  f"{row['observed_fraction']:.0%} of tasks observed, {row['wall_s']:.0f} s", file=sys.stderr,
                  flush=True)
    return rows


def default_steady_steps(n: int) -> int:
    return min(max(math.ceil(n / BATCH), 200), 1000)


def run_scale(name: str, n: int, warmup: int, steps: int, steady_steps: int | None, budget_s: float,
              seed: int) -> list[dict[str, Any]]:
    """Benchmark state (``warmup`` steps, then ``steps`` timed), then steady state (the same run continued to
    ``steady_steps`` steps in all, at most ``budget_s`` of warm-up, then ``steps`` timed)."""
    t0 = time.perf_counter()
    sampler = _build(name, n, seed)
    init = time.perf_counter() - t0
    loop = _Loop(sampler, n, seed)
    target = steady_steps if steady_steps is not None else default_steady_steps(n)
    print(f"[scale {name} {n:,}] built in {init:.1f} s", file=sys.stderr, flush=True)
    rows = []

    def timed(state: str) -> None:
        first = len(loop.times)
        for _ in range(steps):
            loop.step()
        t = loop.times[first:]
        current, peak = _rss_mib()
        row = {"part": "scale", "sampler": name, "tasks": n, "state": state, "steps_before": first,
               "median_step_s": statistics.median(t), "min_step_s": min(t), "max_step_s": max(t),
               "steps_timed": len(t), "observed_fraction": float(loop.seen.mean()), "init_s": init,
               "rss_current_mib": current, "rss_peak_mib": peak}
        rows.append(row)
        print(f"[scale {name} {n:,}] {state:>9} (after {first:,} steps, {row['observed_fraction']:.0%} of tasks "
              f"observed): median {_ms(row['median_step_s'])} (min {_ms(row['min_step_s'])}, "
              f"max {_ms(row['max_step_s'])})", file=sys.stderr, flush=True)

    for _ in range(warmup):
        loop.step()
    timed("benchmark")
    started = time.perf_counter()
    report = started
    while len(loop.times) < target and time.perf_counter() - started < budget_s:
        loop.step()
        if time.perf_counter() - report > 30:
            report = time.perf_counter()
            print(f"[scale {name} {n:,}] warming: step {len(loop.times):,} of {target:,}", file=sys.stderr,
                  flush=True)
    if len(loop.times) < target:
        print(f"[scale {name} {n:,}] steady warm-up stopped at the {budget_s:.0f} s budget after "
              f"{len(loop.times):,} of {target:,} steps", file=sys.stderr, flush=True)
    timed("steady")
    return rows


def run_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["part"] == "long":
        return run_long(job["sampler"], job["tasks"], job["at"], job["window"], job["seed"])
    return run_scale(job["sampler"], job["tasks"], job["warmup"], job["steps"], job["steady_steps"],
                     job["budget_s"], job["seed"])


def _in_subprocess(job: dict[str, Any]) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--job", json.dumps(job)],
                          stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the {job['part']} run of {job['sampler']} at {job['tasks']:,} tasks failed "
                           f"(exit {proc.returncode}); its stderr is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- the whole
def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    envsched = [f"envsched-{p}" for p in args.presets]
    jobs: list[dict[str, Any]] = []
    if args.part in ("long", "both"):
        for n in args.sizes:
            for name in envsched + list(args.long_samplers):
                jobs.append({"part": "long", "sampler": name, "tasks": n, "at": sorted(set(args.at)),
                             "window": args.window, "seed": args.seed})
    if args.part in ("scale", "both"):
        for n in args.scale_sizes:
            for name in envsched + list(args.samplers):
                jobs.append({"part": "scale", "sampler": name, "tasks": n, "warmup": args.warmup,
                             "steps": args.steps, "steady_steps": args.steady_steps,
                             "budget_s": args.steady_budget_s, "seed": args.seed})
    return jobs


def _table(rows: list[dict[str, Any]]) -> str:
    lines = []
    longs = [r for r in rows if r["part"] == "long"]
    if longs:
        lines.append("sampler          tasks     step   median step   RSS now (peak) MiB   state MiB   dump / load")
        for r in longs:
            cur = f"{r['rss_current_mib']:.0f}" if r["rss_current_mib"] is not None else "n/a"
            lines.append(f"{r['sampler']:<15} {r['tasks']:>7,} {r['step']:>8,} {_ms(r['median_step_s']):>13} "
                         f"{cur:>10} ({r['rss_peak_mib']:.0f}) {r['state_json_bytes'] / 2**20:>11.2f}   "
                         f"{_ms(r['state_dump_s'])} / {_ms(r['state_load_s'])}")
    scales = [r for r in rows if r["part"] == "scale"]
    if scales:
        lines.append("sampler          tasks       state   after steps   observed   median step")
        for r in scales:
            lines.append(f"{r['sampler']:<15} {r['tasks']:>9,} {r['state']:>9} {r['steps_before']:>13,} "
                         f"{r['observed_fraction']:>9.0%} {_ms(r['median_step_s']):>13}")
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as docs/performance.md's Markdown tables (``--markdown``): the long part, one line per size, preset
    and measured step, with the median wall and CPU step, RSS, state and dump / load times; then, where there are
    any, the scale part, one line per size, sampler and state."""
    head = ("| tasks | preset | after step | tasks observed | median step (CPU) | RSS | state | dump / load |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in sorted((r for r in rows if r["part"] == "long"), key=lambda r: (r["tasks"], r["sampler"], r["step"])):
        preset = r["sampler"].removeprefix("envsched-")
        rss = f"{r['rss_current_mib']:.0f} MiB" if r["rss_current_mib"] is not None else "n/a"
        lines.append(f"| {r['tasks']:,} | {preset} | {r['step']:,} | {r['observed_fraction']:.0%} | "
                     f"{_ms(r['median_step_s'])} ({_ms(r['median_step_cpu_s'])}) | {rss} | "
                     f"{r['state_json_bytes'] / 2**20:.2f} MiB | "
                     f"{r['state_dump_s'] * 1e3:.0f} / {r['state_load_s'] * 1e3:.0f} ms |")
    scale = sorted((r for r in rows if r["part"] == "scale"),
                   key=lambda r: (r["tasks"], r["sampler"], r["state"] != "benchmark"))
    if scale:
        lines += ["",
                  "| tasks | sampler | state | after steps | tasks observed | median step (min, max) | RSS (peak) |",
                  "|---:|---|---|---:|---:|---:|---:|"]
        for r in scale:
            rss = f"{r['rss_current_mib']:.0f}" if r["rss_current_mib"] is not None else "n/a"
            lines.append(f"| {r['tasks']:,} | {r['sampler'].removeprefix('envsched-')} | {r['state']} | "
                         f"{r['steps_before']:,} | {r['observed_fraction']:.0%} | {_ms(r['median_step_s'])} "
                         f"({_ms(r['min_step_s'])}, {_ms(r['max_step_s'])}) | {rss} ({r['rss_peak_mib']:.0f}) MiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("long", "scale", "both"), default="both")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="tasks, long part")
    ap.add_argument("--at", type=int, nargs="+", default=[50, 1_000, 10_000], help="steps measured, long part")
    ap.add_argument("--window", type=int, default=20, help="steps in each median of the long part")
    ap.add_argument("--presets", nargs="*", choices=PRESETS, default=list(PRESETS), help="EnvSched presets")
    ap.add_argument("--samplers", nargs="*", choices=BASELINES, default=list(BASELINES),
                    help="baselines timed in the scale part")
    ap.add_argument("--long-samplers", nargs="*", choices=BASELINES, default=[],
                    help="baselines also run in the long part (none by default)")
    ap.add_argument("--scale-sizes", type=int, nargs="+", default=[2_550, 100_000, 1_000_000])
    ap.add_argument("--warmup", type=int, default=10, help="steps before the benchmark-state timing")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per state, scale part")
    ap.add_argument("--steady-steps", type=int, default=None,
                    help="steps in all before the steady-state timing (default min(max(ceil(N/64), 200), 1000))")
    ap.add_argument("--steady-budget-s", type=float, default=600.0, help="most seconds of steady warm-up per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="small run: 2,000 tasks, --at 20 100, scale part at 2,550 tasks with 40 steady steps")
    ap.add_argument("--in-process", action="store_true", help="run every configuration in this process")
    ap.add_argument("--json", dest="json_out", default=None, help="write the rows to this JSON file")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--markdown", nargs="+", metavar="JSON", default=None,
                    help="print docs/performance.md's long-run table from earlier runs' --json files; runs nothing")
    args = ap.parse_args(argv)
    if args.markdown:
        rows = []
        for path in args.markdown:
            try:
                rows.extend(json.loads(Path(path).read_text())["rows"])
            except (OSError, ValueError, KeyError) as exc:
                ap.error(f"cannot read the rows of {path}: {exc}")
        print(markdown_table(rows))
        return 0
    if args.job is not None:
        print(json.dumps(run_job(json.loads(args.job))))
        return 0
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    if args.quick:
        if "--sizes" not in given:
            args.sizes = [2_000]
        if "--at" not in given:
            args.at = [20, 100]
        if "--scale-sizes" not in given:
            args.scale_sizes = [2_550]
        if "--steady-steps" not in given:
            args.steady_steps = 40
        if "--steps" not in given:
            args.steps = 5
        if "--warmup" not in given:
            args.warmup = 3
    bad = [x for x in (*args.sizes, *args.scale_sizes) if x < 2]
    if bad or min(args.at) < 1 or args.window < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("sizes must be >= 2 tasks, --at steps, --window and --steps >= 1, --warmup >= 0")
    if min(args.sizes) < BATCH or min(args.scale_sizes) < BATCH:
        ap.error(f"a pool needs at least {BATCH} tasks (one batch of distinct tasks)")
    jobs = _jobs(args)
    load0 = os.getloadavg()
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for job in jobs:
        rows.extend(run_job(job) if args.in_process else _in_subprocess(job))
    print(_table(rows))
    out = {"rows": rows, "argv": sys.argv[1:] if argv is None else argv, "batch": BATCH, "group": GROUP,
           "drift_per_step": DRIFT, "wall_s": time.perf_counter() - t0,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "loadavg_start": load0, "loadavg_end": os.getloadavg()}}
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
