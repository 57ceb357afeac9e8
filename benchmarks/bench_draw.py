"""Benchmark: the cost of one draw of the EnvSched default, for asynchronous trainers and large pools.

Asynchronous trainers (TRL's ``AsyncGRPOTrainer``, prime-rl, verl's replay buffer) ask for one group at a time.
This times, on a synthetic pool of each ``--sizes`` (:func:`envsched.method.graph.synthetic.synthetic_graph`, 50
tasks per environment, as ``benchmarks/bench_scheduler_step.py`` and ``benchmarks/long_run.py`` build them) and
Bernoulli rewards (a fixed ``p ~ Beta(0.6, 0.6)`` per task, 8 rollouts per group):

1. ``--warmup`` (100) steps of ``sample(64)`` followed by the 64 ``update`` calls of its groups (untimed);
2. ``--draws`` (200) calls of ``sample(1)`` each followed by the ``update`` of its group: the **draw** figure is
   the median over these calls of the time of ``sample(1)`` plus its ``update`` (the rewards are drawn before
   the clock starts); the rows also give the mean, how many of the draws were coverage picks (the coverage debt's)
   and the median CPU time of each phase's draws;
3. ``--batches`` (30) calls of ``sample(64)`` (each followed by its 64 updates, untimed): the **batch** figure is
   the median time of ``sample(64)``;
4. ``--pairs`` (100) calls of ``sample(2)`` (what TRL's trainer draws at two tasks a step) each followed by the
   ``update`` of its two groups: the **pair** figure is the median time of ``sample(2)`` plus its updates;
5. the state: ``len(json.dumps(sampler.state_dict()))``, the time of ``state_dict()`` + ``json.dumps`` and of
   ``json.loads`` + ``load_state_dict``, and the process's resident memory.

Wall time (``time.perf_counter``) and process CPU time (``time.process_time``) are both reported; on a shared
machine the CPU time is the steadier one. Every (version, size, repetition) runs in a fresh subprocess. To compare
two versions of the code in one session, give each a source tree with ``--version NAME=SRC_DIR`` (for instance a
``git archive`` of an earlier commit's ``src/``); the runs alternate between versions, size by size, and the
table gives each version's medians and their ratio, so that the load of a shared machine falls on both alike. The
load average (``os.getloadavg``) is recorded at the start and end of every run. ``--config`` times another
configuration than ``SchedulerConfig()``: ``adaptive`` (the default with the online coverage share and the UCB
coverage order, the default before it took the paper's fixed split) or ``paper``. Commands::

    python benchmarks/bench_draw.py --sizes 2550 100000 1000000 --json draw.json
    git archive 7f914f4 src | tar -x -C /tmp/before   # the code before one-task draws
    python benchmarks/bench_draw.py --version before=/tmp/before/src --version after=src --json draw.json
    python benchmarks/bench_draw.py --markdown draw.json      # docs/performance.md's tables (the draws by phase)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_run import _state_figures  # the same dump / load timing as the long-run benchmark

TASKS_PER_ENV = 50
GROUP = 8
BATCH = 64


def _rss_mib() -> float | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


#: ``--config``: the configurations a run can time (``adaptive``: the default before it took the paper's fixed split
#: and coverage ranking, the lab's ``envsched-adaptive``)
CONFIGS = {"default": {}, "adaptive": {"adaptive_share": True, "adaptive_coverage": True}, "paper": None}


def run_one(n: int, warmup: int, draws: int, batches: int, seed: int, pairs: int = 100,
            config: str = "default") -> dict[str, Any]:
    """One run at ``n`` tasks with the code importable as ``envsched`` (see the module docstring)."""
    import envsched
    from envsched.method.config import SchedulerConfig
    from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
    from envsched.method.sampler import EnvSchedSampler

    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    graph = synthetic_graph(n, max(1, n // TASKS_PER_ENV), seed=seed)
    tasks = synthetic_tasks(graph)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    knobs = CONFIGS[config]
    sampler = EnvSchedSampler(tasks, graph, SchedulerConfig.paper() if knobs is None else SchedulerConfig(**knobs),
                              seed=seed)
    init = time.perf_counter() - t0
    rng = np.random.default_rng(seed + 1)
    p = rng.beta(0.6, 0.6, size=n)

    def rewards_of(batch: list[Any]) -> list[list[float]]:
        pos = np.fromiter((sampler.position_of(t) for t in batch), dtype=np.int64, count=len(batch))
        return (rng.random((pos.size, GROUP)) < p[pos, None]).astype(float).tolist()

    t0 = time.perf_counter()
    for _ in range(warmup):
        batch = sampler.sample(BATCH)
        for task, r in zip(batch, rewards_of(batch), strict=True):
            sampler.update(task, r)
    warm = time.perf_counter() - t0
    gc.collect()
    draw_wall, draw_cpu, sample_wall, update_wall, phases = [], [], [], [], []
    for _ in range(draws):
        u = rng.random(GROUP)
        w0, c0 = time.perf_counter(), time.process_time()
        (task,) = sampler.sample(1)
        w1 = time.perf_counter()
        phases.append(sampler.last_phases()[0])
        r = (u < p[sampler.position_of(task)]).astype(float).tolist()
        w2 = time.perf_counter()
        sampler.update(task, r)
        w3, c3 = time.perf_counter(), time.process_time()
        sample_wall.append(w1 - w0)
        update_wall.append(w3 - w2)
        draw_wall.append((w1 - w0) + (w3 - w2))
        draw_cpu.append(c3 - c0)  # (includes the few microseconds of the reward above)
    batch_wall, batch_cpu = [], []
    for _ in range(batches):
        w0, c0 = time.perf_counter(), time.process_time()
        batch = sampler.sample(BATCH)
        batch_wall.append(time.perf_counter() - w0)
        batch_cpu.append(time.process_time() - c0)
        for task, r in zip(batch, rewards_of(batch), strict=True):
            sampler.update(task, r)
    pair_wall, pair_cpu = [], []
    for _ in range(pairs):
        u = rng.random((2, GROUP))
        w0, c0 = time.perf_counter(), time.process_time()
        batch = sampler.sample(2)
        for task, r in zip(batch, (u < p[[sampler.position_of(t) for t in batch], None]).astype(float).tolist(),
                           strict=True):
            sampler.update(task, r)
        pair_wall.append(time.perf_counter() - w0)
        pair_cpu.append(time.process_time() - c0)
    gc.collect()
    state = _state_figures(sampler)
    observed = int(np.count_nonzero(sampler.history.task_observation_counts()))
    by_phase = {ph: [c for c, q in zip(draw_cpu, phases, strict=True) if q == ph]
                for ph in ("coverage", "exploitation")}
    return {
        "tasks": n, "environments": len(sampler.envs), "envsched": str(Path(envsched.__file__).parent),
        "config": config,
        "warmup": warmup, "draws": draws, "batches": batches, "seed": seed,
        "graph_build_s": built, "init_s": init, "warmup_s": warm,
        "draw_ms": _median_ms(draw_wall), "draw_cpu_ms": _median_ms(draw_cpu),
        "draw_sample_ms": _median_ms(sample_wall), "draw_update_ms": _median_ms(update_wall),
        "draw_p90_ms": float(np.percentile(draw_wall, 90)) * 1e3,
        # the one-task draws by phase (a coverage pick where the coverage debt gives the draw its slot)
        "draw_cpu_mean_ms": statistics.fmean(draw_cpu) * 1e3, "draw_coverage": len(by_phase["coverage"]),
        **{f"draw_cpu_{ph}_ms": _median_ms(xs) if xs else None for ph, xs in by_phase.items()},
        "batch_ms": _median_ms(batch_wall), "batch_cpu_ms": _median_ms(batch_cpu),
        "pairs": pairs, "pair_ms": _median_ms(pair_wall) if pairs else None,
        "pair_cpu_ms": _median_ms(pair_cpu) if pairs else None,
        "state_bytes": state["state_json_bytes"], "state_dump_s": state["state_dump_s"],
        "state_load_s": state["state_load_s"],
        "tasks_observed": observed, "rss_mib": _rss_mib(),
        "load_start": load_start, "load_end": os.getloadavg()[0],
    }


def _subprocess(src: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    cmd = [sys.executable, __file__, "--one", str(n), "--warmup", str(args.warmup), "--draws", str(args.draws),
           "--batches", str(args.batches), "--pairs", str(args.pairs), "--seed", str(args.seed),
           "--config", args.config]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"run at {n:,} tasks with {src} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt_ms(x: float) -> str:
    return f"{x:.3f} ms" if x < 1 else f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per size and version (medians over its repetitions), and the ratio to the first version."""
    versions = list(dict.fromkeys(r["version"] for r in rows))
    sizes = sorted({r["tasks"] for r in rows})
    lines = ["| tasks | version | `sample(1)` + `update` (CPU) | `sample(64)` (CPU) | `sample(2)` + 2 `update` (CPU) "
             "| state | dump / load | RSS | load average |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    base: dict[int, dict[str, float]] = {}
    for n in sizes:
        for v in versions:
            rs = [r for r in rows if r["tasks"] == n and r["version"] == v]
            if not rs:
                continue

            def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
                return statistics.median(r[key] for r in rs)

            fig = {k: med(k) for k in ("draw_ms", "draw_cpu_ms", "batch_ms", "batch_cpu_ms", "state_bytes",
                                       "state_dump_s", "state_load_s")}
            paired = all(r.get("pair_cpu_ms") is not None for r in rs)  # (rows of earlier runs have none)
            if paired:
                fig.update(pair_ms=med("pair_ms"), pair_cpu_ms=med("pair_cpu_ms"))
            ratio = ""
            if v != versions[0] and n in base:
                ratio = (f" (x{fig['draw_cpu_ms'] / base[n]['draw_cpu_ms']:.2f}, "
                         f"x{fig['batch_cpu_ms'] / base[n]['batch_cpu_ms']:.2f})")
            else:
                base[n] = fig
            loads = [x for r in rs for x in (r["load_start"], r["load_end"])]
            rss = [r["rss_mib"] for r in rs if r["rss_mib"] is not None]
            rss_text = f"{statistics.median(rss):.0f} MiB" if rss else "-"
            pair_text = "-"
            if paired:
                pair_text = f"{_fmt_ms(fig['pair_ms'])} ({_fmt_ms(fig['pair_cpu_ms'])})"
                if v != versions[0] and base[n].get("pair_cpu_ms"):
                    pair_text += f" (x{fig['pair_cpu_ms'] / base[n]['pair_cpu_ms']:.2f})"
            lines.append(
                f"| {n:,} | {v} | {_fmt_ms(fig['draw_ms'])} ({_fmt_ms(fig['draw_cpu_ms'])}) | "
                f"{_fmt_ms(fig['batch_ms'])} ({_fmt_ms(fig['batch_cpu_ms'])}){ratio} | {pair_text} | "
                f"{fig['state_bytes'] / 2**20:.2f} MiB | {fig['state_dump_s'] * 1e3:.0f} / "
                f"{fig['state_load_s'] * 1e3:.0f} ms | {rss_text} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def phase_markdown(rows: list[dict[str, Any]]) -> str:
    """The one-task draws by phase, one line per size and version (medians over its repetitions): how many of the
    timed ``sample(1)`` draws were coverage picks, each phase's median CPU time and the mean CPU time of all of
    them (the median of a run whose draws are about half coverage picks lies between the two phases' figures)."""
    rows = [r for r in rows if r.get("draw_cpu_mean_ms") is not None]  # (rows of earlier runs have none)
    versions = list(dict.fromkeys(r["version"] for r in rows))
    lines = ["| tasks | version | coverage draws | `sample(1)` + `update`, CPU: coverage draws | exploitation draws "
             "| mean |", "|---:|---|---:|---:|---:|---:|"]

    def med(rs: list[dict[str, Any]], key: str) -> str:
        xs = [r[key] for r in rs if r.get(key) is not None]
        return _fmt_ms(statistics.median(xs)) if xs else "-"

    for n in sorted({r["tasks"] for r in rows}):
        for v in versions:
            rs = [r for r in rows if r["tasks"] == n and r["version"] == v]
            if rs:
                lines.append(f"| {n:,} | {v} | {statistics.median(r['draw_coverage'] for r in rs):.0f} / "
                             f"{rs[0]['draws']} | {med(rs, 'draw_cpu_coverage_ms')} | "
                             f"{med(rs, 'draw_cpu_exploitation_ms')} | {med(rs, 'draw_cpu_mean_ms')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2_550, 100_000, 1_000_000])
    ap.add_argument("--warmup", type=int, default=100, help="steps of sample(64) + updates before timing")
    ap.add_argument("--draws", type=int, default=200, help="timed calls of sample(1) + update")
    ap.add_argument("--batches", type=int, default=30, help="timed calls of sample(64)")
    ap.add_argument("--pairs", type=int, default=100, help="timed calls of sample(2) + its two updates")
    ap.add_argument("--repeat", type=int, default=1, help="runs per version and size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="default",
                    help="SchedulerConfig() (default), the former default's online share and UCB coverage "
                         "(adaptive), or SchedulerConfig.paper() (paper)")
    ap.add_argument("--version", action="append", default=[], metavar="NAME=SRC_DIR",
                    help="a source tree to time (its envsched package); repeat to compare; default: this checkout")
    ap.add_argument("--json", dest="json_out", help="write the rows here")
    ap.add_argument("--markdown", nargs="+", metavar="JSON", help="print the table of earlier --json files")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a subprocess's single run
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.warmup, args.draws, args.batches, args.seed, args.pairs,
                                 args.config)))
        return 0
    if args.markdown:
        rows = [r for path in args.markdown for r in json.loads(Path(path).read_text())["rows"]]
        print(markdown(rows))
        print()
        print(phase_markdown(rows))
        return 0
    here = str(Path(__file__).resolve().parents[1] / "src")
    versions = [v.split("=", 1) for v in args.version] or [["current", here]]
    rows = []
    for n in args.sizes:
        for rep in range(args.repeat):
            for name, src in versions:
                row = _subprocess(src, n, args)
                row.update(version=name, repetition=rep)
                rows.append(row)
                print(f"{name:>10} {n:>9,} tasks: sample(1)+update {row['draw_ms']:.3f} ms "
                      f"(CPU {row['draw_cpu_ms']:.3f}; sample {row['draw_sample_ms']:.3f}, update "
                      f"{row['draw_update_ms']:.3f}), sample(64) {row['batch_ms']:.2f} ms "
                      f"(CPU {row['batch_cpu_ms']:.2f}), sample(2)+updates {row['pair_ms'] or 0:.2f} ms "
                      f"(CPU {row['pair_cpu_ms'] or 0:.2f}), "
                      f"state {row['state_bytes'] / 2**20:.2f} MiB, dump/load {row['state_dump_s'] * 1e3:.0f}/"
                      f"{row['state_load_s'] * 1e3:.0f} ms, RSS {row['rss_mib']:.0f} MiB, "
                      f"load {row['load_start']:.1f}-{row['load_end']:.1f}", file=sys.stderr, flush=True)
            if args.json_out:
                Path(args.json_out).write_text(json.dumps({"rows": rows, "argv": sys.argv[1:],
                                                           "machine": platform.platform(),
                                                           "cpus": os.cpu_count()}, indent=1))
    print(markdown(rows))
    print()
    print(phase_markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
