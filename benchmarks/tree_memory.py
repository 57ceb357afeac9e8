"""Peak memory of a whole process tree (a process and every child it forks), sampled once a second.

``ru_maxrss`` covers one process; the graph build also runs abstraction worker processes, and RSS counts
pages shared between parent and workers twice. This samples the proportional set size (PSS, from
``/proc/PID/smaps_rollup``: shared pages split between the processes that map them) of every process in
the tree and reports the largest sum seen, with its per-process breakdown. Linux only.

    python benchmarks/tree_memory.py --json mem.json -- python benchmarks/bench_graph.py --sizes 1000000:10000
    python benchmarks/tree_memory.py --pid 1234 --json mem.json      # watch a running process instead
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        out.setdefault(ppid, []).append(int(name))
    return out


def _tree(root: int) -> list[int]:
    kids, todo, out = _children(), [root], []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def watch(root: int, alive: Callable[[], bool], interval_s: float = 1.0) -> dict:
    """Sample the tree under ``root`` while ``alive()``; returns the peak and its breakdown."""
    peak: dict = {"peak_tree_pss_mib": 0.0, "parts_mib": {}, "samples": 0, "interval_s": interval_s}
    start = time.perf_counter()
    while alive():
        parts = {pid: _pss_mib(pid) for pid in _tree(root)}
        total = sum(parts.values())
        peak["samples"] += 1
        if total > peak["peak_tree_pss_mib"]:
            peak.update(peak_tree_pss_mib=round(total, 1), at_s=round(time.perf_counter() - start, 1),
                        parts_mib={str(p): round(v, 1) for p, v in parts.items() if v >= 1})
        time.sleep(interval_s)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, default=None, help="watch this running process instead of a command")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... to run and watch")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if (args.pid is None) == (not cmd):
        ap.error("give either --pid PID or -- COMMAND")
    if args.pid is not None:
        if not os.path.exists(f"/proc/{args.pid}"):
            ap.error(f"no process {args.pid}")
        result = watch(args.pid, lambda: os.path.exists(f"/proc/{args.pid}"), args.interval)
        result["watched"] = f"pid {args.pid}"
        rc = 0
    else:
        proc = subprocess.Popen(cmd)
        result = watch(proc.pid, lambda: proc.poll() is None, args.interval)
        result["watched"] = " ".join(cmd)
        rc = proc.wait()
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    sys.exit(rc)


if __name__ == "__main__":
    main()
