"""benchmarks/v2_ablation.py: development seeds only, and the v2 gate's configuration with other samplers."""

from __future__ import annotations

import json
import runpy
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
VA = SimpleNamespace(**runpy.run_path(str(ROOT / "benchmarks" / "v2_ablation.py"), run_name="v2_ablation"))


def test_seeds_are_development_seeds_only() -> None:
    assert VA.seed_list("20-29") == list(range(20, 30))
    assert VA.seed_list("3,5,8-9") == [3, 5, 8, 9]
    for text, bad in (("5079-5081", "[5079, 5080, 5081]"), ("1000", "[1000]"), ("20,5119", "[5119]")):
        with pytest.raises(SystemExit, match=r"not development seeds") as err:
            VA.seed_list(text)
        assert bad in str(err.value)
    with pytest.raises(SystemExit, match="give a range"):
        VA.seed_list("twenty")


def test_config_is_the_passed_gate_s_but_for_samplers_and_seeds() -> None:
    gate = json.loads((ROOT / "results" / "v2-gate-2-2026-12-06" / "config.json").read_text())["config"]
    mine = asdict(VA.v2_config(["uniform", "envsched"], [20, 21]))
    assert {k: v for k, v in mine.items() if k not in ("samplers", "seeds")} == \
        {k: v for k, v in gate.items() if k not in ("samplers", "seeds")}
    assert mine["samplers"] == ["uniform", "envsched"] and mine["seeds"] == [20, 21]
    assert mine["sampler_options"] == {}  # untuned: every sampler at its defaults


def test_an_unknown_sampler_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown sampler 'bogus'"):
        VA.main(["--seeds", "20", "--samplers", "envsched,bogus", "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()
