"""Every script in examples/ has a test here that runs it (CI runs them all, the slow ones included)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_example_script_has_a_test_that_runs_it():
    scripts = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))
    assert len(scripts) >= 7
    here = Path(__file__).parent
    missing = [s for s in scripts if not (here / f"test_{s}.py").is_file()
               or f'run_example("{s}"' not in (here / f"test_{s}.py").read_text()]
    assert not missing, f"examples without a test that runs them: {missing}"
