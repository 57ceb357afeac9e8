"""A real TRL GRPO run on CPU drawing from an envsched sampler (tiny random Llama, locally trained tokenizer).

Checks the two hooks end to end: every drawn group comes back to ``update`` exactly once, in order, with
the right task ids (the reward functions verify each prompt against its ``task_id``), unscored rollouts
arrive as ``None``, costs are completion lengths, and resuming from a TRL checkpoint continues with the
draws (and feedback) of the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from trl import GRPOConfig  # noqa: E402

from envsched.envs.reasoning_gym import build_reasoning_gym_pool, score_task_answer  # noqa: E402
from envsched.integrations.trl import SAMPLER_STATE_FILE, EnvSchedGRPOTrainer, TaskRepeatSampler  # noqa: E402
from envsched.samplers.simple import CurriculumSampler, UniformSampler  # noqa: E402

pytestmark = pytest.mark.slow  # spawns processes or trains: outside the fast lane

G = 4  # num_generations
TASKS_PER_CHUNK = 2
MAX_COMPLETION = 8
ENVS = ["chain_sum", "basic_arithmetic", "leg_counting"]


def _sampler_class():
    """EnvSchedSampler when the method package provides a working one, else the RFC curriculum."""
    try:
        from envsched.method.sampler import EnvSchedSampler
    except Exception:
        return None
    return EnvSchedSampler


def _make_sampler(pool):
    cls = _sampler_class()
    if cls is not None:
        return _recording(cls(pool, seed=3))
    return _recording(CurriculumSampler(pool, group_size=G, key="group", success_threshold=0.3, seed=3))


def _recording(sampler):
    """``sampler``, logging every draw (``sampler.draws``) and every update (``sampler.updates``) the trainer
    makes."""
    base = type(sampler)

    class Recording(base):  # type: ignore[misc, valid-type]
        def sample(self, n):
            out = super().sample(n)
            self.draws.append([t["id"] for t in out])
            return out

        def update(self, task, rewards, costs=None):
            super().update(task, rewards, costs)
            self.updates.append((task["id"], list(rewards), list(costs)))

    sampler.__class__ = Recording
    sampler.draws, sampler.updates = [], []
    return sampler


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_llm):
    root = tmp_path_factory.mktemp("grpo")
    pool = build_reasoning_gym_pool(ENVS, tasks_per_dataset=4, num_tiers=2, seed=0)
    model_dir = root / "model"
    hf_tok = tiny_llm(pool, model_dir)
    return root, pool, str(model_dir), hf_tok


def _run(setup, out, resume=None):
    _root, pool, model_dir, tok = setup
    sampler = _make_sampler(pool)
    mismatched: list[str] = []
    holder: dict = {}

    def shaped(prompts, completions, task_id, **kw):
        """Digit fraction of the completion; None for the last rollout of each group (unscored)."""
        out_ = []
        for i, (p, c, tid) in enumerate(zip(prompts, completions, task_id, strict=True)):
            if holder["trainer"].task_for(tid)["instruction"] != p:
                mismatched.append(tid)
            out_.append(None if i % G == G - 1 else sum(ch.isdigit() for ch in c) / max(len(c), 1))
        return out_

    def correct(completions, task_id, **kw):
        return [score_task_answer(holder["trainer"].task_for(t), (re.findall(r"-?\d+", c) or [""])[0])
                for c, t in zip(completions, task_id, strict=True)]

    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, beta=0.0, report_to="none", seed=0,
                      max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1, learning_rate=5e-3,
                      num_generations=G, per_device_train_batch_size=G * TASKS_PER_CHUNK,
                      max_completion_length=MAX_COMPLETION, disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[shaped, correct], args=args,
                                  processing_class=tok, task_sampler=sampler, sampler_reward_funcs=["shaped"])
    holder["trainer"] = trainer
    trainer.train(resume_from_checkpoint=resume)
    return trainer, sampler, mismatched


@pytest.fixture(scope="module")
def runs(setup):
    root = setup[0]
    a = _run(setup, root / "a")
    b = _run(setup, root / "b", resume=str(root / "a" / "checkpoint-2"))
    return a, b


def test_every_drawn_group_fed_back_once_with_matching_ids(runs):
    (trainer, sampler, mismatched), _ = runs
    assert not mismatched, f"reward functions saw prompts of other tasks: {mismatched[:3]}"
    pending = trainer.pending_chunks
    # accelerate prefetches one generation batch: exactly one chunk drawn but never trained on
    assert len(pending) == 1 and pending == sampler.draws[-1:]
    assert len(sampler.draws) == 4 + 1 and all(len(c) == TASKS_PER_CHUNK for c in sampler.draws)
    fed = [u[0] for u in sampler.updates]
    assert fed == [t for chunk in sampler.draws[:-1] for t in chunk]  # every group once, in draw order
    assert trainer.envsched_draw_log == sampler.draws
    assert sampler.groups == 4 * TASKS_PER_CHUNK and sampler.episodes == 4 * TASKS_PER_CHUNK * G
    assert sampler.outstanding_groups == TASKS_PER_CHUNK
    for _, rewards, costs in sampler.updates:
        assert len(rewards) == G and len(costs) == G
        assert rewards[-1] is None and all(isinstance(r, float) and 0.0 <= r <= 1.0 for r in rewards[:-1])
        assert all(1 <= c <= MAX_COMPLETION for c in costs)
    assert sampler.unscored_episodes == 4 * TASKS_PER_CHUNK


def test_checkpoint_holds_sampler_state_and_pending_chunk(runs, setup):
    (_trainer, sampler, _), _ = runs
    state = json.loads((setup[0] / "a" / "checkpoint-2" / SAMPLER_STATE_FILE).read_text())
    assert state["global_step"] == 2
    assert state["pending"] == [sampler.draws[2]]
    assert state["sampler"]["counters"]["groups"] == 2 * TASKS_PER_CHUNK
    assert state["sampler"]["counters"]["dispatched_groups"] == 3 * TASKS_PER_CHUNK


def test_resume_continues_the_same_draws(runs):
    (_ta, sa, _), (tb, sb, mismatched) = runs
    assert not mismatched
    # the resumed run replays the chunk pending at the checkpoint, then draws what run A drew
    assert tb.envsched_draw_log == sa.draws[2:]
    assert sb.draws == sa.draws[3:]
    assert [u[0] for u in sb.updates] == [u[0] for u in sa.updates[2 * TASKS_PER_CHUNK:]]
    assert sb.state_dict()["counters"] == sa.state_dict()["counters"]
    assert sb.state_dict()["rng"] == sa.state_dict()["rng"]


def test_resume_without_sampler_state_is_refused(runs, setup, tmp_path):
    (trainer, _, _), _ = runs
    with pytest.raises(FileNotFoundError, match=r"envsched_sampler\.json"):
        trainer.load_sampler_state(str(tmp_path))


def test_repeat_sampler_layout_and_validation(setup):
    pool = setup[1]
    s = UniformSampler(pool, seed=1)
    drawn = []
    rs = TaskRepeatSampler(s, lambda t: t["index"], mini_repeat_count=3, batch_size=2, repeat_count=2,
                           chunks_per_epoch=2, on_draw=drawn.append)
    items = list(rs)
    assert len(items) == len(rs) == 2 * 2 * 3 * 2
    for c, rows in enumerate(drawn):
        chunk = items[c * 12:(c + 1) * 12]
        expected = [r for r in rows for _ in range(3)]
        assert chunk == expected + expected
    with pytest.raises(ValueError, match="batch_size"):
        TaskRepeatSampler(s, lambda t: 0, mini_repeat_count=2, batch_size=0)


def test_bad_sampler_arguments_are_refused(setup, tmp_path):
    _, _pool, model_dir, tok = setup
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2,
                      per_device_train_batch_size=2, max_steps=1)
    with pytest.raises(TypeError, match="TaskSampler"):
        EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                            args=args, processing_class=tok, task_sampler=object())


def test_two_processes_gather_groups_across_ranks(setup, tmp_path):
    """Two CPU processes (gloo): each group's four rollouts are split over the ranks; both ranks must feed
    their identical samplers the same gathered groups, with the unscored rollout of rank 1 as None."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = Path(__file__).with_name("grpo_multiproc_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(port), str(worker), setup[2],
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["draws"] == r1["draws"] and r0["updates"] == r1["updates"] and r0["pending"] == r1["pending"]
    assert len(r0["updates"]) == 3  # one task per generation batch (4 rollouts over 2 ranks), 3 steps
    assert [u[0] for u in r0["updates"]] == [c[0] for c in r0["draws"][:3]]
    for _, rewards, costs in r0["updates"]:
        assert len(rewards) == 4 and rewards[3] is None and all(r is not None for r in rewards[:3])
        assert all(1 <= c <= 6 for c in costs)
    # each rank scored only its half of every group, with prompts matching their task ids
    for r in (r0, r1):
        assert len(r["seen"]) == 3 * 2 and all(ok for _, ok in r["seen"])
    assert [t for t, _ in r0["seen"]] == [t for t, _ in r1["seen"]]


