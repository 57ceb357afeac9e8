"""reasoning-gym (PyPI ``reasoning-gym``, Apache-2.0): each dataset an environment, its items tasks.

Every reasoning-gym generator is procedural and offline: ``create_dataset(name, size=, seed=, **config)``
yields items ``{"question", "answer", "metadata"}`` and the dataset's own ``score_answer(answer, entry)``
returns a reward in [0, 1]. A task spec built here carries everything needed to regenerate and score its item
offline (``reasoning_gym``: dataset name, configuration, seed, size and item index), so specs stay plain JSON.

**Difficulty tiers.** As in OpenEnv RFC 013's ``chain_sum`` example, a tier is a configuration, and tiers are
closely spaced: ``chain_sum`` uses the RFC's five tiers exactly (tier ``k``: ``k + 2`` terms of ``k + 1``
digits, negation from the third tier); any other dataset with a reasoning-gym curriculum uses the
curriculum's global level ``k`` with each range attribute narrowed to its level's own interval
(``RangeAttributeMode.UPPER_BOUND``), for ``k = 0 .. min(num_tiers, levels) - 1``; a dataset without a
curriculum has one tier, its default configuration.

**Episodes** (:class:`ReasoningGymEnvironment`): ``reset(task)`` returns the question; ``step(answer_text)``
ends the episode with the reward of the dataset's scoring rules. Every answer is scored in a bounded worker
process (a deadline per answer, a memory cap) and no answer is ever evaluated as code: the eleven datasets
whose ``score_answer`` evaluates text are scored by envsched's safe equivalents, the others by their own
scorer, under envsched's reward-integrity rules; a dataset that was not audited is refused unless the
operator sets ``ENVSCHED_ALLOW_EVALUATING_SCORERS=1`` (:mod:`envsched.envs.safe_scoring`, docs/scorers.md).
Items are generated in another worker process (:mod:`envsched.envs._rg_items`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from envsched.envs.base import Environment, EnvironmentUnavailable, StepResult
from envsched.validation import check_int

__all__ = [
    "BENCHMARK_DATASETS",
    "DEFAULT_DATASETS",
    "DEFAULT_NUM_TIERS",
    "EXTRA_DATASETS",
    "ReasoningGymEnvironment",
    "build_reasoning_gym_pool",
    "dataset_tiers",
    "list_datasets",
    "list_scorable_datasets",
    "regenerate_item",
    "rg_version",
    "score_task_answer",
]

DEFAULT_NUM_TIERS = 5

#: 43 datasets that generate offline in milliseconds, keep questions under 20 kB and give their own reference
#: answers 1.0 on every item of the benchmark pool (checked by tests/envs/test_reasoning_gym.py); chosen
#: across reasoning-gym's categories (algebra, algorithmic, arc, arithmetic, cognition, games, geometry,
#: graphs, induction, logic, probability). ``circuit_logic`` (questions up to 440 kB) and ``codeio`` (runs
#: generated code, prints errors) and ``list_functions`` (its items change with generation order, so a spec
#: cannot regenerate its item) were left out.
BENCHMARK_DATASETS: tuple[str, ...] = (
    "acre", "advanced_geometry", "arc_1d", "base_conversion", "basic_arithmetic", "chain_sum", "coin_flip",
    "color_cube_rotation", "complex_arithmetic", "count_bits", "course_schedule", "cryptarithm",
    "decimal_chain_sum", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "gcd", "gsm_symbolic", "knights_knaves", "largest_island", "lcm", "letter_counting", "mahjong_puzzle",
    "mini_sudoku", "needle_haystack", "number_sorting", "palindrome_generation", "path_star",
    "power_function", "quantum_lock", "rectangle_count", "self_reference", "shortest_path",
    "simple_equations", "simple_geometry", "simple_integration", "spiral_matrix", "survo", "syllogism",
    "tower_of_hanoi", "tsumego", "word_ladder",
)
#: Eight more datasets with the same properties, for the 51-dataset pool used without bfcl-eval.
EXTRA_DATASETS: tuple[str, ...] = (
    "bitwise_arithmetic", "calendar_arithmetic", "decimal_arithmetic", "dice", "group_anagrams",
    "isomorphic_strings", "leg_counting", "products",
)
#: The datasets :func:`build_reasoning_gym_pool` builds by default (51).
DEFAULT_DATASETS: tuple[str, ...] = tuple(sorted(BENCHMARK_DATASETS + EXTRA_DATASETS))
_RG_INSTALL = "pip install 'reasoning-gym>=0.1.25'"


def _rg() -> Any:
    try:
        import reasoning_gym
        from reasoning_gym import factory
    except ImportError as exc:  # pragma: no cover - reasoning-gym is a core dependency
        raise EnvironmentUnavailable(f"reasoning-gym is not installed ({exc}); install it: {_RG_INSTALL}") from exc
    return reasoning_gym, factory


def rg_version() -> str:
    """The installed reasoning-gym version."""
    try:
        from importlib.metadata import version
        return version("reasoning-gym")
    except Exception:  # pragma: no cover
        return "unknown"


def list_datasets() -> list[str]:
    """Names of the registered reasoning-gym datasets (without the ``composite`` meta-dataset)."""
    _, factory = _rg()
    return sorted(n for n in factory.DATASETS if n != "composite")


def list_scorable_datasets(allow_evaluating_scorers: bool | None = None) -> list[str]:
    """:func:`list_datasets` without the datasets that have no safe scorer (unless ``allow_evaluating_scorers``,
    default ``ENVSCHED_ALLOW_EVALUATING_SCORERS``): what ``datasets="all"`` builds."""
    from envsched.envs.safe_scoring import evaluating_scorers_allowed, scoring_kind

    allow = evaluating_scorers_allowed() if allow_evaluating_scorers is None else allow_evaluating_scorers
    return [n for n in list_datasets() if allow or scoring_kind(n) != "unaudited"]


def _check_dataset(name: str) -> None:
    if name not in list_datasets():
        known = list_datasets()
        raise ValueError(f"unknown reasoning-gym dataset {name!r} ({len(known)} known, e.g. "
                         f"{', '.join(known[:8])}...; see envsched.envs.reasoning_gym.list_datasets())")


def _jsonable_config(cfg: Any) -> dict[str, Any]:
    data = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
    data.pop("seed", None)
    data.pop("size", None)
    return json.loads(json.dumps(data))


@functools.cache
def _tiers(name: str, num_tiers: int) -> tuple[str, ...]:
    _check_dataset(name)
    if name == "chain_sum":  # RFC 013's example server: five tiers
        return tuple(json.dumps({"min_terms": k + 2, "max_terms": k + 2, "min_digits": k + 1,
                                 "max_digits": k + 1, "allow_negation": k >= 2}, sort_keys=True)
                     for k in range(min(num_tiers, 5)))
    _, factory = _rg()
    if name not in factory.CURRICULA:
        return (json.dumps({}),)
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    curriculum = factory.create_curriculum(name)
    levels = max((len(a.levels) for a in curriculum.attributes.values()), default=1)
    out = []
    for k in range(min(num_tiers, levels)):
        curriculum.set_global_level(k)
        cfg = curriculum.generate_configuration(
            context=DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND))
        out.append(json.dumps(_jsonable_config(cfg), sort_keys=True))
    return tuple(out)


def dataset_tiers(name: str, num_tiers: int = DEFAULT_NUM_TIERS) -> list[dict[str, Any]]:
    """The difficulty tiers of a dataset: one configuration (keyword arguments of ``create_dataset``) each."""
    if num_tiers < 1:
        raise ValueError(f"num_tiers must be >= 1, got {num_tiers}")
    return [json.loads(c) for c in _tiers(name, num_tiers)]


def _seed(base: int, name: str, tier: int, split: str) -> int:
    return (int(base) * 1_000_003 + zlib.crc32(f"{name}/{split}/{tier}".encode())) % (2**31 - 1)


@functools.lru_cache(maxsize=256)
def _cached_item(name: str, config_json: str, seed: int, size: int, index: int) -> dict[str, Any]:
    from envsched.envs._rg_items import generate_item

    return generate_item(name, json.loads(config_json), seed, size, index)


def _item(name: str, config: Mapping[str, Any], seed: int, size: int, index: int) -> dict[str, Any]:
    """Item ``index`` of a dataset, generated in the generation worker (:mod:`envsched.envs._rg_items`: no
    generator runs in this process) and cached; a copy, so a caller may change it."""
    return copy.deepcopy(_cached_item(name, json.dumps(dict(config), sort_keys=True), int(seed), int(size),
                                      int(index)))


def _meta(task: Mapping[str, Any]) -> dict[str, Any]:
    meta = task.get("reasoning_gym")
    if not isinstance(meta, Mapping) or not {"dataset", "config", "seed", "size", "item"} <= set(meta):
        raise ValueError(f"task {task.get('id')!r} is not a reasoning-gym task: it needs 'reasoning_gym' with "
                         "dataset, config, seed, size and item (build it with build_reasoning_gym_pool)")
    return dict(meta)


def regenerate_item(task: Mapping[str, Any]) -> dict[str, Any]:
    """Regenerate a task's reasoning-gym item (question, reference answer, metadata) from its spec, in the
    generation worker (some generators keep memory or take seconds: none runs in this process)."""
    m = _meta(task)
    _check_dataset(m["dataset"])
    if not 0 <= int(m["item"]) < int(m["size"]):
        raise ValueError(f"task {task.get('id')!r}: item {m['item']} outside 0..{m['size'] - 1}")
    return _item(m["dataset"], m["config"], m["seed"], m["size"], m["item"])


def score_task_answer(task: Mapping[str, Any], answer: str | None, *,
                      allow_evaluating_scorers: bool | None = None) -> float:
    """Score ``answer`` by the task's dataset's scoring rules (a reward in [0, 1]), never evaluating it as code.

    Scored in a bounded worker process: datasets whose reasoning-gym scorer evaluates text by envsched's safe
    equivalents, the others by their own ``score_answer`` (see :mod:`envsched.envs.safe_scoring`). An answer
    over a bound, degenerate (blank, NaN), or one the scorer raises on scores 0.0. A dataset without a safe
    scorer raises :class:`~envsched.envs.safe_scoring.UnsafeScorerError` unless ``allow_evaluating_scorers``
    (or ``ENVSCHED_ALLOW_EVALUATING_SCORERS=1``).
    """
    return _score(task, answer, allow_evaluating_scorers).reward


def _score(task: Mapping[str, Any], answer: Any, allow: bool | None, item: Mapping[str, Any] | None = None) -> Any:
    from envsched.envs.safe_scoring import check_scorer_allowed, score_answer

    m = _meta(task)
    check_scorer_allowed(m["dataset"], allow)
    if item is None:
        item = regenerate_item(task)
    return score_answer(m["dataset"], item, answer, config=m["config"], seed=int(m["seed"]), size=int(m["size"]),
                        allow_evaluating=allow)


@functools.cache
def _verifier(name: str) -> tuple[tuple[str, ...], str, str]:
    _, factory = _rg()
    cls = factory.DATASETS[name][0]
    fn = cls.score_answer
    owner = next((c for c in cls.__mro__ if "score_answer" in vars(c)), cls)
    try:
        code = inspect.getsource(fn)
    except (OSError, TypeError):  # pragma: no cover
        code = ""
    if owner.__name__ == "ProceduralDataset":
        checks = (f"the answer is compared with the generated reference answer by {owner.__name__}.score_answer",
                  "exactly the reference answer scores 1.0",
                  "an answer that contains the reference answer scores len(reference) / len(answer)",
                  "any other answer scores 0.0")
    else:
        doc = inspect.getdoc(fn)
        first = doc.strip().splitlines()[0] if doc and doc.strip() else ""
        checks = (f"the answer is scored by reasoning-gym's {owner.__name__}.score_answer against the item's "
                  "reference answer and metadata",
                  "a correct answer scores 1.0, a wrong or empty one less (reward in [0, 1])")
        if first:
            checks = (*checks, f"score_answer: {first}")
    return checks, code, owner.__name__


def _spread(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def build_reasoning_gym_pool(datasets: Iterable[str] | str | None = None, *,
                             tasks_per_dataset: int | Mapping[str, int] = 50,
                             num_tiers: int = DEFAULT_NUM_TIERS, seed: int = 0,
                             split: str = "train",
                             on_progress: Callable[[int, int], None] | None = None,
                             allow_evaluating_scorers: bool | None = None) -> list[dict[str, Any]]:
    """Generate reasoning-gym items as envsched task specs: one environment per dataset.

    Args:
        datasets: dataset names (default: :data:`DEFAULT_DATASETS`, 51 checked datasets; ``"all"`` for
            every registered dataset but ``composite``, some of which fail to generate or to score their
            own reference answers in reasoning-gym 0.1.25).
        tasks_per_dataset: items per dataset, or a mapping name -> count. A dataset's items are spread
            over its tiers as evenly as possible (lower tiers take the remainder).
        num_tiers: the most tiers per dataset (see the module doc).
        seed: base seed; each (dataset, split, tier) gets its own seed derived from it.
        split: the ``split`` of every spec; ``index`` numbers the specs 0..N-1 in order.
        on_progress: called as ``on_progress(done, total)`` after each task.
        allow_evaluating_scorers: accept datasets without a safe scorer (see
            :mod:`envsched.envs.safe_scoring`; default: ``ENVSCHED_ALLOW_EVALUATING_SCORERS``). Without it
            ``"all"`` leaves them out and a list naming one is refused.

    Each spec: ``id`` ``reasoning_gym/{dataset}-{split}-{k}``, ``env`` and ``group`` the dataset,
    ``difficulty`` the tier, ``instruction`` the question, ``tools`` one ``{dataset}.submit_answer``
    operation, ``initial_state`` the tier's configuration, ``verifier`` (checks; ``code``: the source of
    the dataset's ``score_answer``) and ``reasoning_gym`` (dataset, tier, config, seed, size, item, version).
    """
    from envsched.envs.safe_scoring import check_scorer_allowed

    if datasets == "all":
        names = list_scorable_datasets(allow_evaluating_scorers)
    elif isinstance(datasets, str):
        raise TypeError("datasets must be a list of dataset names (or \"all\"), not a single string")
    else:
        names = list(datasets) if datasets is not None else list(DEFAULT_DATASETS)
    for name in names:
        _check_dataset(name)
        check_scorer_allowed(name, allow_evaluating_scorers)
    if len(set(names)) != len(names):
        raise ValueError("datasets lists a name twice")
    counts: dict[str, int] = {}
    for name in names:
        n = tasks_per_dataset.get(name, 0) if isinstance(tasks_per_dataset, Mapping) else tasks_per_dataset
        counts[name] = check_int(n, f"tasks_per_dataset for {name!r}", low=0)
    if isinstance(tasks_per_dataset, Mapping) and (extra := set(tasks_per_dataset) - set(names)):
        raise ValueError(f"tasks_per_dataset names datasets not being built: {sorted(extra)}")
    version = rg_version()
    total = sum(counts.values())
    specs: list[dict[str, Any]] = []
    for name in names:
        tiers = dataset_tiers(name, num_tiers)
        checks, code, scorer = _verifier(name)
        k = 0
        for tier, n_tier in enumerate(_spread(counts[name], len(tiers))):
            if n_tier == 0:
                continue
            cfg = tiers[tier]
            tier_seed = _seed(seed, name, tier, split)
            for item_index in range(n_tier):
                item = _item(name, cfg, tier_seed, n_tier, item_index)
                specs.append({
                    "id": f"reasoning_gym/{name}-{split}-{k}",
                    "env": name,
                    "split": split,
                    "index": len(specs),
                    "group": name,
                    "difficulty": tier,
                    "instruction": str(item["question"]),
                    "tools": [{"name": f"{name}.submit_answer",
                               "description": f"Submit the final answer to the {name} question as text; "
                                              f"reasoning-gym's {scorer}.score_answer scores it in [0, 1]."}],
                    "initial_state": {"dataset": name, "tier": tier, "config": cfg},
                    "verifier": {"checks": list(checks), "code": code},
                    "reasoning_gym": {"dataset": name, "tier": tier, "config": cfg, "seed": tier_seed,
                                      "size": n_tier, "item": item_index, "version": version},
                })
                k += 1
                if on_progress is not None:
                    on_progress(len(specs), total)
    return specs


class ReasoningGymEnvironment(Environment):
    """One-step episodes of reasoning-gym tasks: ``reset`` gives the question, ``step`` takes the answer.

    ``step(answer_text)`` returns ``StepResult(observation=None, reward=score, done=True)``; the score is
    :func:`score_task_answer`'s (the dataset's scoring rules, never evaluating the answer). An answer that
    was not scored normally (over its time or memory budget, blank or NaN, or one the dataset's scorer raised
    on) scores 0.0 with ``info["scoring"]`` saying why; only a failure that is not the answer's (the item's
    dataset cannot be rebuilt) leaves the reward ``None`` with ``info["error"]`` saying why. ``reset``
    refuses a dataset without a safe scorer unless ``allow_evaluating_scorers`` (default:
    ``ENVSCHED_ALLOW_EVALUATING_SCORERS``).
    """

    name = "reasoning_gym"

    def __init__(self, *, allow_evaluating_scorers: bool | None = None) -> None:
        _rg()
        self.allow_evaluating_scorers = allow_evaluating_scorers
        self._task: dict[str, Any] | None = None
        self._item: dict[str, Any] | None = None
        self._reward: float | None = None
        self._done = False
        self.last_error: str | None = None

    def reset(self, task: Mapping[str, Any], seed: int | None = None) -> str:
        """Regenerate the task's item and return its question (``seed`` is unused: the spec fixes the item)."""
        from envsched.envs.safe_scoring import check_scorer_allowed

        check_scorer_allowed(_meta(task)["dataset"], self.allow_evaluating_scorers)
        self._item = regenerate_item(task)
        self._task = dict(task)
        self._reward = None
        self._done = False
        self.last_error = None
        return str(self._item["question"])

    def step(self, action: str | None) -> StepResult:
        if self._task is None or self._item is None:
            raise RuntimeError("call reset(task) before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset(task) to start another")
        if action is not None and not isinstance(action, str):
            raise TypeError(f"a reasoning-gym action is the answer text (str), got {type(action).__name__}")
        self._done = True
        info: dict[str, Any] = {}
        try:
            score = _score(self._task, action, self.allow_evaluating_scorers, item=self._item)
            self._reward = score.reward
            if score.note:
                info["scoring"] = score.note
        except Exception as exc:  # not the answer's failure (the dataset cannot be rebuilt): unscored
            self._reward = None
            self.last_error = f"{type(exc).__name__}: {exc}"
            info["error"] = self.last_error
        return StepResult(observation=None, reward=self._reward, done=True, info=info)

    def final_reward(self) -> float | None:
        if self._task is None:
            raise RuntimeError("call reset(task) first")
        return self._reward

    @property
    def reference_answer(self) -> str:
        """The current item's reference answer (for tests and scripted policies)."""
        if self._item is None:
            raise RuntimeError("call reset(task) first")
        return str(self._item["answer"])
