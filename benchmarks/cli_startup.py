"""Start-up time of the command line: ``envsched --help`` and ``import envsched`` (target: under 0.5 s).

Runs each command ``--repeat`` times in a fresh interpreter and prints the median and the minimum wall time.
The speed target is checked here, not by a timed assert in the tests (those check that ``--help`` imports no
subcommand and no numpy, which is what makes it fast).

    python benchmarks/cli_startup.py [--repeat 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "envsched --help": [shutil.which("envsched") or "envsched", "--help"],
    "python -c 'import envsched'": [sys.executable, "-c", "import envsched"],
    "envsched run --help": [shutil.which("envsched") or "envsched", "run", "--help"],
}


def measure(argv: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    results = {}
    for name, argv in COMMANDS.items():
        times = measure(argv, args.repeat)
        results[name] = {"median_s": statistics.median(times), "min_s": min(times), "runs": len(times)}
        print(f"{name:32s} median {results[name]['median_s']:.3f} s   min {results[name]['min_s']:.3f} s")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
