"""The neural learner: a :class:`~envsched_lab.neural.model.TinyTransformer` trained by GRPO on the tasks the
sampler draws, rewarded by each task's verifier (exact match or the family's ``score``).

Nothing about transfer, interference, forgetting or generalisation is written here: they are whatever the
shared network does when GRPO updates it on the sampled groups. Determinism: the network's initialisation,
the warm-up data and every sampled completion come from generators seeded by ``seed``;
``torch.set_num_threads(threads)`` (default 1, so that each benchmark worker uses one core and results do
not depend on the machine's core count) and ``torch.use_deterministic_algorithms(True)`` are set when the
learner is built (both are process-wide torch settings).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import math
import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from envsched.errors import InvalidValueError
from envsched.validation import check_int, is_number
from envsched_lab.cache import bench_cache_dir
from envsched_lab.families import WARMUP_FAMILIES, FamilyPool
from envsched_lab.neural.grpo import (
    Completions,
    advantages,
    answer_logprobs,
    decode,
    encode_prompts,
    generate,
    grpo_update,
    supervised_step,
)
from envsched_lab.neural.model import CharTokenizer, TinyTransformer

__all__ = ["NeuralConfig", "NeuralLearner", "Pretraining"]


@runtime_checkable
class Pretraining(Protocol):
    """A source of supervised examples for the phase before GRPO (instead of the warm-up families): ``key``
    names it in the warmed-up weights' cache; ``batch(rng, n)`` returns ``n`` prompts and their answers."""

    key: str

    def batch(self, rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]: ...


