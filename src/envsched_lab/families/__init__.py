"""Task families for the neural benchmark learner (``envsched bench --learner neural``), as plug-ins.

**The contract** (stable; docs/benchmark.md, "Task families"): ``--families MODULE:ATTR`` names a list of
family objects. Each family has

* ``name`` (str): the environment name of its tasks (``env``); ``corpus/family`` by convention;
* ``tools`` (list of ``{"name", "description"}``): what the environment offers;
* ``generate(rng, tier) -> dict``: one task, ``rng`` a :class:`numpy.random.Generator`, ``tier`` an int from
  0. The dict is a task spec as :class:`~envsched.pool.TaskPool` reads it (``instruction``, ``tools``,
  ``difficulty``, ``verifier`` with ``checks``; no ``id`` or ``env``: the benchmark assigns them) plus
  ``prompt`` (the text the network reads) and ``answer`` (reward 1 for an exact match of the completion, else
  0), or, instead of ``answer``, a method ``score(task, completion) -> float`` on the family (graded reward in
  [0, 1]; ``task`` is the dict ``generate`` returned);
* optionally ``tiers`` (int, default 3): how many difficulty tiers it has, and ``corpus`` (str): the group it
  belongs to (written as the spec's ``category``; the held-out split stratifies by the name's part before
  ``/``).

``prompt`` and ``answer`` never enter the pool: the benchmark keeps them beside it, so no sampler (and no
graph built from the specs' text) can read an answer. The benchmark pool holds ``per_tier`` tasks per family and
tier, generated from ``numpy.random.default_rng([pool_seed, family index, tier])``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envsched.errors import EnvSchedError
from envsched.pool.pool import TaskPool
from envsched.validation import is_int
from envsched_lab.families.arith import ARITH_FAMILIES
from envsched_lab.families.base import Family, TemplateFamily
from envsched_lab.families.lists import LIST_FAMILIES
from envsched_lab.families.text import TEXT_FAMILIES
from envsched_lab.families.warmup import WARMUP_FAMILIES

__all__ = ["DEFAULT_FAMILIES", "DEFAULT_FAMILIES_REF", "WARMUP_FAMILIES", "Family", "FamilyError", "FamilyPool",
           "TemplateFamily", "build_family_pool", "load_families", "validate_family"]

#: The 15 shipped families in three corpora (lists, text, arith).
DEFAULT_FAMILIES: list[Any] = [*LIST_FAMILIES, *TEXT_FAMILIES, *ARITH_FAMILIES]
DEFAULT_FAMILIES_REF = "envsched_lab.families:DEFAULT_FAMILIES"

_SPEC_KEYS = ("instruction", "tools", "difficulty", "verifier")
_FORBIDDEN = ("id", "env")


class FamilyError(EnvSchedError, ValueError):
    """A family (or the task it generated) breaks the contract; the message names the family and the rule."""


def load_families(ref: str) -> list[Any]:
    """The family list named by ``MODULE:ATTR`` (``FamilyError`` says what is wrong with the reference)."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise FamilyError(f"--families takes MODULE:ATTR (e.g. {DEFAULT_FAMILIES_REF}), got {ref!r}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise FamilyError(f"cannot import family module {module!r}: {exc}") from None
    try:
        families = getattr(mod, attr)
    except AttributeError:
        raise FamilyError(f"module {module!r} has no attribute {attr!r}") from None
    if callable(families) and not isinstance(families, Sequence):
        families = families()
    if not isinstance(families, Sequence) or isinstance(families, str) or not families:
        raise FamilyError(f"{ref} must be a non-empty list of family objects, got {type(families).__name__}")
    names = [getattr(f, "name", None) for f in families]
    dup = sorted({n for n in names if names.count(n) > 1 and n is not None})
    if dup:
        raise FamilyError(f"{ref}: duplicate family names {dup}")
    for f in families:
        validate_family(f)
    return list(families)


def validate_family(family: Any) -> None:
    """Check a family's static attributes (name, tools, generate, tiers)."""
    name = getattr(family, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise FamilyError(f"family {family!r} has no non-empty str `name`")
    tools = getattr(family, "tools", None)
    if not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) and isinstance(t.get("name"), str)
                                                   and isinstance(t.get("description"), str) for t in tools):
        raise FamilyError(f"family {name!r}: `tools` must be a list of {{'name': str, 'description': str}}")
    if not callable(getattr(family, "generate", None)):
        raise FamilyError(f"family {name!r} has no generate(rng, tier) method")
    tiers = getattr(family, "tiers", 3)
    if not is_int(tiers) or tiers < 1:
        raise FamilyError(f"family {name!r}: `tiers` must be a positive int, got {tiers!r}")


