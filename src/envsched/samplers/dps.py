"""DPS, Dynamics-Predictive Sampling (Mao, Qu, Wang, Zou and Ji, ICLR 2026, arXiv 2603.10887).

DPS is the successor of MoPPS by the same group. It models each prompt's *solving state* during RL
finetuning as a hidden Markov chain over three states -- 1 unsolved, 2 partially solved, 3 solved -- with a
transition matrix learned online per prompt, filters the state from every group's rewards, predicts it one
training step ahead, and fills each batch with the prompts most likely to be partially solved at the next
step (the only ones whose GRPO group has a gradient), so that no rollouts are spent to find them.

Sources. The authors' code, https://github.com/maoyixiu/DPS (``recipe/dps/task_sampler.py``, class
``BayesianHMMSampler``; the launch scripts ``recipe/dps/scripts/*/*_dps.sh``; ``recipe/dps/our_ray_trainer.py``
for how the trainer calls it), and the paper's method as its README restates it (the three-stage inference
pipeline and the ``Top_B`` selection equation). Only the abstract and introduction of the paper's text could
be read here, so the rules below cite the code, whose names are given.

The rules, with the code they follow (``task_sampler.py`` unless said otherwise):

* **States and observation** (``train``): a group's success rate ``s`` (mean reward mapped to [0, 1]) is
  observed as state 1 if ``s == 0``, 3 if ``s == 1``, else 2. The emission is deterministic, so the
  filtered posterior after an observation is the one-hot vector of that state (``pi_new[obs_idx] = 1``).
* **Transition model** (``__init__``, ``predict_next_state``): per prompt, Dirichlet counts ``alpha[i, j]``
  for the move from state ``j`` to state ``i``; the expected matrix is ``P = alpha / alpha.sum(axis=0)``
  (columns sum to 1). Prior ``alpha0``: ``hmm_prior_alpha`` = 1.0 everywhere (every script), or the named
  structures ``progress``, ``stability`` and ``local`` of the code.
* **Transition learning** (``update_transition_params``): with the belief ``b`` of the previous step and the
  observation ``o`` of this one, the soft count of each move is the joint posterior
  ``J = outer(o, b) * P / sum(outer(o, b) * P)``, and ``alpha <- lam * alpha + (1 - lam) * alpha0 + J``
  (``hmm_transition_decay_ratio`` = ``lam``: 0.5 for Countdown and Geometry3k, 0.7 for MATH).
* **Prediction** (``train``, ``predict_next_state``): after an observation the next step's prior is
  ``P(alpha_new) @ o``. A tracked prompt without an observation in a step keeps its prior as posterior, its
  counts decay toward the prior (``J = 0``) and it is propagated one step: ``prior <- P @ prior``.
  Tracked = every prompt that has been a candidate or observed (the code's per-index dictionaries).
* **Initial belief** (``hmm_prior_pi``): uniform (default), or one of the three states.
* **Selection** (``sample_batch``, strategy ``topk``; README: ``B_t = Top_B(mu_t^prior(2))``): from a candidate
  batch of ``candidate_ratio * n`` prompts, keep the ``n`` with the highest predicted probability of state 2.
  Candidates come from the trainer's data loader: the pool in a fresh random order every epoch, taken in
  consecutive slices, the last short slice dropped (``our_ray_trainer.py``: loader batch =
  ``candidate_ratio * gen_batch_size``; :func:`~envsched.samplers.baselines.loader_batch`, MoPPS's stream
  too); ``candidate_ratio`` is 8 for Countdown and Geometry3k, 32 for MATH.
  The ``topk+entropy`` strategy adds ``entropy_weight * H(prior)`` to the score (``hmm_entropy_weight``, 0).

Envsched's protocol delivers groups one by one, possibly late; the code works in whole training steps. Here a
*step* ends at each :meth:`sample` call: the tracked prompts not observed since the previous call are then
propagated one step (before the new selection), exactly as the code's ``train`` does at the end of a step.
Deviations (ours):

* A group reported late (after the next ``sample``) is filtered in when it arrives, as an observation of the
  current step; a prompt observed twice in one step is updated twice in order.
* Graded rewards: the success rate is the mean of the rewards mapped to [0, 1] through the reward range; it
  is 0 (unsolved) or 1 (solved) only when every scored rollout is at the bottom or top of the range.
* Unscored rollouts (``None``) are left out of the success rate; a group with none scored is no observation.
* When an observation is impossible under the model (a zero in a ``local`` prior makes ``sum(J) = 0``; the
  code would divide by zero), the counts only decay: nothing is learned from that move.
* Ties in the score are broken by the random candidate order (the code's ``argsort`` leaves them to the
  sort), and candidates never exceed the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

import envsched.validation as _check
from envsched.errors import StateError
from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.samplers.baselines import load_loader_state, loader_batch
from envsched.validation import check_number, is_number

__all__ = ["NAMED_TRANSITION_PRIORS", "STATES", "DPSSampler"]

#: The three solving states, in the order of every belief vector.
STATES = ("unsolved", "partial", "solved")
_N_STATES = len(STATES)
#: The code's named Dirichlet priors (``hmm_prior_alpha``), ``[to_state, from_state]``.
NAMED_TRANSITION_PRIORS: dict[str, tuple[tuple[float, ...], ...]] = {
    "progress": ((1.0, 0.5, 0.5), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0)),
    "stability": ((1.0, 0.5, 0.5), (0.5, 1.0, 0.5), (0.5, 0.5, 1.0)),
    "local": ((1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (0.0, 1.0, 1.0)),
}
_INITIAL_BELIEFS = {"uniform": (1 / 3, 1 / 3, 1 / 3), "unsolved": (1.0, 0.0, 0.0), "partial": (0.0, 1.0, 0.0),
                    "solved": (0.0, 0.0, 1.0)}
_SUM_TOLERANCE = 1e-6


def _transition_prior_matrix(prior: Any) -> np.ndarray:
    if isinstance(prior, str):
        if prior not in NAMED_TRANSITION_PRIORS:
            raise ValueError(f"transition_prior must be a positive number, one of {sorted(NAMED_TRANSITION_PRIORS)} "
                             f"or a 3x3 matrix, got {prior!r}")
        return np.asarray(NAMED_TRANSITION_PRIORS[prior], dtype=float)
    if is_number(prior):
        check_number(prior, "transition_prior", low=0, low_open=True)
        return np.full((_N_STATES, _N_STATES), float(prior))
    try:
        m = _check.float_grid(prior if isinstance(prior, list | tuple) else None, "transition_prior",
                              (_N_STATES, _N_STATES), low=0.0)
    except StateError:
        raise ValueError("transition_prior must be a positive number, a name "
                         f"({', '.join(sorted(NAMED_TRANSITION_PRIORS))}) or a 3x3 matrix of finite counts >= 0 "
                         f"with every column summing to more than 0, got {prior!r:.80}") from None
    if not (m.sum(axis=0) > 0).all():
        raise ValueError("transition_prior: every column (a from-state) needs a positive sum")
    return m


def _expected(alpha: np.ndarray) -> np.ndarray:
    """Expected transition matrices ``alpha / alpha.sum(axis=-2)`` (columns: from-state)."""
    return alpha / alpha.sum(axis=-2, keepdims=True)


class DPSSampler(BaseSampler):
    """DPS: per-task HMM of the solving state, Bayesian filtering, top-``n`` predicted partially solved.

    See the module docstring for every rule and the code it follows.

    Args:
        candidate_ratio: candidates per selected task (``B_hat / B``; 8 for Countdown/Geometry3k, 32 for MATH).
        transition_decay: ``lam``, the weight kept by old transition counts each step (0.5; MATH 0.7; 1.0 =
            no forgetting).
        transition_prior: Dirichlet prior counts ``alpha0``: a number for every entry (1.0), a name
            (``"progress"``, ``"stability"``, ``"local"``) or a 3x3 matrix indexed ``[to, from]``.
        initial_belief: ``"uniform"`` (default), ``"unsolved"``, ``"partial"`` or ``"solved"``.
        entropy_weight: weight of the belief's entropy added to the score (0.0 = the ``topk`` strategy).
    """

    distinct_per_batch: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, candidate_ratio: float = 8.0,
                 transition_decay: float = 0.5, transition_prior: float | str | Sequence[Sequence[float]] = 1.0,
                 initial_belief: str = "uniform", entropy_weight: float = 0.0,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(candidate_ratio, "candidate_ratio", low=1)
        check_number(transition_decay, "transition_decay", low=0, high=1)
        check_number(entropy_weight, "entropy_weight", low=0)
        if initial_belief not in _INITIAL_BELIEFS:
            raise ValueError(f"initial_belief must be one of {sorted(_INITIAL_BELIEFS)}, got {initial_belief!r}")
        self._alpha0 = _transition_prior_matrix(transition_prior)
        self.candidate_ratio = float(candidate_ratio)
        self.transition_decay = float(transition_decay)
        self.transition_prior = (transition_prior if isinstance(transition_prior, str) else
                                 float(transition_prior) if np.ndim(transition_prior) == 0 else self._alpha0.tolist())
        self.initial_belief = initial_belief
        self.entropy_weight = float(entropy_weight)
        n = len(self.tasks)
        self._pi0 = np.asarray(_INITIAL_BELIEFS[initial_belief], dtype=float)
        self.alpha = np.broadcast_to(self._alpha0, (n, _N_STATES, _N_STATES)).copy()
        self.prior = np.tile(self._pi0, (n, 1))  # predicted belief for the coming step (mu^prior)
        self.previous = np.tile(self._pi0, (n, 1))  # belief of the previous step (the code's pis_before)
        self.tracked = np.zeros(n, dtype=bool)
        self.observed_this_step = np.zeros(n, dtype=bool)
        self.observations = np.zeros(n, dtype=np.int64)
        self.steps = 0
        self._order = np.arange(n, dtype=np.int64)  # the candidate stream: one random order per epoch
        self._cursor = n  # exhausted: the first sample() draws a fresh order
        self._last_scores: np.ndarray = np.zeros(0)

    # ------------------------------------------------------------------ public views
    def partial_probability(self) -> np.ndarray:
        """Predicted probability of the partially solved state per task (what selection ranks)."""
        return self.prior[:, 1].copy()

    def state_probabilities(self) -> dict[str, dict[str, float]]:
        """Predicted belief per task key: ``{"unsolved": p1, "partial": p2, "solved": p3}``."""
        return {k: dict(zip(STATES, map(float, self.prior[i]), strict=True)) for i, k in enumerate(self._keys)}

    def transition_matrix(self, task: Any) -> np.ndarray:
        """Expected transition matrix of ``task`` (a spec or key), ``[to, from]``, columns summing to 1."""
        return _expected(self.alpha[self.position_of(task)])

    # ------------------------------------------------------------------ the protocol hooks
    def _select(self, n: int) -> list[int]:
        size = len(self.tasks)
        m = min(size, max(n, round(self.candidate_ratio * n)))
        # everything is computed on copies and assigned at the end: sample() changes nothing if it fails
        alpha, prior, previous = self.alpha, self.prior, self.previous
        if self.steps > 0:  # the step that ended: propagate the tracked tasks it did not observe
            idle = np.flatnonzero(self.tracked & ~self.observed_this_step)
            if idle.size:
                alpha, prior, previous = alpha.copy(), prior.copy(), previous.copy()
                lam = self.transition_decay
                a = lam * alpha[idle] + (1.0 - lam) * self._alpha0
                nxt = np.einsum("kij,kj->ki", _expected(a), prior[idle])
                previous[idle] = prior[idle]
                prior[idle] = nxt / nxt.sum(axis=1, keepdims=True)
                alpha[idle] = a
        cand, order, cursor = loader_batch(self._rng, self._order, self._cursor, m)
        p = prior[cand]
        score = p[:, 1]
        if self.entropy_weight > 0:
            score = score + self.entropy_weight * -(p * np.log(p + 1e-10)).sum(axis=1)
        top = np.argsort(-score, kind="stable")[:n]
        chosen = cand[top]
        # commit
        self.alpha, self.prior, self.previous = alpha, prior, previous
        self._order, self._cursor = order, cursor
        self.tracked[cand] = True
        self.observed_this_step[:] = False
        self.steps += 1
        self._last_scores = score[top]
        return chosen.tolist()

    def _observe(self, group: GroupResult) -> None:
        if group.scored.size == 0:
            return
        low, high = self.reward_range
        s = float(((group.scored - low) / (high - low)).mean())
        state = 0 if s <= 0.0 else 2 if s >= 1.0 else 1
        obs = np.zeros(_N_STATES)
        obs[state] = 1.0
        i, lam = group.position, self.transition_decay
        joint = np.outer(obs, self.previous[i]) * _expected(self.alpha[i])
        z = joint.sum()
        learned = joint / z if z > 0 else 0.0
        alpha = lam * self.alpha[i] + (1.0 - lam) * self._alpha0 + learned
        nxt = _expected(alpha) @ obs
        self.alpha[i] = alpha
        self.previous[i] = obs
        self.prior[i] = nxt / nxt.sum()
        self.tracked[i] = True
        self.observed_this_step[i] = True
        self.observations[i] += 1

    def _extra_metrics(self) -> dict[str, float]:
        p = self.prior
        entropy = -(p * np.log(p + 1e-10)).sum(axis=1)
        return {
            "dps_mean_partial_probability": float(p[:, 1].mean()),
            # the code's sampled_state2_prob: mean score of the last batch (0.0 before the first batch)
            "dps_last_batch_partial_probability": float(self._last_scores.mean()) if self._last_scores.size
            else 0.0,
            "dps_tracked_fraction": float(self.tracked.mean()),
            "dps_mean_state_entropy": float(entropy.mean()),
        }

    # ------------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        return {"alpha": self.alpha.tolist(), "prior": self.prior.tolist(), "previous": self.previous.tolist(),
                "tracked": self.tracked.tolist(), "observed_this_step": self.observed_this_step.tolist(),
                "observations": self.observations.tolist(), "steps": self.steps,
                "order": self._order.tolist(), "cursor": self._cursor, "last_scores": self._last_scores.tolist()}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        n, k = len(self.tasks), _N_STATES
        _check.mapping(extra, "", keys=("alpha", "prior", "previous", "tracked", "observed_this_step",
                                        "observations", "steps", "order", "cursor", "last_scores"))
        alpha = _check.float_grid(extra["alpha"], "alpha", (n, k, k), low=0.0,
                                  high=float(self._alpha0.max()) + _check.MAX_COUNT)
        if not (alpha.sum(axis=1) > 0).all():
            raise StateError("alpha", "has a column (from-state) summing to 0")
        beliefs = []
        for name in ("prior", "previous"):
            b = _check.float_grid(extra[name], name, (n, k), low=0.0, high=1.0)
            if n and np.abs(b.sum(axis=1) - 1.0).max() > _SUM_TOLERANCE:
                raise StateError(name, "holds a belief that does not sum to 1")
            beliefs.append(b)
        tracked = _check.bool_array(extra["tracked"], "tracked", length=n)
        observed = _check.bool_array(extra["observed_this_step"], "observed_this_step", length=n)
        if (observed & ~tracked).any():
            raise StateError("observed_this_step", "marks a task that is not tracked")
        observations = _check.int_array(extra["observations"], "observations", length=n)
        steps = _check.whole(extra["steps"], "steps")
        order, cursor = load_loader_state(extra, n)
        # the partial-solving probabilities of the last batch's picks: one per task of the last batch
        n_scores = len(getattr(self, "_incoming_last_batch", []))
        raw_scores = extra["last_scores"]
        if isinstance(raw_scores, list) and len(raw_scores) != n_scores:
            raise StateError("last_scores", f"has {len(raw_scores)} entries but last_batch has {n_scores} "
                                                   "tasks (one score per pick of the last batch)")
        scores = _check.float_array(raw_scores, "last_scores", length=n_scores, low=0.0, high=1.0)
        # each observation adds a joint posterior of total mass 1 to a task's counts and decay pulls them toward
        # the prior, so no count exceeds the prior's largest entry plus the task's observations
        bound = float(self._alpha0.max()) + observations[:, None, None] + 1e-6
        if (alpha > bound).any():
            raise StateError("alpha", "holds counts larger than the prior plus the task's observations "
                                             "can reach")
        self.alpha, (self.prior, self.previous) = alpha, beliefs
        self.tracked, self.observed_this_step, self.observations = tracked, observed, observations
        self.steps, self._order, self._cursor, self._last_scores = steps, order, cursor, scores
