"""benchmarks/long_run.py runs end to end at a tiny size (both parts, every sampler, in this process) and
reports what it says it does: a row per checkpoint step and per state, medians over the stated windows."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "long_run.py"


@pytest.mark.slow
def test_quick_run_at_a_tiny_size(tmp_path, capsys):
    lr = SimpleNamespace(**runpy.run_path(str(SCRIPT), run_name="long_run"))
    out = tmp_path / "lr.json"
    assert lr.main(["--quick", "--sizes", "100", "--at", "3", "6", "--window", "4", "--scale-sizes", "100",
                    "--steady-steps", "8", "--steps", "2", "--warmup", "1", "--in-process", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    longs = [r for r in data["rows"] if r["part"] == "long"]
    assert [(r["sampler"], r["step"], r["window"]) for r in longs] == [
        ("envsched-default", 3, 3), ("envsched-default", 6, 4), ("envsched-paper", 3, 3), ("envsched-paper", 6, 4)]
    for r in longs:
        assert r["min_step_s"] <= r["median_step_s"] <= r["max_step_s"]
        assert r["state_json_bytes"] > 0 and r["rss_peak_mib"] > 0 and 0 < r["observed_fraction"] <= 1
    scales = [r for r in data["rows"] if r["part"] == "scale"]
    assert [(r["sampler"], r["state"], r["steps_before"]) for r in scales] == [
        (name, state, before) for name in ("envsched-default", "envsched-paper", "uniform", "mopps", "plr")
        for state, before in (("benchmark", 1), ("steady", 8))]
    assert all(r["steps_timed"] == 2 for r in scales)
    assert "median step" in capsys.readouterr().out
    assert lr.default_steady_steps(2_550) == 200 and lr.default_steady_steps(100_000) == 1000
    # --markdown renders the long rows of saved runs as docs/performance.md's table, sorted, running nothing
    assert lr.main(["--markdown", str(out)]) == 0
    long_table, scale_table = (t.splitlines() for t in capsys.readouterr().out.strip().split("\n\n"))
    table = long_table
    assert table[0].startswith("| tasks | preset | after step |") and len(table) == 2 + len(longs)
    assert scale_table[0].startswith("| tasks | sampler | state | after steps |")
    assert len(scale_table) == 2 + len(scales)
    first_scale = scales[0]  # envsched-default's benchmark state: default sorts before mopps, paper, plr, uniform
    assert scale_table[2] == (f"| 100 | default | benchmark | 1 | {first_scale['observed_fraction']:.0%} | "
                              f"{first_scale['median_step_s'] * 1e3:.1f} ms ({first_scale['min_step_s'] * 1e3:.1f} ms, "
                              f"{first_scale['max_step_s'] * 1e3:.1f} ms) | {first_scale['rss_current_mib']:.0f} "
                              f"({first_scale['rss_peak_mib']:.0f}) MiB |")
    assert [line.split(" | ")[1:3] for line in scale_table[2:4]] == [["default", "benchmark"], ["default", "steady"]]
    first = longs[0]
    assert table[2].startswith(f"| 100 | default | 3 | {first['observed_fraction']:.0%} | "
                               f"{first['median_step_s'] * 1e3:.1f} ms ({first['median_step_cpu_s'] * 1e3:.1f} ms) |")
    assert [line.split(" | ")[1] for line in table[2:]] == ["default", "default", "paper", "paper"]
