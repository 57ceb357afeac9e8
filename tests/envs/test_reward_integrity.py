"""The reward-integrity sweep: every reasoning-gym dataset envsched can schedule (the bundled pool's and every
other dataset ``build_reasoning_gym_pool("all")`` builds), scored with answers that cannot be correct.

For two items of each dataset (tier 0): NaN and infinity spellings, blank answers, control characters and
terminal escapes score exactly 0; answers of the reference's type with a wrong value and very long strings
never score full credit (some datasets give partial credit by design: a close number, a matching prefix,
similar text, or a small reward for any non-empty answer, listed in docs/scorers.md). The references score 1.0
(five datasets have none: many answers are valid). Found by the first run and fixed in
envsched's scoring layer: ``complex_arithmetic`` gave ``"nan"`` 1.0, ``coin_flip`` gave ``"0"`` 1.0 for any
probability below 1, ``game_of_life_halting`` gave every non-empty answer 1.0.
"""

from __future__ import annotations

import re

import pytest

from envsched.envs import safe_scoring
from envsched.envs.reasoning_gym import (
    DEFAULT_DATASETS,
    build_reasoning_gym_pool,
    list_scorable_datasets,
    regenerate_item,
)
from envsched.envs.safe_scoring import score_answer

NON_FINITE = ["nan", "NaN", "-nan", "+nan", "NAN", "nanj", "-nanj", "nan+nanj", "NaN+NaNi", "nan + nan i", "(nan)",
              "[nan]", "nan%", "nan nan", "NaN/NaN", "sNaN", "inf", "-inf", "+inf", "Inf", "INF", "infinity",
              "-Infinity", "infj", "inf+infj", "∞", "-∞", "oo", "-oo", "zoo", "1e999", "-1e999", "1e309"]
BLANK = ["", " ", "\t", "\n", "\r\n", "   \n\t ", "\u200b", "\ufeff", "\u00a0", "\u2028"]
CONTROL = ["\x00", "\x1b", "\x07", "\x7f", "\x00" * 100, "\x08\x08\x08", "\x1b[2J", "\x1b[31m\x1b[0m",
           "\x1b]0;title\x07", "\x1bc"]
LONG = ["x" * 100_000, "1" * 100_000, "9" * 5_000, "A " * 50_000, "(" * 50_000, "0." + "9" * 10_000,
        "[" + "1, " * 30_000 + "1]"]
#: datasets whose items carry no reference answer (``None``: many solutions are valid, the scorer checks one)
NO_REFERENCE = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
#: datasets ``build_reasoning_gym_pool`` cannot build (reasoning-gym 0.1.25 fails to generate their items)
NOT_SCHEDULABLE = {"aiw", "arc_agi", "knight_swap", "rearc", "time_intervals", "word_sorting"}
_OPPOSITE = {"true": "False", "false": "True", "yes": "No", "no": "Yes"}


def wrong_values(reference: str) -> list[str]:
    """Answers of the reference's type with another value: the number plus one (or doubled), the opposite of a
    yes/no or true/false, and the text with each letter and digit moved on by one (``3 x 5`` -> ``4 x 6``)."""
    r = reference.strip()
    out = []
    if re.fullmatch(r"-?\d+", r):
        out += [str(int(r) + 1), str(-int(r) - 1)]
    else:
        try:
            value = float(r)
            out.append(repr(value + max(1.0, abs(value))))
        except ValueError:
            pass
    if r.casefold() in _OPPOSITE:
        out.append(_OPPOSITE[r.casefold()])

    def shift(ch: str) -> str:
        for lo, hi in (("0", "9"), ("a", "z"), ("A", "Z")):
            if lo <= ch <= hi:
                return chr(ord(lo) + (ord(ch) - ord(lo) + 1) % (ord(hi) - ord(lo) + 1))
        return ch

    out.append("".join(shift(ch) for ch in r))
    return [a for a in dict.fromkeys(out) if a.strip() != r]


def test_wrong_values_keep_the_type_and_change_the_value() -> None:
    assert wrong_values("41") == ["42", "-42", "52"]
    assert wrong_values("0.5") == ["1.5", "1.6"]
    assert wrong_values("True") == ["False", "Usvf"]
    assert wrong_values("2 × 2 × 5 × 7") == ["3 × 3 × 6 × 8"]
    assert wrong_values("[[1, 2], [9, 0]]") == ["[[2, 3], [0, 1]]"]


@pytest.fixture(scope="module")
def schedulable() -> dict[str, list[dict]]:
    """Two tier-0 items of every dataset that can be built, by name.

    Seed 4: reasoning-gym's sokoban generator searches for a solvable board, and its time depends on the seed
    (two tier-0 items: 1.2 s at seed 4, 6-25 s at seeds 0-3 and 5-7); every other dataset builds in 0.3 s or
    less at any seed. Which two items are swept is otherwise arbitrary."""
    out, failed = {}, set()
    for name in list_scorable_datasets():
        try:
            out[name] = build_reasoning_gym_pool([name], tasks_per_dataset=2, num_tiers=1, seed=4)
        except (ValueError, TypeError):  # reasoning-gym fails to generate (or tier) the dataset
            failed.add(name)
    assert failed == NOT_SCHEDULABLE  # a change in what can be scheduled is noticed here
    return out


