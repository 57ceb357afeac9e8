"""`envsched bench`'s messages say exactly what is missing, and its help counts the samplers the registry has."""

from __future__ import annotations

import re

from click.testing import CliRunner

import envsched_lab.report as report
import envsched_lab.runner as runner
from envsched.cli.main import cli


def test_each_missing_bench_package_is_named_with_what_it_writes(monkeypatch):
    monkeypatch.setattr(report, "has_module", lambda name: name != "pyarrow")  # matplotlib came with another package
    lines = report.missing_bench_outputs()
    assert len(lines) == 1 and "pyarrow" in lines[0] and "Parquet" in lines[0] and "PNG" not in lines[0]
    assert "pip install 'envsched[lab]'" in lines[0]
    monkeypatch.setattr(report, "has_module", lambda name: False)
    assert [("matplotlib" in x, "PNG" in x) for x in report.missing_bench_outputs()] == [(False, False),
                                                                                         (True, True)]
    assert len(report.missing_bench_outputs(plots=False)) == 1  # --no-plots: matplotlib is not needed
    monkeypatch.setattr(report, "has_module", lambda name: True)
    assert report.missing_bench_outputs() == []


def test_help_counts_the_registry_samplers(monkeypatch):
    def count() -> int:
        text = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200).output
        return int(re.search(r"default: all (\d+);", text).group(1))

    n = count()
    assert n == sum(s in runner.available_samplers() for s in runner.DEFAULT_SAMPLERS) >= 12
    from envsched.samplers import registry

    record = registry.SamplerRecord("newcomer-test", "a sampler registered later",
                                    "envsched.samplers.registry:_uniform")
    monkeypatch.setitem(registry.SAMPLERS, "newcomer-test", record)
    monkeypatch.setattr(runner, "DEFAULT_SAMPLERS", (*runner.DEFAULT_SAMPLERS, "newcomer-test"))
    assert count() == n + 1  # one more sampler in the registry: one more in the help


def test_bench_without_the_lab_extra_says_how_to_install_it_in_one_line(monkeypatch, tmp_path):
    from envsched.cli import common

    monkeypatch.setitem(common.EXTRAS, "lab", ("envsched_no_such_module",))
    res = CliRunner().invoke(cli, ["bench", "--quick", "--out", str(tmp_path / "run")])
    assert res.exit_code != 0
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1, res.output
    assert "'lab' extra" in lines[0] and "envsched_no_such_module" in lines[0]
    assert "pip install 'envsched[lab]'" in lines[0]
    assert not (tmp_path / "run").exists()


def test_summary_tables_never_split_a_word(monkeypatch):
    """At any width a table either fits with every word whole or is printed one block per sampler."""
    from types import SimpleNamespace

    from rich.console import Console

    import envsched_lab.cli as lab_cli
    import envsched_lab.report as report

    head = ["sampler", "signal/episode", "signal/cost", "envs/batch", "tools/batch", "held-out@40", "vs uniform@40",
            "exploitation/hit-rate"]
    rows = [["envsched-paper", "0.1234", "0.0567", "31.20", "40.10", "27.75 ± 3.10", "+4.50 [+3.32, +5.68]*",
             "0.812"],
            ["oracle-variance", "0.4567", "0.2345", "33.10", "41.20", "32.25 ± 2.90", "-", "-"]]
    monkeypatch.setattr(report, "summary_tables", lambda summary, cfg: [("efficiency", head, rows)])
    cfg = SimpleNamespace(seeds=[0, 1], steps=40, batch_size=64, group_size=8)
    words = {w for text in (*head[1:], *(c for r in rows for c in r)) for w in text.split()}
    for width in (60, 80, 100, 140):
        console = Console(width=width, record=True, color_system=None)
        lab_cli._print_summary(console, {"coldstart": {}, "learner": "simulated learner"}, cfg)
        out = console.export_text()
        assert all(w in out for w in words), (width, out)
        assert max(len(line) for line in out.splitlines()) <= width
    assert lab_cli._fits_unbroken(head, rows, 140) and not lab_cli._fits_unbroken(head, rows, 80)
