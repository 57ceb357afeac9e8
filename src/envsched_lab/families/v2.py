"""The v2 pool (``envsched bench --learner neural --pool v2``): environments in the paper's regime.

**Environments.** An environment is a (skill, surface) pair: 12 skills x 5 surfaces = 60 environments of 18
to 42 tasks (1,800 tasks). A *skill* is an operation on a record of 4 to 6 symbols (the maximum, the symbol
in position two, the successor of the maximum, the sum, ...). A *surface* is a vocabulary shared by the tasks,
tools and verifier of its environments: the symbols (an alphabet of 10 relabelling the values 0-9), the
keyword that names the skill in the prompt, the separator, the answer format (a prefix or a suffix), and the
words in which the spec text, the tools and the verifier's checks describe the skill. The same skill on
another surface is the cross-environment relation: it executes alike (tools of the same operation families,
the same checks) in other words and other symbols. The held-out split (:func:`split_v2`)
holds out one surface of every skill and a fifth of every other environment's tasks.

**What the network reads.** Only the prompt: ``KEYWORD SEP RECORD``, for example ``max:3729`` (answer ``9``)
on the digit surface or ``top/cbja`` (answer ``#j``) on the letter surface. The answer is one symbol (two for
the sums and products) in the surface's answer format; the verifier wants that string exactly. The spec
(instruction, tools, checks, initial state) never holds the prompt or the answer.

**Balanced answers.** Each environment's answers cycle through its skill's answer set (every value the same
number of times, give or take one; at least 8 values, so chance is at most 12.5 %), and each record is drawn
conditioned on its answer, so no constant answer scores more than chance in any environment. Every prompt of
the pool is distinct (a duplicate is drawn again), so no held-out prompt is a training prompt.

**Pre-training** (:class:`V2Pretraining`): supervised examples of the pool's skills and surfaces whose prompts
are not in the pool, weighted per stage (:data:`EXPOSURE`). Part of each environment's examples write the
answer in the surface's *other* format; the share written in the verifier's format (:data:`CONVENTION`) differs
per environment (a seeded order per skill), so the pre-trained policy starts with partial competence spread
over (0, 1), as a pretrained LLM that has seen the skill under other conventions does.

**Staged learnability.** *Early* skills (max, min, second, penult, succlast) are pre-trained with the
verifier's format on some surfaces: RL can raise them at once. *Late* skills (succmax, predmin, succsecond,
maxends: an early skill composed with another step) are pre-trained only in the other format: they start
near 0 (no GRPO group has signal) and become learnable once training on early skills of the same surface has
moved the network towards the verifier's format. *Unlearnable* skills (two-symbol sums and products) stay
near 0 for this network.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envsched.pool.pool import TaskPool
from envsched.validation import check_int, check_number
from envsched_lab.families import FamilyPool
from envsched_lab.split import PoolSplit, SplitConfig, _rank

__all__ = [
    "SKILLS",
    "STAGES",
    "SURFACES",
    "V2_LEARNER",
    "V2_POOL",
    "Skill",
    "Surface",
    "V2Pool",
    "V2Pretraining",
    "build_v2_pool",
    "split_v2",
]

#: The pool's name in ``BenchConfig.pool`` and ``--pool``.
V2_POOL = "v2"
#: Bumped when the pool, its pre-training or its learner defaults change (it enters the pool's fingerprint).
V2_VERSION = "v2.0"
STAGES = ("early", "late", "unlearnable")
LENGTHS = (4, 5, 6)
"""Record length per tier."""

Make = Callable[[np.random.Generator, int, int], list[int]]


@dataclass(frozen=True)
class Skill:
    """An operation on a record of values 0-9. ``make(rng, n, answer)`` draws a record of length ``n`` whose
    answer is ``answer``; ``answers`` is the balanced answer set; ``ops`` the operation families of its tools
    besides reading the record and submitting the reply (the same on every surface); ``prerequisite`` the early
    skill a late skill composes with another step."""

    name: str
    stage: str
    prerequisite: str | None
    answers: tuple[int, ...]
    ops: tuple[str, ...]
    texts: tuple[str, ...]
    check: str
    make: Make = field(repr=False)
    width: int = 1
    """Symbols in an answer (1, or 2 for the two-digit answers of the sums and products)."""

    def answer_of(self, record: Sequence[int]) -> int:
        """The answer computed from the record (the definition ``make`` is checked against)."""
        return _ANSWER[self.name](list(record))


@dataclass(frozen=True)
class Surface:
    """A vocabulary: symbols, prompt syntax, answer format, and the words of the spec text."""

    name: str
    alphabet: str
    sep: str
    prefix: str
    suffix: str
    keywords: Mapping[str, str]
    words: Mapping[str, str]
    verbs: Mapping[str, str]
    alt: tuple[str, str] = ("", "")
    """The other answer format (prefix, suffix) that part of the pre-training data uses."""

    def symbol(self, value: int) -> str:
        return self.alphabet[value]

    def symbols(self, value: int, width: int = 1) -> str:
        """``value`` written with ``width`` symbols (base 10, most significant first)."""
        return "".join(self.alphabet[(value // 10 ** k) % 10] for k in range(width - 1, -1, -1))

    def answer(self, value: int, width: int = 1) -> str:
        """The verifier's answer string: ``value`` in this surface's symbols and answer format."""
        return f"{self.prefix}{self.symbols(value, width)}{self.suffix}"

    def alt_answer(self, value: int, width: int = 1) -> str:
        """``value`` in the other answer format (what part of the pre-training data uses)."""
        return f"{self.alt[0]}{self.symbols(value, width)}{self.alt[1]}"


# ----------------------------------------------------------------------------------------------- skills
def _max(rng: np.random.Generator, n: int, a: int) -> list[int]:
    xs = [int(x) for x in rng.integers(0, a + 1, size=n)]
    xs[int(rng.integers(n))] = a
    return xs


def _min(rng: np.random.Generator, n: int, a: int) -> list[int]:
    xs = [int(x) for x in rng.integers(a, 10, size=n)]
    xs[int(rng.integers(n))] = a
    return xs


def _put(index: int, shift: int = 0) -> Make:
    """Random symbols with ``answer - shift`` (modulo 10) at ``index``."""
    def make(rng: np.random.Generator, n: int, a: int) -> list[int]:
        xs = [int(x) for x in rng.integers(0, 10, size=n)]
        xs[index] = (a - shift) % 10
        return xs
    return make


def _succmax(rng: np.random.Generator, n: int, a: int) -> list[int]:
    return _max(rng, n, (a - 1) % 10)


def _predmin(rng: np.random.Generator, n: int, a: int) -> list[int]:
    return _min(rng, n, (a + 1) % 10)


def _maxends(rng: np.random.Generator, n: int, a: int) -> list[int]:
    xs = [int(x) for x in rng.integers(0, 10, size=n)]
    end = 0 if rng.random() < 0.5 else n - 1
    xs[end] = a
    xs[n - 1 - end] = int(rng.integers(0, a + 1))
    return xs


def _solve(rng: np.random.Generator, n: int, a: int, rest: Callable[[list[int]], int], slot: int) -> list[int]:
    """A record whose answer is ``a``: the other symbols at random, the one at ``slot`` (weight 1 in the
    answer) set to ``a - rest(record)``, drawn again until that is a symbol 0-9."""
    for _ in range(10_000):
        xs = [int(x) for x in rng.integers(0, 10, size=n)]
        need = a - rest(xs)
        if 0 <= need <= 9:
            xs[slot] = need
            return xs
    raise ValueError(f"no record of length {n} has answer {a}")  # pragma: no cover - answer sets are feasible


def _sum(rng: np.random.Generator, n: int, a: int) -> list[int]:
    return _solve(rng, n, a, lambda xs: sum(xs[:-1]), n - 1)


def _wsum(rng: np.random.Generator, n: int, a: int) -> list[int]:
    def rest(xs: list[int]) -> int:
        r = sum((i + 1) * x for i, x in enumerate(xs) if i) % 100
        return r - 100 if r > a else r
    return _solve(rng, n, a, rest, 0)


def _prod(rng: np.random.Generator, n: int, a: int) -> list[int]:
    return _solve(rng, n, a, lambda xs: xs[0] * xs[1], 2)


#: Each skill's definition, from the record (what ``make`` is checked against).
_ANSWER: dict[str, Callable[[list[int]], int]] = {
    "max": lambda xs: max(xs),
    "min": lambda xs: min(xs),
    "second": lambda xs: xs[1],
    "penult": lambda xs: xs[-2],
    "succlast": lambda xs: (xs[-1] + 1) % 10,
    "succmax": lambda xs: (max(xs) + 1) % 10,
    "predmin": lambda xs: (min(xs) - 1) % 10,
    "succsecond": lambda xs: (xs[1] + 1) % 10,
    "maxends": lambda xs: max(xs[0], xs[-1]),
    "sum": lambda xs: sum(xs),
    "wsum": lambda xs: sum((i + 1) * x for i, x in enumerate(xs)) % 100,
    "prod": lambda xs: xs[0] * xs[1] + xs[2],
}

#: The 12 skills. Text templates use the surface's words: {largest}, {smallest}, {symbol}, {record}, {position},
#: {previous}, {next}, {total}, {product}, {weighted}, {end}, {reply}.
SKILLS: tuple[Skill, ...] = (
    Skill("max", "early", None, tuple(range(2, 10)), ("search",),
          ("Submit the {largest} {symbol} of the {record}.",
           "Find the {largest} {symbol} in the {record} and submit it as the {reply}."),
          "{reply} equals the {largest} {symbol} of the {record}", _max),
    Skill("min", "early", None, tuple(range(0, 8)), ("delete",),
          ("Submit the {smallest} {symbol} of the {record}.",
           "Find the {smallest} {symbol} in the {record} and submit it as the {reply}."),
          "{reply} equals the {smallest} {symbol} of the {record}", _min),
    Skill("second", "early", None, tuple(range(10)), ("update",),
          ("Submit the {symbol} in {position} two of the {record}, counting from the start.",
           "Read the {record} and submit its {symbol} at {position} two."),
          "{reply} equals the {symbol} at {position} two", _put(1)),
    Skill("penult", "early", None, tuple(range(10)), ("update", "control"),
          ("Submit the {symbol} in {position} two from the {end} of the {record}.",
           "Read the {record} back from its {end} and submit the {symbol} at {position} two."),
          "{reply} equals the {symbol} at {position} two from the {end}", _put(-2)),
    Skill("succlast", "early", None, tuple(range(10)), ("transfer",),
          ("Submit the {symbol} {next} to the {symbol} at the {end} of the {record}, wrapping around.",
           "Take the {symbol} at the {end} of the {record} and submit the {symbol} {next} to it."),
          "{reply} equals the {symbol} {next} to the one at the {end}", _put(-1, 1)),
    Skill("succmax", "late", "max", (*range(3, 10), 0), ("search", "transfer"),
          ("Submit the {symbol} {next} to the {largest} {symbol} of the {record}, wrapping around.",
           "Find the {largest} {symbol} of the {record} and submit the {symbol} {next} to it."),
          "{reply} equals the {symbol} {next} to the {largest} one", _succmax),
    Skill("predmin", "late", "min", (9, *range(0, 7)), ("delete", "schedule"),
          ("Submit the {symbol} {previous} to the {smallest} {symbol} of the {record}, wrapping around.",
           "Find the {smallest} {symbol} of the {record} and submit the {symbol} {previous} to it."),
          "{reply} equals the {symbol} {previous} to the {smallest} one", _predmin),
    Skill("succsecond", "late", "second", tuple(range(10)), ("update", "transfer"),
          ("Submit the {symbol} {next} to the one in {position} two of the {record}, wrapping around.",
           "Read the {symbol} at {position} two of the {record} and submit the {symbol} {next} to it."),
          "{reply} equals the {symbol} {next} to the one at {position} two", _put(1, 1)),
    Skill("maxends", "late", "max", tuple(range(2, 10)), ("search", "control"),
          ("Submit the {largest} of the two {symbol}s at the start and the {end} of the {record}.",
           "Compare the first {symbol} of the {record} with the one at its {end} and submit the {largest}."),
          "{reply} equals the {largest} of the two {symbol}s at the ends", _maxends),
    Skill("sum", "unlearnable", None, tuple(range(6, 34)), ("compute", "communicate"),
          ("Submit the {total} of the {record} as two {symbol}s.",
           "Add up the {record} and submit the {total} in two {symbol}s."),
          "{reply} equals the {total} of the {record}", _sum, width=2),
    Skill("wsum", "unlearnable", None, tuple(range(10, 80)), ("compute", "schedule"),
          ("Submit the {weighted} {total} of the {record}, keeping its last two {symbol}s.",
           "Weight each {symbol} by its {position} plus one, add them up and submit the last two {symbol}s."),
          "{reply} equals the {weighted} {total} modulo one hundred", _wsum, width=2),
    Skill("prod", "unlearnable", None, tuple(range(91)), ("compute", "control"),
          ("Submit the {product} of the first two {symbol}s plus the third, as two {symbol}s.",
           "Multiply the first two {symbol}s of the {record}, add the third and submit the two {symbol}s."),
          "{reply} equals the {product} of the first two plus the third", _prod, width=2),
)
SKILL_INDEX = {s.name: i for i, s in enumerate(SKILLS)}


# ----------------------------------------------------------------------------------------------- surfaces
def _surface(name: str, alphabet: str, sep: str, fmt: str, alt: str, keywords: str, words: str,
             verbs: str) -> Surface:
    kw = dict(zip([s.name for s in SKILLS], keywords.split(), strict=True))
    concepts = ("largest", "smallest", "symbol", "record", "position", "previous", "next", "total", "product",
                "weighted", "end", "reply")
    fams = ("lookup", "create", "search", "delete", "update", "control", "compute", "transfer", "schedule",
            "communicate")
    prefix, suffix = fmt.split("_")
    alt_prefix, alt_suffix = alt.split("_")
    return Surface(name, alphabet, sep, prefix, suffix, kw, dict(zip(concepts, words.split(), strict=True)),
                   dict(zip(fams, verbs.split(), strict=True)), (alt_prefix, alt_suffix))


#: The 5 surfaces. Keywords use no character of their surface's alphabet (the prompt reads unambiguously).
SURFACES: tuple[Surface, ...] = (
    _surface("digits", "0123456789", ":", "_", "_.",
             "max min snd pen nxl nxm pvm nxs mxe sum wsm prd",
             "largest smallest digit list position predecessor successor sum product weighted end reply",
             "read submit search remove update run compute transfer schedule send"),
    _surface("letters", "abcdefghij", "/", "#_", "_",
             "top low sx pn up upt lwr ups tps tot wtot mul",
             "highest lowest letter string index preceding following total multiple scaled back answer",
             "get record find drop set execute calculate pay book notify"),
    _surface("tally", "klmnopqrst", ">", "_.", "#_",
             "hi ebb bi ib uv hiu ebd bu he add wad fab",
             "greatest least mark tape slot before after aggregate times graded tail response",
             "fetch write scan erase modify start evaluate deposit reserve post"),
    _surface("capitals", "ABCDEFGHIJ", "|", "=_", "_=",
             "big sml sec pen nxe nxb pvs nxc bge acc wacc mlt",
             "biggest tiniest glyph row place prior subsequent sum product weighted finish output",
             "load add browse clear adjust launch estimate trade appoint share"),
    _surface("runes", "KLMNOPQRST", ";", "_!", "=_",
             "pk dp sd pd ne np ps ns pe sm ws mp",
             "peak bottom rune chain rank earlier then tally product loaded rear verdict",
             "view insert filter delete change press convert refund block reply"),
)

#: Pre-training exposure (relative weight of an environment's examples) per stage.
EXPOSURE: dict[str, float] = {"early": 1.0, "late": 0.4, "unlearnable": 0.3}
#: Per stage, the shares of an environment's pre-training labels written in the verifier's answer format (the
#: rest use the surface's other format); each skill's five surfaces get its stage's levels in a seeded order.
CONVENTION: dict[str, tuple[float, ...]] = {"early": (0.95, 0.75, 0.5, 0.3, 0.1), "late": (0.0, 0.0, 0.0, 0.0, 0.0),
                                            "unlearnable": (0.95, 0.75, 0.5, 0.3, 0.1)}
#: Environment sizes: each skill's five surfaces get these sizes in a seeded order (mean 30).
ENV_SIZES = (18, 24, 30, 36, 42)

#: The learner's v2 defaults (``NeuralConfig`` fields), applied under any ``--learner KEY=VALUE``.
V2_LEARNER: dict[str, Any] = {
    "d_model": 64, "n_layers": 2, "n_heads": 4, "max_len": 24, "max_new_tokens": 4, "optimizer": "sgd",
    "lr": 0.07, "max_grad_norm": 0.0, "epochs": 1, "warmup_steps": 2500, "warmup_batch": 128, "warmup_lr": 3e-3,
    "score": "expected", "eval_every": 10, "train_eval_tasks": 200,
}


#: Record lengths in words: the spec text states its task's length in words the graph's text features read
#: (a one-character number is not a token of ``envsched.method.graph``'s TF-IDF).
_NUMBER_WORDS = {4: "four", 5: "five", 6: "six"}


def env_name(skill: Skill, surface: Surface) -> str:
    return f"{surface.name}/{skill.name}"


def prompt_of(skill: Skill, surface: Surface, record: Sequence[int]) -> str:
    """What the network reads: the surface's keyword for the skill, its separator, the record in its symbols."""
    return f"{surface.keywords[skill.name]}{surface.sep}{''.join(surface.symbol(v) for v in record)}"


