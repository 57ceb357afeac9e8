"""reasoning-gym: seeded pools with difficulty tiers, scored by each dataset's own score_answer."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from envsched.envs.default_pool import benchmark_rg_counts
from envsched.envs.reasoning_gym import (
    BENCHMARK_DATASETS,
    DEFAULT_DATASETS,
    EXTRA_DATASETS,
    ReasoningGymEnvironment,
    build_reasoning_gym_pool,
    dataset_tiers,
    regenerate_item,
    score_task_answer,
)
from envsched.pool import TaskPool


@pytest.fixture(scope="module")
def bench_specs(bundled_pool) -> list[dict]:
    """The reasoning-gym tasks of the bundled pool (43 datasets with BFCL installed, else 51)."""
    return [s for s in bundled_pool if s["env"].startswith("reasoning_gym/")]


def test_benchmark_part_counts() -> None:
    counts = benchmark_rg_counts(800, sorted(BENCHMARK_DATASETS))
    assert sum(counts.values()) == 1750 and len(counts) == 43
    assert sorted(Counter(counts.values()).items()) == [(40, 13), (41, 30)]
    assert counts["acre"] == 41 and counts["word_ladder"] == 40  # alphabetical: the first 30 get one more
    assert len(DEFAULT_DATASETS) == 51 and set(BENCHMARK_DATASETS) < set(DEFAULT_DATASETS)
    specs = build_reasoning_gym_pool(["gcd", "lcm"], tasks_per_dataset={"gcd": 7, "lcm": 3})
    assert Counter(s["env"] for s in specs) == {"gcd": 7, "lcm": 3}
    assert all(v == 0 for v in TaskPool(specs).missing_fields().values())


@pytest.mark.slow
def test_reference_answers_score_one_and_wrong_answers_less(bench_specs: list[dict]) -> None:
    from envsched.envs import reasoning_gym as rg

    assert len(bench_specs) in (1750, 2550)
    _fresh_items(rg)  # regenerate every item from its spec alone, in reverse order
    env = ReasoningGymEnvironment()
    not_same, not_full, not_lower = [], [], []
    for spec in reversed(bench_specs):
        if env.reset(spec) != spec["instruction"]:
            not_same.append(spec["id"])
        result = env.step(env.reference_answer)
        if not (result.done and result.reward == 1.0):
            not_full.append(spec["id"])
        env.reset(spec)
        wrong = env.step("this is not the answer 0.123").reward
        if wrong is None or wrong >= 1.0:
            not_lower.append(spec["id"])
    assert not_same == [] and not_full == [] and not_lower == []


def test_chain_sum_tiers_follow_the_rfc_example() -> None:
    tiers = dataset_tiers("chain_sum")
    assert len(tiers) == 5
    assert [(t["min_terms"], t["max_digits"], t["allow_negation"]) for t in tiers] == [
        (2, 1, False), (3, 2, False), (4, 3, True), (5, 4, True), (6, 5, True)]
    specs = build_reasoning_gym_pool(["chain_sum"], tasks_per_dataset=10, seed=3)
    assert [s["difficulty"] for s in specs] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for s in specs:
        numbers = re.findall(r"\d+", s["instruction"].split("=")[0])
        tier = s["difficulty"]
        assert len(numbers) == tier + 2  # tier k: k + 2 terms ...
        assert max(len(n) for n in numbers) == tier + 1  # ... of (at most, with negation) k + 1 digits
        if tier < 2:
            assert "-" not in s["instruction"].replace(" - ", " ")  # no negative terms before tier 3
            assert all(len(n) == tier + 1 for n in numbers)


def test_curriculum_tiers_are_closely_spaced_configurations() -> None:
    tiers = dataset_tiers("gcd")
    assert len(tiers) >= 2
    assert tiers[0] != tiers[1]
    assert all(isinstance(json.dumps(t), str) for t in tiers)
    assert dataset_tiers("gsm_symbolic") == [{}]  # no curriculum: one tier, the default configuration


@pytest.mark.slow
def test_specs_are_json_and_regenerate_offline() -> None:
    specs = build_reasoning_gym_pool(["gcd", "word_ladder"], tasks_per_dataset=6, seed=7)
    again = json.loads(json.dumps(specs))
    assert again == specs
    for s in again:
        item = regenerate_item(s)
        assert item["question"] == s["instruction"]
        assert score_task_answer(s, item["answer"]) == 1.0
        assert "def score_answer" in s["verifier"]["code"]
        assert s["verifier"]["checks"] and s["tools"][0]["name"] == f"{s['env']}.submit_answer"
    # seeded: same seed same items, another seed other items
    assert build_reasoning_gym_pool(["gcd"], tasks_per_dataset=6, seed=7) == specs[:6]
    other = build_reasoning_gym_pool(["gcd"], tasks_per_dataset=6, seed=8)
    assert [s["instruction"] for s in other] != [s["instruction"] for s in specs[:6]]


def test_a_scorer_that_raises_on_the_answer_scores_it_zero_with_the_reason() -> None:
    # prime_factorization's own score_answer raises on a non-numeric answer (reasoning-gym 0.1.25): a failure
    # the answer caused is the answer's (0.0, the exception recorded), never an unscored episode
    spec = build_reasoning_gym_pool(["prime_factorization"], tasks_per_dataset=1)[0]
    env = ReasoningGymEnvironment()
    env.reset(spec)
    result = env.step("zzz not a number")
    assert result.done and result.reward == 0.0 and env.final_reward() == 0.0
    assert "raised" in result.info["scoring"] and "ValueError" in result.info["scoring"]
    assert "error" not in result.info
    env.reset(spec)
    assert env.step(env.reference_answer).reward == 1.0


def test_an_item_that_cannot_be_rebuilt_is_an_unscored_episode() -> None:
    """Only a failure that is not the answer's (the dataset cannot be rebuilt) leaves the episode unscored."""
    from envsched.envs.safe_scoring import score_answer

    spec = build_reasoning_gym_pool(["gcd"], tasks_per_dataset=1)[0]
    item = regenerate_item(spec)
    with pytest.raises(RuntimeError, match="could not run"):
        score_answer("gcd", item, item["answer"], config={"no_such_option": 1}, seed=0, size=1)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'no_such'"):
        build_reasoning_gym_pool(["no_such"])
    with pytest.raises(ValueError, match=r"tasks_per_dataset for 'gcd' must be an integer >= 0, got -1"):
        build_reasoning_gym_pool(["gcd"], tasks_per_dataset=-1)
    with pytest.raises(ValueError, match=r"tasks_per_dataset for 'gcd' must be an integer >= 0, got True"):
        build_reasoning_gym_pool(["gcd"], tasks_per_dataset=True)
    with pytest.raises(ValueError, match="not being built"):
        build_reasoning_gym_pool(["gcd"], tasks_per_dataset={"gcd": 2, "lcm": 3})
    with pytest.raises(TypeError):
        build_reasoning_gym_pool("gcd")
    with pytest.raises(ValueError, match="not a reasoning-gym task"):
        ReasoningGymEnvironment().reset({"id": "x", "env": "gcd"})
    env = ReasoningGymEnvironment()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    spec = build_reasoning_gym_pool(["gcd"], tasks_per_dataset=1)[0]
    env.reset(spec)
    with pytest.raises(TypeError, match="answer text"):
        env.step(42)
    env.step("1")
    with pytest.raises(RuntimeError, match="over"):
        env.step("1")
    broken = json.loads(json.dumps(spec))
    broken["reasoning_gym"]["item"] = 5
    with pytest.raises(ValueError, match="outside"):
        regenerate_item(broken)


