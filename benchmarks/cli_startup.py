"""Start-up time of the command line: ``envsched --help`` and ``import envsched`` (target: under 0.5 s).

Runs each command ``--repeat`` times in a fresh interpreter and prints the median and the minimum wall time
and the median CPU time (user + system; on a shared machine the wall time mostly measures the others' load).
The speed target is checked here, not by a timed assert in the tests (those check that ``--help`` imports no
subcommand and no numpy, which is what makes it fast).

    python benchmarks/cli_startup.py [--repeat 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "envsched --help": [shutil.which("envsched") or "envsched", "--help"],
    "python -c 'import envsched'": [sys.executable, "-c", "import envsched"],
    "envsched run --help": [shutil.which("envsched") or "envsched", "run", "--help"],
    "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
}


def measure(argv: list[str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall times and CPU times (user + system of the child) of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    results = {}
    for name, argv in COMMANDS.items():
        walls, cpus = measure(argv, args.repeat)
        results[name] = {"median_s": statistics.median(walls), "min_s": min(walls),
                         "median_cpu_s": statistics.median(cpus), "runs": len(walls)}
        r = results[name]
        print(f"{name:40s} wall median {r['median_s']:.3f} s, min {r['min_s']:.3f} s; "
              f"CPU median {r['median_cpu_s']:.3f} s")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