def _check_task(family: Any, task: Any, tier: int) -> None:
    name = family.name
    if not isinstance(task, Mapping):
        raise FamilyError(f"family {name!r}: generate() returned {type(task).__name__}, not a dict")
    for k in _FORBIDDEN:
        if k in task:
            raise FamilyError(f"family {name!r}: a generated task may not set {k!r} (the benchmark assigns it)")
    missing = [k for k in (*_SPEC_KEYS, "prompt") if k not in task]
    if missing:
        raise FamilyError(f"family {name!r}: generated task lacks {missing}")
    if not isinstance(task["prompt"], str) or not task["prompt"]:
        raise FamilyError(f"family {name!r}: `prompt` must be a non-empty str")
    has_answer = isinstance(task.get("answer"), str)
    if not has_answer and not callable(getattr(family, "score", None)):
        raise FamilyError(f"family {name!r}: a task needs a str `answer`, or the family a score(task, completion)")
    checks = (task.get("verifier") or {}).get("checks") if isinstance(task.get("verifier"), Mapping) else None
    if not isinstance(checks, list) or not checks or not all(isinstance(c, str) for c in checks):
        raise FamilyError(f"family {name!r}: `verifier` must be {{'checks': [str, ...]}}")
    if has_answer and task["answer"]:
        text = " ".join([str(task["instruction"]), *checks, *(str(t.get("description", "")) for t in task["tools"])])
        if len(task["answer"]) > 1 and re.search(rf"(?<!\w){re.escape(task['answer'])}(?!\w)", text):
            raise FamilyError(f"family {name!r}: the spec text contains the answer {task['answer']!r}")
    if task["difficulty"] != tier:
        raise FamilyError(f"family {name!r}: `difficulty` must be the tier ({tier}), got {task['difficulty']!r}")


@dataclass
class FamilyPool:
    """A benchmark pool generated from families, with what the network reads and how it is scored.

    ``pool`` holds the specs (no prompt, no answer); ``prompts``, ``answers`` (``None`` where the family
    scores) and ``family_of`` are aligned with the pool's positions."""

    pool: TaskPool
    prompts: list[str]
    answers: list[str | None]
    tasks: list[dict[str, Any]]
    families: list[Any]
    family_of: np.ndarray

    def reward(self, position: int, completion: str) -> float:
        """The verifier's reward of ``completion`` for the task at ``position``."""
        ans = self.answers[position]
        if ans is not None:
            return 1.0 if completion == ans else 0.0
        fam = self.families[int(self.family_of[position])]
        return float(np.clip(float(fam.score(self.tasks[position], completion)), 0.0, 1.0))


_CACHE: dict[tuple[str, int, int], FamilyPool] = {}


def build_family_pool(families: str | Sequence[Any] = DEFAULT_FAMILIES_REF, *, per_tier: int = 20,
                      seed: int = 0) -> FamilyPool:
    """Generate ``per_tier`` tasks per family and tier (ids ``{family}/t{tier}/{k}``), deterministic in ``seed``.

    A ``MODULE:ATTR`` reference is memoised per process (the pool is rebuilt identically in each worker)."""
    key = (families, per_tier, seed) if isinstance(families, str) else None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    if not is_int(per_tier) or per_tier < 1:
        raise FamilyError(f"per_tier must be a positive int, got {per_tier!r}")
    fams = load_families(families) if isinstance(families, str) else list(families)
    for f in fams:
        validate_family(f)
    specs, prompts, answers, tasks, fam_of = [], [], [], [], []
    for fi, fam in enumerate(fams):
        for tier in range(int(getattr(fam, "tiers", 3))):
            rng = np.random.default_rng([seed, fi, tier])
            for k in range(per_tier):
                task = fam.generate(rng, tier)
                _check_task(fam, task, tier)
                spec = {k2: v for k2, v in task.items() if k2 not in ("prompt", "answer")}
                spec["id"] = f"{fam.name}/t{tier}/{k}"
                spec["env"] = fam.name
                corpus = getattr(fam, "corpus", None) or (fam.name.split("/", 1)[0] if "/" in fam.name else None)
                if corpus and "category" not in spec:
                    spec["category"] = corpus
                specs.append(spec)
                prompts.append(task["prompt"])
                answers.append(task.get("answer") if isinstance(task.get("answer"), str) else None)
                tasks.append(dict(task))
                fam_of.append(fi)
    out = FamilyPool(pool=TaskPool(specs), prompts=prompts, answers=answers, tasks=tasks, families=fams,
                     family_of=np.asarray(fam_of, dtype=np.int64))
    if key is not None:
        _CACHE[key] = out
    return out
