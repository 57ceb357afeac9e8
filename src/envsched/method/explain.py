"""Explanations of EnvSched's batches, beside its three stages: why each task was selected (the paper's case
studies F.1-F.3, as data).

For every selected task the sampler builds one explanation record: the phase and batch rank, the
percentile ``q`` and informativeness, the predicted mean / dispersion / variance, the estimate of each
relation and the neighbours behind it (with their own histories), the global reference, the task's own
history, the similarity penalty, exposure, the caps that bind it and the filters. Records are JSON objects;
with a run file they are appended to it, one per line, after every ``sample()`` -- ``envsched explain``
prints them.

Record schema (``"format": "envsched.explain/1"``, ``"kind": "pick"``)::

    step, rank, task_id, env, phase ("cold_start" | "coverage" | "exploitation" | "fill"),
    score (the penalised score the pick maximised), base_score, q, informativeness,
    predicted {mean, dispersion, variance, variance_reconstructed} | null,
    half_lives {long|short: {half_life, score, q, variance, variance_reconstructed}} | null,
    decline, global_reference {mean, variance, dispersion} | null,
    own_history {groups, weight, mean, variance, dispersion} | null,
    relations {within|cross: {used, has_observed_neighbors, estimate {mean, variance, dispersion},
               neighbors [{id, env, weight, similarity, observed, groups, mean, variance}]}} | null,
    fusion {within_weight, prior {mean, variance, dispersion}, prior_strength, unobserved_neighbours
            ("reference" | "environment"), environment {mean, variance, dispersion} | null} | null,
    similarity {max_similarity, penalty}, exposure {exposure, discount}, novelty,
    coverage {env_batch_count, env_coverage_count, env_selections_before, task_observations_before,
              tied_envs},
    caps {max_per_env_coverage | env_quota_per_batch | max_consecutive_selections:
          {paper, limit, count, reached}},
    filters {progress {transitions, residual, filtered}, identifier {flagged, reason}},
    relaxed [names of caps or filters a fill pick ignored],
    adaptive {coverage_slots, share, coverage_yield, exploitation_yield, signal_alpha, signal_beta,
              exploitation_score, coverage_score, caps_active} | null (null in the paper preset and at
              cold start; a field is null when its rule is switched off)

Values from the prediction are on the pool's reward scale mapped to [0, 1]; relation and history values
use the long half-life (the short one is in ``half_lives``). The first line of a run file is a header
(``"kind": "header"``) with the sampler configuration.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from envsched.method.config import SchedulerConfig
from envsched.method.graph.dual_graph import DualRelationGraph
from envsched.method.history.prediction import Prediction
from envsched.method.history.statistics import History
from envsched.method.run_file import EXPLAIN_FORMAT, open_run_file, parse_run_line, read_run_line
from envsched.method.scheduling.batch import Pick
from envsched.method.scheduling.policy import PolicyTrace

__all__ = ["EXPLAIN_FORMAT", "build_records", "filter_snapshot", "iter_run_file", "read_run_file", "write_records"]

# json.dumps' settings without its cycle check (records are trees): the same text, about a third faster
_ENCODER = json.JSONEncoder(check_circular=False)
_STATS = ("mean", "variance", "dispersion")


def _f(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else round(x, 6)


def _round6(a: np.ndarray) -> list[float | None]:
    """``[_f(x) for x in a]`` for a float array, vectorised, with exactly Python's ``round(x, 6)``.

    ``numpy.round`` computes ``rint(x * 1e6) / 1e6``. The division of an integer by ``1e6`` is correctly
    rounded, as is Python's conversion of the rounded decimal, so the two agree whenever they pick the same
    integer; they can differ only when ``x * 1e6`` lies within its own rounding error of a half-integer.
    Those values (and non-finite or huge ones) go through ``round`` itself.
    """
    a = np.asarray(a, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        y = a * 1e6
        near_half = np.abs(np.abs(y - np.floor(y)) - 0.5) <= np.abs(y) * 2.0 ** -51
        slow = near_half | ~(np.abs(y) < 2.0 ** 51)
        out = (np.rint(y) / 1e6).tolist()
    for j in np.flatnonzero(slow).tolist():
        out[j] = _f(a[j])
    return out


def _stats(row: np.ndarray) -> dict[str, float | None]:
    return {k: _f(row[j]) for j, k in enumerate(_STATS)}


def _stats_of(values: list[float | None]) -> dict[str, float | None]:
    return dict(zip(_STATS, values, strict=True))


def _neighbors(idx: np.ndarray, weight: np.ndarray, similarity: np.ndarray, pred: Prediction, observed: np.ndarray,
               task_ids: list[str], envs: list[str], env_codes: np.ndarray,
               max_neighbors: int | None) -> list[list[dict[str, Any]]]:
    """The neighbour lists of one relation for every pick (rows of ``idx``; ``-1`` padding skipped)."""
    hist = pred.long.history
    valid = idx >= 0
    k = np.where(valid, idx, 0)
    seen = observed[k]
    w, s = _round6(weight[valid]), _round6(similarity[valid])
    mean, var = _round6(hist.values[k[valid], 0]), _round6(hist.values[k[valid], 1])
    ks, obs, groups = k[valid].tolist(), seen[valid].tolist(), hist.groups[k[valid]].tolist()
    env_of = env_codes[k[valid]].tolist()
    out, j = [], 0
    for count in valid.sum(axis=1).tolist():
        rows = []
        for t in range(j, j + count):
            o = obs[t]
            rows.append({"id": task_ids[ks[t]], "env": envs[env_of[t]], "weight": w[t], "similarity": s[t],
                         "observed": o, "groups": int(groups[t]), "mean": mean[t] if o else None,
                         "variance": var[t] if o else None})
        j += count
        out.append(rows if max_neighbors is None else rows[:max_neighbors])
    return out


def filter_snapshot(history: History, positions: list[int]) -> dict[int, tuple[int, float, bool, int]]:
    """What the explanation needs from the history, per selected task, taken right after the batch was
    recorded: ``(scorable transitions, residual, progress-filtered, consecutive selections)``. Reads only the
    picks' rows (``O(len(positions))``), the progress filter's included."""
    pos = np.asarray(positions, dtype=np.int64)
    transitions, residual, run = history.transitions[pos], history.residual[pos], history.run_length[pos]
    filtered = history.progress_filtered(pos)
    return dict(zip(positions, zip(transitions.tolist(), residual.tolist(), filtered.tolist(), run.tolist(),
                                   strict=True), strict=True))


def _prediction_fields(per_pick: list[dict[str, Any]], pos: np.ndarray, pr: Prediction, graph: DualRelationGraph,
                       config: SchedulerConfig, task_ids: list[str], envs: list[str], env_codes: np.ndarray) -> None:
    """The prediction part of every pick's record (``q`` .. ``fusion``), filled into ``per_pick`` in record
    order. Values are gathered for all picks and rounded in one pass; what a record holds is what the
    per-value code wrote (``_round6`` is ``round(x, 6)`` exactly)."""
    long, short, h = pr.long, pr.short, pr.long.history
    cols = [pr.q, pr.informativeness, pr.mean, pr.dispersion, pr.variance, long.v_reconstructed,
            long.score, long.q, long.v_direct, long.v_reconstructed, short.score, short.q, short.v_direct,
            short.v_reconstructed, pr.decline, h.weight]
    table = np.column_stack([c[pos] for c in cols] + [h.values[pos], long.within[pos], long.cross[pos],
                                                       long.prior[pos]])
    flat, width = _round6(table.ravel()), table.shape[1]
    rows = [flat[t * width:(t + 1) * width] for t in range(len(per_pick))]
    reference = _stats(pr.reference)
    observed = h.observed
    weighted = (h.weight[pos] > 0).tolist()
    groups = h.groups[pos].tolist()
    neighbors = {
        "within": _neighbors(graph.within_index[pos], graph.within_weight[pos], graph.within_similarity[pos], pr,
                             observed, task_ids, envs, env_codes, config.explain_max_neighbors),
        "cross": _neighbors(graph.cross_index[pos], graph.cross_weight[pos], graph.cross_similarity[pos], pr,
                            observed, task_ids, envs, env_codes, config.explain_max_neighbors)}
    has = {"within": long.within_has[pos].tolist(), "cross": long.cross_has[pos].tolist()}
    within_weight = config.within_fusion_weight if config.use_cross_edges else (1.0 if config.use_within_edges
                                                                                 else 0.0)
    env_est = long.relations.environment
    env_rows = _round6(env_est[pos].ravel()) if env_est is not None else None
    for t, rec in enumerate(per_pick):
        r = rows[t]
        rec["q"] = r[0]
        rec["informativeness"] = r[1]
        rec["predicted"] = {"mean": r[2], "dispersion": r[3], "variance": r[4], "variance_reconstructed": r[5]}
        rec["half_lives"] = {
            "long": {"half_life": long.history.half_life, "score": r[6], "q": r[7], "variance": r[8],
                     "variance_reconstructed": r[9]},
            "short": {"half_life": short.history.half_life, "score": r[10], "q": r[11], "variance": r[12],
                      "variance_reconstructed": r[13]}}
        rec["decline"] = r[14]
        rec["global_reference"] = dict(reference)
        rec["own_history"] = {"groups": int(groups[t]), "weight": r[15],
                              **(_stats_of(r[16:19]) if weighted[t] else dict.fromkeys(_STATS))}
        rec["relations"] = {
            rel: {"used": used, "has_observed_neighbors": bool(has[rel][t]), "estimate": _stats_of(r[a:a + 3]),
                  "neighbors": neighbors[rel][t]}
            for rel, used, a in (("within", config.use_within_edges, 19), ("cross", config.use_cross_edges, 22))}
        rec["fusion"] = {"within_weight": within_weight, "prior": _stats_of(r[25:28]),
                         "prior_strength": config.prior_strength,
                         "unobserved_neighbours": config.unobserved_neighbours,
                         "environment": None if env_rows is None else _stats_of(env_rows[3 * t:3 * t + 3])}


def build_records(step: int, picks: list[Pick], *, graph: DualRelationGraph,
                  snapshot: dict[int, tuple[int, float, bool, int]], prediction: Prediction | None,
                  config: SchedulerConfig, task_ids: list[str], envs: list[str], env_codes: np.ndarray,
                  identifier_flags: dict[int, str],
                  trace: PolicyTrace | None = None) -> list[dict[str, Any]]:
    """One record per pick (see the module docstring); ``snapshot`` from :func:`filter_snapshot`;
    ``trace``: the scheduling policy's trace of the batch (its ``adaptive`` part; ``None``: cold start)."""
    adaptive = trace.explain([p.pos for p in picks]) if trace is not None else None
    out = []
    c1, c3 = config.caps_for(len(picks)) if picks else (config.max_per_env_coverage, config.env_quota_per_batch)
    per_pick: list[dict[str, Any]] = [{} for _ in picks]
    if prediction is not None and picks:
        _prediction_fields(per_pick, np.array([p.pos for p in picks], dtype=np.int64), prediction, graph, config,
                           task_ids, envs, env_codes)
    residuals = [snapshot[p.pos][1] for p in picks]
    # the pick's own numbers, rounded in one pass (novelty None and an infinite residual stay None)
    nums = _round6(np.array([[p.score, p.base_score, p.max_similarity, p.exposure, p.exposure_discount,
                              math.nan if p.novelty is None else p.novelty, 0.0 if math.isinf(r) else r]
                             for p, r in zip(picks, residuals, strict=True)], dtype=float).reshape(-1))
    batch_info = {k: _f(v) for k, v in adaptive[0].items()} if adaptive is not None else None
    for t, (p, fields) in enumerate(zip(picks, per_pick, strict=True)):
        i = p.pos
        score, base_score, max_similarity, exposure, discount, novelty, residual = nums[7 * t:7 * t + 7]
        rec: dict[str, Any] = {
            "format": EXPLAIN_FORMAT, "kind": "pick", "step": step, "rank": p.rank, "task_id": task_ids[i],
            "env": envs[int(env_codes[i])], "phase": p.phase, "score": score, "base_score": base_score,
        }
        if prediction is not None:
            rec.update(fields)
        else:
            rec.update(q=None, informativeness=None, predicted=None, half_lives=None, decline=None,
                       global_reference=None, own_history=None, relations=None, fusion=None)
        rec["similarity"] = {"max_similarity": max_similarity, "penalty": config.similarity_penalty}
        rec["exposure"] = {"exposure": exposure, "discount": discount}
        rec["novelty"] = novelty if p.novelty is not None else None
        rec["coverage"] = {"env_batch_count": p.env_batch_count, "env_coverage_count": p.env_coverage_count,
                           "env_selections_before": p.env_selections_before,
                           "task_observations_before": p.task_observations_before, "tied_envs": p.tied_envs}
        transitions, res, filtered, run = snapshot[i]
        rec["caps"] = {
            "max_per_env_coverage": {"paper": "C1", "limit": c1, "count": p.env_coverage_count,
                                     "reached": p.env_coverage_count >= c1},
            "env_quota_per_batch": {"paper": "C3", "limit": c3, "count": p.env_batch_count,
                                    "reached": p.env_batch_count >= c3},
            "max_consecutive_selections": {"paper": "C_task", "limit": config.max_consecutive_selections,
                                           "count": run, "reached": run >= config.max_consecutive_selections},
        }
        if p.phase == "cold_start":
            rec["caps"]["cold_start_max_per_env"] = {"paper": "C (cold start)", "limit": config.cold_start_max_per_env,
                                                     "count": p.env_batch_count,
                                                     "reached": p.env_batch_count >= config.cold_start_max_per_env}
        rec["filters"] = {
            "progress": {"transitions": transitions, "residual": None if math.isinf(res) else residual,
                         "filtered": filtered},
            "identifier": {"flagged": i in identifier_flags, "reason": identifier_flags.get(i)},
        }
        rec["relaxed"] = list(p.relaxed)
        if adaptive is not None:
            rec["adaptive"] = {**batch_info, **adaptive[1].get(i, {})}
        else:
            rec["adaptive"] = None
        out.append(rec)
    return out