@pytest.mark.slow
def test_extra_datasets_regenerate_their_items_in_any_order() -> None:
    from envsched.envs import reasoning_gym as rg

    specs = build_reasoning_gym_pool(EXTRA_DATASETS, tasks_per_dataset=6, seed=11)
    assert len(TaskPool(specs).envs) == 8
    _fresh_items(rg)  # regenerate from scratch, in reverse order
    mismatched = [s["id"] for s in reversed(specs) if regenerate_item(s)["question"] != s["instruction"]]
    assert mismatched == []
    assert [s["id"] for s in specs if score_task_answer(s, regenerate_item(s)["answer"]) != 1.0] == []


def test_items_do_not_depend_on_the_ambient_decimal_context() -> None:
    import decimal

    from envsched.envs import reasoning_gym as rg

    specs = build_reasoning_gym_pool(["decimal_chain_sum", "decimal_arithmetic"], tasks_per_dataset=10, seed=2)
    _fresh_items(rg)
    with decimal.localcontext() as ctx:
        ctx.prec = 3  # e.g. what BFCL's MathAPI leaves behind in a process running it
        assert [regenerate_item(s)["question"] for s in specs] == [s["instruction"] for s in specs]
        assert all(score_task_answer(s, regenerate_item(s)["answer"]) == 1.0 for s in specs)


