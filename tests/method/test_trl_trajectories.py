"""The identifier filter wired into a real TRL GRPO run (CPU, tiny random Llama): reward functions queue
trajectories with ``trainer.record_trajectory`` and the trainer hands them to ``EnvSchedSampler.submit_trajectory``
at feedback time, after the group updates."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from envsched.envs.reasoning_gym import build_reasoning_gym_pool  # noqa: E402
from envsched.integrations.trl import EnvSchedGRPOTrainer  # noqa: E402
from envsched.method.config import SchedulerConfig  # noqa: E402
from envsched.method.graph.synthetic import graph_from_arrays  # noqa: E402
from envsched.method.sampler import EnvSchedSampler  # noqa: E402
from envsched.method.scheduling.identifier_filter import IdentifierVerdict, Trajectory  # noqa: E402

G = 4


class _FlagHard:
    """A hook that flags the difficulty-1 tasks (so the test knows which tasks must end up flagged)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def check(self, task, trajectory):
        self.seen.append((task["id"], trajectory.reward))
        flagged = task["difficulty"] == 1
        return IdentifierVerdict(flagged, trajectory.reward, [], "difficulty 1" if flagged else None)


def test_reward_function_trajectories_reach_the_identifier_filter(tmp_path):
    pool = build_reasoning_gym_pool(["chain_sum", "leg_counting"], tasks_per_dataset=4, num_tiers=2, seed=0)
    lines = [t["instruction"] for t in pool] + [" ".join(str(i) for i in range(k, k + 20)) for k in range(30)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                     padding_side="left")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      pad_token_id=hf_tok.pad_token_id, eos_token_id=hf_tok.eos_token_id,
                      bos_token_id=hf_tok.eos_token_id)
    model_dir = tmp_path / "model"
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    hf_tok.save_pretrained(model_dir)

    hook = _FlagHard()
    ids, envs = [t["id"] for t in pool], [t["env"] for t in pool]
    graph = graph_from_arrays(ids, envs, [[j for j in range(len(pool)) if j != i and envs[j] == envs[i]]
                                         for i in range(len(pool))], [[] for _ in pool])
    sampler = EnvSchedSampler(pool, graph, SchedulerConfig(batch_size=2), seed=0, identifier_filter=hook)
    holder: dict = {}
    recorded: list[str] = []

    def reward(completions, task_id, **kw):
        out = [float(i % 2) for i in range(len(completions))]  # mixed groups
        for i, (c, tid) in enumerate(zip(completions, task_id, strict=True)):
            if i % G == 0:  # one full-marks trajectory per group, as an environment would save it
                holder["trainer"].record_trajectory(tid, Trajectory([[c]], reward=1.0))
                recorded.append(tid)
        return out

    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, beta=0.0, report_to="none",
                      seed=0, max_steps=2, save_strategy="no", logging_steps=1, learning_rate=1e-3,
                      num_generations=G, per_device_train_batch_size=G * 2, max_completion_length=4,
                      disable_tqdm=True)
    trainer = EnvSchedGRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=args, processing_class=hf_tok,
                                  task_sampler=sampler)
    holder["trainer"] = trainer
    with pytest.raises(KeyError, match="unknown task id"):
        trainer.record_trajectory("nope", Trajectory([["x"]], 1.0))
    trainer.train()
    assert len(recorded) == 4  # 2 steps x 2 groups
    assert [tid for tid, _ in hook.seen] == recorded and all(r == 1.0 for _, r in hook.seen)
    hard = {tid for tid in recorded if trainer.task_for(tid)["difficulty"] == 1}
    assert hard and hard != set(recorded)  # the run drew both kinds, so the next line can fail
    assert set(sampler.identifier_flags()) == hard
    assert not trainer._es_trajectories  # the queue was handed over