def _tools(skill: Skill, surface: Surface) -> list[dict[str, str]]:
    w, v = surface.words, surface.verbs
    tools = [{"name": f"{v['lookup']}_{w['record']}",
              "description": f"Return the {w['record']} of {w['symbol']}s attached to the task."}]
    for op in skill.ops:
        tools.append({"name": f"{v[op]}_{w['symbol']}",
                      "description": f"{v[op].capitalize()} {w['symbol']}s of the {w['record']} for the "
                                     f"{w['reply']}."})
    tools.append({"name": f"{v['create']}_{w['reply']}",
                  "description": f"{v['create'].capitalize()} the final {w['reply']}: one {w['symbol']}."})
    return tools


def _fmt(text: str, surface: Surface) -> str:
    return text.format(**surface.words)


@dataclass
class V2Pool:
    """The v2 pool of one seed: the :class:`FamilyPool` the learner reads, and what every task is."""

    seed: int
    fpool: FamilyPool
    skill_of: np.ndarray
    """Skill index (into :data:`SKILLS`) per task."""
    surface_of: np.ndarray
    """Surface index (into :data:`SURFACES`) per task."""
    tier_of: np.ndarray
    exposure: dict[str, float]
    """Pre-training exposure weight per environment."""
    convention: dict[str, float]
    """Per environment, the share of pre-training labels that follow the verifier's convention."""

    @property
    def pool(self) -> TaskPool:
        return self.fpool.pool

    @property
    def envs(self) -> list[str]:
        return sorted(set(self.fpool.pool.envs))

    def stage_of(self) -> np.ndarray:
        """Stage name per task."""
        return np.array([SKILLS[int(k)].stage for k in self.skill_of])

    def pretraining(self) -> V2Pretraining:
        return V2Pretraining(self)

    def split(self, split_seed: int, heldout_task_share: float = 0.2) -> Any:
        """The v2 held-out split (:func:`split_v2`)."""
        return split_v2(self, split_seed, heldout_task_share=heldout_task_share)


