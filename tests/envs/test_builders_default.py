"""Corpus registry, combined pool, the bundled default/benchmark pool (with its cache) and `envsched pool build`."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from envsched.cli.main import cli
from envsched.envs import bfcl as bfcl_module
from envsched.envs import default_pool as default_module
from envsched.envs.base import EnvironmentUnavailable
from envsched.envs.builders import CORPORA, available_corpora, build_combined_pool, build_corpus, prefix_envs
from envsched.envs.default_pool import default_pool, default_pool_path
from envsched.pool import TaskPool

TAU2 = Path("/work/shared/data/tau2-bench")
ACE = Path("/work/shared/data/acebench")
HAS_BFCL = bfcl_module.bfcl_available()
HAS_DATA = TAU2.is_dir() and ACE.is_dir()


def test_registry() -> None:
    assert list(CORPORA) == ["bfcl", "reasoning_gym", "tau2", "acebench"]
    assert CORPORA["tau2"].needs_data_dir and not CORPORA["reasoning_gym"].needs_data_dir
    assert "reasoning_gym" in available_corpora()
    assert "tau2" not in available_corpora() and "tau2" in available_corpora({"tau2": TAU2})
    with pytest.raises(ValueError, match="unknown corpus 'gsm8k'"):
        build_corpus("gsm8k")
    with pytest.raises(ValueError, match="give data_dir"):
        build_corpus("tau2")
    with pytest.raises(ValueError, match="takes no data folder"):
        build_corpus("reasoning_gym", data_dir="/tmp")
    assert prefix_envs([{"id": "a", "env": "x"}], "c")[0]["env"] == "c/x"


@pytest.mark.skipif(not HAS_DATA, reason="shared data folder not present")
def test_combined_pool_keeps_every_environment_apart() -> None:
    corpora = ["reasoning_gym", "tau2", "acebench"] + (["bfcl"] if HAS_BFCL else [])
    pool = build_combined_pool(corpora, data_dirs={"tau2": TAU2, "acebench": ACE},
                               options={"reasoning_gym": {"datasets": ["gcd", "chain_sum"], "tasks_per_dataset": 5},
                                        "bfcl": {"categories": ["base"], "limit": 20}})
    by_env = pool.summary()["by_env"]
    assert by_env["tau2/retail"] == 114 and by_env["acebench/Travel"] == 10
    assert by_env["reasoning_gym/gcd"] == 5 and by_env["reasoning_gym/chain_sum"] == 5
    assert all(e.split("/", 1)[0] in CORPORA for e in pool.envs)
    assert [s["index"] for s in pool] == list(range(len(pool)))
    assert len(pool) == 184 + 50 + 10 + (20 if HAS_BFCL else 0)
    assert len(pool.envs) == 3 + 4 + 2 + (len({s["env"] for s in pool if s["env"].startswith("bfcl/")}))
    with pytest.raises(ValueError, match="give data_dir"):
        build_combined_pool(["tau2"])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_BFCL, reason="needs bfcl-eval")
def test_bundled_pool_is_the_paper_size(bundled_pool: TaskPool, bundled_pool_cache: Path) -> None:
    assert len(bundled_pool) == 2550 and len(bundled_pool.envs) == 51
    corpus = Counter(e.split("/", 1)[0] for e in bundled_pool.envs)
    assert corpus == {"bfcl": 8, "reasoning_gym": 43}
    by_corpus = Counter(s["env"].split("/", 1)[0] for s in bundled_pool)
    assert by_corpus == {"bfcl": 800, "reasoning_gym": 1750}
    assert all(v == 0 for v in bundled_pool.missing_fields().values())
    path = default_pool_path(cache=bundled_pool_cache)
    assert path.is_file() and path.name.startswith("default-bfcl+rg-")
    again = default_pool(cache=bundled_pool_cache)  # read back from the cache
    assert again.fingerprint() == bundled_pool.fingerprint()


def test_default_pool_cache_mechanics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []

    def small(*, seed: int = 0, on_progress=None) -> TaskPool:
        builds.append(seed)
        from envsched.envs.reasoning_gym import build_reasoning_gym_pool
        return TaskPool(build_reasoning_gym_pool(["gcd"], tasks_per_dataset=3, seed=seed), name="small")

    monkeypatch.setattr(default_module, "benchmark_pool", small)
    monkeypatch.setenv("ENVSCHED_CACHE_DIR", str(tmp_path / "c"))
    first = default_pool()
    path = default_pool_path()
    assert path.parent == tmp_path / "c" / "pools" and path.is_file() and builds == [0]
    assert default_pool().fingerprint() == first.fingerprint() and builds == [0]  # cached: no rebuild
    assert not list(path.parent.glob("*.tmp"))  # atomic write leaves no temporary file
    # a new format version (or package version) is a new cache file, rebuilt
    monkeypatch.setattr(default_module, "POOL_FORMAT_VERSION", default_module.POOL_FORMAT_VERSION + 1)
    assert default_pool_path() != path
    default_pool()
    assert builds == [0, 0]
    # a corrupt cache file is rebuilt, with a warning
    newest = default_pool_path()
    newest.write_text("{not json\n")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert default_pool().fingerprint() == first.fingerprint()
    assert builds == [0, 0, 0]
    assert default_pool(seed=1).fingerprint() != first.fingerprint()


@pytest.mark.slow
def test_without_bfcl_the_bundled_pool_falls_back_to_reasoning_gym(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bfcl_module, "bfcl_available", lambda: False)
    with pytest.warns(RuntimeWarning, match=r"bfcl-eval is not installed.*pip install --no-deps bfcl-eval"):
        pool = default_module.benchmark_pool()
    assert len(pool) == 2550 and len(pool.envs) == 51
    assert all(e.startswith("reasoning_gym/") for e in pool.envs)
    assert set(Counter(s["env"] for s in pool).values()) == {50}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(EnvironmentUnavailable, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
            default_module.benchmark_pool(require_bfcl=True)


@pytest.mark.skipif(not HAS_DATA, reason="shared data folder not present")
def test_cli_pool_build(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "tau2.jsonl"
    res = runner.invoke(cli, ["pool", "build", "tau2", "--data-dir", str(TAU2), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["tasks"] == 184 and summary["by_env"]["retail"] == 114
    assert len(TaskPool.from_file(out)) == 184
    out2 = tmp_path / "rg.json"
    res = runner.invoke(cli, ["pool", "build", "reasoning_gym", "--datasets", "gcd,lcm", "--tasks-per-dataset",
                              "4", "--tiers", "2", "--out", str(out2)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "gcd" in res.output
    loaded = TaskPool.from_file(out2)
    assert len(loaded) == 8 and {s["difficulty"] for s in loaded} == {0, 1}
    res = runner.invoke(cli, ["pool", "build", "acebench", "--data-dir", str(tmp_path / "missing"), "--out",
                              str(tmp_path / "a.jsonl")])
    assert res.exit_code == 1 and "ACEBench folder not found" in res.output
    assert not (tmp_path / "a.jsonl").exists()
    res = runner.invoke(cli, ["pool", "build", "tau2", "--out", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "--data-dir" in res.output
    res = runner.invoke(cli, ["pool", "build", "reasoning_gym", "--out", str(tmp_path / "x.csv")])
    assert res.exit_code == 2 and ".jsonl or .json" in res.output
    res = runner.invoke(cli, ["pool", "build", "reasoning_gym", "--datasets", "nope", "--out",
                              str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and "unknown reasoning-gym dataset 'nope'" in res.output