def test_unknown_sampler_reward_func_is_refused(setup, tmp_path):
    _, pool, model_dir, tok = setup
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2,
                      per_device_train_batch_size=2, max_steps=1)

    def correct(completions, **k):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="sampler_reward_funcs"):
        EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[correct], args=args, processing_class=tok,
                            task_sampler=UniformSampler(pool), sampler_reward_funcs=["format"])


def test_private_hooks_are_checked_against_the_supported_versions(setup, tmp_path):
    """A TRL whose private hook changed signature is refused at construction, naming the versions."""
    from trl import GRPOTrainer

    from envsched.integrations.trl import SUPPORTED_VERSIONS, EnvSchedGRPOMixin, check_trl_hooks

    check_trl_hooks(GRPOTrainer)  # the installed (pinned) TRL passes

    class ChangedTRL(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # a future TRL dropping an argument
            raise AssertionError("never reached")

    class Trainer(EnvSchedGRPOMixin, ChangedTRL):
        pass

    _, pool, model_dir, tok = setup
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2,
                      per_device_train_batch_size=2, max_steps=1)
    with pytest.raises(RuntimeError, match=rf"supports TRL {SUPPORTED_VERSIONS['trl']} with transformers "
                                           rf"{SUPPORTED_VERSIONS['transformers']}.*_calculate_rewards"):
        Trainer(model=model_dir, reward_funcs=[lambda completions, **k: [0.0] * len(completions)], args=args,
                processing_class=tok, task_sampler=UniformSampler(pool))


