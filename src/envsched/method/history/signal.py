"""Stage 2 of EnvSched, the rules of ours (not in the paper): signal rates and the per-task Beta posterior.

A *signal group* is a group with at least two scored rewards that are not all equal: the only groups from which
GRPO gets a gradient (defined once, :func:`envsched.samplers.base.is_signal_group`, for every sampler's
``signal_groups`` counter and for this module). Everything here is derived from
:class:`~envsched.method.history.statistics.History`'s logged groups (:meth:`History.logged_groups
<envsched.method.history.statistics.History.logged_groups>`, never the log's columns), so it needs no state of
its own (``state_dict`` / ``load_state_dict`` restore it); with recency weights ``0.5 ** (age / half_life)``, ``age`` in
scheduler steps; in the decayed form (the default preset) the log holds only the last steps, and the sums of the
observations absorbed out of it are added from :meth:`History.decayed_signal
<envsched.method.history.statistics.History.decayed_signal>` (exact: these sums are linear in the weights):

* :func:`phase_yields`: signal groups per scored group of the coverage and of the exploitation picks (the
  online coverage share, ``adaptive_share``);
* :func:`env_signal`: the same per environment (the coverage environment's upper confidence bound,
  ``adaptive_coverage``);
* :func:`declining`: tasks whose short-half-life signal rate is below their long-half-life one (where the
  default applies the task cap and the exposure discount, ``caps_on_decline_only``);
* :func:`signal_posterior`: a Beta posterior per task on its mean reward mapped to [0, 1], prior
  ``Beta(ess * mu, ess * (1 - mu))`` from the prior mean ``mu`` (graph-propagated, or the global reference
  when the graph prior is off, as in the default), the task's own scored
  rollouts as counts (a graded reward ``r`` counts ``r`` successes and ``1 - r`` failures); ``None``
  rewards never enter the log's statistics, so they are ignored;
* :func:`mixed_probability`, :func:`group_signal`, :func:`optimistic_signal`, :func:`beta_upper`: turning a
  posterior into the probability that a group of ``G`` rollouts has signal, ``1 - p^G - (1 - p)^G``.

Everything is ``O(L + N)`` numpy (``L`` logged groups; bounded by the live window in the decayed form). Beta
quantiles use the normal approximation
``mean +- z_q sd`` clipped to [0, 1] (:func:`beta_quantile`): the exact ``scipy.special.betaincinv`` costs
about 35 ms per call at 2,550 tasks, which alone would take most of the 50 ms step budget.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln, ndtri

from envsched.method.history.sets import member
from envsched.method.history.statistics import PHASES, History

__all__ = ["beta_quantile", "declining", "env_signal", "group_signal", "mixed_probability", "optimistic_signal",
           "phase_yields", "signal_counts", "signal_posterior"]

_COVERAGE, _EXPLOITATION = PHASES.index("coverage"), PHASES.index("exploitation")
_EPS = 1e-6


def phase_yields(history: History, half_life: float) -> dict[str, tuple[float, float]]:
    """Recency-weighted ``(signal groups, scorable groups)`` of the coverage and the exploitation picks."""
    g = history.logged_groups()
    w = history.obs_weights(half_life)
    out = {}
    for name, code in (("coverage", _COVERAGE), ("exploitation", _EXPLOITATION)):
        sel = g.phase == code
        out[name] = (float(w[sel & g.signal].sum()), float(w[sel & g.scorable].sum()))
    old = history.decayed_signal_of(half_life, np.zeros(0, dtype=np.int64))  # (the phases' sums only)
    if old is not None:
        out = {name: (s + float(old.phase_signal[code]), k + float(old.phase_scorable[code]))
               for (name, (s, k)), code in zip(out.items(), (_COVERAGE, _EXPLOITATION), strict=True)}
    return out


def _weighted_counts(index: np.ndarray, weights: np.ndarray, length: int) -> np.ndarray:
    """``np.bincount(index, weights, minlength=length)`` as float64 always: numpy returns int64 zeros for an
    empty ``index`` even with float weights, and the decayed sums are then added in place."""
    return np.bincount(index, weights=weights, minlength=length).astype(float, copy=False)


def env_signal(history: History, half_life: float) -> tuple[np.ndarray, np.ndarray]:
    """Recency-weighted ``(signal groups (E,), scorable groups (E,))`` per environment, all phases."""
    g = history.logged_groups()
    ok, sig = g.scorable, g.signal
    w = history.obs_weights(half_life)
    env = history.env_codes[g.task]
    e = history.num_envs
    s_e, k_e = _weighted_counts(env[sig], w[sig], e), _weighted_counts(env[ok], w[ok], e)
    old = history.decayed_signal(half_life)
    if old is not None:
        s_e += np.bincount(history.env_codes, weights=old.signal, minlength=e)
        k_e += np.bincount(history.env_codes, weights=old.scorable, minlength=e)
    return s_e, k_e


def _task_rate(history: History, half_life: float, anchor: int | None,
               only: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    g = history.logged_groups()
    ok, sig = g.scorable, g.signal
    w = history.obs_weights(half_life, anchor)
    pos, n = g.task, history.n
    if only is not None:  # the rows of those tasks, in log order
        rows = member(pos, only)
        ok, sig, w, n = ok & rows, sig & rows, w, only.size
        pos = np.searchsorted(only, pos)  # (read only where a row is one of theirs)
    s, k = _weighted_counts(pos[sig], w[sig], n), _weighted_counts(pos[ok], w[ok], n)
    old = (history.decayed_signal(half_life, anchor) if only is None
           else history.decayed_signal_of(half_life, only, anchor))
    if old is not None:
        s += old.signal
        k += old.scorable
    return s, k


def declining(history: History, long_half_life: float, short_half_life: float, anchor: int | None = None,
              positions: np.ndarray | None = None) -> np.ndarray:
    """Tasks whose signal is declining: at least two scorable groups, and the short-half-life share of
    signal groups is below the long-half-life share (``(N,)`` bool). ``anchor``: the recency weights valued at that
    step (:meth:`History.task_history`: the same shares up to rounding); ``positions``: only those tasks (distinct,
    ascending; the same values as their rows of the whole array)."""
    only = None if positions is None else np.asarray(positions, dtype=np.int64)
    s_long, k_long = _task_rate(history, long_half_life, anchor, only)
    s_short, k_short = _task_rate(history, short_half_life, anchor, only)
    groups = history.scorable_counts(only)
    n = history.n if only is None else only.size
    rate_long = np.divide(s_long, k_long, out=np.zeros(n), where=k_long > 0)
    rate_short = np.divide(s_short, k_short, out=np.zeros(n), where=k_short > 0)
    return (groups >= 2) & (rate_short < rate_long - 1e-9)


def signal_counts(history: History, half_life: float,
                  positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Recency-weighted ``(reward sums, complement sums)`` of each task's scored rollouts (rewards mapped to
    [0, 1]; ``None`` rewards are not in the log's statistics); of the tasks ``positions`` only (distinct,
    ascending) when given, the same values."""
    g = history.logged_groups()
    n_sc = g.scored.astype(float)
    ok = g.scored > 0
    pos, n = g.task, history.n
    if positions is not None:
        only = np.asarray(positions, dtype=np.int64)
        ok &= member(pos, only)
        pos, n = np.searchsorted(only, pos), only.size
    w = history.obs_weights(half_life)[ok]
    succ = g.successes[ok]
    pos = pos[ok]
    s = _weighted_counts(pos, w * succ, n)
    f = _weighted_counts(pos, w * (n_sc[ok] - succ), n)
    old = history.decayed_signal(half_life) if positions is None else history.decayed_signal_of(half_life, only)
    if old is not None:
        s += old.successes
        f += old.failures
    return s, f


