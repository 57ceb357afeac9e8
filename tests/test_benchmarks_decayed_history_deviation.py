"""benchmarks/decayed_history_deviation.py on the real-outcome replay (tau-bench GPT-4o airline): it compares only
steps after the first fold, the two samplers draw from the same state (identical batches before any difference
can arise), and its summary is what its rows say."""

from __future__ import annotations

import json
import runpy
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
DEV = SimpleNamespace(**runpy.run_path(str(BENCH / "decayed_history_deviation.py"), run_name="decayed_dev"))
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau-bench" / "gpt-4o-airline.json"


@pytest.mark.skipif(not DATA.exists(), reason="the recorded tau-bench episodes are not beside the checkout")
def test_the_tau_bench_replay_compares_the_steps_after_the_first_fold(tmp_path, capsys):
    out = tmp_path / "dev.json"
    assert DEV.main(["--pool", "tau-bench", "--data", str(DATA), "--steps", "45", "--seed", "3",
                     "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    rows, summary = got["rows"], got["summary"]
    assert summary["pool"].startswith("tau-bench GPT-4o airline") and "50 tasks" in summary["pool"]
    # the first fold absorbs at step 20 (DECAYED_WINDOW 16 + 4): nothing earlier is compared
    assert [r["step"] for r in rows] == list(range(20, 45)) and summary["compared_steps"] == 25
    assert all(r["overlap"] * 8 == round(r["overlap"] * 8) and 0 < r["overlap"] <= 1 for r in rows)
    assert summary["overlap_mean"] == pytest.approx(statistics.fmean(r["overlap"] for r in rows))
    assert summary["identical_batches"] == sum(r["overlap"] == 1.0 for r in rows)
    assert summary["spearman_min"] == min(r["spearman"] for r in rows) > 0.5
    assert 0 <= summary["max_abs_informativeness"] < max(r["max_informativeness"] for r in rows)
    assert json.loads(capsys.readouterr().out) == summary