def _fresh_items(rg) -> None:
    """Forget the generated items: the next ones come from a fresh generation worker."""
    from envsched.envs._rg_items import _ItemWorker

    rg._cached_item.cache_clear()
    _ItemWorker.clear_idle()


def _benign_answers(reference: str) -> list[str]:
    """The reference, near misses and list forms a model might give (nothing that only scores when evaluated)."""
    words = reference.split()
    out = [reference, f" {reference} ", reference + "0", "", "0", "1", "this is not the answer 0.123", "[1, 2]",
           "x", "x**2/2 + C", "(1 + 2) * 3", str(words), "[" + ", ".join(words) + "]"]
    if "\n" in reference:
        out.append(str([[int(v) if v.lstrip("-").isdigit() else v for v in row.split()]
                        for row in reference.split("\n")]))
    if len(reference) < 200:
        out.append(repr(list(reference)))
    return out


_EVALUATING_ELSEWHERE = ("binary_matrix", "countdown", "intermediate_integration", "n_queens",
                         "polynomial_multiplication", "puzzle24", "string_insertion")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", sorted(DEFAULT_DATASETS + _EVALUATING_ELSEWHERE))
def test_the_safe_path_scores_as_the_datasets_own_scorer_on_benign_answers(dataset: str) -> None:
    """Every default dataset (one item per tier) and the evaluating datasets outside it (two items):
    references score 1.0 through the safe path, and benign answers score exactly what reasoning-gym's own
    score_answer gives them in this process (0 where it raises; less where an integrity rule applies)."""
    import decimal

    from reasoning_gym import factory

    from envsched.envs.safe_scoring import ANSWER_RULES, scoring_kind

    assert scoring_kind(dataset) != "unaudited"
    n = 2 if dataset in _EVALUATING_ELSEWHERE else len(dataset_tiers(dataset))
    specs = build_reasoning_gym_pool([dataset], tasks_per_dataset=n, seed=13)
    differ = []
    for spec in specs:
        item = regenerate_item(spec)
        assert score_task_answer(spec, item["answer"]) == 1.0, spec["id"]
        m = spec["reasoning_gym"]
        ds = factory.create_dataset(dataset, size=m["size"], seed=m["seed"], **m["config"])
        for answer in _benign_answers(str(item["answer"])):
            with decimal.localcontext(decimal.Context()):
                try:
                    want = float(ds.score_answer(answer, entry=item))
                except Exception:
                    want = 0.0  # a scorer that raises on an answer scores it 0 (docs/scorers.md)
            if answer.strip() == "":
                want = 0.0  # a blank answer scores 0 (some datasets gave it 0.01, a reward for nothing)
            try:
                got = score_task_answer(spec, answer)
            except Exception:
                got = None
            if got != want and not (dataset in ANSWER_RULES and got is not None and got < want):
                differ.append((spec["id"], answer[:40], got, want))  # an integrity rule only lowers a reward
    assert differ == []
