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
