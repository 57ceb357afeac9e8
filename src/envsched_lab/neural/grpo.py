"""Sampling, GRPO's clipped policy-gradient update and the supervised warm-up, for :class:`TinyTransformer`.

GRPO as in DeepSeekMath (Shao et al. 2024, arXiv 2402.03300), without the KL term (as DAPO, arXiv 2503.14476):
for a group of ``G`` completions of one prompt with rewards ``r``, each completion's advantage is
``(r_i - mean(r)) / (std(r) + 1e-6)``; the objective is PPO's clipped surrogate per token,
``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` with ``rho`` the ratio of new to sampling-time token
probabilities, averaged over a completion's tokens and then over **all** completions of the batch (groups
with equal rewards have zero advantage and only dilute the mean, as in GRPO). ``epochs`` passes over the
batch, one Adam step each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from envsched_lab.neural.model import EOS, PAD, SEP, CharTokenizer, TinyTransformer

__all__ = ["Completions", "advantages", "answer_logprobs", "decode", "encode_prompts", "generate", "grpo_loss",
           "grpo_update", "supervised_step"]


def encode_prompts(prompts: Sequence[str]) -> torch.Tensor:
    """Left-padded prompt rows, each ending with SEP: ``(N, P)``."""
    rows = [[*CharTokenizer.encode(p), SEP] for p in prompts]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
    return out


@dataclass
class Completions:
    """Sampled completions of ``prompt`` rows: tokens ``(N, T)`` (EOS then PAD after the end), the
    sampling-time log-probability of each token and the mask of the completion's tokens (EOS included)."""

    prompt: torch.Tensor
    tokens: torch.Tensor
    logp: torch.Tensor
    mask: torch.Tensor

    def select(self, rows: torch.Tensor | np.ndarray | Sequence[int]) -> Completions:
        idx = torch.as_tensor(np.asarray(rows), dtype=torch.long)
        return Completions(self.prompt[idx], self.tokens[idx], self.logp[idx], self.mask[idx])

    @staticmethod
    def cat(parts: Sequence[Completions]) -> Completions:
        """Rows of several batches (prompts and completions right-aligned / left-aligned to a common width)."""
        pw = max(p.prompt.shape[1] for p in parts)
        tw = max(p.tokens.shape[1] for p in parts)

        def lpad(x: torch.Tensor, w: int) -> torch.Tensor:
            return F.pad(x, (w - x.shape[1], 0), value=PAD)

        def rpad(x: torch.Tensor, w: int, v: float | int) -> torch.Tensor:
            return F.pad(x, (0, w - x.shape[1]), value=v)

        return Completions(torch.cat([lpad(p.prompt, pw) for p in parts]),
                           torch.cat([rpad(p.tokens, tw, PAD) for p in parts]),
                           torch.cat([rpad(p.logp, tw, 0.0) for p in parts]),
                           torch.cat([rpad(p.mask, tw, False) for p in parts]))


def decode(tokens: torch.Tensor) -> list[str]:
    return [CharTokenizer.decode(row.tolist()) for row in tokens]


@torch.no_grad()
def generate(model: TinyTransformer, prompt: torch.Tensor, max_new: int, *, greedy: bool = False,
             generator: torch.Generator | None = None, temperature: float = 1.0, repeats: int = 1) -> Completions:
    """Autoregressive completions of each prompt row, ``repeats`` of them per row (sampling at ``temperature``,
    or greedy), with a key/value cache: the prompt is read once per row."""
    logits, (kv, real) = model.prefill(prompt)
    logits = logits[:, -1]
    if repeats > 1:
        kv = [(k.repeat_interleave(repeats, 0), v.repeat_interleave(repeats, 0)) for k, v in kv]
        real = real.repeat_interleave(repeats, 0)
        logits = logits.repeat_interleave(repeats, 0)
        prompt = prompt.repeat_interleave(repeats, 0)
    cache = (kv, real)
    n = prompt.shape[0]
    toks, logps = [], []
    done = torch.zeros(n, dtype=torch.bool)
    for t in range(max_new):
        if t:
            logits, cache = model.extend(toks[-1], cache)
        logits = _outputs_only(logits.float())
        logp_all = F.log_softmax(logits if greedy else logits / temperature, dim=-1)
        nxt = logp_all.argmax(-1) if greedy else torch.multinomial(logp_all.exp(), 1, generator=generator)[:, 0]
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        toks.append(nxt)
        logps.append(torch.where(done, torch.zeros(n), logp_all.gather(1, nxt[:, None]).squeeze(1)))
        done = done | (nxt == EOS) | (nxt == PAD)
        if bool(done.all()):
            break
    tokens = torch.stack(toks, 1)
    # a completion's tokens: everything up to and including its EOS (PAD rows after it are not part of it)
    ended_before = torch.cumsum((tokens == EOS).long(), dim=1) - (tokens == EOS).long()
    mask = (ended_before == 0) & (tokens != PAD)
    return Completions(prompt, tokens, torch.stack(logps, 1), mask)


