"""Warm-up families: a short supervised phase before GRPO, never scheduled and never evaluated.

They teach the answer *format* only: read the characters after the ``:``, write a short string, end it
with the end-of-sequence token. ``echo`` copies the input (1 to 4 characters), ``first`` and ``last``
answer with one character of it. Inputs mix digits and lowercase letters. Without this phase a randomly
initialised network almost never emits one exact character followed by the end token (about 1 chance in 10^4
over a 100-token vocabulary), so nearly every GRPO group would have zero reward variance. ``first`` is a
special case of the indexing primitive (``at0``); every sampler starts from the same warmed-up network, so
this favours none of them."""

from __future__ import annotations

import numpy as np

from envsched_lab.families.base import TemplateFamily

__all__ = ["WARMUP_FAMILIES"]

_ALPHABET = "0123456789abcdefghij"
_TOOLS = [{"name": "read", "description": "Return the input string."}]


def _word(rng: np.random.Generator, lo: int, hi: int) -> str:
    n = int(rng.integers(lo, hi + 1))
    return "".join(_ALPHABET[int(i)] for i in rng.integers(0, len(_ALPHABET), size=n))


def _echo(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = _word(rng, 1, 4)
    return "echo:" + w, w


def _first(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = _word(rng, 2, 7)
    return "first:" + w, w[0]


def _last(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    w = _word(rng, 2, 7)
    return "last:" + w, w[-1]


WARMUP_FAMILIES = [
    TemplateFamily("warmup/echo", "warmup", _TOOLS, ("Repeat the input.",), ("reply equals the input",), _echo, 1),
    TemplateFamily("warmup/first", "warmup", _TOOLS, ("Reply with the first character.",),
                   ("reply equals the first character",), _first, 1),
    TemplateFamily("warmup/last", "warmup", _TOOLS, ("Reply with the last character.",),
                   ("reply equals the last character",), _last, 1),
]
