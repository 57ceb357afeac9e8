"""The presets' batches, pinned bit for bit: a golden trace recorded from the code before the scheduling
policies (``envsched.method.scheduling.policy``) replaced the adaptive inputs' nullable fields.

``data/policy_golden.json`` holds, for the default, the former (adaptive) defaults, the paper preset and each
ablation of the default's rules, the positions drawn at each of 15 steps with seeded rewards and the phase of each
explanation record; and a ``state_dict`` saved by that code after 8 steps, with the batches drawn after loading it
(states written before the refactor must still resume, to the same batches). It was computed once, from the code at
commit 75d658b. The paper preset's entries must never change (the paper preset stays bit for bit); the other entries
change only with a deliberate change of the default's rules, in the commit that makes it and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from envsched.method.config import FORMER_PIPELINE_DEFAULTS, SchedulerConfig
from envsched.method.graph.synthetic import synthetic_graph, synthetic_tasks
from envsched.method.migrations import read_config
from envsched.method.sampler import EnvSchedSampler

GOLDEN = Path(__file__).parent / "data" / "policy_golden.json"
STEPS, BATCH = 15, 16
#: every preset and each switch of the default's rules (the bench's ablations among them)
#: The default's exploitation score became the paper's calibrated informativeness after this trace was recorded:
#: "variance-score" is that rule, and the entries of the former default and its ablations name
#: ``exploitation_score="signal_probability"`` explicitly, so each pins the same batches as when recorded.
#: The default then left the paper's graph prior, calibration and decline term out (they earned nothing on either
#: learner); every adaptive entry switches back on what it read of them (the graph prior; and, with the paper's
#: exploitation score, the calibration and the decline term), so each still pins the batches it pinned.
#: The default took the graph prior back with the environment estimate as the substitute of a neighbour without
#: history (``unobserved_neighbours="environment"``); the former entries name the global reference they ran with,
#: so each still pins the batches it pinned, and ``"default"`` pins the current default (recorded from the code that
#: made that change).
#: The default then took the paper's fixed split and coverage ranking (``adaptive_share=False``,
#: ``adaptive_coverage=False``); every entry recorded before names the online share and the UCB coverage it ran
#: with (``_ADAPTIVE``), ``"adaptive-environment"`` pins the default before that change (round 4's default, the lab's
#: ``envsched-adaptive``) under its former name's batches, and ``"default"`` was re-pinned from the code that made it.
_ADAPTIVE = {"adaptive_share": True, "adaptive_coverage": True}
_GRAPH = {**_ADAPTIVE, "use_within_edges": True, "use_cross_edges": True, "unobserved_neighbours": "reference"}
_SIGNAL = {**_GRAPH, "exploitation_score": "signal_probability"}
CONFIGS = {
    "default": {},
    "adaptive-environment": dict(_ADAPTIVE),
    "adaptive": _SIGNAL, "paper": {"preset": "paper"},
    "variance-score": {**FORMER_PIPELINE_DEFAULTS, **_ADAPTIVE},
    "fixed-share": {**_SIGNAL, "adaptive_share": False},
    "paper-coverage": {**_SIGNAL, **FORMER_PIPELINE_DEFAULTS, "adaptive_coverage": False},  # reads them all
    "caps-always": {**_SIGNAL, "caps_on_decline_only": False},
    "thompson": {**_SIGNAL, "exploitation_rule": "thompson"},
    "upper-quantile": {**_SIGNAL, "exploitation_rule": "upper_quantile"},
    "coverage-only": {**_SIGNAL, "mode": "coverage_only"},
    "paper-exploitation-only": {"preset": "paper", "mode": "exploitation_only"},
    "paper-no-cross": {"preset": "paper", "use_cross_edges": False, "coverage_share": 0.25},
}
_PHASE = {"cold_start": "s", "coverage": "c", "exploitation": "x", "fill": "f"}


def _config(name: str) -> SchedulerConfig:
    kw = dict(CONFIGS[name])
    return SchedulerConfig.paper(**kw) if kw.pop("preset", None) == "paper" else SchedulerConfig(**kw)


def _pool():
    g = synthetic_graph(120, 8, seed=7)
    return synthetic_tasks(g), g


def _steps(s: EnvSchedSampler, rng: np.random.Generator, p: np.ndarray, steps: int, first: int = 0) -> list:
    """``steps`` batches with seeded rewards (some ``None``, a few dropped groups): per step the positions
    drawn and the explanation records' phases, one letter each (s, c, x, f)."""
    out = []
    for step in range(first, first + steps):
        batch = s.sample(BATCH)
        phases = "".join(_PHASE[r["phase"]] for r in s.explanations())
        out.append([[s.position_of(t) for t in batch], phases])
        for i, t in enumerate(batch):
            if step == 1 and i % 3 == 0:
                s.discard(t)
                continue
            s.update(t, [None if rng.random() < 0.05 else float(rng.random() < p[s.position_of(t)])
                         for _ in range(8)])
    return out


