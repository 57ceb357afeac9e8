"""prime-rl integration: an envsched sampler with the shape of prime-rl's curriculum ``TaskSampler``.

Targets prime-rl ``main`` @ 559b447 (the composable curricula of PR #3261/#3297, in ``v0.8.1.dev40+``)
and verifiers 0.4.0 (``import verifiers.v1 as vf``). prime-rl's sampler is
``class TaskSampler(Iterator[vf.Task], ABC)`` with ``__next__() -> vf.Task``,
``observe(group: list[vf.Episode])``, ``state_dict()``, ``load_state_dict(state)`` and
``metrics() -> dict[str, float]``; :class:`PrimeRLTaskSampler` implements exactly that over any envsched
:class:`~envsched.samplers.base.TaskSampler`, keyed by the verifiers ``Task.key``:

* ``__next__`` pops the next task from a buffer refilled with ``inner.sample(draw_batch)`` (prime-rl draws
  one task at a time, lazily and far ahead of feedback; ``draw_batch > 1`` lets a batch-level scheduler
  such as EnvSched compose a batch at once);
* ``observe(group)`` -- called by ``Curriculum.on_result`` before the admission gates and before
  ``filter_zero_advantages`` -- reports one group: one reward per episode (the trainable traces'
  ``trace.reward``; ``None`` when the rollout was not scored: no trace, a trace with errors, or a reward
  function that did not run), costs = the episode's output tokens.

prime-rl's sampler config is a closed union (``standard`` or ``difficulty_pool``), so the adapter goes in from a
custom orchestrator entrypoint: :func:`orchestrator_main` runs prime-rl's own orchestrator ``main`` with its
``TrainSource`` replaced by :func:`envsched_train_source`'s subclass, which, as each run's train source is built
(before a resume loads its checkpoint into it), replaces every env's ``curricula[env].sampler`` (a plain
attribute, looked up on every draw) with a :class:`PrimeRLTaskSampler` over that env's finite taskset
(:func:`install_task_samplers`); see ``docs/trainers.md``.

Groups prime-rl cancels as stale (``max_off_policy_steps``) never reach ``observe``; their dispatches stay
outstanding in the inner sampler (visible as ``outstanding_groups``) and do no harm.

Rewards of any scale: prime-rl's ``trace.reward`` is an unbounded weighted sum, so ``observe`` maps the rewards
through a :class:`~envsched.integrations._rewards.RewardScale` (``reward_range=`` given, else learned) onto the
inner sampler's range -- a finite reward never raises inside the orchestrator's ``on_result`` -- and a NaN/inf
reward reaches the sampler as ``None`` (counted in ``metrics()["rewards_nonfinite"]``; the rollout still
counts in episodes and cost).

verifiers is imported lazily: this module only needs the objects' attributes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from envsched.integrations._rewards import RewardScale
from envsched.pool.spec import task_key
from envsched.samplers.base import TaskSampler
from envsched.validation import check_int

__all__ = ["PRIME_RL_STATE_FORMAT", "PrimeRLTaskSampler", "envsched_train_source", "episode_reward",
           "install_task_samplers", "orchestrator_main", "task_spec_from_vf"]

PRIME_RL_STATE_FORMAT = "envsched.prime_rl/1"


def task_spec_from_vf(task: Any, env: str) -> dict[str, Any]:
    """An envsched task spec for a verifiers ``Task``: ``id`` = ``task.key``, ``env``, ``instruction``
    (the prompt text), ``index`` (``task.data.idx``) and ``name`` when set."""
    data = task.data
    spec: dict[str, Any] = {"id": str(task.key), "env": env}
    try:
        text = data.prompt_text
    except Exception:
        text = None
    if text:
        spec["instruction"] = str(text)
    if getattr(data, "idx", None) is not None:
        spec["index"] = int(data.idx)
    if getattr(data, "name", None):
        spec["name"] = str(data.name)
    return spec


def _trace_unscored(trace: Any) -> bool:
    rewards = getattr(trace, "rewards", None) or {}
    return bool(getattr(trace, "errors", None)) or not rewards or any(r is None for r in rewards.values())


def episode_reward(episode: Any) -> float | None:
    """One rollout's reward: the mean ``trace.reward`` of the episode's trainable traces, ``None`` if the
    episode has no trainable trace or none of them was scored (errors, or a reward that did not run). Any
    scale; NaN/inf are returned as they are (the sampler adapter turns them into ``None`` and counts them)."""
    traces = [t for t in getattr(episode, "traces", []) or [] if getattr(t.agent, "trainable", True)]
    scored = [float(t.reward) for t in traces if not _trace_unscored(t)]
    if not scored:
        return None
    return sum(scored) / len(scored)


def _episode_cost(episode: Any) -> float:
    total = 0
    for t in getattr(episode, "traces", []) or []:
        n = int(getattr(t, "num_output_tokens", 0) or 0)
        if n == 0 and getattr(t, "usage", None) is not None:
            n = int(t.usage.completion_tokens or 0)
        total += n
    return float(total)


class PrimeRLTaskSampler:
    """prime-rl ``TaskSampler`` over an envsched sampler.

    Args:
        inner: the envsched sampler; its task specs' ids must be the verifiers ``Task.key`` s.
        tasks: the verifiers ``Task`` objects (``__next__`` returns them); keys must be unique.
        draw_batch: tasks per ``inner.sample`` call (default 1).
        reward_of: episode -> reward or ``None`` (default :func:`episode_reward`).
        cost_of: episode -> cost (default: output tokens of its traces); ``None`` reports no costs.
        reward_range: the range of ``reward_of``'s rewards, mapped onto the inner sampler's ``reward_range``
            (``None``: learned from the rewards, see :class:`~envsched.integrations._rewards.RewardScale`).

    Use :meth:`from_tasks` to build the inner sampler from the tasks.
    """

    def __init__(self, inner: TaskSampler, tasks: Iterable[Any], *, draw_batch: int = 1,
                 reward_of: Callable[[Any], float | None] = episode_reward,
                 cost_of: Callable[[Any], float] | None = _episode_cost,
                 reward_range: Sequence[float] | None = None) -> None:
        for m in ("sample", "update", "state_dict", "load_state_dict"):
            if not callable(getattr(inner, m, None)):
                raise TypeError(f"inner must be an envsched TaskSampler; {type(inner).__name__} has no {m}()")
        draw_batch = check_int(draw_batch, "draw_batch", low=1)
        self.inner = inner
        self.reward_scale = RewardScale.for_sampler(inner, reward_range)
        self.draw_batch = draw_batch
        self.reward_of = reward_of
        self.cost_of = cost_of
        self._tasks: dict[str, Any] = {}
        for t in tasks:
            key = getattr(t, "key", None)
            if key is None:
                raise TypeError(f"tasks must be verifiers Tasks with a .key, got {type(t).__name__}")
            if key in self._tasks:
                raise ValueError(f"duplicate task.key {key!r}: keys must be unique within a taskset")
            self._tasks[str(key)] = t
        if not self._tasks:
            raise ValueError("tasks is empty")
        inner_tasks = getattr(inner, "tasks", None)
        if inner_tasks is not None:
            inner_keys = {task_key(s) for s in inner_tasks}
            if inner_keys != set(self._tasks):
                missing = sorted(set(self._tasks) - inner_keys)[:3]
                extra = sorted(inner_keys - set(self._tasks))[:3]
                raise ValueError(f"the inner sampler's task ids must be the tasks' keys; missing {missing}, "
                                 f"unknown {extra}")
        self._specs: dict[str, Any] = ({task_key_of(s): s for s in inner_tasks} if inner_tasks is not None
                                       else {})
        self._buffer: deque[str] = deque()
        self._observed = 0

    @classmethod
    def from_tasks(cls, tasks: Sequence[Any], make_sampler: Callable[[list[dict[str, Any]]], TaskSampler], *,
                   env: str, spec_of: Callable[[Any, str], dict[str, Any]] = task_spec_from_vf,
                   **kwargs: Any) -> PrimeRLTaskSampler:
        """Build the inner sampler over ``spec_of(task, env)`` specs (default :func:`task_spec_from_vf`)."""
        tasks = list(tasks)
        return cls(make_sampler([spec_of(t, env) for t in tasks]), tasks, **kwargs)

    # ------------------------------------------------------------------ prime-rl's TaskSampler
    def __iter__(self) -> PrimeRLTaskSampler:
        return self

    def __next__(self) -> Any:
        """The next task (``vf.Task``) to roll out a group for."""
        if not self._buffer:
            drawn = self.inner.sample(self.draw_batch)
            if not drawn:
                raise StopIteration
            for spec in drawn:
                key = task_key_of(spec)
                if key not in self._tasks:
                    raise KeyError(f"the inner sampler drew {key!r}, which is not a task key of this taskset")
                self._specs.setdefault(key, spec)
                self._buffer.append(key)
        return self._tasks[self._buffer.popleft()]

    def observe(self, group: list[Any]) -> None:
        """Report one finished group (every episode of one task) to the inner sampler.

        Raises ``ValueError`` for an empty group or one whose episodes do not share exactly one
        ``task.key`` (prime-rl's own check), ``KeyError`` for a key not in the taskset."""
        if not group:
            raise ValueError("observe() needs a non-empty group of episodes")
        keys = {getattr(e.task, "key", None) for e in group}
        keys.discard(None)
        if len(keys) != 1:
            raise ValueError(f"a group must hold episodes of exactly one task.key, got {sorted(map(str, keys))}")
        key = str(keys.pop())
        if key not in self._tasks:
            raise KeyError(f"episode task.key {key!r} is not a task of this taskset")
        rewards = self.reward_scale.map([self.reward_of(e) for e in group])
        costs = [float(self.cost_of(e)) for e in group] if self.cost_of is not None else None
        spec = self._specs.get(key, key)
        self.inner.update(spec, rewards, costs)
        self._observed += 1

    def metrics(self) -> dict[str, float]:
        """The inner sampler's metrics plus ``buffered`` (drawn, not yet handed out) and ``observed_groups``;
        prime-rl logs them as ``curriculum/<env>/sampler/<name>``."""
        m: dict[str, float] = {}
        if callable(getattr(self.inner, "metrics", None)):
            m.update({k: float(v) for k, v in self.inner.metrics().items()})
        m.update(self.reward_scale.metrics())
        m["buffered"] = float(len(self._buffer))
        m["observed_groups"] = float(self._observed)
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"format": PRIME_RL_STATE_FORMAT, "inner": self.inner.state_dict(), "buffer": list(self._buffer),
                "observed": self._observed, "reward_scale": self.reward_scale.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (``ValueError``, nothing changed, if it does not fit)."""
        if not isinstance(state_dict, Mapping) or state_dict.get("format") != PRIME_RL_STATE_FORMAT:
            raise ValueError("not a PrimeRLTaskSampler state")
        buffer = [str(k) for k in state_dict.get("buffer", [])]
        unknown = [k for k in buffer if k not in self._tasks]
        if unknown:
            raise ValueError(f"state buffers tasks not in this taskset: {unknown[:3]}")
        scale = RewardScale(self.reward_scale.target,
                            self.reward_scale.source if self.reward_scale.fixed else None)
        if "reward_scale" in state_dict:
            scale.load_state_dict(state_dict["reward_scale"])
        self.inner.load_state_dict(state_dict["inner"])
        self.reward_scale = scale
        self._buffer = deque(buffer)
        self._observed = int(state_dict.get("observed", 0))


def task_key_of(spec: Any) -> str:
    """Key of an inner task spec (``id``, as envsched keys specs)."""
    return task_key(spec)


# ---------------------------------------------------------------------------------------------- orchestrator
#: make_task_sampler(specs, env_name) -> the envsched sampler of one env's curriculum
SamplerFactory = Callable[[list[dict[str, Any]], str], TaskSampler]


def install_task_samplers(train_source: Any, make_task_sampler: SamplerFactory, *,
                          envs: Sequence[str] | None = None, draw_batch: int = 1,
                          reward_range: Sequence[float] | None = None) -> dict[str, PrimeRLTaskSampler]:
    """Replace the task sampler of each env's curriculum in prime-rl's ``TrainSource`` (``envs``: those named;
    default every env) with a :class:`PrimeRLTaskSampler` over ``make_task_sampler(specs, env_name)``, the specs
    being :func:`task_spec_from_vf` of the env's tasks. Returns the installed adapters by env name.

    The tasks are those prime-rl gave the curriculum's sampler (its ``tasks``: a finite taskset). Checks every
    env before replacing any: ``KeyError`` for an env not in ``train_source.curricula``, ``ValueError`` for an
    infinite taskset (envsched schedules over a finite pool)."""
    curricula = getattr(train_source, "curricula", None)
    if not isinstance(curricula, Mapping):
        raise TypeError(f"expected prime-rl's TrainSource (with .curricula), got {type(train_source).__name__}")
    names = list(curricula) if envs is None else [str(e) for e in envs]
    tasks_of: dict[str, list[Any]] = {}
    for name in names:
        if name not in curricula:
            raise KeyError(f"no train env {name!r} in prime-rl's train source; its envs: {sorted(curricula)}")
        tasks = getattr(curricula[name].sampler, "tasks", None)
        if tasks is None:
            raise ValueError(f"train env {name!r} has an infinite taskset (or a sampler without .tasks); envsched "
                             "schedules over a finite pool: give the env a finite taskset")
        tasks_of[name] = list(tasks)
    installed = {name: PrimeRLTaskSampler.from_tasks(tasks, lambda specs, n=name: make_task_sampler(specs, n),
                                                     env=name, draw_batch=draw_batch, reward_range=reward_range)
                 for name, tasks in tasks_of.items()}
    for name, sampler in installed.items():
        curricula[name].sampler = sampler
    return installed


def envsched_train_source(base: type, make_task_sampler: SamplerFactory, **kwargs: Any) -> type:
    """A subclass of prime-rl's ``TrainSource`` (``base``) that installs envsched's samplers
    (:func:`install_task_samplers` with ``kwargs``) as it is built -- so before the orchestrator loads a resumed
    checkpoint into it, whose sampler states are then the adapters' own. The adapters are in
    ``.envsched_samplers``."""

    class EnvSchedTrainSource(base):  # type: ignore[misc, valid-type]
        _envsched_base = base  # prime-rl's own class (installing twice replaces, never stacks)

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.envsched_samplers = install_task_samplers(self, make_task_sampler, **kwargs)

    EnvSchedTrainSource.__qualname__ = f"EnvSchedTrainSource[{base.__qualname__}]"
    return EnvSchedTrainSource


def registry_sampler_factory(name: str = "envsched", *, seed: int = 0, group_size: int = 8,
                             **options: Any) -> SamplerFactory:
    """``make_task_sampler`` building ``name`` from envsched's sampler registry for each env."""
    from envsched.samplers.registry import make_sampler

    def make(specs: list[dict[str, Any]], env_name: str) -> TaskSampler:
        return make_sampler(name, specs, seed=seed, group_size=group_size, **options)

    return make


def orchestrator_main(argv: Sequence[str] | None = None, make_task_sampler: SamplerFactory | None = None) -> Any:
    """prime-rl's orchestrator with envsched choosing every train env's tasks: a custom orchestrator entrypoint.

    ``argv`` (default ``sys.argv[1:]``): envsched's options, then prime-rl's orchestrator arguments as for its
    ``orchestrator`` command (``@ orch.toml``, ``--flags``), which prime-rl parses itself:
    ``--envsched-sampler NAME`` (a registry name, default ``envsched``; ignored with ``make_task_sampler``),
    ``--envsched-seed``, ``--envsched-group-size`` (default 8), ``--envsched-draw-batch`` (default 1),
    ``--envsched-envs A,B`` (default every train env), ``--envsched-reward-range LOW,HIGH`` (default learned).

    Runs ``prime_rl.orchestrator.orchestrator.main()`` with that module's ``TrainSource`` replaced by
    :func:`envsched_train_source`'s subclass. Needs prime-rl ``main`` (>= v0.8.1.dev40, the composable
    curricula) and its Python 3.12; exits with one line naming that when prime-rl is not importable."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="envsched prime-rl orchestrator", add_help=False)
    parser.add_argument("--envsched-sampler", default="envsched")
    parser.add_argument("--envsched-seed", type=int, default=0)
    parser.add_argument("--envsched-group-size", type=int, default=8)
    parser.add_argument("--envsched-draw-batch", type=int, default=1)
    parser.add_argument("--envsched-envs", default=None)
    parser.add_argument("--envsched-reward-range", default=None)
    args, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    reward_range = None
    if args.envsched_reward_range is not None:
        try:
            low, high = (float(x) for x in args.envsched_reward_range.split(","))
        except ValueError:
            parser.error(f"--envsched-reward-range takes LOW,HIGH, got {args.envsched_reward_range!r}")
        reward_range = (low, high)
    if make_task_sampler is None:
        from envsched.samplers.registry import available_samplers

        if args.envsched_sampler not in available_samplers():
            parser.error(f"unknown --envsched-sampler {args.envsched_sampler!r}; choose one of: "
                         f"{', '.join(sorted(available_samplers()))}")
        make_task_sampler = registry_sampler_factory(args.envsched_sampler, seed=args.envsched_seed,
                                                     group_size=args.envsched_group_size)
    try:
        import prime_rl.orchestrator.orchestrator as orchestrator
    except ImportError as exc:
        raise SystemExit(f"the prime-rl orchestrator entrypoint needs prime-rl (main >= v0.8.1.dev40, Python 3.12; "
                         f"installed from its repository, it is not on PyPI): {exc}") from None
    envs = [e for e in args.envsched_envs.split(",") if e] if args.envsched_envs else None
    base = getattr(orchestrator.TrainSource, "_envsched_base", orchestrator.TrainSource)
    orchestrator.TrainSource = envsched_train_source(base, make_task_sampler, envs=envs,
                                                     draw_batch=args.envsched_draw_batch, reward_range=reward_range)
    sys.argv = [sys.argv[0], *rest]
    return orchestrator.main()


def _register_with_prime_rl() -> None:
    """Register as a virtual subclass of prime-rl's ABC when prime-rl is installed (isinstance checks)."""
    try:
        from prime_rl.orchestrator.curriculum.samplers.base import TaskSampler as PrimeTaskSampler
    except Exception:
        return
    PrimeTaskSampler.register(PrimeRLTaskSampler)


_register_with_prime_rl()

if __name__ == "__main__":
    orchestrator_main()
