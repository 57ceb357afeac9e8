"""The learner model of the rollout-efficiency benchmark: a seeded stand-in for the policy being trained.

Why a model and not a real LLM: the benchmark compares *schedulers* at a matched rollout budget over
11 samplers x 5 seeds x 200 steps x 512 rollouts (5.6 M rollouts) on 2 CPU cores. What a scheduler can
exploit is how outcomes relate across tasks and over training; the model below makes those relations
explicit, documented and switchable, so a result can be traced to an assumption.

**Competence.** Every task ``i`` has a competence ``c_i = (U theta)_i + phi_i`` (a logit):

* ``theta`` are *shared latent skills*, one per tool/operation (env-qualified tool name), one per
  abstract pattern (a cross-environment family of tasks) and one per environment. ``U`` (N x K, sparse)
  holds which skills a task really uses: its tools share 0.5 of the weight equally, its pattern 0.25,
  its environment 0.25 (without tools: pattern 0.5, environment 0.5).
* ``phi_i`` is a *private* skill of task ``i`` (shared with nothing).

Initial skills are Gaussian, scaled so that ``Var[(U theta)_i] = s * V`` and ``Var[phi_i] = (1 - s) * V``
with ``s = sharing`` (structure sharing strength, 0..1) and ``V = competence_sd**2``: with ``s = 0``
related tasks are no more alike than unrelated ones, and nothing learnt on one task moves another.

**Rollouts.** A rollout of task ``i`` draws a rollout-level "luck" ``eps ~ N(0, rollout_noise**2)``;
each of the task's ``m_i`` verifier checks (``len(verifier.checks)``, 1..``max_checks``) passes with
probability ``sigmoid(c_i - d_i + eps + delta_ij)``, where ``d_i ~ N(difficulty_mean, difficulty_sd**2)``
is the task's own difficulty and ``delta_ij ~ N(0, check_sd**2)`` a fixed per-check offset. The reward is
the share of checks passed (``reward="graded"``) or 1 only if all pass (``reward="binary"``), on [0, 1].

**Real environments.** For a BFCL multi-turn task (when :mod:`envsched.envs.bfcl` is importable) the
checks are the task's distinct tools: a rollout "gets a tool wrong" when that tool's check fails in the
draw above, every ground-truth call of that tool is then left out, and the remaining calls are executed
against the real BFCL environment classes and scored by the real BFCL checker
(``replay_reward(task, calls_per_turn)``). The checker's result is memoised on the exact corrupted call
sequence (task, set of tools got wrong), so each distinct failure pattern is executed once per process.

**Training (GRPO).** Training on a group of task ``i`` with rewards ``r`` moves competence by the group's
GRPO signal ``g = std(r)`` (the expected move of a logit under GRPO's std-normalised advantage,
``Var(r) / std(r)``): ``c_i`` rises by ``eta * g``, a share ``s`` of it through the shared skills the task
uses (``Delta theta = eta g s U_i / |U_i|^2``) and ``1 - s`` through ``phi_i``. No signal (all rewards
equal), no learning. With ``batch_normalise`` (default) the step is GRPO's mean over the batch:
``eta = lr * batch_reference / n_batch``, so zero-signal groups dilute it; otherwise ``eta = lr`` (v1).
*Transfer*: a fraction ``transfer`` of every shared-skill move also goes to related skills (co-used by the
same tasks, co-occurrence weighted); *interference*: a seeded share ``interference`` of those couplings
conflict, and the move *lowers* the related skill. *Forgetting*: after each training step, skills not moved
in that step relax toward their initial value by ``forgetting`` (a fraction per step). Reasoning-gym
difficulty follows the dataset's tier (``tier_share`` of its variance). The rationale of every choice, with
its source: ``docs/benchmark-learner.md``.

**Misleading static features.** Schedulers only see the task specs. With ``feature_noise = q``, a share
``q`` of the tasks really depend on another pattern and on the tools of another task of the same
environment than their spec says, so static similarity misleads on them.

**Score.** :meth:`LearnerModel.score` is the expected reward over a set of tasks (default: all), times
100 (exact expectation over checks, Gauss-Hermite quadrature over ``eps``), computed from the model for
every task (BFCL tasks included), so it carries no sampling noise. The benchmark builds the model over the
whole pool and scores the held-out tasks and environments no sampler may draw
(:mod:`envsched_lab.split`); :meth:`LearnerModel.sampled_score` is the Monte-Carlo form a tuning
protocol may use.

**Cost.** A rollout costs its BFCL ground-truth calls, its number of checks for other tasks with tools and
several checks, else 1.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from envsched.pool.pool import TaskPool
from envsched.validation import check_bool, check_int, check_number, is_int, is_number

__all__ = ["LearnerConfig", "LearnerModel", "load_bfcl_memo", "save_bfcl_memo", "sharing_degree", "task_structure"]


@dataclass(frozen=True)
class LearnerConfig:
    """Knobs of :class:`LearnerModel` (see the module docstring for the model)."""

    sharing: float = 0.5
    """Structure sharing strength ``s`` in [0, 1]; 0 = tasks share nothing."""
    feature_noise: float = 0.0
    """Share ``q`` of tasks whose real skills differ from what their static features say."""
    reward: Literal["graded", "binary"] = "graded"
    lr: float = 0.02
    """Competence gain (logits) per unit of group reward std."""
    transfer: float = 0.2
    """Fraction of a shared-skill move that also reaches related skills."""
    forgetting: float = 0.005
    """Per-step relaxation of unmoved skills toward their initial value."""
    competence_sd: float = 1.5
    difficulty_mean: float = 1.0
    difficulty_sd: float = 2.0
    rollout_noise: float = 1.0
    check_sd: float = 0.75
    max_checks: int = 16
    real_envs: bool = True
    """Execute BFCL multi-turn tasks against the real environments (when available)."""
    batch_normalise: bool = True
    """Normalise a step's update by the number of groups in the trained batch (GRPO's batch mean): a
    zero-signal group dilutes the step. ``False`` is v1 (every group moves by ``lr * std``)."""
    batch_reference: int = 64
    """With ``batch_normalise``, a task moves by ``lr * batch_reference * std / n_batch`` (v1's step at 64)."""
    interference: float = 0.25
    """Probability that a pair of co-used skills conflicts: the ``transfer`` share of a move then *lowers* the
    related skill (drawn once per seed, symmetric). 0 is v1 (transfer always helps)."""
    tier_share: float = 0.5
    """Share of a reasoning-gym task's difficulty variance explained by its tier (0 is v1)."""
    bfcl_tool_scope: Literal["function", "env"] = "function"
    """BFCL function skills: one per function, shared across BFCL environments (``function``), or one per
    (environment, function) (``env``)."""
    step: Literal["mean", "normalised"] = "mean"
    """How a training step turns the batch's GRPO signal into a move. ``mean``: the move is the batch-mean signal
    times ``lr`` (SGD on GRPO's mean loss, v2). ``normalised``: the same direction, scaled by an optimiser-like
    normaliser, the running root mean square of past steps' update norms (Adam's second moment on the whole
    update, bias-corrected), so a step's length is about ``normalised_lr`` whatever the batch's dilution;
    a batch with more signal groups spreads its step over more tasks and, at the same length, moves more of
    them (see docs/benchmark-learner.md, "Step rule")."""
    normalised_lr: float = 0.03
    """With ``step="normalised"``: the length of a step whose update norm equals the running RMS."""
    normalised_decay: float = 0.999
    """With ``step="normalised"``: decay of the running mean of squared update norms (Adam's beta2)."""

    def __post_init__(self) -> None:
        for name in ("sharing", "feature_noise", "transfer", "forgetting", "interference", "tier_share"):
            self._number(name, low=0, high=1)
        if self.reward not in ("graded", "binary"):
            raise ValueError(f"LearnerConfig.reward must be 'graded' or 'binary', got {self.reward!r}")
        for name in ("lr", "competence_sd", "difficulty_sd", "rollout_noise", "check_sd"):
            self._number(name, low=0)
        self._number("difficulty_mean")
        if self.step not in ("mean", "normalised"):
            raise ValueError(f"LearnerConfig.step must be 'mean' or 'normalised', got {self.step!r}")
        self._number("normalised_lr", low=0, high=10, low_open=True, high_open=True)
        self._number("normalised_decay", low=0, high=1, high_open=True)
        if self.step == "mean":
            unread = [f"{name}={getattr(self, name)!r}" for name in ("normalised_lr", "normalised_decay")
                      if getattr(self, name) != getattr(type(self), name)]
            if unread:
                raise ValueError(f"LearnerConfig: {', '.join(unread)} is read only with step='normalised' "
                                 "(set step='normalised', or leave it at its default)")
        if self.bfcl_tool_scope not in ("function", "env"):
            raise ValueError(f"LearnerConfig.bfcl_tool_scope must be 'function' or 'env', got {self.bfcl_tool_scope!r}")
        for name in ("real_envs", "batch_normalise"):
            check_bool(getattr(self, name), f"LearnerConfig.{name}")
        for name in ("batch_reference", "max_checks"):
            object.__setattr__(self, name, check_int(getattr(self, name), f"LearnerConfig.{name}", low=1))

    def _number(self, name: str, **bounds: Any) -> None:
        """Check a number field with :func:`~envsched.validation.check_number`; a numpy scalar becomes a ``float``
        (a Python ``int`` or ``float`` is kept as given, so the config's recorded form is unchanged)."""
        value = getattr(self, name)
        check_number(value, f"LearnerConfig.{name}", **bounds)
        if not isinstance(value, int | float):
            object.__setattr__(self, name, float(value))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LearnerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown learner option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))


