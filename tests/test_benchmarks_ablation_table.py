"""benchmarks/ablation_table.py: the paired difference per seed, the verdict's direction for an ablation (removes
a component) and a variant (adds one back), folders merged without a sampler given twice."""

from __future__ import annotations

import gzip
import json
import runpy
import shutil
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


def _write_steps(folder: Path, scores: dict[str, list[list[float]]], targets: dict[str, tuple[float, int, int]]
                 ) -> Path:
    """A run folder whose samplers score ``scores[sampler][seed][step - 1]`` at steps 1, 2, 3 (v2's endpoints
    are steps inside a run, not its end), with a ``summary.json`` of steps to uniform's best score."""
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as fh:
        for sampler, per_seed in scores.items():
            for seed, values in enumerate(per_seed):
                for step, value in enumerate(values, start=1):
                    fh.write(json.dumps({"sampler": sampler, "seed": seed, "step": step, "heldout": value,
                                         "batch_variance": 0.04 if sampler == "uniform" else 0.05,
                                         "envs_covered": 20.0 if sampler == "uniform" else 15.0}) + "\n")
    summary = {"samplers": {s: {"steps_to_target": {"mean": mean, "std": 0.0, "n": reached},
                                "target_missed": missed} for s, (mean, reached, missed) in targets.items()}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_steps_margin_and_targets(tmp_path: Path) -> None:
    base = [[10.0, 20.0, 30.0], [12.0, 22.0, 33.0], [11.0, 21.0, 31.0], [13.0, 24.0, 35.0]]
    folder = _write_steps(tmp_path / "v2", {
        "envsched": base,
        "uniform": [[v - d for v, d in zip(r, (0.0, 3.0, 5.0), strict=True)] for r in base],
        # at step 2 about 3 points below the default on every seed; at step 3 within 0.1 of it
        "envsched-no-graph": [[r[0], r[1] - 3.0 - 0.1 * i, r[2] + 0.05 * (-1) ** i] for i, r in enumerate(base)],
        # spread far beyond the margin around a mean difference of 0
        "envsched-with-decline": [[r[0], r[1], r[2] + s] for r, s in zip(base, (5.0, -5.0, 4.0, -4.0), strict=True)],
    }, {"uniform": (100.0, 4, 0), "envsched": (60.0, 3, 1), "envsched-no-graph": (0.0, 0, 4)})
    out = tmp_path / "table.json"
    AT.main([str(folder), "--steps", "3,2", "--margin", "2", "--name", "v2", "--out", str(out)])
    table = json.loads(out.read_text())
    assert table["columns"] == ["sampler", "component", "held-out@2", "envsched minus it @2", "verdict @2",
                                "held-out@3", "envsched minus it @3", "verdict @3", "steps to uniform's best",
                                "batch variance vs uniform", "envs/batch vs uniform"]
    assert table["align"][4] == "left" and table["align"][3] == "right"
    rows = {r["sampler"]: r for r in table["records"]}
    assert rows["envsched"]["held-out@2"] == "21.75" and rows["envsched"]["held-out@3"] == "32.25"
    assert rows["uniform"]["envsched minus it @2"] == "+3.00 [+3.00, +3.00] (n=4)"
    assert rows["uniform"]["verdict @3"] == "envsched better"
    assert rows["envsched-no-graph"]["envsched minus it @2"].startswith("+3.15 [")
    assert rows["envsched-no-graph"]["verdict @2"] == "earns its place"
    assert rows["envsched-no-graph"]["verdict @3"] == "equivalent (±2)"
    assert rows["envsched-with-decline"]["verdict @2"] == "identical on every seed"
    assert rows["envsched-with-decline"]["verdict @3"] == "not detected"
    assert rows["envsched"]["steps to uniform's best"] == "60 (missed 1/4)"
    assert rows["envsched-no-graph"]["steps to uniform's best"] == "never (missed 4/4)"
    assert rows["envsched-with-decline"]["steps to uniform's best"] == "-"
    assert rows["envsched"]["batch variance vs uniform"] == "+25 %"
    assert rows["envsched"]["envs/batch vs uniform"] == "-25 %"
    # without a margin nothing is called equivalent
    plain = {r["sampler"]: r for r in AT.ablation_rows(AT.load_folders([folder]), steps=[3])}
    assert plain["envsched-no-graph"]["verdict @3"] == "not detected"


def test_steps_refuse_a_step_a_run_lacks(tmp_path: Path) -> None:
    folder = _write_steps(tmp_path / "v2", {"envsched": [[1.0, 2.0]] * 2, "uniform": [[1.0, 2.0]] * 2}, {})
    with pytest.raises(SystemExit, match="envsched seed 0: no record of step 3"):
        AT.ablation_rows(AT.load_folders([folder]), steps=[3])
    with pytest.raises(SystemExit, match="--steps 'x'"):
        AT.main([str(folder), "--steps", "x", "--name", "v2", "--out", str(tmp_path / "never.json")])
    with pytest.raises(SystemExit, match="--margin must be"):
        AT.ablation_rows(AT.load_folders([folder]), steps=[2], margin=-1.0)
    assert not (tmp_path / "never.json").exists()


def test_a_compressed_folder_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain = _write(tmp_path / "plain", {"envsched": [20.0, 22.0, 21.0], "uniform": [18.0, 19.5, 18.5],
                                        "envsched-no-graph": [19.0, 21.0, 21.5]})
    packed = tmp_path / "packed"
    packed.mkdir()
    with (plain / "metrics.jsonl").open("rb") as src, gzip.open(packed / "metrics.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    rows = AT.ablation_rows(AT.load_folders([packed]))
    assert rows == AT.ablation_rows(AT.load_folders([plain]))
    assert rows[2]["envsched minus it"].startswith("+0.50 [")
    with pytest.raises(SystemExit, match=r"metrics\.jsonl does not exist"):
        AT.load_folders([tmp_path])