def write_records(path: str | os.PathLike[str], records: list[dict[str, Any]],
                  header: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
    """Append ``records`` to the JSONL run file ``path`` (the header first when the file is new or empty).
    ``header``: the header's fields, or a function returning them, called only when the header is written (a
    sampler writing every step then builds it once per file, not once per step)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", encoding="utf-8") as fh:
        if new:
            fields = header() if callable(header) else header
            fh.write(json.dumps({"format": EXPLAIN_FORMAT, "kind": "header", **fields}) + "\n")
        fh.write("".join(_ENCODER.encode(r) + "\n" for r in records))
        fh.flush()


def iter_run_file(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of a run file (header included). Raises ``ValueError`` naming the bad line, and refuses
    what :mod:`envsched.method.run_file` refuses (anything but a regular file, an overlong or too deeply nested
    line) before reading it."""
    path = Path(path)
    with open_run_file(path) as fh:
        lineno = 0
        while True:
            lineno += 1
            where = f"{path}, line {lineno}"
            line = read_run_line(fh, where)
            if not line:
                return
            if not line.strip():
                continue
            rec = parse_run_line(line, where)
            if not isinstance(rec, dict) or rec.get("format") != EXPLAIN_FORMAT:
                raise ValueError(f"{where}: not an explanation record (format "
                                 f"{rec.get('format') if isinstance(rec, dict) else None!r}, "
                                 f"expected {EXPLAIN_FORMAT!r})")
            yield rec


def read_run_file(path: str | os.PathLike[str], *, step: int | None = None,
                  task: str | None = None) -> list[dict[str, Any]]:
    """The pick records of a run file, optionally of one step and/or one task id."""
    return [r for r in iter_run_file(path) if r.get("kind") == "pick"
            and (step is None or r.get("step") == step) and (task is None or r.get("task_id") == task)]
