"""Reward integrity: answers that cannot be correct whatever a dataset's scorer makes of them.

Rules applied by :func:`envsched.envs.safe_scoring.score_answer` before an answer reaches any scorer, in
linear time whatever the answer's length:

- a **blank** answer (nothing left once whitespace, control and format characters are removed) scores 0.0,
  unless the reference answer is blank too;
- a **non-finite number** (``nan``, ``NaN``, ``-nan``, ``nanj``, ``nan+nanj``, ``inf``, ``-Infinity``,
  ``1e999``, ``sNaN``, ``oo``, ``zoo``, ``∞``... in any case, with signs, brackets, ``i``/``j`` and spaces)
  scores 0.0, unless the reference answer is one too. reasoning-gym's ``complex_arithmetic`` gave ``"nan"``
  1.0 (``min(1.0, exp(-nan))`` is 1.0), and a policy learns such an answer fast.

and, after a score, :func:`clean_reward`: a reward that is not a finite number in [0, 1] is 0.0 (non-finite)
or clipped to [0, 1], with the reason recorded.
"""

from __future__ import annotations

import decimal
import math
import re
import unicodedata
from typing import Any

__all__ = ["blank", "clean_reward", "degenerate_reason", "non_finite_number", "number_class"]

#: Longest text (after removing spaces and brackets) read as a number by :func:`non_finite_number`: longer
#: text is not a short number spelling (``1e999`` needs 5 characters; a 10,000-digit mantissa is refused
#: by ``float`` as well as ``Decimal`` only after work proportional to its length).
_MAX_NUMBER_TEXT = 400
_SPACE = re.compile(r"[\s_]+")
_SYMBOLIC_INFINITY = re.compile(r"[+-]?(?:oo|zoo|∞)(?:\*?[ij])?")
#: Whitespace, control characters and the format characters (Cf) of Unicode 15, as one class.
_BLANK_RUN = re.compile("[\\s\\x00-\\x1f\\x7f-\\x9f\\u00ad\\u0600-\\u0605\\u061c\\u06dd\\u070f\\u0890\\u0891"
                        "\\u08e2\\u180e\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2064\\u2066-\\u206f\\ufeff"
                        "\\ufff9-\\ufffb\\U000110bd\\U000110cd\\U00013430-\\U0001343f\\U0001bca0-\\U0001bca3"
                        "\\U0001d173-\\U0001d17a\\U000e0001\\U000e0020-\\U000e007f]*")
_IMAGINARY = re.compile(r"\*?i(?=$|[+-])")
#: ANSI/VT100 escape sequences: CSI (``ESC [ ... final``), OSC (``ESC ] ... BEL``) and two-character ones.
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-~])")
_ALNUM = re.compile(r"[^\W_]")
_NOT_IN_A_NON_FINITE_WORD = re.compile(r"[^\W_afinostyzAFINOSTYZ]")
_NON_FINITE_START = re.compile("[nNiIoOzZsS\u221e]")
#: A NaN or infinity word: ``nan``, ``snan``, ``inf``, ``infinity``, ``oo``, ``zoo`` (not inside a longer word), ``∞``.
_NON_FINITE_WORD = re.compile(r"(?<![^\W\d_])(?:s?nan|inf(?:inity)?|z?oo)(?![^\W\d_])|∞", re.IGNORECASE)


