"""The dashboard's views, as plotly figure specifications (plain JSON, drawn by plotly.js) and table rows.

Every number is computed from the :class:`~envsched.dashboard.model.RunIndex` columns with numpy; long runs
are shown in at most :data:`MAX_COLUMNS` step bins (a bin's value is the mean, or the share, over its steps),
so that the page stays small however long the run is.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
from scipy.stats import hypergeom

from envsched.dashboard.model import RunIndex

__all__ = ["MAX_COLUMNS", "build_views", "metrics", "pick_rows"]

MAX_COLUMNS = 400
_COLORS = {"cold_start": "#8c6bb1", "coverage": "#2b8cbe", "exploitation": "#e6550d", "fill": "#7f7f7f"}
_BASE_LAYOUT: dict[str, Any] = {"margin": {"l": 60, "r": 20, "t": 40, "b": 45}, "template": "plotly_white",
                                "font": {"size": 12}, "hovermode": "closest"}


def _labels(names: list[str]) -> list[str]:
    """Names from a pool file, escaped for plotly (which reads a few HTML tags in labels: ``<a href>``,
    ``<b>``...): plotly decodes ``&lt;``, ``&gt;`` and ``&amp;``, so a name shows as the text it is."""
    return [html.escape(n, quote=False) for n in names]


def _num(a: np.ndarray) -> list[float | None]:
    """A float array as JSON numbers, NaN as ``null`` (a gap in the plot)."""
    a = np.asarray(a, dtype=np.float64)
    out: list[float | None] = np.round(a, 6).tolist()
    for i in np.flatnonzero(~np.isfinite(a)).tolist():
        out[i] = None
    return out


def _bins(num_steps: int) -> tuple[int, np.ndarray]:
    """Bin width and the first step of each bin, for ``num_steps`` steps in at most MAX_COLUMNS bins."""
    width = max(1, math.ceil(num_steps / MAX_COLUMNS))
    return width, np.arange(1, num_steps + 1, width)


def _binned_sum(values: np.ndarray, steps: np.ndarray, num_steps: int, width: int, rows: np.ndarray | None = None,
                num_rows: int = 1) -> np.ndarray:
    """Sum of ``values`` per (row, step bin): shape ``(num_rows, bins)``."""
    nb = math.ceil(num_steps / width) if num_steps else 0
    b = (np.asarray(steps, dtype=np.int64) - 1) // width
    r = np.zeros(b.size, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    ok = (b >= 0) & (b < nb) & (r >= 0)
    flat = np.bincount(r[ok] * nb + b[ok], weights=np.asarray(values, dtype=np.float64)[ok],
                       minlength=num_rows * nb)
    return flat.reshape(num_rows, nb)


def _step_labels(starts: np.ndarray, width: int, num_steps: int) -> list[str]:
    if width == 1:
        return [f"step {s}" for s in starts.tolist()]
    return [f"steps {s}-{min(s + width - 1, num_steps)}" for s in starts.tolist()]


def _step_hover(width: int) -> str:
    """The hover text naming a heat map column's steps (its first step is the column's x)."""
    return "step %{x}" if width == 1 else f"steps from %{{x}} ({width} per column)"


def uniform_envs_expected(pool_env_sizes: np.ndarray, n: int) -> float:
    """Expected number of distinct environments in a batch of ``n`` tasks drawn uniformly without replacement
    from the pool (an environment is missed with the hypergeometric probability of drawing none of its tasks)."""
    total = int(pool_env_sizes.sum())
    n = min(int(n), total)
    sizes = pool_env_sizes[pool_env_sizes > 0]
    return float(np.sum(1.0 - hypergeom.pmf(0, total, sizes, n)))


def _empty(title: str, text: str) -> dict[str, Any]:
    return {"data": [], "layout": {**_BASE_LAYOUT, "title": {"text": title},
                                   "xaxis": {"visible": False}, "yaxis": {"visible": False},
                                   "annotations": [{"text": text, "showarrow": False, "font": {"size": 14}}]}}


def coverage_views(ix: RunIndex, snap: dict[str, Any]) -> dict[str, Any]:
    """Environments x steps heat map (share of each batch per environment) and environments per batch
    against the expectation of uniform sampling over the same pool."""
    S = len(snap["steps"]["seq"])
    if S == 0:
        return {"coverage": _empty("Environment coverage", "no batch drawn yet"),
                "envs_per_batch": _empty("Environments per batch", "no batch drawn yet")}
    width, starts = _bins(S)
    picks = snap["picks"]
    known = picks["task"] >= 0
    env = ix.env_of_task[picks["task"][known]]
    E = len(ix.envs)
    counts = _binned_sum(np.ones(env.size), picks["step"][known], S, width, env, E)
    share = counts / np.maximum(counts.sum(axis=0, keepdims=True), 1)
    labels = _step_labels(starts, width, S)
    heat = {"type": "heatmap", "x": starts.tolist(), "y": _labels(ix.envs), "z": [_num(r) for r in share],
            "colorscale": "Viridis", "zmin": 0, "colorbar": {"title": {"text": "share of batch"}, "thickness": 12},
            "hovertemplate": "%{y}<br>" + _step_hover(width) + "<br>share %{z:.3f}<extra></extra>"}
    coverage = {"data": [heat], "layout": {
        **_BASE_LAYOUT, "title": {"text": f"Environment coverage: share of each batch per environment "
                                          f"({S} steps{'' if width == 1 else f', {width} steps per column'})"},
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"automargin": True, "tickfont": {"size": 11 if E <= 24 else 9}, "dtick": 1},
        "height": max(360, 14 * E + 120)}}
    # distinct environments per batch (exact per step, then the bin mean)
    per_step = np.bincount((picks["step"][known] - 1).astype(np.int64) * E + env, minlength=S * E).reshape(S, E)
    distinct = (per_step > 0).sum(axis=1).astype(np.float64)
    n = snap["steps"]["n"].astype(np.int64)
    expected_for = {int(k): uniform_envs_expected(ix.pool_env_sizes, int(k)) for k in np.unique(n)}
    expected = np.array([expected_for[int(k)] for k in n])
    steps_idx = np.arange(1, S + 1)
    nb = len(starts)
    denom = _binned_sum(np.ones(S), steps_idx, S, width)[0]
    got = _binned_sum(distinct, steps_idx, S, width)[0] / np.maximum(denom, 1)
    want = _binned_sum(expected, steps_idx, S, width)[0] / np.maximum(denom, 1)
    envs_per_batch = {"data": [
        {"type": "scatter", "mode": "lines", "name": "this run", "x": starts.tolist(), "y": _num(got),
         "line": {"color": "#e6550d"}, "customdata": labels, "hovertemplate": "%{customdata}: %{y:.2f}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "uniform sampling (expected)", "x": starts.tolist(),
         "y": _num(want), "line": {"color": "#636363", "dash": "dash"}, "customdata": labels,
         "hovertemplate": "%{customdata}: %{y:.2f}<extra></extra>"}],
        "layout": {**_BASE_LAYOUT, "title": {"text": f"Environments per batch (of {E} in the pool)"},
                   "xaxis": {"title": {"text": "step"}}, "yaxis": {"title": {"text": "distinct environments"},
                                                                   "rangemode": "tozero"},
                   "legend": {"orientation": "h", "y": -0.25}, "height": 320}}
    del nb
    return {"coverage": coverage, "envs_per_batch": envs_per_batch}


def signal_views(ix: RunIndex, snap: dict[str, Any]) -> dict[str, Any]:
    """Signal over time: signal groups per episode, mean within-group reward variance, zero-signal share
    (overall), and the share of groups with signal per environment."""
    S = len(snap["steps"]["seq"])
    c = snap["closes"]
    upd = c["kind"] == 0
    if S == 0 or not upd.any():
        return {"signal": _empty("Signal over time", "no update yet"),
                "signal_env": _empty("Signal per environment", "no update yet")}
    width, starts = _bins(S)
    labels = _step_labels(starts, width, S)
    step = snap["c_step"][upd]
    groups = _binned_sum(np.ones(step.size), step, S, width)[0]
    sig = _binned_sum(c["signal"][upd].astype(float), step, S, width)[0]
    episodes = _binned_sum(c["n"][upd].astype(float), step, S, width)[0]
    has_var = np.isfinite(c["var"][upd])
    var_sum = _binned_sum(np.where(has_var, c["var"][upd], 0.0), step, S, width)[0]
    var_n = _binned_sum(has_var.astype(float), step, S, width)[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_episode = np.where(episodes > 0, sig / episodes, math.nan)
        zero = np.where(groups > 0, 1.0 - sig / groups, math.nan)
        variance = np.where(var_n > 0, var_sum / var_n, math.nan)
    x = starts.tolist()
    hover = {"customdata": labels}
    signal = {"data": [
        {"type": "scatter", "mode": "lines", "name": "signal groups per episode", "x": x, "y": _num(per_episode),
         "line": {"color": "#2b8cbe"}, **hover, "hovertemplate": "%{customdata}: %{y:.4f}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "mean within-group reward variance", "x": x, "y": _num(variance),
         "line": {"color": "#31a354"}, **hover, "hovertemplate": "%{customdata}: %{y:.4f}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "zero-signal share (right axis)", "x": x, "y": _num(zero),
         "yaxis": "y2", "line": {"color": "#de2d26", "dash": "dot"}, **hover,
         "hovertemplate": "%{customdata}: %{y:.3f}<extra></extra>"}],
        "layout": {**_BASE_LAYOUT, "title": {"text": "Signal over time (by the step a group was drawn in)"},
                   "xaxis": {"title": {"text": "step"}},
                   "yaxis": {"title": {"text": "per episode / variance"}, "rangemode": "tozero"},
                   "yaxis2": {"overlaying": "y", "side": "right",
                              "range": [0, 1], "showgrid": False, "tickformat": ".1f"},
                   "legend": {"orientation": "h", "y": -0.25}, "height": 340}}
    E = len(ix.envs)
    known = c["task"][upd] >= 0
    env = ix.env_of_task[c["task"][upd][known]]
    g_env = _binned_sum(np.ones(env.size), step[known], S, width, env, E)
    s_env = _binned_sum(c["signal"][upd][known].astype(float), step[known], S, width, env, E)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(g_env > 0, s_env / g_env, math.nan)
    signal_env = {"data": [{
        "type": "heatmap", "x": x, "y": _labels(ix.envs), "z": [_num(r) for r in share], "zmin": 0, "zmax": 1,
        "colorscale": "YlGnBu", "reversescale": True, "customdata": g_env.astype(np.int64).tolist(),
        "colorbar": {"title": {"text": "groups with signal"}, "thickness": 12},
        "hovertemplate": "%{y}<br>" + _step_hover(width) + "<br>signal share %{z:.2f} of %{customdata} groups"
                         "<extra></extra>"}],
        "layout": {**_BASE_LAYOUT, "title": {"text": "Share of groups with signal, per environment (blank: not drawn)"},
                   "xaxis": {"title": {"text": "step"}},
                   "yaxis": {"automargin": True, "tickfont": {"size": 11 if E <= 24 else 9}, "dtick": 1},
                   "height": max(360, 14 * E + 120)}}
    return {"signal": signal, "signal_env": signal_env}


def _phases() -> tuple[str, ...]:
    """EnvSched's phases (:data:`envsched.method.history.statistics.PHASES`, their one definition), imported
    only when a run file's picks are shown: that package loads the graph builder (scikit-learn), which the
    rest of the dashboard never needs."""
    from envsched.method.history.statistics import PHASES

    return PHASES


def prediction_table(ix: RunIndex, snap: dict[str, Any]) -> dict[str, np.ndarray]:
    """Explained picks joined with their outcome: phase code, predicted variance, observed variance and
    signal (NaN / False while the group is outstanding)."""
    explained = snap["explained"]
    if not explained:
        return {}
    keys = np.array(list(explained.keys()), dtype=np.int64).reshape(-1, 2)
    vals = list(explained.values())
    pred = np.array([np.nan if v["pred_var"] is None else v["pred_var"] for v in vals], dtype=np.float64)
    phases = _phases()
    phase = np.array([phases.index(v["phase"]) if v["phase"] in phases else -1 for v in vals])
    picks = snap["picks"]
    T = len(ix.keys) + 1
    code = picks["step"].astype(np.int64) * T + (picks["task"] + 1)
    order = np.argsort(code, kind="stable")
    want = keys[:, 0] * T + (keys[:, 1] + 1)
    at = np.searchsorted(code[order], want)
    found = (at < code.size) & (code[order][np.minimum(at, max(code.size - 1, 0))] == want) if code.size else \
        np.zeros(want.size, dtype=bool)
    pick = np.where(found, order[np.minimum(at, max(code.size - 1, 0))] if code.size else 0, -1)
    close = np.where(pick >= 0, snap["closed_by"][np.maximum(pick, 0)] if code.size else -1, -1)
    c = snap["closes"]
    ok = (close >= 0)
    upd = ok & (c["kind"][np.maximum(close, 0)] == 0 if c["kind"].size else ok)
    observed = np.where(upd, c["var"][np.maximum(close, 0)] if c["var"].size else math.nan, math.nan)
    signal = upd & (c["signal"][np.maximum(close, 0)] if c["signal"].size else upd)
    return {"phase": phase, "pred": pred, "observed": observed, "signal": signal, "reported": upd}


def prediction_views(ix: RunIndex, snap: dict[str, Any], *, bins: int = 10) -> dict[str, Any]:
    """Reliability diagram: predicted variance of each picked group (from the run file) against the variance
    its rollouts gave, in bins of predicted variance, one series per phase; marker labels are the counts."""
    title = "Predicted against observed within-group variance"
    if ix.run_file is None:
        return {"reliability": _empty(title, "start the dashboard with --run-file RUN.jsonl "
                                              "(written by envsched run --explain) to see predictions")}
    t = prediction_table(ix, snap)
    if not t or not (t["reported"] & np.isfinite(t["pred"])).any():
        return {"reliability": _empty(title, "no explained pick has been reported yet")}
    usable = t["reported"] & np.isfinite(t["pred"]) & np.isfinite(t["observed"])
    top = max(0.25, float(np.nanmax(t["pred"][usable])))
    edges = np.linspace(0.0, top, bins + 1)
    data: list[dict[str, Any]] = [{"type": "scatter", "mode": "lines", "name": "perfect prediction", "x": [0, top],
                                   "y": [0, top], "line": {"color": "#bdbdbd", "dash": "dash"}, "hoverinfo": "skip"}]
    for code, name in enumerate(_phases()):
        sel = usable & (t["phase"] == code)
        if not sel.any():
            continue
        b = np.clip(np.digitize(t["pred"][sel], edges) - 1, 0, bins - 1)
        n = np.bincount(b, minlength=bins)
        px = np.bincount(b, weights=t["pred"][sel], minlength=bins)
        oy = np.bincount(b, weights=t["observed"][sel], minlength=bins)
        sg = np.bincount(b, weights=t["signal"][sel].astype(float), minlength=bins)
        keep = n > 0
        data.append({"type": "scatter", "mode": "lines+markers+text", "name": f"{name} ({int(sel.sum())} groups)",
                     "x": _num(px[keep] / n[keep]), "y": _num(oy[keep] / n[keep]),
                     "text": [str(int(v)) for v in n[keep]], "textposition": "top center",
                     "customdata": _num(sg[keep] / n[keep]),
                     "marker": {"size": _num(6 + 3 * np.sqrt(n[keep] / n[keep].max()) * 4),
                                "color": _COLORS.get(name)},
                     "line": {"color": _COLORS.get(name)},
                     "hovertemplate": "predicted %{x:.4f}<br>observed %{y:.4f}<br>%{text} groups (the label), "
                                      "signal share "
                                      "%{customdata:.2f}<extra>" + name + "</extra>"})
    return {"reliability": {"data": data, "layout": {
        **_BASE_LAYOUT, "title": {"text": title},
        "xaxis": {"title": {"text": "predicted variance (reward scale mapped to [0, 1])"}, "range": [0, top * 1.05]},
        "yaxis": {"title": {"text": "observed variance (mean over the bin)"}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.25}, "height": 380}}}


def async_views(ix: RunIndex, snap: dict[str, Any]) -> dict[str, Any]:
    """Outstanding groups after each draw, late updates and discarded / reclaimed groups per step."""
    S = len(snap["steps"]["seq"])
    if S == 0:
        return {"async": _empty("Asynchronous state", "no batch drawn yet")}
    width, starts = _bins(S)
    labels = _step_labels(starts, width, S)
    step_seq = snap["steps"]["seq"]
    c = snap["closes"]
    dispatched = np.searchsorted(snap["picks"]["seq"], step_seq, side="right")
    closed = np.searchsorted(c["seq"], step_seq, side="right")
    outstanding = (dispatched - closed).astype(np.float64)
    steps_idx = np.arange(1, S + 1)
    denom = np.maximum(_binned_sum(np.ones(S), steps_idx, S, width)[0], 1)
    arrival = np.maximum(np.searchsorted(step_seq, c["seq"]), 1)
    late = _binned_sum(((c["kind"] == 0) & (snap["c_lag"] >= 1)).astype(float), arrival, S, width)[0]
    disc = _binned_sum((c["kind"] == 1).astype(float), arrival, S, width)[0]
    recl = _binned_sum((c["kind"] == 2).astype(float), arrival, S, width)[0]
    x = starts.tolist()
    h = {"customdata": labels, "hovertemplate": "%{customdata}: %{y}<extra></extra>"}
    fig = {"data": [
        {"type": "scatter", "mode": "lines", "name": "outstanding after the draw (mean)", "x": x,
         "y": _num(_binned_sum(outstanding, steps_idx, S, width)[0] / denom), "line": {"color": "#3182bd"}, **h},
        {"type": "bar", "name": "late updates (arrived after a later draw)", "x": x, "y": _num(late),
         "marker": {"color": "#fd8d3c"}, **h},
        {"type": "bar", "name": "discarded", "x": x, "y": _num(disc), "marker": {"color": "#969696"}, **h},
        {"type": "bar", "name": "reclaimed (lease expired)", "x": x, "y": _num(recl), "marker": {"color": "#de2d26"},
         **h}],
        "layout": {**_BASE_LAYOUT, "title": {"text": "Asynchronous state"}, "barmode": "stack",
                   "xaxis": {"title": {"text": "step"}}, "yaxis": {"title": {"text": "groups"}, "rangemode": "tozero"},
                   "legend": {"orientation": "h", "y": -0.25}, "height": 320}}
    return {"async": fig}


def metrics(ix: RunIndex, snap: dict[str, Any]) -> dict[str, float]:
    """The sampler's ``metrics()`` counters, recomputed from the log (the RFC 013 counters and rates and the
    dispatch bookkeeping of ``BaseSampler.metrics``, plus what ``DurableSampler.metrics`` adds). A sampler's
    own extra figures need the sampler itself and are not shown."""
    c = snap["closes"]
    upd = c["kind"] == 0
    groups = int(upd.sum())
    signal = int(c["signal"][upd].sum())
    episodes = int(c["n"][upd].sum())
    unscored = int((c["n"][upd] - c["scored"][upd]).sum())
    cost = float(c["cost"][upd].sum())
    dispatched = int(snap["picks"]["seq"].size)
    discarded = int((c["kind"] != 0).sum())
    matched_updates = int((snap["match"][upd] >= 0).sum())
    outstanding = dispatched - matched_updates - discarded
    n = snap["steps"]["n"]
    last = snap["picks"]["task"][snap["picks"]["seq"] == snap["steps"]["seq"][-1]] if n.size else np.zeros(0, int)
    leases = ix.reader.lease_counts()
    return {
        "groups": float(groups), "signal_groups": float(signal), "episodes": float(episodes),
        "unscored_episodes": float(unscored), "cost": cost,
        "signal_groups_per_episode": signal / episodes if episodes else 0.0,
        "signal_groups_per_cost": signal / cost if cost > 0 else 0.0,
        "zero_signal_fraction": 1.0 - signal / groups if groups else 0.0,
        "dispatched_groups": float(dispatched), "discarded_groups": float(discarded),
        "outstanding_groups": float(max(outstanding, 0)),
        "last_batch_size": float(last.size),
        "last_batch_envs": float(np.unique(ix.env_of_task[last[last >= 0]]).size),
        "late_updates": float(((c["kind"] == 0) & (snap["c_lag"] >= 1)).sum()),
        "store_events": float(snap["seq"]), "reclaimed_groups": float(leases["reclaim"]),
        "open_leases": float(leases["open"]),
    }


def pick_rows(ix: RunIndex, snap: dict[str, Any], *, task: str | None = None, step: int | None = None,
              last_steps: int = 3, limit: int = 500) -> list[dict[str, Any]]:
    """Rows of the picks table, newest first: the latest ``last_steps`` batches, or the picks of ``step``, or
    those whose task id contains ``task`` (case-insensitive). Values are plain data; the page shows them as
    text."""
    picks = snap["picks"]
    S = len(snap["steps"]["seq"])
    limit = max(1, min(int(limit), 5000))
    if task:
        needle = task.lower()
        tasks = np.array([i for i, k in enumerate(ix.keys) if needle in k.lower()], dtype=np.int64)
        sel = np.flatnonzero(np.isin(picks["task"], tasks))
    elif step is not None:
        sel = np.flatnonzero(picks["step"] == int(step))
    else:
        sel = np.flatnonzero(picks["step"] > S - max(1, int(last_steps)))
    sel = sel[::-1][:limit]
    c = snap["closes"]
    explained = snap["explained"]
    rows = []
    for i in sel.tolist():
        t = int(picks["task"][i])
        st = int(picks["step"][i])
        close = int(snap["closed_by"][i])
        if close < 0:
            status, mean, var, sig = "outstanding", None, None, None
        elif c["kind"][close] == 0:
            status = "late update" if snap["c_lag"][close] >= 1 else "updated"
            mean = None if not np.isfinite(c["mean"][close]) else round(float(c["mean"][close]), 4)
            var = None if not np.isfinite(c["var"][close]) else round(float(c["var"][close]), 4)
            sig = bool(c["signal"][close])
        else:
            status, mean, var, sig = ("reclaimed" if c["kind"][close] == 2 else "discarded"), None, None, None
        e = explained.get((st, t), {})
        rows.append({"step": st, "rank": e.get("rank", int(picks["rank"][i])),
                     "task_id": ix.keys[t] if t >= 0 else "(unknown task)",
                     "env": ix.envs[int(ix.env_of_task[t])] if t >= 0 else "",
                     "instruction": ix.instructions[t] if t >= 0 else "", "phase": e.get("phase"),
                     "predicted_variance": e.get("pred_var"), "q": e.get("q"), "status": status,
                     "observed_mean": mean, "observed_variance": var, "signal": sig, "reasons": e.get("reasons", [])})
    return rows


def build_views(ix: RunIndex, snap: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure, the metrics and a summary, as one JSON-ready object."""
    snap = snap if snap is not None else ix.snapshot()
    figures: dict[str, Any] = {}
    for part in (coverage_views, signal_views, prediction_views, async_views):
        figures.update(part(ix, snap))
    m = metrics(ix, snap)
    header = ix.header
    return {
        "version": snap["version"], "seq": snap["seq"], "steps": len(snap["steps"]["seq"]),
        "figures": figures, "metrics": m,
        "summary": {"store": ix.reader.where, "sampler_class": str(header.get("sampler_class")),
                    "num_tasks": len(ix.keys), "num_envs": len(ix.envs), "group_size": header.get("group_size"),
                    "run_file": None if ix.run_file is None else str(ix.run_file.path),
                    "explained_picks": len(snap["explained"]), "discard_reasons": snap["discard_reasons"],
                    "unknown_keys": snap["unknown_keys"], "last_event_time": snap["last_event_time"],
                    "warnings": ix.warnings()},
    }
