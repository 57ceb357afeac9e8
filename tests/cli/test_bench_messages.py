"""`envsched bench`'s messages say exactly what is missing, and its help counts the samplers the registry has."""

from __future__ import annotations

import re

from click.testing import CliRunner

import envsched.bench.report as report
import envsched.bench.runner as runner
from envsched.cli.main import cli


def test_each_missing_bench_package_is_named_with_what_it_writes(monkeypatch):
    monkeypatch.setattr(report, "has_module", lambda name: name != "pyarrow")  # matplotlib came with another package
    lines = report.missing_bench_outputs()
    assert len(lines) == 1 and "pyarrow" in lines[0] and "Parquet" in lines[0] and "PNG" not in lines[0]
    assert "pip install 'envsched[bench]'" in lines[0]
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
