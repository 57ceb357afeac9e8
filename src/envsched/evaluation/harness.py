"""The RFC 013 evaluation harness: a reproducible evaluation of a policy on a held-out split.

:class:`EvalHarness` enumerates a split with a :class:`~envsched.samplers.SequentialSampler` crossed with
seeds, runs ``samples_per_task`` episodes per (task, seed) through any envsched
:class:`~envsched.envs.base.Environment` runner (OpenEnv over its WebSocket session, reasoning-gym, BFCL in
process...) and a :class:`~envsched.evaluation.policy.Policy`, writes every episode to a JSONL file as it
finishes, and returns an :class:`EvalResult` (scores, breakdowns, per-task outcomes, reproducibility).

Robustness: infrastructure failures (:class:`~envsched.envs.base.InfrastructureError`: connection lost,
capacity reached, timeouts, the policy endpoint down) are retried with exponential backoff on a fresh
environment, and only those; a concurrency limit bounds parallel episodes (threads, or Ray workers);
each episode has a deadline (checked between turns and passed on as request timeouts); and a run that
stops half-way resumes from its JSONL without re-running finished episodes. Episodes that ended in an
infrastructure failure are re-run on resume (the new line supersedes the old one; nothing is counted
twice).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envsched.envs.base import Environment, InfrastructureError
from envsched.envs.openenv import InvalidActionError
from envsched.evaluation.guards import CircuitBreaker, EvaluationStopped, check_endpoint
from envsched.evaluation.metrics import report, reproducibility_check
from envsched.evaluation.policy import ActionAdapter, AnswerAdapter, Policy, PolicyError
from envsched.evaluation.records import EpisodeLog, EpisodeRecord, episode_key
from envsched.pool.pool import TaskPool
from envsched.samplers.simple import SequentialSampler
from envsched.validation import check_int, check_number, is_number

__all__ = ["EpisodeSettings", "EpisodeTimeout", "EvalHarness", "EvalResult", "run_episode"]

log = logging.getLogger(__name__)

RESULT_FORMAT = "envsched.eval.result/1"
EPISODES_FILE = "episodes.jsonl"
RUN_FILE = "run.json"
RESULT_FILE = "result.json"


class EpisodeTimeout(InfrastructureError):
    """An episode ran past its deadline."""


@dataclass(frozen=True)
class EpisodeSettings:
    """How one episode is run (picklable, so Ray workers get it too)."""

    max_turns: int = 10
    success_threshold: float = 1.0
    episode_timeout_s: float = 300.0
    max_retries: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_turns", check_int(self.max_turns, "max_turns", low=1))
        object.__setattr__(self, "max_retries", check_int(self.max_retries, "max_retries", low=0))
        check_number(self.success_threshold, "success_threshold", finite=False)
        check_number(self.episode_timeout_s, "episode_timeout_s", low=0, low_open=True, finite=False)
        check_number(self.backoff_s, "backoff_s", low=0, finite=False)
        check_number(self.backoff_max_s, "backoff_max_s", low=0, finite=False)


# ---------------------------------------------------------------------------- one episode
def run_episode(env_factory: Callable[[], Environment], policy: Policy, adapter: ActionAdapter,
                task: Mapping[str, Any], seed: int | None, sample: int, settings: EpisodeSettings,
                sleep: Callable[[float], None] = time.sleep) -> EpisodeRecord:
    """Run one episode with retries (infrastructure failures only) and return its record.

    Retries go through tenacity: at most ``max_retries`` more attempts, each on a fresh environment, after
    waits of ``backoff_s * 2**k`` seconds (k = 0, 1, ...) capped at ``backoff_max_s``.
    """
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    started = time.time()
    key = episode_key(str(task.get("id")), seed, sample)

    def log_failure(state: Any) -> None:
        log.info("episode %s: infrastructure failure (attempt %d/%d): %s", key, state.attempt_number,
                 settings.max_retries + 1, state.outcome.exception() if state.outcome else None)

    retrying = Retrying(stop=stop_after_attempt(settings.max_retries + 1),
                        wait=wait_exponential(multiplier=settings.backoff_s, max=settings.backoff_max_s),
                        retry=retry_if_exception_type(InfrastructureError), after=log_failure, sleep=sleep,
                        reraise=True)
    attempts = 0
    rec: EpisodeRecord | None = None
    try:
        for attempt in retrying:
            with attempt:
                attempts = attempt.retry_state.attempt_number
                rec = _attempt(env_factory, policy, adapter, task, seed, sample, settings)
    except InfrastructureError as exc:  # every attempt failed on infrastructure
        return _record(task, seed, sample, "infra_error", None, attempts=attempts, started=started,
                       error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # the harness or the environment itself failed: not retried
        return _record(task, seed, sample, "error", None, attempts=attempts, started=started,
                       error=f"{type(exc).__name__}: {exc}\n{_short_tb(exc)}")
    assert rec is not None
    rec.attempts, rec.started_at, rec.duration_s = attempts, started, time.time() - started
    return rec


def _attempt(env_factory: Callable[[], Environment], policy: Policy, adapter: ActionAdapter,
             task: Mapping[str, Any], seed: int | None, sample: int, settings: EpisodeSettings) -> EpisodeRecord:
    deadline = time.monotonic() + settings.episode_timeout_s
    policy_s = env_s = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    turns = 0

    def remaining(what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EpisodeTimeout(f"episode timed out after {settings.episode_timeout_s:g}s ({what})")
        return left

    env = env_factory()
    if callable(getattr(env, "set_deadline", None)):
        env.set_deadline(deadline)  # an environment that can bounds its steps by the deadline (BFCL: each call)
    try:
        t = time.monotonic()
        observation = env.reset(task, seed)
        env_s += time.monotonic() - t
        messages = adapter.initial_messages(task, observation)
        outcome, reward, error = None, None, None
        done = False
        while turns < settings.max_turns:
            t = time.monotonic()
            try:
                resp = policy.complete(messages, timeout_s=remaining("waiting for the policy"))
            except PolicyError as exc:
                outcome, reward, error = "policy_error", 0.0, str(exc)
                turns += 1
                break
            finally:
                policy_s += time.monotonic() - t
            turns += 1
            if resp.prompt_tokens is not None:
                prompt_tokens = (prompt_tokens or 0) + resp.prompt_tokens
            if resp.completion_tokens is not None:
                completion_tokens = (completion_tokens or 0) + resp.completion_tokens
            messages.append({"role": "assistant", "content": resp.text})
            try:
                action = adapter.to_action(resp.text, task)
            except PolicyError as exc:
                outcome, reward, error = "policy_error", 0.0, str(exc)
                break
            remaining("before the environment step")
            t = time.monotonic()
            try:
                result = env.step(action)
            except InvalidActionError as exc:
                # the environment rejected the action as invalid: the policy's failure
                outcome, reward, error = "policy_error", 0.0, f"{type(exc).__name__}: {exc}"
                break
            finally:
                env_s += time.monotonic() - t
            if result.done:
                done = True
                break
            messages.append(adapter.feedback_message(result))
        if outcome is None:
            if done:
                reward = env.final_reward()
                if reward is None:
                    outcome = "unscored"
                else:
                    outcome = "success" if reward >= settings.success_threshold else "failure"
            else:
                final = env.final_reward()
                outcome, reward = "limit", (0.0 if final is None else final)
                error = f"turn limit ({settings.max_turns}) reached before the episode ended"
        return _record(task, seed, sample, outcome, None if reward is None else float(reward), turns=turns,
                       prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, policy_s=policy_s,
                       env_s=env_s, error=error)
    finally:
        try:
            env.close()
        except Exception as exc:
            log.debug("closing the environment failed: %s", exc)


def _record(task: Mapping[str, Any], seed: int | None, sample: int, outcome: str, reward: float | None,
            *, attempts: int = 1, started: float = 0.0, **kw: Any) -> EpisodeRecord:
    diff = task.get("difficulty")
    return EpisodeRecord(task_id=str(task.get("id")), seed=seed, sample=sample, outcome=outcome, reward=reward,
                         env=task.get("env"), group=task.get("group"),
                         difficulty=diff if is_number(diff, numpy=False) else None,
                         split=task.get("split"), index=task.get("index"), attempts=attempts,
                         started_at=started, duration_s=(time.time() - started) if started else 0.0, **kw)


def _short_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))[-1500:]


# ---------------------------------------------------------------------------- the result
@dataclass
class EvalResult:
    """An evaluation's outcome (``result.json``). ``scores`` holds the headline metrics."""

    scores: dict[str, Any]
    per_task: dict[str, dict[str, Any]]
    by_env: dict[str, dict[str, Any]]
    by_group: dict[str, dict[str, Any]]
    by_difficulty: dict[str, dict[str, Any]]
    reproducible: bool | None
    reproducibility: dict[str, Any]
    config: dict[str, Any]
    complete: bool = True
    training: dict[str, Any] = field(default_factory=dict)
    format: str = RESULT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return _json_safe({k: getattr(self, k) for k in self.__dataclass_fields__})

    def save(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False))
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalResult:
        if data.get("format") != RESULT_FORMAT:
            raise ValueError(f"not an envsched evaluation result (format {data.get('format')!r}, "
                             f"expected {RESULT_FORMAT!r})")
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EvalResult:
        return cls.from_dict(read_result_json(path))


