"""In-training evaluation on a schedule (RFC 013's framework-neutral ``EvalSchedule``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envsched.evaluation.harness import EvalHarness, EvalResult

__all__ = ["EvalSchedule"]

log = logging.getLogger(__name__)


class EvalSchedule:
    """Evaluate the policy every ``every_n_steps`` optimizer steps.

    Call :meth:`maybe_run` after each optimizer step; ``maybe_run(0)`` gives the baseline before
    training. Each evaluation's :class:`EvalResult` gets ``training = {"step", "sampler_episodes",
    "sampler_cost", "sampler_signal_groups", ...}`` -- the sampler's counters at that step, so that scores
    are read against the episodes and cost spent to reach them -- and is passed to
    ``on_result(step, result)``. The policy is whatever the harness's policy serves at that moment (an
    OpenAI-compatible endpoint serving the current weights).

    Args:
        harness: the evaluation to run.
        every_n_steps: evaluation period in optimizer steps (> 0).
        on_result: called with ``(step, result)`` after each evaluation.
        sampler: the training sampler whose ``metrics()`` (or counters) are logged beside the scores.
        output_dir: each evaluation writes to ``output_dir/step-NNNNNNNN`` (resumable); ``None`` keeps
            results in memory.
    """

    def __init__(self, harness: EvalHarness, every_n_steps: int,
                 on_result: Callable[[int, EvalResult], None] | None = None, *, sampler: Any = None,
                 output_dir: str | os.PathLike[str] | None = None) -> None:
        if not isinstance(harness, EvalHarness) and not hasattr(harness, "run"):
            raise TypeError(f"harness must be an EvalHarness, got {type(harness).__name__}")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps!r}")
        if on_result is not None and not callable(on_result):
            raise TypeError("on_result must be callable as on_result(step, result)")
        self.harness = harness
        self.every_n_steps = every_n_steps
        self.on_result = on_result
        self.sampler = sampler
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.history: list[tuple[int, EvalResult]] = []
        self._last_step: int | None = None

    def due(self, step: int) -> bool:
        """Whether :meth:`maybe_run` would evaluate at ``step``."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            return False
        return step % self.every_n_steps == 0

    def maybe_run(self, step: int) -> EvalResult | None:
        """Evaluate if ``step`` is due (0, then every ``every_n_steps``; never twice for one step)."""
        if not self.due(step):
            return None
        out = self.output_dir / f"step-{step:08d}" if self.output_dir is not None else None
        result = self.harness.run(out)
        result.training = {"step": step, **self._sampler_counters()}
        if out is not None:
            result.save(out / "result.json")
        self._last_step = step
        self.history.append((step, result))
        s = result.scores
        log.info("eval at step %d: success_rate=%.4f±%.4f mean_reward=%.4f error_rate=%.4f "
                 "(sampler: %s episodes, cost %s)", step, s.get("success_rate", float("nan")),
                 s.get("success_rate_se", float("nan")), s.get("mean_reward", float("nan")),
                 s.get("error_rate", float("nan")), result.training.get("sampler_episodes"),
                 result.training.get("sampler_cost"))
        if self.on_result is not None:
            self.on_result(step, result)
        return result

    def _sampler_counters(self) -> dict[str, Any]:
        s = self.sampler
        if s is None:
            return {}
        if hasattr(s, "metrics"):
            m = dict(s.metrics())
        else:
            m = {k: getattr(s, k) for k in ("groups", "signal_groups", "episodes", "cost") if hasattr(s, k)}
        out = {f"sampler_{k}": v for k, v in m.items()}
        out.setdefault("sampler_episodes", getattr(s, "episodes", None))
        out.setdefault("sampler_cost", getattr(s, "cost", None))
        return out