def token_logprobs(model: TinyTransformer, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each completion token given the prompt and the tokens before it: ``(N, T)``."""
    seq = torch.cat([prompt, tokens], dim=1)
    p, t = prompt.shape[1], tokens.shape[1]
    logits = _outputs_only(model(seq)[:, p - 1:p - 1 + t].float())
    lp = F.log_softmax(logits, dim=-1).gather(2, tokens[..., None]).squeeze(2)
    return torch.where(tokens == PAD, torch.zeros_like(lp), lp)  # PAD after the end: not a token (0, not -inf)


def _outputs_only(logits: torch.Tensor) -> torch.Tensor:
    """Logits with PAD and SEP removed: a completion is characters ended by EOS (or by the length limit)."""
    out = logits.clone()
    out[..., PAD] = float("-inf")
    out[..., SEP] = float("-inf")
    return out


def answer_tokens(answers: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded answer rows followed by EOS, and their mask."""
    rows = [[*CharTokenizer.encode(a), EOS] for a in answers]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out, out != PAD


@torch.no_grad()
def answer_logprobs(model: TinyTransformer, prompts: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """``log P(answer, then EOS | prompt)`` per task: the log of the probability that one sampled completion
    is an exact match (the expected sampled success, computed exactly)."""
    toks, mask = answer_tokens(answers)
    lp = token_logprobs(model, encode_prompts(prompts), toks)
    return (lp * mask).sum(1).numpy().astype(float)


def advantages(rewards: np.ndarray) -> np.ndarray:
    """Group-normalised advantages ``(r - mean) / (std + 1e-6)`` per row (zero for rows of equal rewards)."""
    r = np.asarray(rewards, dtype=float)
    std = r.std(axis=1, keepdims=True)
    return np.where(std > 1e-12, (r - r.mean(axis=1, keepdims=True)) / (std + 1e-6), 0.0)


def grpo_loss(model: TinyTransformer, comp: Completions, adv: torch.Tensor, clip: float, total: int) -> torch.Tensor:
    """Negative clipped surrogate, token-mean per completion, summed over rows and divided by ``total`` (the
    batch's number of completions, zero-advantage ones included)."""
    logp = token_logprobs(model, comp.prompt, comp.tokens)
    ratio = torch.exp(logp - comp.logp)
    a = adv[:, None]
    obj = torch.minimum(ratio * a, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * a)
    m = comp.mask.float()
    per_row = (obj * m).sum(1) / m.sum(1).clamp(min=1.0)
    return -per_row.sum() / max(total, 1)


def grpo_update(model: TinyTransformer, opt: torch.optim.Optimizer, comp: Completions, adv: np.ndarray,
                *, clip: float, epochs: int, total: int, max_grad_norm: float | None = 1.0,
                grad_norms: list[float] | None = None) -> list[float]:
    """``epochs`` optimiser steps on the clipped objective over the rows with a non-zero advantage; returns the
    loss before each step. No row with signal: no step (an all-zero gradient would still move Adam's moments).
    The gradient's norm is clipped at ``max_grad_norm`` (``None`` or 0: not clipped) and appended, before
    clipping, to ``grad_norms`` when given."""
    keep = np.flatnonzero(np.abs(adv) > 0)
    if keep.size == 0:
        return []
    sub = comp.select(keep)
    a = torch.as_tensor(adv[keep], dtype=torch.float32)
    losses = []
    model.train()
    for _ in range(epochs):
        loss = grpo_loss(model, sub, a, clip, total)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf)
        if grad_norms is not None:
            grad_norms.append(float(norm))
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def supervised_step(model: TinyTransformer, opt: torch.optim.Optimizer, prompts: Sequence[str],
                    answers: Sequence[str]) -> float:
    """One cross-entropy step on (prompt, answer + EOS) pairs (the warm-up)."""
    toks, mask = answer_tokens(answers)
    model.train()
    lp = token_logprobs(model, encode_prompts(prompts), toks)
    loss = -(lp * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    model.eval()
    return float(loss.detach())
