"""The CPU test model shared by the TRL tests (fixture ``tiny_llm`` in ``tests/conftest.py``) and
``benchmarks/trl_sampler_overhead.py``: a random Llama and a byte-level BPE tokenizer trained locally on the
pool's instructions (no download). Loaded by path: the tests run with ``--import-mode=importlib``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def build_tiny_llm(pool: Sequence[Mapping[str, Any]], out: str | Path, *, filler_lines: int = 50,
                   hidden_size: int = 32, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2) -> PreTrainedTokenizerFast:
    """Save the model and its tokenizer to ``out`` (seeded: ``torch.manual_seed(0)``); returns the tokenizer."""
    lines = [t["instruction"] for t in pool] + [" ".join(str(i) for i in range(k, k + 20))
                                                 for k in range(filler_lines)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                     padding_side="left")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=256, pad_token_id=hf_tok.pad_token_id,
                      eos_token_id=hf_tok.eos_token_id, bos_token_id=hf_tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(out)
    hf_tok.save_pretrained(out)
    return hf_tok