_PATTERN_FIELDS = ("pattern", "category", "group")


def _rg_category(dataset: str) -> str | None:
    """reasoning-gym's module family of a dataset (``arithmetic``, ``algorithmic``, ``games``...)."""
    try:
        from reasoning_gym.factory import DATASETS
    except Exception:
        return None
    entry = DATASETS.get(dataset)
    if entry is None:
        return None
    parts = entry[0].__module__.split(".")
    return parts[1] if len(parts) > 1 else None


def task_structure(task: Mapping[str, Any]) -> tuple[list[str], str, str, int]:
    """What a task statically says it uses: (env-qualified tool names, abstract pattern, env, #checks).

    The abstract pattern is a family that cuts across environments: the spec's ``pattern`` field if any;
    for a reasoning-gym task its dataset's reasoning-gym family (``arithmetic``, ``games``...); for a BFCL
    task its multi-turn category (``multi_turn_base``, ``multi_turn_miss_func``...); else the spec's
    ``category``/``group``; else a signature of the task's shape (numbers of tools and checks, bucketed).
    #checks is the number of verifier checks, except 1 for answer-scored reasoning-gym tasks (their
    listed checks describe one ``score_answer`` call).
    """
    env = str(task.get("env"))
    tools = sorted({f"{env}::{t.get('name')}" for t in (task.get("tools") or []) if isinstance(t, Mapping)})
    checks = ((task.get("verifier") or {}).get("checks")) or []
    n_checks = len(checks)
    pattern = None
    meta = task.get("metadata") if isinstance(task.get("metadata"), Mapping) else {}
    rg = task.get("reasoning_gym")
    bf = task.get("bfcl")
    if task.get("pattern") is not None:
        pattern = f"pattern:{task['pattern']}"
    elif isinstance(rg, Mapping) and rg.get("dataset"):
        fam = _rg_category(str(rg["dataset"]))
        pattern = f"rg:{fam}" if fam else None
        n_checks = 1
    elif isinstance(bf, Mapping) and bf.get("category"):
        pattern = f"bfcl:{bf['category']}"
    if pattern is None:
        for f in _PATTERN_FIELDS[1:]:
            v = task.get(f, meta.get(f))
            if v is not None and str(v) != "":
                pattern = f"{f}:{v}"
                break
    if pattern is None:
        nt = len(tools)
        pattern = f"shape:t{min(nt, 8) // 2}-c{min(n_checks, 12) // 3}"
    return tools, pattern, env, n_checks