def read_result_json(path: str | os.PathLike[str]) -> Any:
    """The JSON of a ``result.json`` (or of the one in the folder ``path``), with clear errors."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no evaluation result at {path}") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item"):
        return _json_safe(obj.item())
    return obj


# ---------------------------------------------------------------------------- the harness
class EvalHarness:
    """Evaluate a policy on a split of tasks.

    Args:
        env_factory: builds a fresh environment runner (called once per episode attempt and twice for
            the reproducibility check; it must return independent instances).
        policy: the policy under evaluation (e.g. :class:`~envsched.evaluation.policy.ChatCompletionsPolicy`).
        tasks: a :class:`~envsched.pool.TaskPool`, a list of task specs, or anything with
            ``iter_tasks(split)`` (a :class:`~envsched.envs.openenv.TaskAPIClient`).
        adapter: turns observations into messages and model text into actions (default
            :class:`~envsched.evaluation.policy.AnswerAdapter`).
        split: the split to evaluate; tasks of other splits are left out (a spec without ``split``
            belongs to every split).
        seeds: episode seeds crossed with the tasks (task-major order).
        samples_per_task: completions per (task, seed); ``pass@k`` is reported for every ``k`` up to it.
        limit: evaluate only the first ``limit`` tasks of the split.
        num_episodes: run only the first ``num_episodes`` episodes of the plan (``openenv collect``'s
            ``-n``; ``None``: all of them).
        max_turns: see :class:`EpisodeSettings`.
        success_threshold: see :class:`EpisodeSettings`.
        episode_timeout_s: see :class:`EpisodeSettings`.
        max_retries: see :class:`EpisodeSettings`.
        backoff_s: see :class:`EpisodeSettings`.
        backoff_max_s: see :class:`EpisodeSettings`.
        concurrency: episodes run at once (threads; or Ray workers with ``ray_address``).
        check_reproducibility: reset two fresh environments on the first task and compare hashes.
        ray_address: run episodes as Ray tasks (``"auto"``, ``"local"`` or a cluster address).
        meta: free-form description stored in the result (model, endpoint, environment spec).
        endpoints: further endpoints to check before the first episode, ``{what: url}`` (an OpenEnv server);
            the policy's own ``url`` (a :class:`ChatCompletionsPolicy`) is always checked. An unreachable one
            raises :class:`~envsched.evaluation.guards.EndpointUnreachable` before any episode runs.
        max_consecutive_infra_errors: stop the run (raise
            :class:`~envsched.evaluation.guards.EvaluationStopped`) after this many consecutive episodes
            ended in an infrastructure failure; ``None`` never stops.
    """

    def __init__(self, env_factory: Callable[[], Environment], policy: Policy, tasks: Any, *,
                 adapter: ActionAdapter | None = None, split: str = "test", seeds: Sequence[int] | None = (0,),
                 samples_per_task: int = 1, limit: int | None = None, max_turns: int = 10,
                 success_threshold: float = 1.0, concurrency: int = 1, episode_timeout_s: float = 300.0,
                 max_retries: int = 3, backoff_s: float = 1.0, backoff_max_s: float = 30.0,
                 check_reproducibility: bool = True, ray_address: str | None = None,
                 meta: Mapping[str, Any] | None = None, num_episodes: int | None = None,
                 endpoints: Mapping[str, str] | None = None, max_consecutive_infra_errors: int | None = 5) -> None:
        if not callable(env_factory):
            raise TypeError("env_factory must be a callable returning a fresh Environment")
        if not hasattr(policy, "complete"):
            raise TypeError(f"policy must have complete(messages, timeout_s=...), got {type(policy).__name__}")
        samples_per_task = check_int(samples_per_task, "samples_per_task", low=1)
        max_turns = check_int(max_turns, "max_turns", low=1)
        concurrency = check_int(concurrency, "concurrency", low=1)
        max_retries = check_int(max_retries, "max_retries", low=0)
        if limit is not None:
            limit = check_int(limit, "limit (or None)", low=1)
        if num_episodes is not None:
            num_episodes = check_int(num_episodes, "num_episodes (or None)", low=1)
        if not isinstance(split, str) or not split:
            raise ValueError(f"split must be a non-empty string, got {split!r}")
        check_number(success_threshold, "success_threshold", finite=False)
        check_number(episode_timeout_s, "episode_timeout_s", low=0, low_open=True, finite=False)
        check_number(backoff_s, "backoff_s", low=0, finite=False)
        check_number(backoff_max_s, "backoff_max_s", low=0, finite=False)
        if samples_per_task > 1 and getattr(policy, "temperature", None) == 0:
            raise ValueError("samples_per_task > 1 needs a policy temperature > 0 (otherwise every sample of a "
                             "task is the same completion)")
        if seeds is not None:
            seeds = list(seeds)
            if not seeds or len(set(seeds)) != len(seeds):
                raise ValueError(f"seeds must be a non-empty list of distinct integers, got {seeds!r}")
        self.env_factory = env_factory
        self.policy = policy
        self.adapter = adapter or AnswerAdapter()
        self.split = split
        self.seeds = seeds
        self.samples_per_task = samples_per_task
        self.limit = limit
        self.num_episodes = num_episodes
        self.concurrency = concurrency
        self.check_reproducibility = check_reproducibility
        self.ray_address = ray_address
        self.meta = dict(meta or {})
        self.settings = EpisodeSettings(max_turns=max_turns, success_threshold=float(success_threshold),
                                        episode_timeout_s=float(episode_timeout_s), max_retries=max_retries,
                                        backoff_s=float(backoff_s), backoff_max_s=float(backoff_max_s))
        self._tasks_source = tasks
        self._tasks: list[dict[str, Any]] | None = None
        self.endpoints = dict(endpoints or {})
        CircuitBreaker(max_consecutive_infra_errors)  # validates the threshold now, not at run time
        self.max_consecutive_infra_errors = max_consecutive_infra_errors

    def check_endpoints(self) -> None:
        """One TCP connection to the policy's endpoint and to each of ``endpoints``; raises
        :class:`~envsched.evaluation.guards.EndpointUnreachable` with the connection error."""
        url = getattr(self.policy, "url", None)
        targets = ({"the LLM endpoint": url} if isinstance(url, str) else {}) | self.endpoints
        for what, target in targets.items():
            check_endpoint(target, what=what)

    # ------------------------------------------------------------------ planning
    @property
    def tasks(self) -> list[dict[str, Any]]:
        """The tasks evaluated: the split's tasks (first ``limit``)."""
        if self._tasks is None:
            self._tasks = self._load_tasks()
        return self._tasks

    def _load_tasks(self) -> list[dict[str, Any]]:
        src = self._tasks_source
        if hasattr(src, "iter_tasks"):
            tasks = [dict(t) for t in src.iter_tasks(self.split)]
            for i, t in enumerate(tasks):
                t.setdefault("split", self.split)
                t.setdefault("index", i)
                t.setdefault("env", getattr(src, "env_name", "openenv"))
                t.setdefault("id", f"{t['env']}-{self.split}-{t['index']}")
        else:
            if isinstance(src, str | bytes | Mapping) or not isinstance(src, TaskPool | Iterable):
                raise TypeError(f"tasks must be a TaskPool, a list of specs or a TaskAPIClient, "
                                f"got {type(src).__name__}")
            all_tasks = [dict(t) for t in src]
            tasks = [t for t in all_tasks if t.get("split") in (None, self.split)]
            if not tasks:
                splits = sorted({str(t.get("split")) for t in all_tasks})
                raise ValueError(f"no task in split {self.split!r}; the tasks' splits are {splits}")
        if not tasks:
            raise ValueError(f"split {self.split!r} has no tasks")
        return tasks[: self.limit] if self.limit else tasks

    def plan(self) -> list[tuple[dict[str, Any], int | None, int]]:
        """Every episode, in order: ``(task, seed, sample)``."""
        sampler = SequentialSampler(self.tasks, self.seeds, require_dispatch=False)
        items = sampler.sample(len(sampler))
        plan = [(item, item.get("seed") if self.seeds else None, j)
                for item in items for j in range(self.samples_per_task)]
        return plan[: self.num_episodes] if self.num_episodes else plan

    def config(self) -> dict[str, Any]:
        """What identifies this evaluation (a resumed run must match it)."""
        s = self.settings
        return {"split": self.split, "seeds": self.seeds, "samples_per_task": self.samples_per_task,
                "limit": self.limit, **({"num_episodes": self.num_episodes} if self.num_episodes else {}),
                "max_turns": s.max_turns, "success_threshold": s.success_threshold,
                "tasks": len(self.tasks), "tasks_sha256": _digest([t.get("id") for t in self.tasks]),
                **{k: v for k, v in self.meta.items() if k in ("model", "spec", "temperature", "max_tokens")}}

    # ------------------------------------------------------------------ reproducibility (RFC 013 D4)
    def reproducibility_check(self) -> dict[str, Any]:
        """Reset two fresh environments with the first task's split, index and seed; compare hashes."""
        task, seed, _ = self.plan()[0]

        def first_observation() -> Any:
            env = self.env_factory()
            try:
                return env.reset(task, seed)
            finally:
                env.close()

        return reproducibility_check(first_observation, task, seed, what="resets")

    # ------------------------------------------------------------------ running
    def run(self, output_dir: str | os.PathLike[str] | None = None, *, resume: bool = True,
            progress: Callable[[EpisodeRecord, int, int], None] | None = None) -> EvalResult:
        """Run (or resume) the evaluation; write ``episodes.jsonl``, ``run.json`` and ``result.json``
        under ``output_dir`` (kept in memory only when it is ``None``).

        Checks the endpoints first (:meth:`check_endpoints`) and stops early after
        ``max_consecutive_infra_errors`` consecutive infrastructure failures (:class:`EvaluationStopped`; the
        episodes finished so far stay in ``episodes.jsonl`` and a rerun resumes them)."""
        self.check_endpoints()
        plan = self.plan()
        config = self.config()
        out = Path(output_dir) if output_dir is not None else None
        records: dict[str, EpisodeRecord] = {}
        log_file: EpisodeLog | None = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            log_file = EpisodeLog(out / EPISODES_FILE)
            run_file = out / RUN_FILE
            if run_file.exists() and (out / EPISODES_FILE).exists():
                if not resume:
                    raise FileExistsError(f"{out} already holds an evaluation; pass resume=True "
                                          "to continue it or choose another directory")
                previous = json.loads(run_file.read_text()).get("config")
                if previous != _json_safe(config):
                    raise ValueError(f"{out} holds a different evaluation (config {previous}); "
                                     f"this one is {config}: use another output directory")
                records = log_file.load()
            run_file.write_text(json.dumps({"config": _json_safe(config), "meta": _json_safe(self.meta)},
                                           indent=2, sort_keys=True))
        planned = {episode_key(str(t.get("id")), s, j) for t, s, j in plan}
        records = {k: r for k, r in records.items() if k in planned}
        todo = [(t, s, j) for t, s, j in plan
                if (r := records.get(episode_key(str(t.get("id")), s, j))) is None or r.outcome == "infra_error"]
        repro = self.reproducibility_check() if self.check_reproducibility else {"reproducible": None,
                                                                                  "skipped": True}
        log.info("evaluating %d episodes (%d already recorded)", len(todo), len(plan) - len(todo))
        done_count = len(plan) - len(todo)
        breaker = CircuitBreaker(self.max_consecutive_infra_errors)

        def finish(rec: EpisodeRecord) -> bool:
            """Record one episode; return whether the run must stop (the circuit breaker tripped)."""
            nonlocal done_count
            records[rec.key] = rec
            if log_file is not None:
                log_file.append(rec)
            done_count += 1
            if progress is not None:
                progress(rec, done_count, len(plan))
            return breaker.record(rec.outcome, rec.error)

        if self.ray_address is not None:
            self._run_ray(todo, finish)
        else:
            self._run_threads(todo, finish)
        if breaker.tripped:
            raise EvaluationStopped(breaker.consecutive, breaker.last_error, done_count, len(plan))
        result = self.result_from_records(records.values(), plan=plan, reproducibility=repro)
        if out is not None:
            result.save(out / RESULT_FILE)
        return result

    def _run_threads(self, todo: list[tuple[dict[str, Any], int | None, int]],
                     finish: Callable[[EpisodeRecord], bool]) -> None:
        if self.concurrency == 1:
            for task, seed, sample in todo:
                if finish(run_episode(self.env_factory, self.policy, self.adapter, task, seed, sample,
                                      self.settings)):
                    return
            return
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="envsched-eval") as pool:
            pending = {pool.submit(run_episode, self.env_factory, self.policy, self.adapter, t, s, j, self.settings)
                       for t, s, j in todo}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    with lock:
                        stop = finish(fut.result())
                    if stop:  # the breaker tripped: drop the episodes not started, wait for the running ones
                        for other in pending:
                            other.cancel()
                        return

    def _run_ray(self, todo: list[tuple[dict[str, Any], int | None, int]],
                 finish: Callable[[EpisodeRecord], bool]) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ImportError("--ray needs Ray: pip install 'envsched[ray]'") from exc
        if not ray.is_initialized():
            address = None if self.ray_address in ("", "local") else self.ray_address
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False,
                     log_to_driver=False, **({"num_cpus": self.concurrency} if address is None else {}))
        remote = ray.remote(num_cpus=1, max_retries=0)(run_episode)
        env_ref, pol_ref = ray.put(self.env_factory), ray.put(self.policy)
        queue = list(todo)
        running: list[Any] = []
        while queue or running:
            while queue and len(running) < self.concurrency:
                t, s, j = queue.pop(0)
                running.append(remote.remote(env_ref, pol_ref, self.adapter, t, s, j, self.settings))
            ready, running = ray.wait(running, num_returns=1)
            for ref in ready:
                if finish(ray.get(ref)):
                    for other in running:
                        ray.cancel(other)
                    return

    def result_from_records(self, records: Iterable[EpisodeRecord], *,
                            plan: Sequence[tuple[dict[str, Any], int | None, int]] | None = None,
                            reproducibility: Mapping[str, Any] | None = None) -> EvalResult:
        """Scores from records (only the planned episodes, each once)."""
        plan = plan if plan is not None else self.plan()
        by_key = {r.key: r for r in records}
        recs = [by_key[k] for k in (episode_key(str(t.get("id")), s, j) for t, s, j in plan) if k in by_key]
        rep = report(recs, success_threshold=self.settings.success_threshold, max_k=self.samples_per_task)
        scores = rep["scores"]
        scores["planned_episodes"] = len(plan)
        repro = dict(reproducibility or {"reproducible": None})
        return EvalResult(
            scores=scores,
            per_task=rep["per_task"],
            by_env=rep["by_env"],
            by_group=rep["by_group"],
            by_difficulty=rep["by_difficulty"],
            reproducible=repro.get("reproducible"),
            reproducibility=repro,
            config={**self.config(), **{k: v for k, v in self.meta.items()}},
            complete=len(recs) == len(plan),
        )


def _digest(values: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for v in values:
        h.update(str(v).encode())
        h.update(b"\0")
    return h.hexdigest()
