"""The family protocol and :class:`TemplateFamily`, the helper the shipped families are written with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from envsched.errors import InvalidValueError
from envsched.validation import is_int

__all__ = ["Family", "TemplateFamily", "digits", "letters"]


@runtime_checkable
class Family(Protocol):
    """What ``--families MODULE:ATTR`` lists (see :mod:`envsched_lab.families`)."""

    name: str
    tools: list[dict[str, str]]

    def generate(self, rng: np.random.Generator, tier: int) -> dict[str, Any]:
        """One task of difficulty ``tier``: spec fields plus ``prompt`` and ``answer``."""
        ...


@dataclass(frozen=True)
class TemplateFamily:
    """A family whose tasks share one environment description.

    ``make(rng, tier) -> (prompt, answer)`` draws the input and computes the answer. The spec's instruction is
    one of ``instructions`` (drawn at random, so the text varies within the environment without saying
    anything about the input or its difficulty); ``checks`` are the verifier's checks."""

    name: str
    corpus: str
    tools: list[dict[str, str]]
    instructions: tuple[str, ...]
    checks: tuple[str, ...]
    make: Callable[[np.random.Generator, int], tuple[str, str]] = field(repr=False)
    tiers: int = 3
    pattern: str | None = None
    """The primitive the family shares with families of other corpora (the spec's ``pattern``: the held-out
    split holds out only families that share one); ``None``: it shares none."""

    def generate(self, rng: np.random.Generator, tier: int) -> dict[str, Any]:
        if not is_int(tier) or not 0 <= tier < self.tiers:
            raise InvalidValueError(f"family {self.name!r}: tier must be an int in [0, {self.tiers}), got {tier!r}",
                                    name="tier", value=tier)
        prompt, answer = self.make(rng, int(tier))
        out = {
            "instruction": self.instructions[int(rng.integers(len(self.instructions)))],
            "tools": [dict(t) for t in self.tools],
            "difficulty": int(tier),
            "verifier": {"checks": list(self.checks)},
            "prompt": prompt,
            "answer": answer,
        }
        if self.pattern is not None:
            out["pattern"] = self.pattern
        return out


def digits(rng: np.random.Generator, n: int, *, unique: bool = False) -> list[int]:
    """``n`` random decimal digits (distinct when ``unique``)."""
    if unique:
        return [int(x) for x in rng.choice(10, size=n, replace=False)]
    return [int(x) for x in rng.integers(0, 10, size=n)]


def letters(rng: np.random.Generator, n: int, *, alphabet: str = "abcdefghij", unique: bool = False) -> str:
    """``n`` random letters of ``alphabet`` (distinct when ``unique``)."""
    idx = rng.choice(len(alphabet), size=n, replace=not unique)
    return "".join(alphabet[int(i)] for i in idx)