def blank(text: str) -> bool:
    """Whether ``text`` holds nothing but whitespace, control characters (Cc), format characters (Cf) and
    terminal escape sequences (``ESC [ 2 J``, colours)."""
    if "\x1b" in text:
        text = _ESCAPE_SEQUENCE.sub("", text)
    pos, end = 0, len(text)
    while True:
        pos = _BLANK_RUN.match(text, pos).end()  # type: ignore[union-attr]  # the pattern matches "" too
        if pos == end:
            return True
        ch = text[pos]
        if not (ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")):
            return False
        pos += 1


def _strip_brackets(text: str) -> str:
    n = 0  # linear: count the matching outer brackets, then slice once
    while n < len(text) // 2 and text[n] in "([{" and text[-1 - n] == {"(": ")", "[": "]", "{": "}"}[text[n]]:
        n += 1
    return text[n:len(text) - n] if n else text


def _only_non_finite_words(text: str) -> bool:
    """Whether ``text`` is NaN/infinity words and punctuation only (``nan nan``, ``NaN/NaN``, ``[inf, -inf]``,
    ``nan%``): at least one such word, and no letter or digit besides."""
    if _NOT_IN_A_NON_FINITE_WORD.search(text) or not _NON_FINITE_START.search(text):  # the common cases, at once
        return False
    rest, found = _NON_FINITE_WORD.subn(" ", text)
    return found > 0 and _ALNUM.search(rest) is None


def number_class(text: str) -> str | None:
    """How ``text`` reads as a number: ``"non_finite"`` (a NaN or infinite real or complex number as
    ``float``/``complex``/``decimal.Decimal`` read it, in any case, with signs, spaces, brackets and ``i`` for
    ``j``; SymPy's ``oo``/``zoo``/``∞``; or NaN/infinity words and punctuation only), ``"overflow"`` (a
    finite literal beyond the float range, such as
    ``1e999``, which a float-based scorer reads as infinity), ``"finite"``, or ``None`` (not a number)."""
    if _only_non_finite_words(text):
        return "non_finite"
    if len(text) > 4 * _MAX_NUMBER_TEXT:
        return None
    t = _strip_brackets(_SPACE.sub("", text).casefold())
    if not t or len(t) > _MAX_NUMBER_TEXT:
        return None
    if _SYMBOLIC_INFINITY.fullmatch(t):
        return "non_finite"
    spelled = "nan" in t or "inf" in t
    for candidate in (t, _IMAGINARY.sub("j", t)):
        for parse in (float, complex):
            try:
                value = complex(parse(candidate))
            except (ValueError, OverflowError):
                continue
            if math.isfinite(value.real) and math.isfinite(value.imag):
                return "finite"
            return "non_finite" if spelled else "overflow"
    try:
        number = decimal.Decimal(t)
    except (decimal.InvalidOperation, ValueError):
        return None
    return "finite" if number.is_finite() else "non_finite"


def non_finite_number(text: str) -> bool:
    """Whether ``text`` spells a NaN or an infinity, or a literal beyond the float range (see
    :func:`number_class`)."""
    return number_class(text) in ("non_finite", "overflow")


def degenerate_reason(answer: str, reference: Any) -> str | None:
    """Why ``answer`` cannot be correct for ``reference`` (blank; NaN or infinite where the reference is not;
    beyond the float range where the reference is within it), or ``None``."""
    ref = reference if isinstance(reference, str) else str(reference)
    if answer.strip() == ref.strip():
        return None
    if blank(answer) and not blank(ref):
        return "a blank answer (only whitespace or control characters)"
    kind = number_class(answer)
    if kind in ("non_finite", "overflow"):
        ref_kind = number_class(ref)
        if kind == "non_finite" and ref_kind != "non_finite":
            return "a NaN or infinite number for a finite reference answer"
        if kind == "overflow" and ref_kind not in ("non_finite", "overflow"):
            return "a number beyond the float range for a reference answer within it"
    return None


def clean_reward(reward: Any) -> tuple[float, str | None]:
    """``(reward, None)`` for a finite number in [0, 1]; otherwise 0.0 for what is not a finite number, or the
    reward clipped to [0, 1], with why."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return 0.0, f"the scorer returned {type(reward).__name__}, not a number: scored 0"
    value = float(reward)
    if not math.isfinite(value):
        return 0.0, f"the scorer returned {value!r}: scored 0"
    if value < 0.0 or value > 1.0:
        return min(1.0, max(0.0, value)), f"the scorer returned {value!r}, outside [0, 1]: clipped"
    return value, None
