"""The sensitivity matrix: the samplers over a grid of benchmark settings, one verdict per cell.

Each cell changes the default setting along one axis (one factor at a time; the ``full`` matrix does so on
every pool mix):

* batch size 32 / 64 / 128; reward graded / binary; structure sharing 0 / 0.5 / 1; misleading static features
  0 / 0.3;
* pool mix: ``default`` (the 2,550-task benchmark pool), ``bfcl`` (BFCL multi-turn only: 800 tasks in 8
  environments) and ``small-envs`` (many small environments: tau2-bench and ACEBench from a data folder when
  one is given, BFCL's ``long_context`` and ``miss_param`` categories, and 50 checked reasoning-gym datasets
  (all but ``arc_1d``, whose generator can hang) with 10 tasks each, generated with seed 2; built with
  :func:`envsched.envs.builders.build_combined_pool`, the function behind ``envsched pool build combined``).

Per cell and sampler: the held-out score at the last step and its paired difference (over seeds) to the best
*other* sampler of the cell: **win** when the 95 % interval is above 0, **loss** when below, **not detected**
otherwise (an interval crossing zero is not a tie: equivalence needs a stated margin, see
docs/evaluation-protocol.md).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envsched.pool.pool import TaskPool

__all__ = ["MATRIX_PRESETS", "MatrixPreset", "matrix_cells", "matrix_pool", "run_matrix"]


VERDICTS = ("win", "not detected", "loss")

@dataclass(frozen=True)
class MatrixPreset:
    """How big a matrix is: which pools, samplers, seeds and steps."""

    pools: tuple[str, ...]
    samplers: tuple[str, ...]
    seeds: int
    steps: int
    vary_on_every_pool: bool
    axes: dict[str, tuple[Any, ...]] = field(default_factory=lambda: {
        "batch_size": (32, 128), "reward": ("binary",), "sharing": (0.0, 1.0), "feature_noise": (0.3,)})
    base: dict[str, Any] = field(default_factory=lambda: dict(BASE_SETTING))
    """The setting every cell starts from (one axis changed per cell)."""


#: The default benchmark setting, the matrix's centre.
BASE_SETTING: dict[str, Any] = {"batch_size": 64, "reward": "graded", "sharing": 0.5, "feature_noise": 0.0}


MATRIX_PRESETS = {
    "quick": MatrixPreset(pools=("default", "bfcl", "small-envs"),
                          samplers=("uniform", "uniform-ds", "mopps", "plr", "dps", "sec", "envsched",
                                    "envsched-paper"),
                          seeds=3, steps=40, vary_on_every_pool=False),
    "full": MatrixPreset(pools=("default", "bfcl", "small-envs"),
                         samplers=("uniform", "uniform-ds", "curriculum", "mopps", "greso", "plr", "dps", "sec",
                                   "envsched", "envsched-paper"),
                         seeds=5, steps=120, vary_on_every_pool=True),
}


def matrix_cells(preset: MatrixPreset) -> list[dict[str, Any]]:
    """The settings of the matrix: ``{"pool", "batch_size", "reward", "sharing", "feature_noise"}`` each."""
    base = dict(preset.base)
    cells = []
    for i, pool in enumerate(preset.pools):
        cells.append({"pool": pool, **base})
        if i == 0 or preset.vary_on_every_pool:
            for axis, values in preset.axes.items():
                for v in values:
                    cells.append({"pool": pool, **base, axis: v})
    return cells


def matrix_pool(name: str, data_dirs: Mapping[str, str | os.PathLike[str]] | None = None) -> tuple[TaskPool, str]:
    """A pool mix of the matrix and a description of what it holds."""
    from envsched_lab.pools import load_bench_pool

    if name == "default":
        return load_bench_pool("default")
    if name not in ("bfcl", "small-envs"):
        if Path(name).is_file():  # a pool file (custom matrices)
            return load_bench_pool(name)
        raise ValueError(f"unknown matrix pool {name!r}; choose from: default, bfcl, small-envs, or a pool file")
    from envsched.envs.builders import build_combined_pool, build_corpus
    from envsched.envs.reasoning_gym import DEFAULT_DATASETS
    from envsched_lab.runner import bench_cache_dir
    from envsched_lab.tuning import without_hanging_datasets

    dirs = {k: str(v) for k, v in dict(data_dirs or {}).items()}
    key = "-".join(f"{k}" for k in sorted(dirs)) or "nodata"
    path = bench_cache_dir() / f"matrix-pool-{name}-{key}.jsonl"
    if path.exists():
        try:
            pool = TaskPool.from_file(path)
            return pool, f"{name} ({len(pool)} tasks, {len(pool.envs)} environments; cached {path})"
        except Exception:
            pass
    if name == "bfcl":
        pool = TaskPool(build_corpus("bfcl"), name="bfcl")
    elif name == "small-envs":
        corpora = [c for c in ("tau2", "acebench") if c in dirs] + ["bfcl", "reasoning_gym"]
        pool = build_combined_pool(corpora, data_dirs={k: v for k, v in dirs.items() if k in ("tau2", "acebench")},
                                   options={"bfcl": {"categories": ["long_context", "miss_param"]},
                                            "reasoning_gym": {"datasets": without_hanging_datasets(DEFAULT_DATASETS),
                                                              "tasks_per_dataset": 10, "seed": 2}},
                                   name="small-envs")
    else:  # pragma: no cover - names are checked above
        raise AssertionError(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(t) + "\n" for t in pool))
    os.replace(tmp, path)
    return pool, f"{name} ({len(pool)} tasks, {len(pool.envs)} environments)"


def _cell_name(cell: Mapping[str, Any]) -> str:
    return (f"{cell['pool']}_B{cell['batch_size']}_{cell['reward']}_s{cell['sharing']:g}"
            f"_q{cell['feature_noise']:g}")


def run_matrix(preset_name: str | MatrixPreset, out_dir: str | os.PathLike[str], *,
               samplers: Sequence[str] | None = None,
               sampler_options: Mapping[str, Mapping[str, Any]] | None = None, workers: int = 1,
               data_dirs: Mapping[str, str | os.PathLike[str]] | None = None, plots: bool = True,
               progress: Callable[[int, int], None] | None = None,
               on_cell: Callable[[int, int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the matrix ``preset_name`` into ``out_dir`` (one benchmark run directory per cell, resumable) and
    write ``matrix.json``, ``matrix.md`` and ``matrix.png``. Returns the matrix document (``cells``...)."""
    from envsched_lab.report import _verdict
    from envsched_lab.runner import BenchConfig, run_benchmark

    if isinstance(preset_name, MatrixPreset):
        preset, preset_name = preset_name, "custom"
    elif preset_name in MATRIX_PRESETS:
        preset = MATRIX_PRESETS[preset_name]
    else:
        raise ValueError(f"unknown matrix {preset_name!r}; choose from: {', '.join(MATRIX_PRESETS)}")
    names = list(samplers) if samplers else list(preset.samplers)
    cells = matrix_cells(preset)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pools: dict[str, tuple[TaskPool, str]] = {}
    total = len(cells) * len(names) * preset.seeds * preset.steps
    base_done = 0
    started = time.perf_counter()
    doc_cells = []
    for k, cell in enumerate(cells):
        if cell["pool"] not in pools:
            pools[cell["pool"]] = matrix_pool(cell["pool"], data_dirs)
        pool, source = pools[cell["pool"]]
        cfg = BenchConfig(samplers=names, seeds=list(range(preset.seeds)), steps=preset.steps,
                          batch_size=cell["batch_size"],
                          learner={"reward": cell["reward"], "sharing": cell["sharing"],
                                   "feature_noise": cell["feature_noise"]},
                          sampler_options={k_: dict(v) for k_, v in (sampler_options or {}).items()},
                          coldstart_runs=0, score_steps=[preset.steps], target_step=preset.steps, pool=cell["pool"])

        def cell_progress(done: int, _total: int, _base: int = base_done) -> None:
            if progress:
                progress(_base + done, total)

        summary = run_benchmark(cfg, out / _cell_name(cell), pool=pool, pool_source=source, workers=workers,
                                progress=cell_progress, plots=False)
        base_done += len(names) * preset.seeds * preset.steps
        t = preset.steps
        per = summary["samplers"]
        entry: dict[str, Any] = {"setting": dict(cell), "pool_source": source, "samplers": {}, "verdict": {}}
        for s, d in per.items():
            best = d.get(f"paired_vs_best@{t}", {})
            entry["samplers"][s] = {"heldout_score": d[f"heldout_score@{t}"], "paired_vs_best": best,
                                    "paired_vs_uniform": d.get(f"paired_vs_uniform@{t}")}
            entry["verdict"][s] = _verdict(best) if best else "not detected"
        doc_cells.append(entry)
        if on_cell:
            on_cell(k + 1, len(cells), entry)
    doc = {"matrix": preset_name, "samplers": names, "seeds": preset.seeds, "steps": preset.steps,
           "wall_seconds": time.perf_counter() - started, "cells": doc_cells,
           "tally": {s: {v: sum(1 for c in doc_cells if c["verdict"].get(s) == v) for v in VERDICTS}
                     for s in names}}
    (out / "matrix.json").write_text(json.dumps(doc, indent=2, default=float))
    (out / "matrix.md").write_text(matrix_markdown(doc))
    if plots:
        from envsched_lab.report import has_module

        if has_module("matplotlib"):
            matrix_heatmap(doc, out / "matrix.png")
    return doc


