"""In-training evaluation on a schedule (RFC 013's framework-neutral ``EvalSchedule``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from envsched.evaluation.guards import EndpointUnreachable, EvaluationStopped
from envsched.evaluation.harness import EvalHarness
from envsched.validation import check_int

__all__ = ["DEFAULT_HISTORY_SIZE", "EvalSchedule"]

#: Evaluations :attr:`EvalSchedule.history` keeps by default (the newest).
DEFAULT_HISTORY_SIZE = 64

log = logging.getLogger(__name__)


class EvalSchedule:
    """Evaluate the policy every ``every_n_steps`` optimizer steps (RFC 013's ``EvalSchedule``).

    Call :meth:`maybe_run` after each optimizer step; ``maybe_run(0)`` gives the baseline before
    training. The policy is whatever the harness's endpoint serves at that moment (an OpenAI-compatible
    endpoint serving the current weights).

    Args:
        harness: RFC form: an :class:`~envsched.evaluation.rfc013.EnvEvalHarness` (any
            ``openenv.core.evals.EvalHarness``), run with ``harness.run_from_config(config)``; its result
            is OpenEnv's ``EvalResult``. envsched form: an :class:`EvalHarness`, run with
            ``harness.run(output_dir)``; its result is envsched's :class:`EvalResult`.
        config: RFC form: the ``openenv.core.evals.EvalConfig`` (or its dict) of every evaluation.
            envsched form: ``None`` (the harness holds its configuration).
        every_n_steps: evaluation period in optimizer steps (> 0).
        on_result: called with ``(step, result)`` after each evaluation.
        sampler: (keyword) the training sampler whose ``metrics()`` (or counters) are logged beside the
            scores -- ``result.training`` (envsched form) or ``result.scores["training"]`` (RFC form):
            ``{"step", "sampler_episodes", "sampler_cost", "sampler_signal_groups", ...}``, so scores are
            read against the episodes and cost spent to reach them.
        output_dir: (keyword) each evaluation writes to ``output_dir/step-NNNNNNNN``; ``None``: the
            harness's own choice (in memory, or the ``EnvEvalHarness``'s ``output_dir``).
        history_size: (keyword) how many of the newest ``(step, result)`` pairs :attr:`history` keeps
            (default :data:`DEFAULT_HISTORY_SIZE`; 0 keeps none). A result holds every evaluated task's
            scores, so an unbounded list would grow by that much per evaluation for the whole run; older
            results are dropped (oldest first) from memory only -- ``on_result`` received each, and with
            ``output_dir`` each stays on disk as ``step-NNNNNNNN/result.json``.
    """

    def __init__(self, harness: Any, config: Any, every_n_steps: int,
                 on_result: Callable[[int, Any], None] | None = None, *, sampler: Any = None,
                 output_dir: str | os.PathLike[str] | None = None,
                 history_size: int = DEFAULT_HISTORY_SIZE) -> None:
        self.rfc_form = _is_openenv_harness(harness)
        if self.rfc_form:
            config = _eval_config(harness, config)
        elif isinstance(harness, EvalHarness) or hasattr(harness, "run"):
            if config is not None:
                raise TypeError("EvalSchedule(harness, config, every_n_steps, on_result): with envsched's "
                                f"EvalHarness the config is None (it holds its own), got {type(config).__name__}")
        else:
            raise TypeError(f"harness must be an EnvEvalHarness or an EvalHarness, got {type(harness).__name__}")
        every_n_steps = check_int(every_n_steps, "every_n_steps", low=1)
        history_size = check_int(history_size, "history_size (evaluations kept)", low=0)
        if on_result is not None and not callable(on_result):
            raise TypeError("on_result must be callable as on_result(step, result)")
        self.harness = harness
        self.config = config
        self.every_n_steps = every_n_steps
        self.on_result = on_result
        self.sampler = sampler
        self.output_dir = Path(output_dir) if output_dir is not None else None
        #: The newest ``history_size`` evaluations as ``(step, result)``, oldest first.
        self.history: list[tuple[int, Any]] = []
        self.history_size = history_size
        #: Evaluations run so far (kept in :attr:`history` or dropped from it).
        self.evaluations = 0
        #: ``(step, reason)`` of each due evaluation that stopped early because its endpoint could not be
        #: reached (training goes on; the next due step tries again)
        self.skipped: list[tuple[int, str]] = []
        self._last_step: int | None = None

    def due(self, step: int) -> bool:
        """Whether :meth:`maybe_run` would evaluate at ``step``."""
        step = check_int(step, "step", low=0)
        if self._last_step is not None and step <= self._last_step:
            return False
        return step % self.every_n_steps == 0

    def maybe_run(self, step: int) -> Any:
        """Evaluate if ``step`` is due (0, then every ``every_n_steps``; never twice for one step).

        An evaluation whose endpoint cannot be reached, or that the circuit breaker stops, is logged, recorded
        in :attr:`skipped` and returns ``None``: it does not stop the training."""
        if not self.due(step):
            return None
        out = self.output_dir / f"step-{step:08d}" if self.output_dir is not None else None
        training = {"step": step, **self._sampler_counters()}
        if self.rfc_form:
            saved = getattr(self.harness, "output_dir", None)
            if out is not None:
                self.harness.output_dir = out
            try:
                result = self.harness.run_from_config(self.config)
            finally:
                if out is not None:
                    self.harness.output_dir = saved
            result.scores["training"] = training
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / "result.json").write_text(result.model_dump_json(indent=2))
        else:
            try:
                result = self.harness.run(out)
            except (EndpointUnreachable, EvaluationStopped) as exc:  # an evaluation never stops the training
                log.warning("eval at step %d skipped: %s", step, exc)
                self.skipped.append((step, str(exc)))
                return None
            result.training = training
            if out is not None:
                result.save(out / "result.json")
        self._last_step = step
        self.history.append((step, result))
        del self.history[:len(self.history) - self.history_size]
        self.evaluations += 1
        s = result.scores
        log.info("eval at step %d: success_rate=%.4f±%.4f mean_reward=%.4f error_rate=%.4f "
                 "(sampler: %s episodes, cost %s)", step, s.get("success_rate", float("nan")),
                 s.get("success_rate_se", float("nan")), s.get("mean_reward", float("nan")),
                 s.get("error_rate", float("nan")), training.get("sampler_episodes"), training.get("sampler_cost"))
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


def _is_openenv_harness(harness: Any) -> bool:
    try:
        from openenv.core.evals import EvalHarness as OpenEnvEvalHarness
    except ImportError:  # pragma: no cover - openenv not installed
        return False
    return isinstance(harness, OpenEnvEvalHarness)


def _eval_config(harness: Any, config: Any) -> Any:
    from openenv.core.evals import EvalConfig

    if isinstance(config, EvalConfig):
        return config
    if isinstance(config, Mapping):
        data = {"harness_name": harness.name, **config}
        try:
            return EvalConfig(**data)
        except Exception as exc:  # pydantic's ValidationError: name the fields
            raise ValueError(f"config is not a valid openenv EvalConfig: {exc}") from None
    raise TypeError("EvalSchedule(harness, config, every_n_steps, on_result): config must be an "
                    f"openenv.core.evals.EvalConfig (or its dict), got {type(config).__name__}")