@dataclass(frozen=True)
class NeuralConfig:
    """The network, GRPO and evaluation settings (docs/benchmark.md, "The neural learner", gives the reasons)."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 40
    lr: float = 1e-3
    """Adam's learning rate for GRPO."""
    clip: float = 0.2
    """PPO ratio clip epsilon."""
    epochs: int = 2
    """Adam steps per GRPO batch (inner epochs over the whole batch)."""
    temperature: float = 1.0
    max_new_tokens: int = 5
    warmup_steps: int = 300
    """Supervised steps on the warm-up families (envsched_lab.families.warmup), 0 for none."""
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    eval_every: int = 10
    """Held-out and training-pool scores are computed every ``eval_every`` GRPO steps (and at the last step);
    records in between carry the last evaluation (``evaluated`` says which steps were measured)."""
    train_eval_tasks: int = 200
    """Training-pool score: greedy success over an evenly spaced subset of at most this many training tasks."""
    threads: int = 1
    optimizer: str = "adam"
    """The GRPO step's optimiser: ``"adam"`` or ``"sgd"`` (plain gradient steps of size ``lr``: a batch's step
    grows with its signal groups, as GRPO's dilution argument assumes; Adam rescales every step to about
    ``lr`` whatever the batch's signal)."""
    max_grad_norm: float = 1.0
    """Gradient norm clip of the GRPO step (0: none)."""
    score: str = "greedy"
    """What ``heldout``/``score`` report: ``"greedy"`` (greedy success) or ``"expected"`` (the exact expected
    success of one sampled answer); the other is reported as ``*_expected`` / ``*_greedy``."""

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"neural learner option {name} must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, name)!r}")
        for f in fields(self):
            if f.name in _CHOICES:
                continue
            v = getattr(self, f.name)
            if not is_number(v, numpy=False):
                raise InvalidValueError(f"neural learner option {f.name} must be a number, got {v!r}", name=f.name,
                                        value=v)
        ints = ("d_model", "n_layers", "n_heads", "max_len", "epochs", "max_new_tokens", "warmup_steps",
                "warmup_batch", "eval_every", "train_eval_tasks", "threads")
        for k in ints:
            v = getattr(self, k)
            if not float(v).is_integer() or v < (0 if k == "warmup_steps" else 1):
                raise ValueError(f"neural learner option {k} must be an integer >= "
                                 f"{0 if k == 'warmup_steps' else 1}, got {v!r}")
            object.__setattr__(self, k, int(v))
        for k in ("lr", "clip", "temperature", "warmup_lr"):
            v = getattr(self, k)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"neural learner option {k} must be a positive number, got {v!r}")
        if not math.isfinite(self.max_grad_norm) or self.max_grad_norm < 0:
            raise ValueError(f"neural learner option max_grad_norm must be >= 0, got {self.max_grad_norm!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> NeuralConfig:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown neural learner option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


#: Options that take one of a few names (every other option is a number).
_CHOICES: dict[str, tuple[str, ...]] = {"optimizer": ("adam", "sgd"), "score": ("greedy", "expected")}

_WARM: dict[tuple[int, str], bytes] = {}


def _warm_key(cfg: NeuralConfig) -> str:
    d = asdict(cfg)
    for k in ("lr", "clip", "epochs", "temperature", "max_new_tokens", "eval_every", "train_eval_tasks",
              *_RL_ONLY):
        d.pop(k)
    return repr(sorted(d.items()))


#: Options read by the GRPO step or the scores only (the warmed-up weights do not depend on them).
_RL_ONLY = ("optimizer", "max_grad_norm", "score")


def _warm_path(seed: int, cfg: NeuralConfig, extra: str = "") -> Path:
    """The warmed-up weights' cache file in the benchmark cache (``$ENVSCHED_CACHE_DIR/bench``), keyed by the
    seed, the warm-up settings, the pre-training source (``extra``) and the source of the network, the warm-up
    and the warm-up families."""
    from envsched_lab.families import base, warmup
    from envsched_lab.neural import grpo, model

    h = hashlib.sha256(f"{seed}:{_warm_key(cfg)}:{torch.__version__}{extra}".encode())
    for mod in (model, grpo, warmup, base):
        h.update(Path(str(mod.__file__)).read_bytes())
    return bench_cache_dir() / f"neural-warmup-{h.hexdigest()[:20]}.pt"


class NeuralLearner:
    """GRPO on a small transformer over a :class:`~envsched_lab.families.FamilyPool` (positions index its pool)."""

    def __init__(self, fpool: FamilyPool, config: NeuralConfig | Mapping[str, Any] | None = None, *,
                 seed: int = 0, pretraining: Pretraining | None = None) -> None:
        self.config = config if isinstance(config, NeuralConfig) else NeuralConfig.from_dict(config)
        self.fpool = fpool
        self.seed = int(seed)
        self.pretraining = pretraining
        cfg = self.config
        for i, p in enumerate(fpool.prompts):
            CharTokenizer.encode(p)  # raises on a character outside the alphabet
            ans = fpool.answers[i]
            if ans is not None and len(ans) + 1 > cfg.max_new_tokens:
                raise ValueError(f"task {fpool.pool[i]['id']}: answer {ans!r} is longer than max_new_tokens - 1 "
                                 f"({cfg.max_new_tokens - 1})")
            if len(p) + 1 + cfg.max_new_tokens > cfg.max_len:
                raise ValueError(f"task {fpool.pool[i]['id']}: prompt of {len(p)} characters does not fit "
                                 f"max_len {cfg.max_len} with {cfg.max_new_tokens} new tokens")
        torch.set_num_threads(cfg.threads)
        torch.use_deterministic_algorithms(True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.model = TinyTransformer(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                         max_len=cfg.max_len)
        self.model.eval()
        self._warm_up()
        self.opt = self._optimizer(self.model)
        self._gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 17)
        self.steps_trained = 0
        self._evaluated_at = -1
        self._eval: dict[str, dict[int, float]] = {}

    def _optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        if self.config.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=self.config.lr)
        return torch.optim.Adam(model.parameters(), lr=self.config.lr)

    # ------------------------------------------------------------------ warm-up
    def _warm_up(self) -> None:
        """The supervised phase before GRPO: the warm-up families (the answer format), or the ``pretraining``
        source's examples when one is given (the v2 pool's partial competence). Cached per seed and settings."""
        cfg = self.config
        if cfg.warmup_steps == 0:
            self.warmup_loss = math.nan
            return
        extra = "" if self.pretraining is None else f":pretraining={self.pretraining.key}"
        key = (self.seed, _warm_key(cfg) + extra)
        path = _warm_path(self.seed, cfg, extra)
        if key not in _WARM and path.exists():
            with contextlib.suppress(OSError):
                _WARM[key] = path.read_bytes()
        if key in _WARM:
            try:
                self.model.load_state_dict(torch.load(io.BytesIO(_WARM[key]), weights_only=True))
                self.warmup_loss = float("nan")
                return
            except (RuntimeError, ValueError, EOFError, OSError, pickle.UnpicklingError):
                del _WARM[key]  # a damaged cache file: warm up again (and rewrite it)
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.seed)
                    self.model = TinyTransformer(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                                 max_len=cfg.max_len)
        rng = np.random.default_rng([self.seed, 4242])
        opt = torch.optim.Adam(self.model.parameters(), lr=cfg.warmup_lr)
        loss = math.nan
        for _ in range(cfg.warmup_steps):
            if self.pretraining is not None:
                prompts, answers = self.pretraining.batch(rng, cfg.warmup_batch)
            else:
                prompts, answers = [], []
                for _ in range(cfg.warmup_batch):
                    fam = WARMUP_FAMILIES[int(rng.integers(len(WARMUP_FAMILIES)))]
                    t = fam.generate(rng, 0)
                    prompts.append(t["prompt"])
                    answers.append(t["answer"])
            loss = supervised_step(self.model, opt, prompts, answers)
        self.warmup_loss = loss
        buf = io.BytesIO()
        torch.save(self.model.state_dict(), buf)
        _WARM[key] = buf.getvalue()
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(_WARM[key])
            os.replace(tmp, path)

    # ------------------------------------------------------------------ the learner interface
    def rollout(self, positions: Sequence[int] | np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """``n`` sampled completions per task: rewards ``(B, n)``, costs ``(B, n)`` (generated tokens, EOS
        included) and one handle per group for :meth:`train`."""
        pos = self._positions(positions)
        n = check_int(n, "n", low=1)
        prompts = [self.fpool.prompts[i] for i in pos.tolist()]
        comp = generate(self.model, encode_prompts(prompts), self.config.max_new_tokens, generator=self._gen,
                        temperature=self.config.temperature, repeats=int(n))
        texts = decode(comp.tokens)
        rewards = np.array([self.fpool.reward(int(pos[k // n]), s) for k, s in enumerate(texts)],
                           dtype=float).reshape(pos.size, n)
        costs = comp.mask.sum(1).numpy().astype(float).reshape(pos.size, n)
        groups = [comp.select(np.arange(b * n, (b + 1) * n)) for b in range(pos.size)]
        return rewards, costs, groups

    def train(self, positions: Sequence[int] | np.ndarray, rewards: np.ndarray, groups: Sequence[Any]) -> float:
        """One GRPO update on the groups (their completions from :meth:`rollout`). Returns the summed group
        reward std (the batch's signal)."""
        pos = self._positions(positions)
        r = np.asarray(rewards, dtype=float)
        if r.ndim != 2 or r.shape[0] != pos.size or len(groups) != pos.size:
            raise ValueError(f"rewards must be (groups, rollouts) with one handle per group; got {r.shape} and "
                             f"{len(groups)} handles for {pos.size} positions")
        if not all(isinstance(g, Completions) and g.tokens.shape[0] == r.shape[1] for g in groups):
            raise ValueError("each group handle must be the Completions rollout() returned for that group")
        adv = advantages(r)
        self.last_grad_norms: list[float] = []
        self.last_losses = grpo_update(self.model, self.opt, Completions.cat(list(groups)), adv.reshape(-1),
                                       clip=self.config.clip, epochs=self.config.epochs, total=int(r.size),
                                       max_grad_norm=self.config.max_grad_norm or None,
                                       grad_norms=self.last_grad_norms)
        self.steps_trained += 1
        return float(r.std(axis=1).sum())

    def evaluate(self, positions: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Per task: greedy success (reward of the greedy completion) and expected sampled success (the exact
        probability of sampling the answer at temperature 1 for exact-match tasks; for graded families the
        mean reward of 4 completions sampled from a generator fixed by the seed and the training step)."""
        pos = np.arange(len(self.fpool.prompts)) if positions is None else self._positions(positions)
        greedy = np.zeros(pos.size)
        expected = np.zeros(pos.size)
        chunk = 512
        for s in range(0, pos.size, chunk):
            p = pos[s:s + chunk]
            prompts = [self.fpool.prompts[i] for i in p.tolist()]
            comp = generate(self.model, encode_prompts(prompts), self.config.max_new_tokens, greedy=True)
            greedy[s:s + p.size] = [self.fpool.reward(int(i), c) for i, c in zip(p.tolist(), decode(comp.tokens),
                                                                               strict=True)]
            exact = [k for k, i in enumerate(p.tolist()) if self.fpool.answers[i] is not None]
            if exact:
                lp = answer_logprobs(self.model, [prompts[k] for k in exact],
                                     [self.fpool.answers[int(p[k])] for k in exact])  # type: ignore[misc]
                expected[s + np.asarray(exact)] = np.exp(lp)
            graded = [k for k, i in enumerate(p.tolist()) if self.fpool.answers[i] is None]
            if graded:
                gen = torch.Generator().manual_seed(self.seed * 7919 + self.steps_trained)
                expected[s + np.asarray(graded)] = self._mc(p[graded], 4, gen)
        return {"greedy": greedy, "expected": expected}

    def _mc(self, pos: np.ndarray, k: int, gen: torch.Generator) -> np.ndarray:
        prompts = [self.fpool.prompts[i] for i in pos.tolist()]
        comp = generate(self.model, encode_prompts(prompts), self.config.max_new_tokens, generator=gen,
                        temperature=self.config.temperature, repeats=k)
        r = [self.fpool.reward(int(pos[j // k]), c) for j, c in enumerate(decode(comp.tokens))]
        return np.asarray(r, dtype=float).reshape(pos.size, k).mean(1)

    def scores(self, train: np.ndarray, held_a: np.ndarray, held_b: np.ndarray, *,
               last: bool = False) -> dict[str, Any]:
        """x100 scores: greedy success as ``score`` (training pool: an evenly spaced subset of at most
        ``train_eval_tasks`` of its tasks), ``heldout_a``, ``heldout_b``, ``heldout`` (both), and the expected
        sampled success as ``*_expected``. Measured at step 0, every ``eval_every`` training steps and when
        ``last``; in between the last measurement is repeated (``evaluated`` False)."""
        train = np.asarray(train, dtype=np.int64)
        if train.size > self.config.train_eval_tasks:
            train = train[np.linspace(0, train.size - 1, self.config.train_eval_tasks).round().astype(np.int64)]
        held_a, held_b = np.asarray(held_a, dtype=np.int64), np.asarray(held_b, dtype=np.int64)
        sets = {"score": train, "heldout": np.sort(np.concatenate([held_a, held_b])), "heldout_a": held_a,
                "heldout_b": held_b}
        due = self._evaluated_at < 0 or self.steps_trained % self.config.eval_every == 0 or last
        if due and self._evaluated_at != self.steps_trained:
            union = np.unique(np.concatenate(list(sets.values())))
            ev = self.evaluate(union)
            self._eval = {k: dict(zip(union.tolist(), v.tolist(), strict=True)) for k, v in ev.items()}
            self._evaluated_at = self.steps_trained
        out: dict[str, Any] = {"evaluated": self._evaluated_at == self.steps_trained}
        primary, other = (("greedy", "expected") if self.config.score == "greedy" else ("expected", "greedy"))
        for name, p in sets.items():
            for kind, key in ((primary, name), (other, f"{name}_{other}")):
                vals = [self._eval[kind][i] for i in p.tolist()]
                out[key] = float(np.mean(vals) * 100.0) if vals else math.nan
        return out

    def breakdown(self, groups: Mapping[str, np.ndarray]) -> dict[str, float]:
        """x100 means of the primary score (``score``) of the last evaluation over each group of positions
        (each must have been among the positions :meth:`scores` last evaluated)."""
        kind = self.config.score
        out = {}
        for name, p in groups.items():
            vals = [self._eval[kind][i] for i in np.asarray(p, dtype=np.int64).tolist()]
            out[name] = float(np.mean(vals) * 100.0) if vals else math.nan
        return out

    def success_probabilities(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        """Each task's success probability under the current policy, as :meth:`evaluate` computes the expected
        sampled success (exact for exact-match tasks). Reads the network only: no random stream moves."""
        pos = self._positions(positions)
        out = np.zeros(pos.size)
        chunk = 1024
        for s in range(0, pos.size, chunk):
            p = pos[s:s + chunk]
            exact = [k for k, i in enumerate(p.tolist()) if self.fpool.answers[i] is not None]
            if exact:
                lp = answer_logprobs(self.model, [self.fpool.prompts[int(p[k])] for k in exact],
                                     [self.fpool.answers[int(p[k])] for k in exact])  # type: ignore[misc]
                out[s + np.asarray(exact)] = np.exp(lp)
            graded = [k for k, i in enumerate(p.tolist()) if self.fpool.answers[i] is None]
            if graded:
                gen = torch.Generator().manual_seed(self.seed * 7919 + self.steps_trained)
                out[s + np.asarray(graded)] = self._mc(p[graded], 4, gen)
        return out

    def sampled_score(self, positions: Sequence[int] | np.ndarray, rollouts: int, rng: np.random.Generator) -> float:
        """Mean reward x 100 of ``rollouts`` sampled completions per task, from a generator seeded by ``rng``
        (the training stream is not moved)."""
        pos = self._positions(positions)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        return float(self._mc(pos, int(rollouts), gen).mean() * 100.0)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Network, optimiser, sampling generator and step count (everything a resumed run needs)."""
        return {"config": asdict(self.config), "seed": self.seed, "model": copy.deepcopy(self.model.state_dict()),
                "optimizer": copy.deepcopy(self.opt.state_dict()), "generator": self._gen.get_state().clone(),
                "steps_trained": self.steps_trained}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("config") != asdict(self.config) or state.get("seed") != self.seed:
            raise ValueError("neural learner state was saved with another config or seed")
        model = copy.deepcopy(self.model)
        model.load_state_dict(state["model"])  # raises on a shape mismatch before anything is replaced
        opt = self._optimizer(model)
        opt.load_state_dict(state["optimizer"])
        gen = torch.Generator()
        gen.set_state(state["generator"])
        self.model, self.opt, self._gen = model, opt, gen
        self.steps_trained = int(state["steps_trained"])
        self._evaluated_at = -1

    def _positions(self, positions: Sequence[int] | np.ndarray) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        n = len(self.fpool.prompts)
        if pos.ndim != 1 or (pos.size and (pos.min() < 0 or pos.max() >= n)):
            raise ValueError(f"positions must be a 1-D list of task positions in [0, {n})")
        return pos