def signal_posterior(history: History, prior_mean: np.ndarray, ess: float, half_life: float,
                     positions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(alpha, beta)`` of every task's Beta posterior on its mean reward in [0, 1]; of the tasks ``positions`` only
    (distinct, ascending; ``prior_mean`` then theirs) when given, the same values."""
    mu = np.clip(np.asarray(prior_mean, dtype=float), _EPS, 1.0 - _EPS)
    s, f = signal_counts(history, half_life, positions)
    return ess * mu + s, ess * (1.0 - mu) + f


def group_signal(p: np.ndarray, g: int) -> np.ndarray:
    """Probability that ``g`` rollouts with success probability ``p`` are not all equal."""
    p = np.clip(p, 0.0, 1.0)
    return 1.0 - np.power(p, g) - np.power(1.0 - p, g)


def mixed_probability(alpha: np.ndarray, beta: np.ndarray, g: int) -> np.ndarray:
    """Posterior predictive probability of a mixed group of ``g``: ``1 - BB(0) - BB(g)`` (beta-binomial),
    i.e. ``E[1 - p^g - (1 - p)^g]`` under ``Beta(alpha, beta)``."""
    base = betaln(alpha, beta)
    out = 1.0 - np.exp(betaln(alpha, beta + g) - base) - np.exp(betaln(alpha + g, beta) - base)
    return np.clip(out, 0.0, 1.0)


def beta_quantile(alpha: np.ndarray, beta: np.ndarray, q: float) -> np.ndarray:
    """The ``q`` quantile of ``Beta(alpha, beta)`` by the normal approximation ``mean + z_q sd``, clipped to
    [0, 1] (elementwise; monotone in ``q`` and in the counts, which is all the rankings need)."""
    a = np.asarray(alpha, dtype=float)
    b = np.asarray(beta, dtype=float)
    t = a + b
    mean = a / t
    sd = np.sqrt(a * b / (t * t * (t + 1.0)))
    return np.clip(mean + float(ndtri(q)) * sd, 0.0, 1.0)


def optimistic_signal(alpha: np.ndarray, beta: np.ndarray, g: int, q: float) -> np.ndarray:
    """The largest group-signal probability over the central ``2q - 1`` credible interval of ``p``: the
    interval's point nearest 0.5 (``1 - p^g - (1 - p)^g`` is unimodal with its peak at 0.5)."""
    lo = beta_quantile(alpha, beta, 1.0 - q)
    hi = beta_quantile(alpha, beta, q)
    return group_signal(np.clip(0.5, lo, hi), g)
