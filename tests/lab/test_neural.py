"""The neural learner's parts: the network, GRPO, the shipped task families and the family contract."""

import numpy as np
import pytest
import torch

from envsched_lab.families import (
    DEFAULT_FAMILIES,
    WARMUP_FAMILIES,
    FamilyError,
    build_family_pool,
    load_families,
)
from envsched_lab.neural import NeuralConfig, NeuralLearner
from envsched_lab.neural.grpo import (
    advantages,
    answer_logprobs,
    encode_prompts,
    generate,
    grpo_loss,
    grpo_update,
    token_logprobs,
)
from envsched_lab.neural.model import CharTokenizer, TinyTransformer

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "cache"))


def _model(seed=0):
    torch.manual_seed(seed)
    return TinyTransformer(d_model=32, n_layers=1, n_heads=2).eval()


def test_cached_sampling_matches_a_full_forward_pass():
    m = _model()
    comp = generate(m, encode_prompts(["max:12345", "at2:abc", "x"]), 5, generator=torch.Generator().manual_seed(1),
                    repeats=3)
    assert comp.tokens.shape[0] == 9
    lp = token_logprobs(m, comp.prompt, comp.tokens)
    assert torch.allclose(lp[comp.mask], comp.logp[comp.mask], atol=1e-5)
    # left padding does not change what a prompt reads
    alone = answer_logprobs(m, ["x"], ["7"])
    padded = answer_logprobs(m, ["x", "max:12345678"], ["7", "8"])[:1]
    assert alone == pytest.approx(padded, abs=1e-5)


def test_advantages_are_group_normalised():
    adv = advantages(np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    assert adv[0] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert (adv[1] == 0).all()


def test_a_grpo_step_lowers_the_loss_on_a_fixed_batch():
    m = _model(3)
    prompts = encode_prompts(["max:381", "min:940", "at1:ab", "up:cd"])
    comp = generate(m, prompts, 4, generator=torch.Generator().manual_seed(0), repeats=4)
    rewards = np.tile([1.0, 0.0, 0.0, 1.0], (4, 1))  # a fixed, mixed reward per group
    adv = advantages(rewards).reshape(-1)
    a = torch.as_tensor(adv, dtype=torch.float32)
    with torch.no_grad():
        before = float(grpo_loss(m, comp, a, 0.2, 16))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = grpo_update(m, opt, comp, adv, clip=0.2, epochs=1, total=16)
    with torch.no_grad():
        after = float(grpo_loss(m, comp, a, 0.2, 16))
    assert losses == [pytest.approx(before, abs=1e-6)]
    assert after < before - 1e-3
    # rewarded completions became more likely, unrewarded ones less
    with torch.no_grad():
        lp = (token_logprobs(m, comp.prompt, comp.tokens) * comp.mask).sum(1).numpy()
    old = (comp.logp * comp.mask).sum(1).numpy()
    assert (lp - old)[adv > 0].mean() > 0 > (lp - old)[adv < 0].mean()


def test_no_signal_no_step():
    m = _model()
    comp = generate(m, encode_prompts(["max:1"]), 3, generator=torch.Generator().manual_seed(0), repeats=4)
    before = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    assert grpo_update(m, opt, comp, np.zeros(4), clip=0.2, epochs=2, total=4) == []
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))


@pytest.mark.parametrize("family", DEFAULT_FAMILIES + WARMUP_FAMILIES, ids=lambda f: f.name)
def test_each_shipped_family_scores_its_answer_1_and_a_wrong_one_0(family):
    rng = np.random.default_rng(5)
    tiers = getattr(family, "tiers", 3)
    fp = build_family_pool([family], per_tier=4, seed=1)
    assert len(fp.pool) == 4 * tiers
    for pos, spec in enumerate(fp.pool):
        ans = fp.answers[pos]
        assert fp.reward(pos, ans) == 1.0
        wrong = ans[:-1] + ("x" if ans[-1] != "x" else "y")
        assert fp.reward(pos, wrong) == 0.0
        assert fp.reward(pos, ans + "0") == 0.0
        assert "prompt" not in spec and "answer" not in spec  # what samplers and the graph read
        assert spec["env"] == family.name and spec["difficulty"] == int(spec["id"].split("/t")[1].split("/")[0])
        CharTokenizer.encode(fp.prompts[pos])
    # the instruction says nothing about the input (no difficulty signal in the text)
    texts = {family.generate(rng, t)["instruction"] for t in range(tiers) for _ in range(20)}
    assert texts <= set(family.instructions)


