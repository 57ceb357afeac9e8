"""benchmarks/ablation_table.py: the paired difference per seed, the verdict's direction for an ablation (removes
a component) and a variant (adds one back), folders merged without a sampler given twice."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
AT = SimpleNamespace(**runpy.run_path(str(BENCH / "ablation_table.py"), run_name="ablation_table"))


def _write(folder: Path, finals: dict[str, list[float]]) -> Path:
    """A run folder whose samplers end at the given held-out scores (seed i: finals[i]), two steps each."""
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as fh:
        for sampler, values in finals.items():
            for seed, value in enumerate(values):
                for step in (1, 0):  # out of order on disk: the loader sorts by step
                    fh.write(json.dumps({"sampler": sampler, "seed": seed, "step": step,
                                         "heldout": value if step else value - 5.0,
                                         "batch_variance": 0.02 if sampler == "uniform" else 0.03,
                                         "envs_covered": 10.0}) + "\n")
    return folder


def test_rows_pair_by_seed_and_name_the_direction(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", {"envsched": [20.0, 22.0, 21.0, 23.0], "uniform": [18.0, 19.5, 18.5, 20.0],
                                "envsched-with-calibration": [21.0, 23.2, 22.1, 24.0]})
    b = _write(tmp_path / "b", {"envsched-caps-always": [19.0, 21.1, 19.9, 22.0],
                                "envsched-with-decline": [20.1, 21.8, 21.2, 22.9],
                                "envsched-shuffled-graph": [20.0, 22.0, 21.0, 23.0]})
    rows = {r["sampler"]: r for r in AT.ablation_rows(AT.load_folders([a, b]))}
    assert list(rows) == ["envsched", "uniform", "envsched-with-calibration", "envsched-with-decline",
                          "envsched-shuffled-graph", "envsched-caps-always"]
    assert rows["envsched"]["held-out"] == "21.50" and rows["uniform"]["verdict"] == "envsched better"
    # envsched minus the variant that adds the calibration: below zero, so adding it helps
    assert rows["envsched-with-calibration"]["envsched minus it"].startswith("-1.08 [")  # mean of -1, -1.2, -1.1, -1
    assert rows["envsched-with-calibration"]["verdict"] == "adding it helps"
    # an ablation that removes the caps' rule: envsched is above it, so the rule earns its place
    assert rows["envsched-caps-always"]["verdict"] == "earns its place"
    assert rows["envsched-with-decline"]["verdict"] == "not detected"
    assert rows["envsched-shuffled-graph"]["verdict"] == "identical on every seed"
    assert rows["envsched"]["batch variance vs uniform"] == "+50 %"
    with pytest.raises(SystemExit, match="'uniform' is in both"):
        AT.load_folders([a, _write(tmp_path / "c", {"uniform": [1.0]})])
    with pytest.raises(SystemExit, match="has no 'uniform' runs"):
        AT.ablation_rows(AT.load_folders([b]) | {"envsched": {0: []}})
