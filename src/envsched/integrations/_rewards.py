"""Rewards of any scale for the trainer integrations: map a trainer's rewards onto a sampler's declared range.

A trainer's reward can have any scale (prime-rl's ``trace.reward`` is an unbounded weighted sum, verl's score
is whatever the reward function returns, TRL sums weighted reward functions), while an envsched sampler
declares a ``reward_range`` and its ``update`` refuses anything outside it -- correctly, for a caller that
passes bad input. A training loop must not crash mid-run on a reward of 1.5, so each integration passes its
rewards through a :class:`RewardScale` before ``update``:

* **Given range** (``reward_range=(low, high)``): a reward ``r`` is mapped affinely from ``[low, high]`` onto
  the sampler's range; a finite reward outside ``[low, high]`` is clipped to the nearest end and counted in
  ``rewards_clipped``.
* **Learned range** (``reward_range=None``, the default): the observed range starts as the sampler's own
  declared range and widens to include every finite reward seen (``min``/``max`` over all rewards so far,
  from the first group on). Rewards are mapped affinely from the observed range onto the sampler's range,
  so as long as every reward lies in the declared range nothing changes (identity); the first reward outside
  it widens the range from that group on (earlier groups keep the mapping they had). ``rewards_rescaled``
  counts the rewards that lay outside the declared range. The observed range is part of the state, so a
  resumed run maps exactly as the uninterrupted one would have.
* **Unusable rewards** (NaN, +inf, -inf): passed to the sampler as ``None`` -- the rollout still counts in
  ``groups``, ``episodes`` and ``cost`` (RFC 013), and in nothing estimated from rewards -- and counted in
  ``rewards_nonfinite``.

The sampler's own ``update`` is unchanged: it still refuses bad input from any other caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import envsched.validation as _check
from envsched.errors import StateError

__all__ = ["REWARD_SCALE_FORMAT", "RewardScale"]

REWARD_SCALE_FORMAT = "envsched.reward_scale/1"


def _pair(value: Any, what: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a pair (low, high) of numbers, got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"{what} must be two finite numbers with low < high, got {(low, high)!r}")
    return low, high


class RewardScale:
    """Maps one trainer's rewards onto a sampler's ``reward_range`` (see the module docstring for the rule).

    Args:
        target: the sampler's declared range (``sampler.reward_range``; ``(0, 1)`` when it declares none).
        reward_range: the trainer's reward range; ``None`` learns it from the rewards seen.
    """

    def __init__(self, target: Sequence[float] | None = None, reward_range: Sequence[float] | None = None) -> None:
        self.target = _pair(target if target is not None else (0.0, 1.0), "the sampler's reward_range")
        self.fixed = reward_range is not None
        self.source = _pair(reward_range, "reward_range") if reward_range is not None else self.target
        self.nonfinite = 0
        self.clipped = 0
        self.rescaled = 0

    @classmethod
    def for_sampler(cls, sampler: Any, reward_range: Sequence[float] | None = None) -> RewardScale:
        """A scale onto ``sampler.reward_range`` (``(0, 1)`` if the sampler declares none)."""
        return cls(getattr(sampler, "reward_range", None), reward_range)

    def map(self, rewards: Sequence[Any]) -> list[float | None]:
        """The rewards of one group as the sampler takes them: ``None`` stays ``None``, NaN/inf become
        ``None`` (counted), finite values are mapped (and clipped, with a given range) into the sampler's range.
        Updates the learned range first, so a group is mapped with a range that contains all of it."""
        values: list[float | None] = []
        for r in rewards:
            if r is None:
                values.append(None)
                continue
            try:
                v = float(r)
            except (TypeError, ValueError):
                raise ValueError(f"a reward must be a number or None, got {r!r}") from None
            if not math.isfinite(v):
                self.nonfinite += 1
                values.append(None)
                continue
            values.append(v)
        finite = [v for v in values if v is not None]
        if finite and not self.fixed:
            lo, hi = self.target
            self.rescaled += sum(v < lo or v > hi for v in finite)
            self.source = (min(self.source[0], *finite), max(self.source[1], *finite))
        s_lo, s_hi = self.source
        t_lo, t_hi = self.target
        out: list[float | None] = []
        for v in values:
            if v is None:
                out.append(None)
                continue
            if v < s_lo or v > s_hi:
                self.clipped += 1
                v = min(max(v, s_lo), s_hi)
            if (s_lo, s_hi) == (t_lo, t_hi):
                out.append(v)
            else:
                out.append(min(max(t_lo + (v - s_lo) * (t_hi - t_lo) / (s_hi - s_lo), t_lo), t_hi))
        return out

    def metrics(self) -> dict[str, float]:
        """``rewards_nonfinite``, ``rewards_clipped``, ``rewards_rescaled`` and the current source range."""
        return {"rewards_nonfinite": float(self.nonfinite), "rewards_clipped": float(self.clipped),
                "rewards_rescaled": float(self.rescaled), "reward_range_low": self.source[0],
                "reward_range_high": self.source[1]}

    def state_dict(self) -> dict[str, Any]:
        return {"format": REWARD_SCALE_FORMAT, "fixed": self.fixed, "source": list(self.source),
                "target": list(self.target), "nonfinite": self.nonfinite, "clipped": self.clipped,
                "rescaled": self.rescaled}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; ``ValueError`` (nothing changed) if it is not one or was saved
        for another range setting."""
        if not isinstance(state, Mapping) or state.get("format") != REWARD_SCALE_FORMAT:
            raise ValueError("not a RewardScale state")
        source = _pair(state.get("source"), "saved reward range")
        try:
            fixed = _check.choice(state.get("fixed"), "fixed", (True, False))
            counts = [_check.whole(state.get(k, 0), k) for k in ("nonfinite", "clipped", "rescaled")]
        except StateError as exc:
            raise exc.within(owner="RewardScale") from None
        if fixed != self.fixed or (self.fixed and source != self.source):
            raise ValueError(f"the saved reward range {source} ({'given' if fixed else 'learned'}) "
                             f"does not match this run's ({'given' if self.fixed else 'learned'} {self.source})")
        self.source = source
        self.nonfinite, self.clipped, self.rescaled = counts
