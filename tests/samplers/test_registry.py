"""The one sampler registry: every reader (CLI, benchmark, tuning, store) sees the same names, and a sampler
added as one file of code plus one registry entry passes the protocol checks and resumes from a store with no
other edit."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from envsched.pool.pool import TaskPool
from envsched.samplers import registry
from envsched.samplers.base import BaseSampler
from envsched.store import DurableSampler, HistoryStore, StoreError
from envsched.testing import check_sampler

THROWAWAY = textwrap.dedent('''
    """A sampler only the registry test knows: a rotating cursor plus random draws, with state of its own."""
    from envsched.samplers.base import BaseSampler


    class ThrowAwaySampler(BaseSampler):
        def __init__(self, tasks, seed=0, *, stride=3, reward_range=None, require_dispatch=True):
            super().__init__(tasks, seed=seed, reward_range=reward_range, require_dispatch=require_dispatch)
            self.stride = stride
            self.cursor = 0
            self.seen = 0

        def _select(self, n):
            picks = self._rng.choice(len(self.tasks), size=n, replace=False).tolist()
            first = (self.cursor * self.stride) % len(self.tasks)
            if first not in picks:
                picks[0] = first
            self.cursor += 1
            return picks

        def _select_checkpoint(self):
            return self.cursor

        def _select_rollback(self, checkpoint):
            self.cursor = checkpoint

        def _observe(self, group):
            self.seen += len(group.scored)

        def _extra_state(self):
            return {"cursor": self.cursor, "seen": self.seen}

        def _load_extra_state(self, extra):
            cursor, seen = extra.get("cursor", 0), extra.get("seen", 0)
            if not isinstance(cursor, int) or not isinstance(seen, int) or cursor < 0 or seen < 0:
                raise ValueError("bad throw-away state")
            self.cursor, self.seen = cursor, seen


    def make_throwaway(pool, *, seed, group_size, **options):
        return ThrowAwaySampler(pool, seed=seed, **options)
''')


@pytest.fixture
def throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """One file of code (a module on the path) and one registry entry; the registry is restored after."""
    (tmp_path / "throwaway_sampler.py").write_text(THROWAWAY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "SAMPLERS", dict(registry.SAMPLERS))
    monkeypatch.delitem(sys.modules, "throwaway_sampler", raising=False)
    registry.register_sampler("throwaway", "a sampler only this test knows", "throwaway_sampler:make_throwaway",
                              sampler_class="throwaway_sampler:ThrowAwaySampler")
    return "throwaway"


def _pool(n: int = 24) -> TaskPool:
    return TaskPool([{"id": f"t{i}", "env": f"e{i % 3}", "prompt": f"task {i}"} for i in range(n)])


def test_a_registered_sampler_passes_the_protocol_checks_and_resumes_from_a_store(throwaway: str,
                                                                                 tmp_path: Path) -> None:
    check_sampler(lambda pool, seed: registry.make_sampler(throwaway, pool, seed=seed, group_size=4))

    pool = _pool()
    path = tmp_path / "h.sqlite"
    durable = DurableSampler(registry.make_sampler(throwaway, pool, seed=5, stride=5), path, group_size=4)
    for step in range(6):
        batch = durable.sample(4)
        for i, task in enumerate(batch):
            if i == 3 and step % 2:
                durable.discard(task)
            else:
                durable.update(task, [1.0, 0.0, float(step % 2), None])
    durable.close()
    reference = registry.make_sampler(throwaway, pool, seed=5, stride=5)
    again = DurableSampler.resume(path)  # constructed from the store's record alone: class, stride, tasks
    assert type(again.sampler).__name__ == "ThrowAwaySampler" and again.sampler.stride == 5
    assert again.sampler.seen == 6 * 4 * 3 - 3 * 3  # every scored reward of every reported group
    # the resumed sampler draws what an uninterrupted one would: replay the same calls on a fresh one
    replay = DurableSampler(reference, tmp_path / "h2.sqlite", group_size=4)
    for step in range(6):
        batch = replay.sample(4)
        for i, task in enumerate(batch):
            if i == 3 and step % 2:
                replay.discard(task)
            else:
                replay.update(task, [1.0, 0.0, float(step % 2), None])
    assert [t["id"] for t in again.sample(4)] == [t["id"] for t in replay.sample(4)]
    assert again.state_dict()["extra"] == replay.state_dict()["extra"]
    again.close()
    replay.close()


def test_without_its_registry_entry_the_store_refuses_the_class(throwaway: str, tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    DurableSampler(registry.make_sampler(throwaway, _pool(), seed=1), path).close()
    del registry.SAMPLERS[throwaway]
    with pytest.raises(StoreError, match="not a registered envsched sampler class"):
        DurableSampler.resume(HistoryStore(path))


@pytest.mark.parametrize("name", sorted(n for n, r in registry.SAMPLERS.items()
                                        if r.sampler_class != "envsched.method.sampler:EnvSchedSampler"))
def test_every_sampler_saves_and_restores_its_construction_record(name: str) -> None:
    pool = _pool()
    sampler = registry.make_sampler(name, pool, seed=3, group_size=4)
    record = sampler.to_record()
    assert record["sampler_class"] == registry.SAMPLERS[name].sampler_class
    assert record["params_rebuildable"] is True and record["num_tasks"] == len(pool)
    assert record["pool_fingerprint"] == pool.fingerprint()
    rebuilt = type(sampler).from_record(list(pool), record, graph=None, workers=1)
    assert rebuilt.to_record() == record
    assert [t["id"] for t in rebuilt.sample(5)] == [t["id"] for t in sampler.sample(5)]


def test_every_registered_class_is_resumable_and_only_those() -> None:
    classes = registry.sampler_classes()
    assert {r.sampler_class for r in registry.SAMPLERS.values()} <= set(classes)
    assert "envsched.samplers.simple:SequentialSampler" in classes  # resumable, not listed (needs its seeds)
    for name in classes:
        cls = registry.lookup(name)
        assert isinstance(cls, type) and issubclass(cls, BaseSampler), name
    assert classes["envsched.method.sampler:EnvSchedSampler"] == registry.SAMPLERS["envsched"].restore != ""


def test_variants_build_through_their_record_and_names_are_unique() -> None:
    registry.register_sampler("uniform-twice", "uniform with a variant", "envsched.samplers.registry:_uniform",
                              variants=(registry.SamplerVariant("uniform-variant", "a variant", {}),))
    try:
        record, variant = registry.resolve("uniform-variant")
        assert record.name == "uniform-twice" and variant.name == "uniform-variant"
        names = list(registry.benchmark_samplers())
        assert len(names) == len(set(names)) and "uniform-variant" in names
        assert set(registry.available_samplers()) < set(names)
        assert "uniform-ds" in names and "uniform-ds" not in registry.available_samplers()  # benchmark only
        with pytest.raises(ValueError, match="already registered"):
            registry.register_sampler("uniform-variant", "a clash", "envsched.samplers.registry:_uniform")
    finally:
        registry.SAMPLERS.pop("uniform-twice")
    with pytest.raises(ValueError, match="module:attribute"):
        registry.register_sampler("bad-target", "no colon", "envsched.samplers.registry._uniform")
    with pytest.raises(ValueError, match="unknown sampler 'no-such'"):
        registry.make_sampler("no-such", _pool())


def test_the_benchmark_the_tuning_and_the_cli_read_the_registry() -> None:
    from envsched.cli import run
    from envsched_lab import runner, tuning, variants

    bench = runner.available_samplers()
    assert list(bench)[:len(registry.benchmark_samplers())] == list(registry.benchmark_samplers())
    from envsched_lab.oracles import LAB_SAMPLERS

    lab_names = {v.name for v in variants.ENVSCHED_LAB_VARIANTS} | set(variants.ENVSCHED_CONTROLS) | set(LAB_SAMPLERS)
    assert {"oracle-variance", "oracle-coverage"} <= set(LAB_SAMPLERS)
    assert set(bench) - set(registry.benchmark_samplers()) == lab_names
    assert set(run.SAMPLER_NAMES) == set(registry.available_samplers())
    assert set(tuning.TUNING_SPACES) <= set(bench)
    # the library lists samplers a user would choose; the ablations and controls are the lab's
    assert not lab_names & set(registry.benchmark_samplers())
    assert tuple(v.name for v in variants.ENVSCHED_LAB_VARIANTS) == variants.ENVSCHED_ABLATIONS
    pool = _pool()
    for name in ("uniform", "uniform-ds", "curriculum", "plr"):
        a = runner.make_bench_sampler(name, pool, seed=2, batch_size=4, group_size=4)
        b = registry.make_sampler(name, pool, seed=2, group_size=4)
        assert type(a) is type(b) and a.get_params() == b.get_params()
        assert [t["id"] for t in a.sample(4)] == [t["id"] for t in b.sample(4)]
    with pytest.raises(ValueError, match="unknown sampler 'nope'; choose from: uniform, uniform-ds"):
        runner.make_bench_sampler("nope", pool, seed=0)
    with pytest.raises(ValueError, match="unknown sampler"):
        tuning.tune(["nope"], pool=pool, trials=1, steps=1)


def test_envsched_bench_configuration_is_the_one_it_always_was() -> None:
    """The benchmark builds EnvSched through the registry's factory; its SchedulerConfig is still the preset
    with the benchmark's batch size, the variant's overrides and the options, unread knobs reset."""
    pytest.importorskip("envsched.method.sampler")
    from envsched.method.config import SchedulerConfig
    from envsched_lab import runner

    pool = _pool(30)
    # exploitation_rule is unread by the default (read only by the signal-probability score): reset
    tuned: dict[str, Any] = {"exposure_power": 0.2, "decline_penalty": 0.3, "exploitation_rule": "thompson"}
    s = runner.make_bench_sampler("envsched", pool, seed=1, batch_size=6, group_size=4, options=tuned)
    expected = SchedulerConfig.without_unread({**SchedulerConfig().to_dict(), "batch_size": 6,
                                               "rollouts_per_task": 4, **tuned})
    assert s.config == expected and s.config.exploitation_rule == SchedulerConfig().exploitation_rule
    assert s.config.decline_penalty == 0.3  # read by the default's variance prediction
    tuned = {"exposure_power": 0.2, "decline_penalty": 0.3}
    p = runner.make_bench_sampler("envsched-paper", pool, seed=1, batch_size=6, group_size=4, options=tuned)
    assert p.config == SchedulerConfig.paper(batch_size=6, rollouts_per_task=4, **tuned)
    assert (s.config.use_within_edges, s.config.use_cross_edges) == (True, True)  # the default's graph prior
    a = runner.make_bench_sampler("envsched-no-within", pool, seed=1, batch_size=6, group_size=4)
    assert a.config.use_within_edges is False and a.config.use_cross_edges is True and a.config.batch_size == 6
    g = runner.make_bench_sampler("envsched-no-graph", pool, seed=1, batch_size=6, group_size=4)
    assert (g.config.use_within_edges, g.config.use_cross_edges) == (False, False)
    f = runner.make_bench_sampler("envsched-former-default", pool, seed=1, batch_size=6, group_size=4)
    assert (f.config.use_within_edges, f.config.use_cross_edges, f.config.use_calibration) == (True, True, True)
    assert f.config.decline_penalty == 0.25 and not f.config.is_paper
    from envsched.method.config import FORMER_PIPELINE_DEFAULTS
    from envsched_lab.variants import resolve_bench
    assert dict(resolve_bench("envsched-former-default")[1].options) == FORMER_PIPELINE_DEFAULTS
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['preset'\]"):
        runner.make_bench_sampler("envsched", pool, seed=1, options={"preset": "paper"})
