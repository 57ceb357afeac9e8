"""The benchmark's figures: written from per-step records, for any mix of samplers and seeds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from envsched_lab.report import _plots

KEYS = ("heldout", "heldout_a", "heldout_b", "score", "batch_variance", "envs_covered", "tools_covered",
        "signal_per_episode")


def _records(samplers: list[str], seeds: int, steps: int = 12) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for i, s in enumerate(samplers):
        for seed in range(seeds):
            for t in range(1, steps + 1):
                rec = {"sampler": s, "seed": seed, "step": t, "rollouts": 512 * t, "cum_cost": 700.0 * t}
                rec.update({k: 30 + 0.1 * i * t + seed + float(rng.normal(0, 0.2)) for k in KEYS})
                out.append(rec)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("samplers", "seeds"), [
    (["uniform", "plr", "envsched", "envsched-paper", "envsched-no-cross", "envsched-coverage-only"], 3),
    (["uniform", "envsched-no-within"], 1),  # only an ablation besides uniform; one seed: no interval
])
def test_every_figure_is_written(tmp_path, samplers, seeds):
    files = _plots(tmp_path, _records(samplers, seeds), SimpleNamespace(samplers=samplers, group_size=8))
    assert files[0] == "heldout_vs_uniform.png"  # the main figure first
    assert set(files) == {"heldout_vs_uniform.png", "heldout_vs_rollouts.png", "heldout_parts.png",
                          "heldout_vs_cost.png", "score_vs_rollouts.png", "batch_variance.png", "coverage.png",
                          "signal_per_episode.png"}
    for f in files:
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_paired_figure_without_uniform(tmp_path):
    files = _plots(tmp_path, _records(["plr", "greso"], 2), SimpleNamespace(samplers=["plr", "greso"], group_size=8))
    assert "heldout_vs_uniform.png" not in files and "heldout_vs_rollouts.png" in files