#: Real-checker results memoised per process on the exact corrupted call sequence: (task id, bit mask of
#: the task's sorted ground-truth tools got wrong) -> reward. The checker is deterministic, so it is shared
#: by every learner (run) in the process.
_BFCL_MEMO: dict[tuple[str, int], float] = {}


def load_bfcl_memo(path: str | os.PathLike[str]) -> int:
    """Merge a memo file written by :func:`save_bfcl_memo` into this process's memo; returns its size."""
    p = Path(path)
    if not p.exists():
        return len(_BFCL_MEMO)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return len(_BFCL_MEMO)  # a damaged cache is only a cache
    for tid, masks in data.get("results", {}).items():
        for mask, r in masks.items():
            _BFCL_MEMO.setdefault((tid, int(mask)), math.nan if r is None else float(r))
    return len(_BFCL_MEMO)


def save_bfcl_memo(path: str | os.PathLike[str]) -> None:
    """Write this process's memo (merged with what the file already holds) atomically."""
    p = Path(path)
    load_bfcl_memo(p)
    results: dict[str, dict[str, float | None]] = {}
    for (tid, mask), r in _BFCL_MEMO.items():
        results.setdefault(tid, {})[str(mask)] = None if math.isnan(r) else r
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name, suffix=".tmp", dir=p.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"format": "envsched.bfcl-memo/1", "results": results}, fh)
    os.replace(tmp, p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class LearnerModel:
    """Seeded learner over a task pool (the model is described in the module docstring).

    Args:
        pool: the tasks (a :class:`TaskPool` or task specs); positions index them.
        config: a :class:`LearnerConfig` (or a dict of its fields).
        seed: seeds the skills, difficulties, check offsets, feature corruption and rollout noise.
    """

    _GH_POINTS = 12

    def __init__(self, pool: TaskPool | Sequence[Mapping[str, Any]],
                 config: LearnerConfig | Mapping[str, Any] | None = None, seed: int = 0) -> None:
        if config is None:
            config = LearnerConfig()
        elif isinstance(config, Mapping):
            config = LearnerConfig.from_dict(config)
        seed = check_int(seed, "seed", low=0)
        self.tasks = list(pool)
        if not self.tasks:
            raise ValueError("the learner needs at least one task")
        self.config = config
        self.seed = int(seed)
        cfg = config
        n = len(self.tasks)
        init_rng = np.random.default_rng([self.seed, 1])
        self._rng = np.random.default_rng([self.seed, 2])

        structs = [task_structure(t) for t in self.tasks]
        self.static_tools = [s[0] for s in structs]
        self.static_pattern = [s[1] for s in structs]
        self.envs = [s[2] for s in structs]
        self.num_checks = np.array([max(1, min(s[3], cfg.max_checks)) for s in structs], dtype=np.int64)
        self._bfcl: dict[int, dict[str, Any]] = {}
        self._bfcl_module = None
        if cfg.real_envs:
            self._setup_bfcl()
        # Real dependencies: BFCL tasks use the functions their ground truth calls; corrupted for a share
        # feature_noise of tasks (see module docstring).
        scope = (lambda i: "bfcl") if cfg.bfcl_tool_scope == "function" else (lambda i: self.envs[i])
        true_tools = [[f"{scope(i)}::{t}" for t in self._bfcl[i]["tools"]] if i in self._bfcl else ts
                      for i, ts in enumerate(self.static_tools)]
        true_pattern = list(self.static_pattern)
        patterns_all = sorted(set(self.static_pattern))
        by_env: dict[str, list[int]] = {}
        for i, e in enumerate(self.envs):
            by_env.setdefault(e, []).append(i)
        if cfg.feature_noise > 0:
            flip = init_rng.random(n) < cfg.feature_noise
            for i in np.flatnonzero(flip):
                true_pattern[i] = patterns_all[int(init_rng.integers(len(patterns_all)))]
                same = by_env[self.envs[i]]
                j = same[int(init_rng.integers(len(same)))]
                true_tools[i] = true_tools[j] if (i in self._bfcl) == (j in self._bfcl) else true_tools[i]
            self.misleading = flip
        else:
            self.misleading = np.zeros(n, dtype=bool)
        tool_names = sorted({t for ts in true_tools for t in ts})
        pat_names = sorted(set(true_pattern))
        env_names = sorted(set(self.envs))
        self.skill_names = ([f"tool:{t}" for t in tool_names] + [f"pattern:{p}" for p in pat_names]
                            + [f"env:{e}" for e in env_names])
        tix = {t: j for j, t in enumerate(tool_names)}
        pix = {p: len(tool_names) + j for j, p in enumerate(pat_names)}
        eix = {e: len(tool_names) + len(pat_names) + j for j, e in enumerate(env_names)}
        rows, cols, vals = [], [], []
        for i in range(n):
            ts = true_tools[i]
            if ts:
                for t in ts:
                    rows.append(i)
                    cols.append(tix[t])
                    vals.append(0.5 / len(ts))
                w_p = w_e = 0.25
            else:
                w_p = w_e = 0.5
            rows += [i, i]
            cols += [pix[true_pattern[i]], eix[self.envs[i]]]
            vals += [w_p, w_e]
        k = len(self.skill_names)
        self.usage = sp.csr_matrix((vals, (rows, cols)), shape=(n, k))
        self._usage_sq = np.asarray(self.usage.multiply(self.usage).sum(axis=1)).ravel()
        # Related skills: co-used by the same tasks (row-normalised, no self-relation).
        binary = (self.usage > 0).astype(float)
        co = (binary.T @ binary).tocsr()
        co.setdiag(0.0)
        co.eliminate_zeros()
        rs = np.asarray(co.sum(axis=1)).ravel()
        rs[rs == 0] = 1.0
        related = (sp.diags(1.0 / rs) @ co).tocoo()
        # Interference: a seeded, symmetric sign per co-used pair (own stream, so other draws do not move).
        sign_rng = np.random.default_rng([self.seed, 3])
        lo_, hi_ = np.minimum(related.row, related.col), np.maximum(related.row, related.col)
        pair_key = lo_.astype(np.int64) * len(self.skill_names) + hi_
        uniq, inv = np.unique(pair_key, return_inverse=True)
        conflict = sign_rng.random(uniq.size) < cfg.interference
        signs = np.where(conflict[inv], -1.0, 1.0)
        self.related = sp.csr_matrix((related.data * signs, (related.row, related.col)), shape=related.shape)
        self.conflicting_pairs = int(conflict.sum())
        # Initial skills, scaled to the sharing split of the competence variance.
        v = cfg.competence_sd ** 2
        z = init_rng.normal(size=k)
        shared0 = self.usage @ z
        sd_shared = float(np.std(shared0)) or 1.0
        self.theta0 = z * (np.sqrt(cfg.sharing * v) / sd_shared)
        self.phi0 = init_rng.normal(size=n) * np.sqrt((1.0 - cfg.sharing) * v)
        self.theta = self.theta0.copy()
        self.phi = self.phi0.copy()
        self.difficulty = init_rng.normal(cfg.difficulty_mean, cfg.difficulty_sd, size=n)
        self.tier = np.array([_rg_tier(t) for t in self.tasks], dtype=float)  # NaN: no reasoning-gym tier
        has_tier = ~np.isnan(self.tier)
        if cfg.tier_share > 0 and has_tier.sum() >= 2 and np.ptp(self.tier[has_tier]) > 0:
            tiers = self.tier[has_tier]
            z_tier = (tiers - tiers.mean()) / tiers.std()
            noise = np.random.default_rng([self.seed, 4]).normal(size=int(has_tier.sum()))
            self.difficulty[has_tier] = cfg.difficulty_mean + cfg.difficulty_sd * (
                np.sqrt(cfg.tier_share) * z_tier + np.sqrt(1.0 - cfg.tier_share) * noise)
        # Check offsets (a matrix padded to the largest count, masked).
        self.max_m = int(self.num_checks.max())
        # Tasks scored all-or-nothing: every task in binary mode, and BFCL tasks (BFCL's checker is 0/1).
        self.binary = np.full(n, cfg.reward == "binary")
        self.binary[list(self._bfcl)] = True
        self.check_offset = init_rng.normal(0.0, cfg.check_sd, size=(n, self.max_m))
        self.check_mask = np.arange(self.max_m)[None, :] < self.num_checks[:, None]
        # Cost of a rollout (docs/benchmark-learner.md section 4): BFCL its ground-truth calls; a task with
        # tools and several checks (tau2, ACEBench) its checks; anything else (reasoning-gym) 1.
        self.cost_per_rollout = np.array([float(self.num_checks[i]) if structs[i][0] and self.num_checks[i] > 1
                                          else 1.0 for i in range(n)])
        for i, info in self._bfcl.items():
            self.cost_per_rollout[i] = float(max(1, info["num_calls"]))
        gh_x, gh_w = np.polynomial.hermite_e.hermegauss(self._GH_POINTS)
        self._gh_x, self._gh_w = gh_x, gh_w / gh_w.sum()
        self.bfcl_executions = 0
        self.bfcl_rollouts = 0
        self.steps_trained = 0
        self.norm_sq_mean = 0.0  # step="normalised": running mean of squared update norms
        self.norm_steps = 0

    # ------------------------------------------------------------------ real environments
    def _setup_bfcl(self) -> None:
        try:
            from envsched.envs import bfcl  # the environments engineer's module
        except Exception:  # not written yet / bfcl_eval missing: every task uses the check model
            return
        for i, task in enumerate(self.tasks):
            try:
                if not isinstance(task.get("bfcl"), Mapping):
                    continue
                calls = bfcl.ground_truth_calls(task)
            except Exception:
                continue
            tools = sorted({_call_name(c) for turn in calls for c in turn})
            if not tools or len(tools) > 20:
                continue
            self._bfcl[i] = {"id": str(task.get("id")), "calls": calls, "tools": tools,
                             "num_calls": sum(len(t) for t in calls)}
            self.num_checks[i] = len(tools)
        if self._bfcl:
            self._bfcl_module = bfcl

    @property
    def bfcl_tasks(self) -> list[int]:
        """Positions of the tasks rolled out against the real BFCL environments."""
        return sorted(self._bfcl)

    def _bfcl_reward(self, i: int, failed_mask: int) -> float:
        info = self._bfcl[i]
        key = (info["id"], failed_mask)
        hit = _BFCL_MEMO.get(key)
        if hit is not None:
            return hit
        bad = {t for j, t in enumerate(info["tools"]) if failed_mask >> j & 1}
        calls = [[c for c in turn if _call_name(c) not in bad] for turn in info["calls"]]
        raw = self._bfcl_module.replay_reward(self.tasks[i], calls)
        r = math.nan if raw is None else min(max(float(raw), 0.0), 1.0)  # None: the checker failed
        _BFCL_MEMO[key] = r
        self.bfcl_executions += 1
        return r

    # ------------------------------------------------------------------ model
    def competence(self) -> np.ndarray:
        """``c_i - d_i`` for every task (the logit before rollout noise and check offsets)."""
        return self.usage @ self.theta + self.phi - self.difficulty

    def rollout(self, positions: Sequence[int] | np.ndarray, n: int,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Roll out ``n`` times each task in ``positions``: returns rewards and costs, both ``(B, n)``."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim != 1 or (pos.size and (pos.min() < 0 or pos.max() >= len(self.tasks))):
            raise ValueError(f"positions must be a 1-D list of task positions in [0, {len(self.tasks)})")
        n = check_int(n, "n", low=1)
        rng = self._rng if rng is None else rng
        logit = self.competence()[pos]
        eps = rng.normal(0.0, self.config.rollout_noise, size=(pos.size, n))
        p = _sigmoid(logit[:, None, None] + eps[:, :, None] + self.check_offset[pos][:, None, :])
        passed = (rng.random(p.shape) < p) & self.check_mask[pos][:, None, :]
        m = self.num_checks[pos][:, None]
        rewards = np.where(self.binary[pos][:, None], (passed.sum(axis=2) == m).astype(float),
                           passed.sum(axis=2) / m)
        for b, i in enumerate(pos.tolist()):
            if i in self._bfcl:
                k = len(self._bfcl[i]["tools"])
                weights = 1 << np.arange(k)
                failed = (~passed[b, :, :k]).astype(np.int64) @ weights
                rewards[b] = [self._bfcl_reward(i, int(f)) for f in failed]
                self.bfcl_rollouts += n
        costs = np.repeat(self.cost_per_rollout[pos][:, None], n, axis=1)
        return rewards, costs

    def train(self, positions: Sequence[int] | np.ndarray, rewards: np.ndarray | Sequence[Sequence[float]]) -> float:
        """One GRPO step on the given groups. Returns the total signal (sum of group reward std)."""
        pos = np.asarray(positions, dtype=np.int64)
        r = np.asarray(rewards, dtype=float)
        if r.ndim != 2 or r.shape[0] != pos.size:
            raise ValueError(f"rewards must be (groups, rollouts) = ({pos.size}, n), got shape {r.shape}")
        if pos.size and (pos.min() < 0 or pos.max() >= len(self.tasks)):
            raise ValueError("positions out of range")
        cfg = self.config
        # Unscored rollouts (NaN) are left out of the group's signal.
        with np.errstate(invalid="ignore"):
            g = np.nan_to_num(np.nanstd(r, axis=1)) if np.isnan(r).any() else r.std(axis=1)
        g[~(g > 1e-12)] = 0.0
        total = float(g.sum())
        moved_theta = np.zeros(self.theta.size, dtype=bool)
        moved_phi = np.zeros(self.phi.size, dtype=bool)
        sig = g > 0
        step_lr = cfg.lr * (cfg.batch_reference / max(pos.size, 1) if cfg.batch_normalise else 1.0)
        if sig.any():
            p, gs = pos[sig], g[sig]
            coef = step_lr * gs * cfg.sharing / self._usage_sq[p]
            d_theta = self.usage[p].T @ coef
            if cfg.transfer > 0:
                d_theta = d_theta + cfg.transfer * (self.related.T @ d_theta)
            if cfg.step == "normalised":
                d_phi = np.zeros(self.phi.size)
                np.add.at(d_phi, p, step_lr * gs * (1.0 - cfg.sharing))
                scale = self._normalised_scale(float(np.sqrt(d_theta @ d_theta + d_phi @ d_phi)))
                self.theta += d_theta * scale
                self.phi += d_phi * scale
            else:
                self.theta += d_theta
                np.add.at(self.phi, p, step_lr * gs * (1.0 - cfg.sharing))
            moved_theta = d_theta != 0
            moved_phi[p] = True
        elif cfg.step == "normalised":
            self._normalised_scale(0.0)  # an empty step still ages the running mean, as Adam's would
        if cfg.forgetting > 0:
            f = cfg.forgetting
            self.theta[~moved_theta] -= f * (self.theta[~moved_theta] - self.theta0[~moved_theta])
            self.phi[~moved_phi] -= f * (self.phi[~moved_phi] - self.phi0[~moved_phi])
        self.steps_trained += 1
        return total

    def _normalised_scale(self, norm: float) -> float:
        """Update the running mean of squared update norms with ``norm`` and return the factor that turns an
        update of that norm into the normalised step (``normalised_lr * norm / rms``, bias-corrected)."""
        cfg = self.config
        self.norm_sq_mean = cfg.normalised_decay * self.norm_sq_mean + (1.0 - cfg.normalised_decay) * norm**2
        self.norm_steps += 1
        corrected = self.norm_sq_mean / (1.0 - cfg.normalised_decay ** self.norm_steps)
        if norm == 0.0 or corrected <= 0.0:
            return 0.0
        return cfg.normalised_lr / (math.sqrt(corrected) + 1e-12)

    def _check_pass_probabilities(self, positions: Sequence[int] | np.ndarray | None
                                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Task positions, per-check pass probabilities at each quadrature node ``(T, nodes, checks)`` and
        the mask of the checks each task really has."""
        pos = np.arange(len(self.tasks)) if positions is None else np.asarray(positions, dtype=np.int64)
        logit = self.competence()[pos]
        x = logit[:, None, None] + self.config.rollout_noise * self._gh_x[None, :, None] \
            + self.check_offset[pos][:, None, :]
        return pos, _sigmoid(x), self.check_mask[pos][:, None, :]

    def expected_reward(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Exact expected reward per task under the model (quadrature over the rollout noise)."""
        pos, p, mask = self._check_pass_probabilities(positions)
        per = np.where(self.binary[pos][:, None], np.where(mask, p, 1.0).prod(axis=2),
                       np.where(mask, p, 0.0).sum(axis=2) / self.num_checks[pos][:, None])
        return per @ self._gh_w

    def expected_variance(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Expected within-group (population, n -> inf) reward variance per task under the model."""
        pos, p, mask = self._check_pass_probabilities(positions)
        m = self.num_checks[pos][:, None]
        all_pass = np.where(mask, p, 1.0).prod(axis=2)
        binary = self.binary[pos][:, None]
        mean_e = np.where(binary, all_pass, np.where(mask, p, 0.0).sum(axis=2) / m)
        var_e = np.where(binary, all_pass * (1 - all_pass), np.where(mask, p * (1 - p), 0.0).sum(axis=2) / m**2)
        mean = mean_e @ self._gh_w
        second = (var_e + mean_e**2) @ self._gh_w
        return second - mean**2

    def score(self, positions: Sequence[int] | np.ndarray | None = None) -> float:
        """Expected reward x 100 over ``positions`` (default: every task of the pool); NaN for no task."""
        if positions is not None and len(positions) == 0:
            return math.nan
        return float(self.expected_reward(positions).mean() * 100.0)

    def sampled_score(self, positions: Sequence[int] | np.ndarray, rollouts: int,
                      rng: np.random.Generator) -> float:
        """Mean reward x 100 of ``rollouts`` sampled rollouts per task: what an evaluation run measures (no
        exact expectation). Uses ``rng`` only, so it never moves the training stream."""
        rewards, _ = self.rollout(positions, rollouts, rng=rng)
        return float(np.nanmean(rewards) * 100.0)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Mutable state (skills, RNG, counters); the rest is rebuilt from pool, config and seed."""
        return {"config": asdict(self.config), "seed": self.seed, "theta": self.theta.tolist(),
                "phi": self.phi.tolist(), "rng": copy.deepcopy(self._rng.bit_generator.state),
                "steps_trained": self.steps_trained, "norm_sq_mean": self.norm_sq_mean, "norm_steps": self.norm_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("config") != asdict(self.config) or state.get("seed") != self.seed:
            raise ValueError("learner state was saved with another config or seed")
        theta = np.asarray(state["theta"], dtype=float)
        phi = np.asarray(state["phi"], dtype=float)
        if theta.shape != self.theta.shape or phi.shape != self.phi.shape:
            raise ValueError("learner state does not match this pool")
        rng = np.random.default_rng()
        rng.bit_generator.state = copy.deepcopy(state["rng"])
        norm_sq_mean = float(state.get("norm_sq_mean", 0.0))
        norm_steps = state.get("norm_steps", 0)
        if not (math.isfinite(norm_sq_mean) and norm_sq_mean >= 0) or not is_int(norm_steps, numpy=False) \
                or norm_steps < 0:
            raise ValueError("learner state: norm_sq_mean must be finite >= 0 and norm_steps an integer >= 0")
        self.theta, self.phi, self._rng = theta, phi, rng
        self.steps_trained = int(state.get("steps_trained", 0))
        self.norm_sq_mean, self.norm_steps = norm_sq_mean, norm_steps


def _rg_tier(task: Mapping[str, Any]) -> float:
    """A reasoning-gym task's difficulty tier (NaN for any other task)."""
    rg = task.get("reasoning_gym")
    if isinstance(rg, Mapping):
        tier = rg.get("tier", task.get("difficulty"))
        if is_number(tier, numpy=False) and math.isfinite(tier):
            return float(tier)
    return math.nan


def sharing_degree(model: LearnerModel, train_positions: Sequence[int] | np.ndarray,
                   positions: Sequence[int] | np.ndarray) -> float:
    """Share of the skill weight of ``positions`` that sits on skills some training task also uses."""
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size == 0:
        return math.nan
    trained = np.asarray((model.usage[np.asarray(train_positions, dtype=np.int64)] > 0).sum(axis=0)).ravel() > 0
    u = model.usage[pos]
    total = float(u.sum())
    return float(u[:, np.flatnonzero(trained)].sum() / total) if total > 0 else math.nan


def _call_name(call: Any) -> str:
    """Function name of a ground-truth call (a ``"f(a=1)"`` string or a ``{"name": ...}`` dict)."""
    if isinstance(call, Mapping):
        return str(call.get("name") or next(iter(call), ""))
    s = str(call)
    return s.split("(", 1)[0].strip()
