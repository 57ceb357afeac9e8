"""Prediction with fewer sorts: the shared sort order, the shared-reference block, cached operator row
sums and the lazy ``Prediction.q`` give exactly what the straightforward formulas give."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import rankdata

import envsched.method.sampler as sampler_module
from envsched.method.config import FORMER_PIPELINE_DEFAULTS, SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.history.prediction import (
    EnvironmentOperator,
    HalfLifePrediction,
    Prediction,
    RelationEstimates,
    RelationOperator,
    percentile_ranks,
    predict,
    propagate,
    quantile_map,
    relation_operator,
    relation_operators,
    sort_order,
)
from envsched.method.sampler import EnvSchedSampler


def _tied(n: int, share: float, seed: int, distinct: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` values of which ``share`` sit at one common value (the reference), the rest random (drawn from
    ``distinct`` levels when given, so they tie among themselves too); also the mask of the common block."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, distinct, n) / distinct if distinct else rng.random(n)
    block = rng.random(n) < share
    x[block] = x[0] if distinct else 0.375  # a value the others also take (distinct) or not
    return x, block


CASES = [(5_000, 0.9, None), (5_000, 0.9, 7), (5_000, 0.0, None), (5_000, 0.3, 40), (300, 0.95, None),
         (300, 0.5, 3), (6_000, 0.0, 5)]


@pytest.mark.parametrize(("n", "share", "distinct"), CASES)
def test_percentile_ranks_equal_scipy_rankdata_bit_for_bit(n, share, distinct):
    x, block = _tied(n, share, seed=n + int(share * 10))
    if distinct:
        x, block = _tied(n, share, seed=3, distinct=distinct)
    expected = rankdata(x, method="average") / n
    assert np.array_equal(percentile_ranks(x), expected)
    assert np.array_equal(percentile_ranks(x, sort_order(x, block)), expected)
    assert np.array_equal(percentile_ranks(x, sort_order(x)), expected)


def test_percentile_ranks_edge_cases():
    for x in (np.array([0.3]), np.full(10, 0.2), np.array([2.0, 1.0, 2.0, 1.0, 0.0]), np.array([-0.0, 0.0, 1.0])):
        assert np.array_equal(percentile_ranks(x), rankdata(x) / x.size)
    # a NaN makes every rank NaN, as scipy's default nan_policy="propagate"
    x = np.array([0.1, np.nan, 0.3])
    assert np.isnan(percentile_ranks(x)).all() and np.isnan(rankdata(x)).all()
    assert percentile_ranks(np.empty(0)).size == 0


@pytest.mark.parametrize(("n", "share", "distinct"), CASES)
def test_sort_order_with_and_without_a_block(n, share, distinct):
    x, block = _tied(n, share, seed=11, distinct=distinct)
    for b in (block, None):
        order = sort_order(x, b)
        assert np.array_equal(np.sort(order), np.arange(n))  # a permutation
        assert np.array_equal(x[order], np.sort(x))
    # a block that does not hold one value is detected and sorted whole
    if block.sum() > 2:
        y = x.copy()
        y[np.flatnonzero(block)[1]] = -1.0
        assert np.array_equal(y[sort_order(y, block)], np.sort(y))
    # the block's value smallest or largest of all
    for v in (-5.0, 5.0):
        y = x.copy()
        y[block] = v
        assert np.array_equal(y[sort_order(y, block)], np.sort(y))


def test_sort_order_with_nan_keeps_nan_last():
    x = np.array([0.5, np.nan, 0.1, 0.5, 0.5])
    block = np.array([True, False, False, True, True])
    for b in (block, None, np.array([False, True, False, True, False])):
        order = sort_order(x, b)
        assert np.array_equal(x[order][:4], [0.1, 0.5, 0.5, 0.5]) and np.isnan(x[order][4])


@pytest.mark.parametrize(("n", "share", "distinct"), CASES)
def test_quantile_map_with_shared_order_equals_numpy_quantile(n, share, distinct):
    v, block = _tied(n, share, seed=5, distinct=distinct)
    rng = np.random.default_rng(1)
    q = np.concatenate([rng.random(n - 4), [0.0, 1.0, 0.5, 1.0 / (n - 1)]])
    shared = quantile_map(v, q, sort_order(v, block))
    assert np.array_equal(shared, quantile_map(v, q))  # the order changes nothing
    assert np.allclose(shared, np.quantile(v, q, method="linear"), rtol=0, atol=1e-15)
    # probabilities outside [0, 1] are clipped; any shape, a scalar included
    assert np.array_equal(quantile_map(v, np.array([-0.5, 1.5])), [v.min(), v.max()])
    assert quantile_map(v, 0.25).shape == () and quantile_map(v, 0.25) == quantile_map(v, np.array([0.25]))[0]
    assert quantile_map(v, q[:6].reshape(2, 3)).shape == (2, 3)


def test_relation_operator_row_totals_cached_and_propagation_unchanged():
    g = synthetic_graph(600, 12, seed=2)
    ops = relation_operators(g)
    rng = np.random.default_rng(0)
    values = rng.random((600, 6))
    ref = rng.random(6)
    for (index, weight), op in zip(((g.within_index, g.within_weight), (g.cross_index, g.cross_weight)), ops,
                                   strict=True):
        raw = relation_operator(index, weight, 600)
        assert isinstance(op, RelationOperator) and RelationOperator.of(op) is op
        assert np.array_equal(op.row_total, np.asarray(raw.sum(axis=1)).ravel())
        for share in (0.01, 0.3, 1.0):  # few observed tasks (most rows unseen) to all observed
            observed = rng.random(600) < share
            est, has = propagate(values, observed, op, ref)
            est_raw, has_raw = propagate(values, observed, raw, ref)
            plain, plain_has = _plain_propagate(values, observed, raw, ref)
            assert np.array_equal(has, plain_has) and np.array_equal(has_raw, plain_has)
            assert np.array_equal(est, plain) and np.array_equal(est_raw, plain)
    with pytest.raises(TypeError, match="scipy sparse matrix or a RelationOperator"):
        RelationOperator.of(np.eye(3))


def test_environment_relation_is_the_complete_within_environment_graph():
    """``within_relation="environment"``: every other task of the environment with weight 1, from per-environment
    sums; equal to propagating along the explicit block matrix (a singleton environment has no neighbour)."""
    rng = np.random.default_rng(3)
    codes = np.concatenate([rng.integers(0, 6, 300), [6]])  # environment 6 holds one task
    n = codes.size
    block = (codes[:, None] == codes[None, :]).astype(float)
    np.fill_diagonal(block, 0.0)
    op = EnvironmentOperator.of_codes(codes)
    assert np.array_equal(op.row_total, block.sum(axis=1))
    values, ref = rng.random((n, 3)), rng.random(3)
    for share in (0.0, 0.02, 0.5, 1.0):
        observed = rng.random(n) < share
        est, has = propagate(values, observed, op, ref)
        plain, plain_has = _plain_propagate(values, observed, sp.csc_matrix(block), ref)
        assert np.array_equal(has, plain_has)
        np.testing.assert_allclose(est, plain, rtol=0, atol=1e-12)
        assert not has[-1] and np.array_equal(est[-1], ref)  # alone in its environment: the reference
    # one observed task moves the others of its environment by 1 / (n_e - 1) of its deviation, itself not at all
    observed = np.zeros(n, dtype=bool)
    observed[0] = True
    est, has = propagate(values, observed, op, ref)
    same = np.flatnonzero(codes == codes[0])
    np.testing.assert_allclose(est[same[1]], ref + (values[0] - ref) / (same.size - 1))
    assert not has[0] and np.array_equal(est[0], ref)
    assert np.array_equal(est[codes != codes[0]], np.broadcast_to(ref, ((codes != codes[0]).sum(), 3)))


def test_the_sampler_propagates_along_the_relation_its_config_names():
    g = synthetic_graph(400, 8, seed=1)
    tasks = synthetic_tasks(g)
    for relation, kind in (("neighbours", RelationOperator), ("environment", EnvironmentOperator)):
        config = SchedulerConfig(use_within_edges=True, within_relation=relation, batch_size=16)
        s = EnvSchedSampler(tasks, g, config, seed=0)
        assert isinstance(s._operators[0], kind) and isinstance(s._operators[1], RelationOperator)
    with pytest.raises(ValueError, match="within_relation must be one of"):
        SchedulerConfig(within_relation="everything")


def test_relations_the_config_leaves_out_are_propagated_only_when_read():
    """A configuration using neither relation does not propagate, and an explanation reading the estimates later
    gets what propagating the same histories gives (the history has moved on since), with the global reference
    for a neighbour without history (the environment substitute is read only with a relation on)."""
    g = synthetic_graph(400, 8, seed=1)
    # the online share and the UCB coverage leave some tasks without a neighbour with history after 30 steps (the
    # default's fixed split reaches every one), so that both kinds of row are checked below
    config = SchedulerConfig(batch_size=16, use_within_edges=False, use_cross_edges=False, adaptive_share=True,
                             adaptive_coverage=True)
    s = EnvSchedSampler(synthetic_tasks(g), g, config, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(30):
        for t in s.sample(16):
            s.update(t, (rng.random(8) < 0.4).astype(float).tolist())
    pred = s.predict()
    assert pred.long.relations._done == {} and pred.short.relations._done == {}
    assert "q" not in pred.long.__dict__ and "q" not in pred.short.__dict__  # the ranks, also read only by explanations
    for hl in (pred.long, pred.short):
        assert np.array_equal(hl.q, percentile_ranks(hl.score, sort_order(hl.score, pred.shared)))
    ref = pred.reference
    h_long, h_short = pred.long.history, pred.short.history
    for t in s.sample(16):  # the history changes before the estimates are read
        s.update(t, (rng.random(8) < 0.4).astype(float).tolist())
    for i, op in enumerate(s._operators):
        for hl, h in ((pred.long, h_long), (pred.short, h_short)):
            est, has = propagate(h.values, h_long.observed, op, ref)
            got, got_has = (hl.within, hl.within_has) if i == 0 else (hl.cross, hl.cross_has)
            np.testing.assert_allclose(got, est, rtol=1e-12, atol=1e-15)
            assert np.array_equal(got_has, has) and has.any() and not has.all()
    paper = EnvSchedSampler(synthetic_tasks(g), g, SchedulerConfig.paper(batch_size=16), seed=0)
    paper.update(paper.sample(16)[0], [1.0, 0.0] * 4)
    assert set(paper.predict().long.relations._done) == {0, 1}  # a config using both computes both at once


def _plain_propagate(values, observed, operator, reference):
    """The propagation computed the straightforward way (row totals and the csc conversion on every call)."""
    seen = np.flatnonzero(observed)
    if seen.size == 0:
        return np.broadcast_to(reference, values.shape).copy(), np.zeros(values.shape[0], dtype=bool)
    op = sp.csc_matrix(operator)
    row_total = np.asarray(op.sum(axis=1)).ravel()
    agg = np.asarray(op[:, seen] @ np.column_stack([np.ones(seen.size), values[seen]]))
    total = agg[:, 0]
    has = total > 0
    missing = np.maximum(row_total - total, 0.0)
    denom = np.where(has, row_total, 1.0)
    est = np.where(has[:, None], (agg[:, 1:] + missing[:, None] * reference[None, :]) / denom[:, None],
                   reference[None, :])
    return est, has


def _plain_environment(values, observed, codes, reference):
    """Each task's environment estimate: the mean over the other tasks of its environment, an unobserved one
    counting with the reference (the reference alone in an environment of one task)."""
    est = np.empty_like(values)
    has = np.zeros(len(codes), dtype=bool)
    for i in range(len(codes)):
        mates = codes == codes[i]
        mates[i] = False
        k = int(mates.sum())
        if k == 0:
            est[i] = reference
            continue
        obs = mates & observed
        has[i] = obs.any()
        est[i] = (values[obs].sum(axis=0) + (k - obs.sum()) * reference) / k
    return est, has


def _plain_substituted(values, observed, operator, substitute, per_neighbour):
    """A relation's estimates where an unobserved neighbour counts with the task's own substitute (within) or
    with its own (cross); a task without neighbours gets its substitute."""
    op = sp.csr_matrix(operator)
    total = np.asarray(op.sum(axis=1)).ravel()
    observed_sum = op @ np.where(observed[:, None], values, 0.0)
    if per_neighbour:
        unobserved_sum = op @ np.where(observed[:, None], 0.0, substitute)
    else:
        unobserved_sum = (op @ (~observed).astype(float))[:, None] * substitute
    has = (op @ observed.astype(float)) > 0
    est = np.where(total[:, None] > 0, (observed_sum + unobserved_sum) / np.maximum(total, 1e-300)[:, None],
                   substitute)
    return est, has


def _plain_half_life(hist, relations, reference, config):
    (within, within_has), (cross, cross_has) = relations
    if config.use_within_edges and config.use_cross_edges:
        w = config.within_fusion_weight
        prior = w * within + (1.0 - w) * cross
    elif config.use_within_edges:
        prior = within
    elif config.use_cross_edges:
        prior = cross
    else:
        prior = np.broadcast_to(reference, within.shape).copy()
    n0 = config.prior_strength
    W = hist.weight[:, None]
    posterior = (n0 * prior + W * hist.values) / (n0 + W)
    m, v, d = posterior[:, 0], posterior[:, 1], posterior[:, 2]
    v_rec = d * m * (1.0 - m)
    a = config.reconstruction_weight
    n = v.size
    if config.use_calibration:
        q = (1.0 - a) * rankdata(v, method="average") / n + a * rankdata(v_rec, method="average") / n
        score = np.quantile(v, np.clip(q, 0.0, 1.0), method="linear")
    else:  # the blend of the two estimates on their own scale (the default)
        score = (1.0 - a) * v + a * v_rec
        q = rankdata(score, method="average") / n
    return HalfLifePrediction(history=hist, relations=RelationEstimates.of(within, within_has, cross, cross_has),
                              prior=prior, posterior=posterior, v_direct=v, v_reconstructed=v_rec, ranks=q, score=score)


def plain_predict(history, graph, config, operators=None):
    """The prediction with the straightforward formulas: scipy's rankdata for every rank, numpy.quantile for the
    mapping, operators rebuilt and row totals recomputed each call, ``q`` computed eagerly."""
    reference = history.global_reference()
    if reference is None:
        return None
    n = graph.num_nodes
    ops = (relation_operator(graph.within_index, graph.within_weight, n),
           relation_operator(graph.cross_index, graph.cross_weight, n))
    centered = history.centered_observations(reference)
    h_long = history.task_history(config.long_half_life, reference, centered)
    h_short = history.task_history(config.short_half_life, reference, centered)
    both = np.concatenate([h_long.values, h_short.values], axis=1)
    both_reference = np.concatenate([reference, reference])
    rel = []
    environment = config.unobserved_neighbours == "environment" and (config.use_within_edges or
                                                                       config.use_cross_edges)
    if environment:
        substitute, _ = _plain_environment(both, h_long.observed, np.asarray(graph.env_codes), both_reference)
    for i, op in enumerate(ops):
        if environment:
            est, has = _plain_substituted(both, h_long.observed, op, substitute, per_neighbour=i == 1)
        else:
            est, has = _plain_propagate(both, h_long.observed, op, both_reference)
        rel.append(((est[:, :3], has), (est[:, 3:], has)))
    long = _plain_half_life(h_long, (rel[0][0], rel[1][0]), reference, config)
    short = _plain_half_life(h_short, (rel[0][1], rel[1][1]), reference, config)
    decline = np.maximum(0.0, long.score - short.score)
    info = np.maximum(0.5 * (long.score + short.score) - config.decline_penalty * decline, 0.0)
    pred = Prediction(reference=reference, long=long, short=short, decline=decline, informativeness=info)
    pred.__dict__["q"] = rankdata(info, method="average") / n
    return pred


def _assert_same_prediction(a: Prediction | None, b: Prediction | None, exact: bool = True) -> None:
    """Every array equal bit for bit (``exact``), or to 1e-12 (the environment substitute, whose sums the plain
    formulas add in another order); the ranks ``q`` equal either way."""
    assert (a is None) == (b is None)
    if a is None:
        return

    def same(x: np.ndarray, y: np.ndarray, name: Any) -> None:
        if exact or x.dtype == bool:
            assert np.array_equal(x, y), name
        else:
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15, err_msg=str(name))

    for name in ("reference", "decline", "informativeness"):
        same(getattr(a, name), getattr(b, name), name)
    for hl in ("long", "short"):
        x, y = getattr(a, hl), getattr(b, hl)
        for f in ("within", "within_has", "cross", "cross_has", "prior", "posterior", "v_direct", "v_reconstructed",
                  "score"):
            same(getattr(x, f), getattr(y, f), (hl, f))
    if exact:
        assert np.array_equal(a.q, b.q) and all(np.array_equal(getattr(a, h).q, getattr(b, h).q)
                                                for h in ("long", "short"))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["default", "former-default", "paper"])
def test_sampler_choices_equal_those_of_the_plain_prediction(preset, monkeypatch):
    """Two samplers over the same rewards, one predicting with the plain formulas: the same batches every step
    and the same predictions, from the benchmark state (most tasks share the reference) to a late one (most
    tasks observed; 4,500 tasks so the sorts take their large-array paths)."""
    config = {"paper": SchedulerConfig.paper(), "default": SchedulerConfig(),
              "former-default": SchedulerConfig(**FORMER_PIPELINE_DEFAULTS)}[preset]
    g = synthetic_graph(4_500, 90, seed=4)
    tasks = synthetic_tasks(g)
    fast = EnvSchedSampler(tasks, g, config, seed=3, require_dispatch=False)
    plain = EnvSchedSampler(tasks, g, config, seed=3, require_dispatch=False)
    rng = np.random.default_rng(9)
    p = rng.beta(0.6, 0.6, size=len(tasks))
    ids = [t["id"] for t in tasks]
    where = {t: i for i, t in enumerate(ids)}
    for step in range(10):
        with monkeypatch.context() as m:
            m.setattr(sampler_module, "predict", plain_predict)
            expected = plain.sample(64)
            expected_pred = plain.predict()
        assert fast.sample(64) == expected, f"step {step}"
        pred = fast.predict()
        assert pred is None or "q" not in pred.__dict__  # explanation-only: not computed until read
        exact = config.unobserved_neighbours == "reference"
        _assert_same_prediction(pred, expected_pred, exact)
        _assert_same_prediction(pred, plain_predict(fast.history, g, config), exact)
        _assert_same_prediction(pred, predict(plain.history, g, config, relation_operators(g)))
        feed = list(expected)
        if step in (5, 7):  # a late-run state: a third of the pool observed at once
            feed += [tasks[i] for i in rng.choice(len(tasks), 1_500, replace=False)]
        for t in feed:
            rewards = (rng.random(8) < p[where[t["id"]]]).astype(float).tolist()
            fast.update(t, rewards)
            plain.update(t, rewards)
    last = fast.predict()
    assert last.long.history.observed.mean() > 0.5
    if preset == "default":  # the substitute was read: some task's environment estimate is not the reference
        assert last.long.relations.environment is not None
        assert np.abs(last.long.relations.environment - last.reference).max() > 1e-3


@pytest.mark.parametrize("share", [0.02, 0.5, 1.0])
def test_an_aggregate_over_many_observed_tasks_has_the_bits_of_the_columns_copied_out(share):
    # RelationOperator.aggregate multiplies the whole matrix by x spread over the pool (zeros elsewhere) once the
    # observed tasks are 1 / spread_fraction of it, instead of copying their columns out: the same sums, bit for bit
    # (values of both signs, exact zeros and -0.0 among them)
    rng = np.random.default_rng(3)
    n = 2000
    m = sp.random(n, n, density=0.006, random_state=4, format="csc")
    op = RelationOperator.of(m)
    seen = np.flatnonzero(rng.random(n) < share)
    x = rng.normal(size=(seen.size, 7))
    x[::5, 2] = 0.0
    x[1::7, 3] = -0.0
    spread = seen.size * op.spread_fraction >= n
    assert spread == (share > 0.1)
    assert op.aggregate(seen, x).tobytes() == np.asarray(m[:, seen] @ x).tobytes()
