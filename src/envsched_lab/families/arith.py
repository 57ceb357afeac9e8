"""Corpus ``arith``: small integer arithmetic. Shared primitive: maximum (``bigger``, the larger of numbers).
Not shared: ``add``, ``increment`` (carries), ``parity`` and ``mod``."""

from __future__ import annotations

import numpy as np

from envsched_lab.families.base import TemplateFamily

__all__ = ["ARITH_FAMILIES"]

_CALC = {"name": "calculator", "description": "Evaluate an arithmetic expression over integers."}
_ANSWER = {"name": "answer", "description": "Return the final integer answer."}
_OPERANDS = {"name": "get_operands", "description": "Return the operands of the exercise."}


def _num(rng: np.random.Generator, ndigits: int) -> int:
    return int(rng.integers(0 if ndigits == 1 else 10 ** (ndigits - 1), 10**ndigits))


def _add(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    a, b = _num(rng, 1 + (tier >= 1)), _num(rng, 1 + (tier >= 2))
    return f"add:{a}+{b}", str(a + b)


def _bigger(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    k, nd = (2, 1) if tier == 0 else (2, 2) if tier == 1 else (3, 2)
    xs = [int(x) for x in rng.choice(10**nd, size=k, replace=False)]
    return "big:" + ",".join(map(str, xs)), str(max(xs))


def _increment(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    a = _num(rng, 1 + tier)
    return f"inc:{a}", str(a + 1)


def _parity(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    a = _num(rng, 1 + tier)
    return f"par:{a}", "e" if a % 2 == 0 else "o"


def _mod(rng: np.random.Generator, tier: int) -> tuple[str, str]:
    b = int(rng.integers(2, 4 + 2 * tier))
    a = _num(rng, 1 + (tier >= 1))
    return f"mod:{a}%{b}", str(a % b)


ARITH_FAMILIES = [
    TemplateFamily("arith/add", "arith", [_OPERANDS, _CALC, _ANSWER],
                   ("Add the two operands and answer with the sum.",
                    "Compute the sum of the exercise's operands.",
                    "What is the first operand plus the second? Answer with an integer."),
                   ("answer equals the sum of the operands", "answer is an integer"), _add),
    TemplateFamily("arith/bigger", "arith", [_OPERANDS, _ANSWER],
                   ("Answer with the largest of the operands.",
                    "Compare the exercise's numbers and return the greatest one.",
                    "Which operand is the biggest? Answer with it."),
                   ("answer equals the largest operand", "answer is one of the operands"), _bigger, pattern="maximum"),
    TemplateFamily("arith/increment", "arith", [_OPERANDS, _CALC, _ANSWER],
                   ("Answer with the operand plus one.",
                    "Return the successor of the given number.",
                    "What integer follows the operand? Answer with it."),
                   ("answer equals the operand plus one", "answer is an integer"), _increment),
    TemplateFamily("arith/parity", "arith", [_OPERANDS, _ANSWER],
                   ("Answer 'e' if the operand is even and 'o' if it is odd.",
                    "Return the parity of the given number: e for even, o for odd.",
                    "Is the operand even (e) or odd (o)? Answer with one letter."),
                   ("answer equals the operand's parity letter", "answer is e or o"), _parity),
    TemplateFamily("arith/mod", "arith", [_OPERANDS, _CALC, _ANSWER],
                   ("Answer with the remainder of the first operand divided by the second.",
                    "Compute the first operand modulo the second.",
                    "What remains when the first number is divided by the second? Answer with an integer."),
                   ("answer equals the remainder of the division", "answer is a non-negative integer"), _mod),
]