def run_trace(name: str) -> list:
    tasks, g = _pool()
    s = EnvSchedSampler(tasks, g, _config(name), seed=3)
    rng = np.random.default_rng(11)
    return _steps(s, rng, rng.beta(0.6, 0.6, size=len(tasks)), STEPS)


def saved_state_continuation(name: str, state: dict | None) -> dict:
    """The state after 8 steps (``state``: load this one instead of the one this code writes) and 4 batches
    drawn after loading it into a fresh sampler."""
    tasks, g = _pool()
    rng = np.random.default_rng(5)
    p = rng.beta(0.6, 0.6, size=len(tasks))
    s = EnvSchedSampler(tasks, g, _config(name), seed=3)
    _steps(s, rng, p, 8)
    saved = s.state_dict() if state is None else state
    fresh = EnvSchedSampler(tasks, g, _config(name), seed=3)
    fresh.load_state_dict(json.loads(json.dumps(saved)))
    return {"state": saved, "after": _steps(fresh, rng, p, 4, first=8)}


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_every_config(golden):
    assert set(golden["configs"]) == set(CONFIGS)
    assert all(len(golden["configs"][n]) == STEPS for n in CONFIGS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batches_equal_the_recorded_ones(golden, name):
    want = golden["configs"][name]
    got = run_trace(name)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{name}, step {step}: {g} != {w}"
    phases = "".join(p for _, p in want)
    assert "s" in phases  # the trace reaches cold start and the phases after it
    assert ("c" in phases) == (CONFIGS[name].get("mode") != "exploitation_only")
    assert ("x" in phases) == (CONFIGS[name].get("mode") != "coverage_only")


@pytest.mark.parametrize("name", ["adaptive", "paper"])
def test_a_state_saved_before_resumes_to_the_same_batches(golden, name):
    rec = golden["states"][name]
    got = saved_state_continuation(name, rec["state"])
    assert got["after"] == rec["after"]
    # and the state this code writes after the same steps is the one recorded (a config may gain fields)
    written = saved_state_continuation(name, None)["state"]
    config, want_config = written["extra"].pop("config"), dict(rec["state"]["extra"]["config"])
    assert read_config(config) == read_config(want_config)  # former defaults reset (envsched.method.migrations)
    # the recorded state keeps the progress points in their earlier form, [step, sequence, v] per point: this code
    # writes the same points flat, without the sequence numbers (dispatch order is the order they are stored in)
    progress = written["extra"]["history"].pop("progress")
    want = json.loads(json.dumps(rec["state"]))
    old = want["extra"]["history"].pop("progress")
    assert progress == {"pos": old["pos"], "count": old["count"], "length": [len(p) for p in old["points"]],
                        "step": [pt[0] for p in old["points"] for pt in p],
                        "v": [pt[2] for p in old["points"] for pt in p]}
    assert written == {**want, "extra": {k: v for k, v in want["extra"].items() if k != "config"}}