def _setting_label(s: Mapping[str, Any]) -> str:
    base = BASE_SETTING
    diff = [f"{'B' if k == 'batch_size' else k}={v}" for k, v in s.items() if k != "pool" and base.get(k) != v]
    return f"{s['pool']}" + (f" {' '.join(diff)}" if diff else "")


def matrix_markdown(doc: Mapping[str, Any]) -> str:
    """One row per cell: each sampler's held-out score, its paired difference to the best other sampler
    (mean [95% CI]) and its verdict."""
    names = doc["samplers"]
    lines = [f"Sensitivity matrix ({doc['matrix']}: {doc['seeds']} seeds x {doc['steps']} steps per cell). "
             "Per sampler: held-out score; paired difference to the best other sampler, mean [95% CI]; "
             "W = win, - = not detected (the interval crosses 0), L = loss.", "",
             "| setting | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in doc["cells"]:
        cells = []
        for s in names:
            d = c["samplers"].get(s)
            if not d:
                cells.append("-")
                continue
            p = d["paired_vs_best"] or {}
            ci = "" if not p or math.isnan(p.get("low", math.nan)) else f" [{p['low']:+.2f}, {p['high']:+.2f}]"
            cells.append(f"{d['heldout_score']['mean']:.2f} ({p.get('mean', math.nan):+.2f}{ci}) "
                         f"{c['verdict'][s][0].upper()}")
        lines.append(f"| {_setting_label(c['setting'])} | " + " | ".join(cells) + " |")
    lines += ["", "| sampler | wins | not detected | losses |", "|---|---|---|---|"]
    lines += [f"| {s} | {t['win']} | {t['not detected']} | {t['loss']} |" for s, t in doc["tally"].items()]
    lines.append(f"\nWall time: {doc['wall_seconds']:.0f} s.")
    return "\n".join(lines) + "\n"


def matrix_heatmap(doc: Mapping[str, Any], path: Path) -> None:
    """Heat map: cells x samplers, colour = paired difference to the best other sampler, text = verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = doc["samplers"]
    rows = [_setting_label(c["setting"]) for c in doc["cells"]]
    vals = np.array([[c["samplers"].get(s, {}).get("paired_vs_best", {}).get("mean", math.nan) for s in names]
                     for c in doc["cells"]], dtype=float)
    lim = float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 1.0
    fig, ax = plt.subplots(figsize=(1.3 * len(names) + 5.0, 0.42 * len(rows) + 2.2), layout="constrained")
    im = ax.imshow(vals, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for i, c in enumerate(doc["cells"]):
        for j, s in enumerate(names):
            v = c["verdict"].get(s, "")
            dark = np.isfinite(vals[i, j]) and abs(vals[i, j]) > 0.6 * lim  # white on the darkest cells
            mark = {"win": "W", "not detected": "-", "loss": "L"}.get(v, "")
            ax.text(j, i, mark, ha="center", va="center", fontsize=9,
                    color="white" if dark else "black", fontweight="bold")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("held-out score minus best other sampler (points)")
    ax.set_title(f"Sensitivity matrix ({doc['matrix']}, {doc['seeds']} seeds x {doc['steps']} steps): "
                 "W/T/L = paired 95% CI above / across / below 0", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
