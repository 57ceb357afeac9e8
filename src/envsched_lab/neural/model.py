"""Character tokenizer and a small pre-norm causal transformer (torch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EOS", "PAD", "SEP", "VOCAB_SIZE", "Cache", "CharTokenizer", "TinyTransformer"]

PAD, EOS, SEP = 0, 1, 2
_FIRST, _LAST = 32, 126  # printable ASCII
VOCAB_SIZE = 3 + _LAST - _FIRST + 1


class CharTokenizer:
    """Printable ASCII characters, one token each, plus PAD, EOS (end of the answer) and SEP (end of prompt)."""

    vocab_size = VOCAB_SIZE

    @staticmethod
    def encode(text: str) -> list[int]:
        out = []
        for ch in text:
            o = ord(ch)
            if not _FIRST <= o <= _LAST:
                raise ValueError(f"character {ch!r} in {text!r} is not printable ASCII (the tokenizer's alphabet)")
            out.append(3 + o - _FIRST)
        return out

    @staticmethod
    def decode(ids: Sequence[int]) -> str:
        """The characters up to the first EOS/PAD (SEP is never part of a completion)."""
        out = []
        for i in ids:
            i = int(i)
            if i in (PAD, EOS):
                break
            if i != SEP:
                out.append(chr(i - 3 + _FIRST))
        return "".join(out)


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The block's output and its keys and values (``past``'s, then the new positions')."""
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x)), (k, v)


Cache = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
"""Per layer (keys, values), and which cached positions are real tokens (not PAD)."""


class TinyTransformer(nn.Module):
    """Decoder-only transformer over left-padded token rows.

    Positions count from each row's first non-PAD token, so a prompt reads the same whatever its padding; PAD
    keys are masked (a PAD query sees only itself, which keeps softmax rows finite)."""

    def __init__(self, vocab_size: int = VOCAB_SIZE, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                 max_len: int = 48) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        self.max_len = max_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, L, vocab)`` for token rows ``ids`` ``(B, L)``."""
        return self.prefill(ids)[0]

    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, Cache]:
        """Logits for every position of ``ids`` and the cache :meth:`extend` continues from."""
        real = ids != PAD
        pos = (real.long().cumsum(1) - 1).clamp(min=0)
        self._check_len(pos)
        n = ids.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
        mask = causal[None] & (real[:, None, :] | torch.eye(n, dtype=torch.bool, device=ids.device)[None])
        x = self.tok(ids) + self.pos(pos)
        kv = []
        for blk in self.blocks:
            x, layer_kv = blk(x, mask[:, None])
            kv.append(layer_kv)
        return self.head(self.ln(x)), (kv, real)

    def extend(self, tok: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
        """Logits ``(B, vocab)`` after appending one token per row (``tok`` ``(B,)``) to the cached rows."""
        kv, real = cache
        real = torch.cat([real, (tok != PAD)[:, None]], dim=1)
        pos = (real.long().sum(1) - 1).clamp(min=0)
        self._check_len(pos)
        mask = real.clone()
        mask[:, -1] = True  # a PAD query (a finished row) sees itself, which keeps its softmax finite
        x = self.tok(tok[:, None]) + self.pos(pos[:, None])
        new_kv = []
        for blk, past in zip(self.blocks, kv, strict=True):
            x, layer_kv = blk(x, mask[:, None, None, :], past)
            new_kv.append(layer_kv)
        return self.head(self.ln(x))[:, 0], (new_kv, real)

    def _check_len(self, pos: torch.Tensor) -> None:
        if pos.numel() and int(pos.max()) >= self.max_len:
            raise ValueError(f"a sequence is longer than the model's max_len ({self.max_len})")
