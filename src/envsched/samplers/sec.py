"""SEC, Self-Evolving Curriculum (Chen, Lu, Kim, Zhang, Tang, Piché, Gontier, Bengio and Kamalloo, 2025,
arXiv 2505.14970).

SEC treats curriculum selection as a non-stationary multi-armed bandit whose arms are *problem categories*
(the paper's are difficulty levels and problem types; here, by default, environments: the pool's ``env``).
An arm's reward is the mean absolute advantage of its problems in the last batch, a proxy of the immediate
learning gain of a policy-gradient step; the arm values follow TD(0) and the batch's categories are drawn
from a Boltzmann distribution over the values, each problem then drawn within its category.

Sources. The paper (abstract and method as summarised by its README), and the authors' code as released
with the paper's README (``verl/utils/auto_curriculum/priority.py``: ``BanditPriority``;
``verl/utils/auto_curriculum/dataloader.py``: ``BanditDataloader``; configuration in
``verl/trainer/config/ppo_trainer.yaml``, key ``trainer.sec.bandit``; launch lines in the README), read in
the copy vendored at ``sec/`` of https://github.com/Vincent-La/cofa (commit 728e36c, "import sec"). Only the
abstract and introduction of the paper's text could be read here; the rules cite the code.

The rules:

* **Reward** (``BanditPriority.update``, objective ``adv``): GRPO's advantage of every rollout,
  ``A = (r - mean(group)) / (std(group) + 1e-6)`` (verl's ``compute_grpo_outcome_advantage``: Bessel-corrected
  std, epsilon 1e-6), and the category's reward is the mean of ``|A|`` over its rollouts in the step's batch.
* **Value update, TD(0)** (``update_q_values``): ``Q(c) <- Q(c) + alpha * (r(c) - Q(c))``, ``Q`` initialised
  to 0; ``alpha = learning_rate`` = 0.5 (every reproduction command of the README; the yaml default is 0.1).
  Every category is updated each step: one *absent* from the step's batch gets a reward of 0, so its value
  decays toward 0 (``zero_fill_unplayed=True``, the default). With the paper's few categories (difficulty
  levels) and batches of hundreds of problems every arm is played each step and this never matters; with one
  arm per environment it lowers an environment's value for not being drawn (51 environments of equal value
  and 64 groups a step: about 37 played, 14 decayed). ``zero_fill_unplayed=False`` updates only the
  categories played (TD(0) on the pulled arms, the usual bandit rule; registered as ``sec-played-arms``).
* **Boltzmann selection** (``get_probs``, ``sample_arms``): ``p(c) = softmax(Q / tau)``, one category drawn
  per slot of the batch, with replacement; ``tau = temperature`` = 1.0 (Countdown, Zebra, ARC; 0.4 for math,
  0.2 for the 2D curriculum).
* **Within a category** (``BanditDataloader``): the category's problems in a shuffled order, each taken once
  before any is taken again (uniform without replacement per pass; a new shuffled pass when it is used up).

Envsched's protocol delivers groups one by one, possibly late; the code updates once per training step. Here
a *step* ends at each :meth:`sample` call: the groups reported since the previous call are the step's batch,
and every category gets one TD(0) update before the new draw (a reward of 0 for one without scored rollouts
among them, unless ``zero_fill_unplayed=False``). Deviations (ours):

* A group with fewer than two scored rollouts has no GRPO advantage and adds nothing (verl would use the
  raw score of a lone rollout as its advantage); unscored rollouts (``None``) are left out. A step in which
  no group added anything (every group dropped or unscored) updates no value: the code updates once per
  trained batch, and there was none.
* A batch holds distinct tasks: when every task of a drawn category is already in the batch, the category is
  drawn again from the Boltzmann distribution over the categories that still have a task to give.
* Rewards are mapped to [0, 1] through the reward range before the advantage (which is scale-free but for
  the epsilon).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from scipy.special import softmax

import envsched.validation as _check
from envsched.errors import StateError
from envsched.pool.pool import TaskPool
from envsched.samplers.base import BaseSampler, GroupResult
from envsched.validation import check_bool, check_number

__all__ = ["GRPO_EPSILON", "SECSampler", "grpo_advantages"]

#: verl's GRPO epsilon (``compute_grpo_outcome_advantage``).
GRPO_EPSILON = 1e-6
#: Smallest temperature and largest value a state may hold: ``Q / tau`` stays a finite float.
MIN_TEMPERATURE = 1e-6
MAX_VALUE = 1e6


def grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """GRPO's group-normalised advantages ``(r - mean) / (std + 1e-6)`` with the Bessel-corrected std (verl)."""
    r = np.asarray(rewards, dtype=float)
    if r.size < 2:
        raise ValueError("a GRPO advantage needs at least two rollouts")
    return (r - r.mean()) / (r.std(ddof=1) + GRPO_EPSILON)


