"""prime-rl's orchestrator with envsched choosing every train env's tasks: the custom orchestrator entrypoint.

prime-rl's curriculum sampler config is a closed union (``standard`` or ``difficulty_pool``), so envsched cannot be
named in prime-rl's TOML. This script is an orchestrator entrypoint instead: it runs prime-rl's own orchestrator
(``prime_rl.orchestrator.orchestrator.main``, with its config and flags) after replacing its ``TrainSource`` with
a subclass that puts a :class:`envsched.integrations.prime_rl.PrimeRLTaskSampler` in every train env's curriculum
(:func:`envsched.integrations.prime_rl.orchestrator_main`; ``python -m envsched.integrations.prime_rl`` is the
same entrypoint). Checkpoints and resumes go through prime-rl's own orchestrator checkpoint, which then holds the
envsched samplers' states.

With prime-rl installed (``main`` >= v0.8.1.dev40, the composable curricula; Python 3.12; it is installed from
its repository, not PyPI, and its inference server and trainer need GPUs): start prime-rl's ``inference`` and
``trainer`` as its docs say, and run this instead of its ``orchestrator`` command, with the same arguments::

    python examples/prime_rl_orchestrator.py --envsched-sampler envsched --envsched-draw-batch 8 @ orch.toml

Every train env needs a finite taskset (envsched schedules over a pool); ``--envsched-envs A,B`` limits envsched to
some envs. The other ``--envsched-*`` options: ``--envsched-seed``, ``--envsched-group-size`` (the sampler's
rollouts per task: prime-rl's group size), ``--envsched-reward-range LOW,HIGH`` (default: learned).

``--smoke`` runs here, on CPU, without prime-rl: the same entrypoint against a stand-in for prime-rl's
orchestrator module (``tests/integrations/prime_rl_standin.py``: prime-rl main's call order -- draws ahead of
results, groups finishing out of order, ``on_result`` before gates, the train source's state in the checkpoint --
over real verifiers 0.4.0 ``Task``/``Episode`` objects, with envsched's simulated policy as the rollouts), on
``examples/tiny_pool.jsonl``: 4 steps of 4 groups of 4 rollouts, a checkpoint every 2 steps, then a resume from
step 2 to step 6::

    python examples/prime_rl_orchestrator.py --smoke --out runs/prime_rl_smoke
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def smoke(out: Path) -> dict[str, Any]:
    """The entrypoint on the stand-in orchestrator: a run of 4 steps, then a resume from its step-2 checkpoint."""
    from envsched.integrations.prime_rl import orchestrator_main

    spec = importlib.util.spec_from_file_location("prime_rl_standin",
                                                  HERE.parent / "tests" / "integrations" / "prime_rl_standin.py")
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    standin.install()
    t0 = time.time()
    common = ["--envsched-sampler", "envsched", "--envsched-group-size", "4", "--envsched-draw-batch", "2",
              "--pool", str(HERE / "tiny_pool.jsonl"), "--groups", "4", "--rollouts", "4", "--out", str(out)]
    first = orchestrator_main([*common, "--steps", "4"])
    resumed = orchestrator_main([*common, "--steps", "6", "--resume-step", "2"])
    observed = {run: int(sum(v for k, v in result["metrics"].items() if k.endswith("/sampler/observed_groups")))
                for run, result in (("first", first), ("resumed", resumed))}
    summary = {"samplers": first["samplers"], "observed_groups": observed, "resumed_steps": resumed["steps"],
               "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> Any:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv:
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path("runs/prime_rl_smoke")
        return smoke(out)
    # --8<-- [start:entrypoint]
    from envsched.integrations.prime_rl import orchestrator_main

    return orchestrator_main(argv)  # the --envsched-* options, then prime-rl's orchestrator arguments
    # --8<-- [end:entrypoint]


if __name__ == "__main__":
    main()