@pytest.mark.slow  # about 8 s: 99 datasets x 2 items x about 70 answers, some of them at the scorer's deadline
def test_no_degenerate_or_wrong_answer_earns_credit(schedulable: dict[str, list[dict]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(safe_scoring.SCORER_TIMEOUT_ENV, "3")  # a long answer at the deadline costs 3 s, not 10
    assert set(DEFAULT_DATASETS) <= set(schedulable) and len(schedulable) == 99
    must_be_zero, full_credit, reference_not_full, no_reference = [], [], [], set()
    partial: dict[str, set[str]] = {}
    for name, specs in schedulable.items():
        for spec in specs:
            m = spec["reasoning_gym"]
            item = regenerate_item(spec)
            reference = str(item["answer"])

            def score(answer: str, name: str = name, item: dict = item, m: dict = m) -> float:
                return score_answer(name, item, answer, config=m["config"], seed=m["seed"], size=m["size"]).reward

            if item["answer"] is None:
                no_reference.add(name)
            elif score(reference) != 1.0:
                reference_not_full.append(name)
            for kind, answers in (("non-finite", NON_FINITE), ("blank", BLANK), ("control", CONTROL)):
                must_be_zero += [(name, kind, a[:20], r) for a in answers if a.strip() != reference.strip()
                                 and (r := score(a)) != 0.0]
            for kind, answers in (("long", LONG), ("wrong value", wrong_values(reference))):
                for a in answers:
                    r = score(a)
                    if r >= 1.0:
                        full_credit.append((name, kind, a[:30], reference[:30]))
                    elif r > 0.0:
                        partial.setdefault(name, set()).add(kind)
    print(f"swept {len(schedulable)} datasets; partial credit (by design) on: "
          + ", ".join(f"{n} ({'/'.join(sorted(k))})" for n, k in sorted(partial.items())))
    assert must_be_zero == []
    assert full_credit == []
    assert reference_not_full == []
    assert no_reference == NO_REFERENCE


@pytest.mark.parametrize("answer", NON_FINITE)
def test_complex_arithmetic_gives_no_credit_to_a_non_finite_answer(answer: str) -> None:
    """The audit's case (reasoning-gym computes ``min(1.0, exp(-nan))``, which is 1.0)."""
    spec = build_reasoning_gym_pool(["complex_arithmetic"], tasks_per_dataset=1, num_tiers=1, seed=5)[0]
    item = regenerate_item(spec)
    m = spec["reasoning_gym"]
    score = score_answer("complex_arithmetic", item, answer, config=m["config"], seed=m["seed"], size=m["size"])
    assert score.reward == 0.0 and score.note  # scored 0, with why


@pytest.mark.parametrize("answer, reward", [("0", 0.2), ("0.", 0.2), ("0.1", 0.6), ("0.12", 0.8), ("0.125", 1.0),
                                            ("1/8", 1.0), ("0.12501", 1.0), ("1", 0.0)])
def test_coin_flip_prefix_credit_is_over_the_longer_number(answer: str, reward: float) -> None:
    """reasoning-gym divided the matching prefix by the shorter number: ``"0"`` scored 1.0 for 0.125."""
    spec = next(s for s in build_reasoning_gym_pool(["coin_flip"], tasks_per_dataset=2, num_tiers=1, seed=5)
                if regenerate_item(s)["answer"] == "0.125")
    item = regenerate_item(spec)
    m = spec["reasoning_gym"]
    assert score_answer("coin_flip", item, answer, config=m["config"], seed=m["seed"],
                        size=m["size"]).reward == pytest.approx(reward)


@pytest.mark.parametrize("answer", ["xx", "1", "maybe", "True", "true ", "yes", "no", "Fals", "eslaF"])
def test_game_of_life_halting_gives_credit_to_the_right_word_only(answer: str) -> None:
    """reasoning-gym compared ``bool(answer)`` with ``bool(reference)``: any non-empty answer scored 1.0."""
    spec = next(s for s in build_reasoning_gym_pool(["game_of_life_halting"], tasks_per_dataset=2, num_tiers=1,
                                                     seed=5) if regenerate_item(s)["answer"] == "False")
    item = regenerate_item(spec)
    m = spec["reasoning_gym"]

    def score(a: str) -> float:
        return score_answer("game_of_life_halting", item, a, config=m["config"], seed=m["seed"],
                            size=m["size"]).reward

    assert score(answer) == 0.0
    assert score("False") == score(" false ") == 1.0