class SECSampler(BaseSampler):
    """SEC: a Boltzmann bandit over task categories (environments) valued by TD(0) on mean ``|advantage|``.

    See the module docstring for every rule and the code it follows.

    Args:
        learning_rate: TD(0) step ``alpha`` (0.5).
        temperature: Boltzmann temperature ``tau`` (1.0).
        category: the task field whose value is a task's category (``"env"``; the paper's ``"difficulty"``
            works too). Tasks without it share one category, labelled ``"None"``.
        zero_fill_unplayed: give categories absent from a step's batch a reward of 0, as the published code
            does (True, the default; False: only played categories are updated).
    """

    distinct_per_batch: ClassVar[bool] = True

    def __init__(self, tasks: TaskPool | Sequence[Any], seed: int | None = 0, *, learning_rate: float = 0.5,
                 temperature: float = 1.0, category: str = "env", zero_fill_unplayed: bool = True,
                 reward_range: tuple[float, float] | None = None, require_dispatch: bool = True) -> None:
        super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
        check_number(learning_rate, "learning_rate", low=0, high=1, low_open=True)
        check_number(temperature, "temperature", low=MIN_TEMPERATURE)
        if not isinstance(category, str) or not category:
            raise ValueError(f"category must be the name of a task field, got {category!r}")
        check_bool(zero_fill_unplayed, "zero_fill_unplayed")
        self.learning_rate = float(learning_rate)
        self.temperature = float(temperature)
        self.category = category
        self.zero_fill_unplayed = zero_fill_unplayed
        labels: dict[str, int] = {}
        arm = np.empty(len(self.tasks), dtype=np.int64)
        for i, t in enumerate(self.tasks):
            value = t.get(category) if isinstance(t, Mapping) else getattr(t, category, None)
            arm[i] = labels.setdefault(str(value), len(labels))  # arms in order of first appearance (the code's)
        self.categories: list[str] = list(labels)
        self._arm = arm
        self._members = [np.flatnonzero(arm == c) for c in range(len(labels))]
        c = len(labels)
        self.q = np.zeros(c)
        self._pending_sum = np.zeros(c)  # sum of |A| over the step's scored rollouts, per category
        self._pending_count = np.zeros(c, dtype=np.int64)
        self._used = np.zeros(len(self.tasks), dtype=bool)  # taken in the category's current pass
        self.steps = 0

    # ------------------------------------------------------------------ public views
    def probabilities(self) -> dict[str, float]:
        """Boltzmann probability of each category: ``softmax(Q / temperature)``."""
        return dict(zip(self.categories, map(float, self._probs()), strict=True))

    def values(self) -> dict[str, float]:
        """TD(0) value ``Q`` of each category."""
        return dict(zip(self.categories, map(float, self.q), strict=True))

    def category_of(self, task: Any) -> str:
        """The category label of ``task`` (a spec or key)."""
        return self.categories[int(self._arm[self.position_of(task)])]

    def _probs(self, q: np.ndarray | None = None) -> np.ndarray:
        return softmax((self.q if q is None else q) / self.temperature)

    # ------------------------------------------------------------------ the protocol hooks
    def _select(self, n: int) -> list[int]:
        q = self._end_step()
        probs = self._probs(q)
        used = self._used.copy()
        in_batch = np.zeros(len(self.tasks), dtype=bool)
        left = np.array([m.size for m in self._members])  # tasks of each category not yet in this batch
        arms = self._rng.choice(len(probs), size=n, p=probs)
        chosen: list[int] = []
        for a in arms:
            a = int(a)
            if left[a] == 0:  # every task of this category is in the batch: draw among those that have one
                p = np.where(left > 0, probs, 0.0)
                if not p.sum() > 0:  # the remaining categories' probabilities underflowed to 0
                    p = (left > 0).astype(float)
                a = int(self._rng.choice(len(p), p=p / p.sum()))
            members = self._members[a]
            free = members[~used[members] & ~in_batch[members]]
            if free.size == 0:  # the category's pass is used up: a new pass
                used[members] = False
                free = members[~in_batch[members]]
            i = int(free[self._rng.integers(free.size)])
            used[i] = in_batch[i] = True
            left[a] -= 1
            chosen.append(i)
        # commit
        self.q = q
        self._pending_sum = np.zeros_like(self._pending_sum)
        self._pending_count = np.zeros_like(self._pending_count)
        self._used = used
        self.steps += 1
        return chosen

    def _end_step(self) -> np.ndarray:
        """The values after the TD(0) update of the step that ends now (a copy; nothing assigned)."""
        q = self.q.copy()
        played = self._pending_count > 0
        if self.steps == 0 or not played.any():  # no step yet, or a step that trained on nothing
            return q
        reward = np.zeros_like(q)
        reward[played] = self._pending_sum[played] / self._pending_count[played]
        update = played | self.zero_fill_unplayed
        q[update] += self.learning_rate * (reward[update] - q[update])
        return q

    def _observe(self, group: GroupResult) -> None:
        if group.scored.size < 2:
            return
        low, high = self.reward_range
        adv = grpo_advantages((group.scored - low) / (high - low))
        a = int(self._arm[group.position])
        self._pending_sum[a] += float(np.abs(adv).sum())
        self._pending_count[a] += adv.size

    def _extra_metrics(self) -> dict[str, float]:
        p = self._probs()
        return {"sec_q_mean": float(self.q.mean()), "sec_q_max": float(self.q.max()),
                "sec_prob_max": float(p.max()), "sec_prob_min": float(p.min()),
                "sec_prob_entropy": float(-(p * np.log(np.maximum(p, 1e-300))).sum())}

    # ------------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        return {"categories": list(self.categories), "q": self.q.tolist(), "pending_sum": self._pending_sum.tolist(),
                "pending_count": self._pending_count.tolist(), "used": self._used.tolist(), "steps": self.steps}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        c, n = len(self.categories), len(self.tasks)
        _check.mapping(extra, "", keys=("categories", "q", "pending_sum", "pending_count", "used", "steps"))
        if extra["categories"] != self.categories:
            raise StateError("categories", f"are not this sampler's {c} categories (field {self.category!r})")
        q = _check.float_array(extra["q"], "q", length=c, low=0.0, high=MAX_VALUE)
        pending_sum = _check.float_array(extra["pending_sum"], "pending_sum", length=c, low=0.0)
        pending_count = _check.int_array(extra["pending_count"], "pending_count", length=c)
        if (pending_sum > MAX_VALUE * pending_count).any():
            raise StateError("pending_sum", "exceeds what its rollouts can hold (a mean |advantage| above "
                                                   f"{MAX_VALUE:g}, or a sum for a category without rollouts)")
        used = _check.bool_array(extra["used"], "used", length=n)
        steps = _check.whole(extra["steps"], "steps")
        self.q, self._pending_sum, self._pending_count, self._used, self.steps = (
            q, pending_sum, pending_count, used, steps)