def _order(seed: int, tag: str, k: int, n: int) -> np.ndarray:
    """A seeded permutation of ``range(n)`` for item ``k`` (stable across processes)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{tag}:{k}".encode()).digest()[:8], "little")
    return np.random.default_rng(h).permutation(n)


def exposure_weights(seed: int) -> dict[str, float]:
    """Pre-training exposure per environment (its stage's weight)."""
    return {env_name(skill, surface): float(EXPOSURE[skill.stage]) for skill in SKILLS for surface in SURFACES}


def convention_rates(seed: int) -> dict[str, float]:
    """Per environment, the share of its pre-training labels that follow the verifier's convention: each
    skill's surfaces get :data:`CONVENTION`'s levels in a seeded order."""
    out = {}
    for k, skill in enumerate(SKILLS):
        order = _order(seed, "convention", k, len(SURFACES))
        for j, surface in enumerate(SURFACES):
            out[env_name(skill, surface)] = float(CONVENTION[skill.stage][int(order[j])])
    return out


_POOLS: dict[int, V2Pool] = {}


def build_v2_pool(seed: int = 0) -> V2Pool:
    """The v2 pool of ``seed`` (memoised per process): every environment's tasks with balanced answers and
    balanced tiers, distinct prompts across the whole pool, drawn from ``default_rng([seed, skill, surface])``."""
    seed = int(seed)
    if seed in _POOLS:
        return _POOLS[seed]
    specs: list[dict[str, Any]] = []
    prompts: list[str] = []
    answers: list[str | None] = []
    tasks: list[dict[str, Any]] = []
    skill_of, surface_of, tier_of = [], [], []
    seen: set[str] = set()
    for k, skill in enumerate(SKILLS):
        sizes = [ENV_SIZES[int(i)] for i in _order(seed, "sizes", k, len(SURFACES))]
        for j, surface in enumerate(SURFACES):
            rng = np.random.default_rng([seed, k, j])
            env = env_name(skill, surface)
            size = sizes[j]
            tools = _tools(skill, surface)
            state = {"alphabet": surface.alphabet,
                     "answer_format": f"{surface.prefix}<{surface.words['symbol']}>{surface.suffix}"}
            vals = [skill.answers[i % len(skill.answers)] for i in range(size)]
            vals = [vals[int(i)] for i in rng.permutation(size)]
            tiers = [i % len(LENGTHS) for i in range(size)]
            tiers = [tiers[int(i)] for i in rng.permutation(size)]
            checks = [_fmt(skill.check, surface),
                      f"{surface.words['reply']} is written in the answer format of the {surface.words['record']}"]
            for t, (a, tier) in enumerate(zip(vals, tiers, strict=True)):
                n = LENGTHS[tier]
                for _ in range(1000):
                    record = skill.make(rng, n, a)
                    prompt = prompt_of(skill, surface, record)
                    if prompt not in seen:
                        break
                else:  # pragma: no cover - every skill has far more inputs per answer than an environment needs
                    raise RuntimeError(f"{env}: no new prompt for answer {a} at length {n}")
                seen.add(prompt)
                text = _fmt(skill.texts[int(rng.integers(len(skill.texts)))], surface)
                text += f" The {surface.words['record']} holds {_NUMBER_WORDS[n]} {surface.words['symbol']}s."
                specs.append({"id": f"{env}/{t}", "env": env, "category": surface.name, "instruction": text,
                              "tools": tools, "difficulty": tier, "verifier": {"checks": checks},
                              "initial_state": state})
                prompts.append(prompt)
                answers.append(surface.answer(a, skill.width))
                tasks.append({"prompt": prompt, "answer": answers[-1], "value": a,
                              "record": record})
                skill_of.append(k)
                surface_of.append(j)
                tier_of.append(tier)
    pool = TaskPool(specs)
    fam_of = np.arange(len(specs), dtype=np.int64) * 0
    fpool = FamilyPool(pool=pool, prompts=prompts, answers=answers, tasks=tasks, families=[], family_of=fam_of)
    out = V2Pool(seed=seed, fpool=fpool, skill_of=np.asarray(skill_of, dtype=np.int64),
                 surface_of=np.asarray(surface_of, dtype=np.int64), tier_of=np.asarray(tier_of, dtype=np.int64),
                 exposure=exposure_weights(seed), convention=convention_rates(seed))
    _POOLS[seed] = out
    return out


class V2Pretraining:
    """Supervised pre-training examples for the v2 pool of one seed: the pool's skills and surfaces, drawn with
    probability proportional to each environment's exposure weight, with inputs drawn uniformly (not
    balanced), and never a prompt of the pool."""

    def __init__(self, v2: V2Pool) -> None:
        self.v2 = v2
        self._pool_prompts = set(v2.fpool.prompts)
        self._envs = [(k, j) for k in range(len(SKILLS)) for j in range(len(SURFACES))]
        w = np.array([v2.exposure[env_name(SKILLS[k], SURFACES[j])] for k, j in self._envs], dtype=float)
        if w.sum() <= 0:
            raise ValueError("v2 pre-training: every exposure weight is 0")
        self._p = w / w.sum()
        self._q = np.array([v2.convention[env_name(SKILLS[k], SURFACES[j])] for k, j in self._envs], dtype=float)
        digest = hashlib.sha256("\0".join(v2.fpool.prompts + [str(a) for a in v2.fpool.answers]).encode())
        # what the network reads and answers, not the spec text: the examples depend on nothing else
        self.key = f"{V2_VERSION}:{v2.seed}:{digest.hexdigest()[:24]}:{EXPOSURE}:{CONVENTION}"

    def batch(self, rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
        """``n`` (prompt, answer) pairs."""
        prompts, answers = [], []
        picks = rng.choice(len(self._envs), size=n, p=self._p)
        for e in picks.tolist():
            k, j = self._envs[e]
            skill, surface = SKILLS[k], SURFACES[j]
            while True:
                a = skill.answers[int(rng.integers(len(skill.answers)))]
                record = skill.make(rng, LENGTHS[int(rng.integers(len(LENGTHS)))], a)
                prompt = prompt_of(skill, surface, record)
                if prompt not in self._pool_prompts:
                    break
            prompts.append(prompt)
            answers.append(surface.answer(a, skill.width) if rng.random() < self._q[e]
                           else surface.alt_answer(a, skill.width))
        return prompts, answers


def split_v2(v2: Any, split_seed: int, *, heldout_task_share: float = 0.2) -> PoolSplit:
    """The v2 pool's held-out split (:mod:`envsched_lab.families.v2`), stratified across skills.

    * **held-out environments (b)**: one surface of every skill, so every skill has an unseen surface. The
      skills are put in a seeded order and take the surfaces in a seeded cyclic order, so each surface is held
      out for as many skills as any other, give or take one (12 skills, 5 surfaces: 3, 3, 2, 2, 2).
    * **held-out tasks (a)**: in every training environment, the ``heldout_task_share`` of its tasks with the
      smallest ``sha256(f"{split_seed}:{task id}")`` (at least one task stays in training).

    Every prompt of a v2 pool is distinct, so no held-out prompt is a training prompt.
    """
    seed = check_int(split_seed, "split_seed", low=0)
    check_number(heldout_task_share, "heldout_task_share", low=0, high=1, high_open=True)
    rng = np.random.default_rng([seed, 1729])
    skills = rng.permutation(len(SKILLS))
    surfaces = rng.permutation(len(SURFACES))
    heldout_envs = sorted(env_name(SKILLS[int(k)], SURFACES[int(surfaces[i % len(SURFACES)])])
                          for i, k in enumerate(skills))
    pool = v2.pool
    tasks = list(pool)
    by_env: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        by_env[str(t["env"])].append(i)
    missing = [e for e in heldout_envs if e not in by_env]
    if missing:
        raise ValueError(f"the v2 split names environments the pool does not have: {missing}")
    held = set(heldout_envs)
    train_pos: list[int] = []
    held_task_pos: list[int] = []
    for e, positions in by_env.items():
        if e in held:
            continue
        ranked = sorted(positions, key=lambda i: _rank(seed, str(tasks[i]["id"])))
        k = min(round(heldout_task_share * len(ranked)), len(ranked) - 1)
        held_task_pos += ranked[:k]
        train_pos += ranked[k:]
    train_positions = np.array(sorted(train_pos), dtype=np.int64)
    env_pos = np.array(sorted(i for e in heldout_envs for i in by_env[e]), dtype=np.int64)
    cfg = SplitConfig(split_seed=seed, heldout_env_share=len(heldout_envs) / len(by_env),
                      heldout_task_share=heldout_task_share)
    train = TaskPool([tasks[i] for i in train_positions], reward_range=getattr(pool, "reward_range", None))
    return PoolSplit(pool=pool, config=cfg, train_positions=train_positions,
                     heldout_task_positions=np.array(sorted(held_task_pos), dtype=np.int64),
                     heldout_env_positions=env_pos, heldout_envs=heldout_envs, train=train)