def test_normalize_then_sum_is_refused_unless_the_sampler_rewards_are_chosen(setup, tmp_path):
    _, pool, model_dir, tok = setup
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=2,
                      per_device_train_batch_size=2, max_steps=1, multi_objective_aggregation="normalize_then_sum")

    def correct(completions, **k):
        return [0.0] * len(completions)

    def fmt(completions, **k):
        return [1.0] * len(completions)

    with pytest.raises(ValueError, match=r"normalize_then_sum.*sampler_reward_funcs"):
        EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[correct, fmt], args=args, processing_class=tok,
                            task_sampler=UniformSampler(pool))
    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[correct, fmt], args=args, processing_class=tok,
                                  task_sampler=UniformSampler(pool), sampler_reward_funcs=["correct"])
    assert trainer._es_func_idx == [0]


def test_rewards_of_any_scale_never_raise_mid_training(setup, tmp_path):
    """Step s gives the first rollout of every group 1.5, -1.0, 100.0, NaN (s = 0..3), the others 0.5: the run
    finishes, the sampler gets them mapped by the learned range, NaN as None, every group counted."""
    _, pool, model_dir, tok = setup
    values = [1.5, -1.0, 100.0, float("nan")]
    sampler = UniformSampler(pool, seed=0)

    def scaled(completions, trainer_state, **kw):
        v = values[trainer_state.global_step]
        return [None if (i % G == 0 and v != v) else (v if i % G == 0 else 0.5) for i in range(len(completions))]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, beta=0.0, report_to="none", seed=0,
                      max_steps=4, save_strategy="no", logging_steps=1, num_generations=G,
                      per_device_train_batch_size=G, max_completion_length=4, disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[scaled], args=args, processing_class=tok,
                                  task_sampler=sampler)
    trainer.train()
    log = trainer.envsched_feedback_log
    assert [e["step"] for e in log] == [0, 1, 2, 3]
    assert [e["raw_rewards"][0] for e in log[:3]] == values[:3] and log[3]["raw_rewards"][0] is None
    firsts = [e["rewards"][0] for e in log]
    assert firsts[:3] == [1.0, 0.0, 1.0] and firsts[3] is None
    assert log[0]["rewards"][1] == pytest.approx(0.5 / 1.5)  # learned range [0, 1.5]
    assert log[1]["rewards"][1] == pytest.approx(1.5 / 2.5)  # [-1, 1.5]
    assert log[2]["rewards"][1] == pytest.approx(1.5 / 101)  # [-1, 100]
    assert sampler.groups == 4 and sampler.episodes == 4 * G and sampler.unscored_episodes == 1
    m = trainer.envsched_metrics()
    assert m["rewards_rescaled"] == 3 and m["reward_range_low"] == -1.0 and m["reward_range_high"] == 100.0
    with pytest.raises(ValueError, match="outside the declared reward range"):
        sampler.update(pool[0], [1.5], None)  # the sampler itself still refuses raw out-of-range input


def test_feedback_and_draw_logs_keep_the_newest_log_size_entries(setup, tmp_path):
    """10 groups in 5 chunks fed back (6 drawn, one prefetched) with log_size=3: each log holds the 3 newest
    entries, in order, and counts every entry it ever took."""
    _, pool, model_dir, tok = setup

    sampler = _recording(UniformSampler(pool, seed=1))

    def digits(completions, **kw):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, beta=0.0, report_to="none", seed=0,
                      max_steps=5, save_strategy="no", logging_steps=1, num_generations=G,
                      per_device_train_batch_size=G * TASKS_PER_CHUNK, max_completion_length=4, disable_tqdm=True)
    with pytest.raises(ValueError, match="log_size"):
        EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[digits], args=args, processing_class=tok,
                            task_sampler=sampler, log_size=-1)
    trainer = EnvSchedGRPOTrainer(model=model_dir, reward_funcs=[digits], args=args, processing_class=tok,
                                  task_sampler=sampler, log_size=3)
    trainer.train()
    assert len(sampler.updates) == 5 * TASKS_PER_CHUNK and len(sampler.draws) == 6
    log = trainer.envsched_feedback_log
    assert len(log) == 3 and trainer.envsched_feedback_logged == 5 * TASKS_PER_CHUNK
    assert [(e["task_id"], e["rewards"], e["costs"]) for e in log] == sampler.updates[-3:]
    assert [e["step"] for e in log] == [3, 4, 4]
    assert trainer.envsched_draw_log == sampler.draws[-3:] and trainer.envsched_draws_logged == 6