def test_the_shipped_pool_has_corpora_tiers_and_shared_primitives():
    assert len(DEFAULT_FAMILIES) >= 12
    corpora = {f.corpus for f in DEFAULT_FAMILIES}
    assert len(corpora) >= 3 and all(f.tiers >= 3 for f in DEFAULT_FAMILIES)
    ops = {f.name.split("/")[1] for f in DEFAULT_FAMILIES}
    assert {"max", "count", "at"} <= ops  # over lists and text alike
    fp = build_family_pool()
    assert len(fp.pool) == 900 and fp.pool.fingerprint() == build_family_pool().pool.fingerprint()


def test_family_contract_errors_name_the_family():
    class NoTier:
        name, tools = "bad/tier", []

        def generate(self, rng, tier):
            return {"instruction": "x", "tools": [], "difficulty": 7, "verifier": {"checks": ["c"]},
                    "prompt": "p", "answer": "a"}

    class SetsId(NoTier):
        name = "bad/id"

        def generate(self, rng, tier):
            return {**super().generate(rng, tier), "difficulty": tier, "id": "mine"}

    class Leaks(NoTier):
        name = "bad/leak"

        def generate(self, rng, tier):
            return {**super().generate(rng, tier), "difficulty": tier, "instruction": "the answer is 42",
                    "answer": "42"}

    for fam, words in ((NoTier(), "difficulty"), (SetsId(), "'id'"), (Leaks(), "contains the answer")):
        with pytest.raises(FamilyError, match=words) as err:
            build_family_pool([fam], per_tier=1)
        assert fam.name in str(err.value)
    for ref, words in (("nocolon", "MODULE:ATTR"), ("envsched.nope:X", "cannot import"),
                       ("envsched_lab.families:NOPE", "no attribute")):
        with pytest.raises(FamilyError, match=words):
            load_families(ref)


def test_neural_config_rejects_bad_options():
    with pytest.raises(ValueError, match="unknown neural learner option"):
        NeuralConfig.from_dict({"d_modl": 3})
    with pytest.raises(ValueError, match="multiple of n_heads"):
        NeuralConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="lr must be a positive"):
        NeuralConfig(lr=-1.0)


def test_learner_state_round_trip_and_determinism():
    fp = build_family_pool(DEFAULT_FAMILIES[:2], per_tier=3)
    cfg = {"warmup_steps": 3, "warmup_batch": 8, "d_model": 32, "n_heads": 2, "n_layers": 1}
    a, b = NeuralLearner(fp, cfg, seed=4), NeuralLearner(fp, cfg, seed=4)
    pos = np.arange(6)
    ra, _, ga = a.rollout(pos, 4)
    state = a.state_dict()
    a.train(pos, ra, ga)
    r2, _, _ = a.rollout(pos, 4)
    rb, _, gb = b.rollout(pos, 4)
    b.train(pos, rb, gb)
    assert np.array_equal(ra, rb) and np.array_equal(r2, b.rollout(pos, 4)[0])
    c = NeuralLearner(fp, cfg, seed=4)
    c.load_state_dict(state)
    c.train(pos, ra, ga)
    assert all(torch.equal(x, y) for x, y in zip(c.model.parameters(), a.model.parameters(), strict=True))
    with pytest.raises(ValueError, match="another config or seed"):
        NeuralLearner(fp, cfg, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="positions"):
        a.rollout([99], 2)
