"""A strict parser for the SymPy expressions reasoning-gym's scorers read (:func:`safe_parse_expr`), used by
:mod:`envsched.envs.safe_scoring` in place of ``sympy.parse_expr``, which ``eval``-s its input: a tokenizer and
recursive-descent parser for numbers, ``+ - * / **``, parentheses, calls of an allow-list of functions and
plain names, which builds the expression with SymPy's operators and evaluates nothing."""

from __future__ import annotations

import fractions
import functools
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_CONSTANT_BITS", "MAX_EXPR_CHARS", "MAX_EXPR_DEPTH", "MAX_EXPR_TOKENS", "MAX_NUMBER_DIGITS",
           "safe_parse_expr"]

#: Longest text :func:`safe_parse_expr` parses, most tokens, deepest nesting, longest number literal.
MAX_EXPR_CHARS = 50_000
MAX_EXPR_TOKENS = 20_000
MAX_EXPR_DEPTH = 64
MAX_NUMBER_DIGITS = 1_000
#: A constant (a subexpression without free names) may have at most about this many bits, whatever its base:
#: ``9**9**9``, ``sqrt(2)**(2**36)``, ``pi**(10**6)`` and ``2**(10**6/3)`` are refused before SymPy sees them
#: (SymPy computes such powers exactly, or to that precision when ``floor``/``Abs`` evaluate them).
MAX_CONSTANT_BITS = 100_000


_TOKEN = re.compile(r"[ \t]*(?:(?P<num>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
                    r"|[0-9]+[eE][+-]?[0-9]+|[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>\*\*|[-+*/(),]))")
_FUNCTIONS = (
    "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "asec", "acsc", "atan2", "sinh",
    "cosh", "tanh", "coth", "sech", "csch", "asinh", "acosh", "atanh", "acoth", "exp", "log", "ln", "sqrt",
    "cbrt", "Abs", "abs", "sign", "floor", "ceiling", "erf", "Min", "Max", "min", "max",
)
_CONSTANTS = ("pi", "E", "I", "oo")
_MAX_NAME = 32


@functools.cache
def _names() -> tuple[dict[str, Any], frozenset[str]]:
    """(allowed name -> SymPy object, names ``parse_expr`` would resolve to something else: refused)."""
    import builtins
    import keyword

    import sympy

    allowed: dict[str, Any] = {n: getattr(sympy, n) for n in _FUNCTIONS if hasattr(sympy, n)}
    allowed.update({"abs": sympy.Abs, "min": sympy.Min, "max": sympy.Max, "ln": sympy.log})
    allowed.update({n: getattr(sympy, n) for n in _CONSTANTS})
    reserved = set(getattr(sympy, "__all__", dir(sympy))) | set(dir(builtins)) | set(keyword.kwlist)
    reserved |= set(getattr(keyword, "softkwlist", ()))
    return allowed, frozenset(reserved - set(allowed))


def _tokens(text: str) -> list[tuple[str, str]]:
    if not text.isascii():
        raise ValueError("an expression is ASCII text")
    if len(text) > MAX_EXPR_CHARS:
        raise ValueError(f"an expression of {len(text)} characters, more than {MAX_EXPR_CHARS}")
    out: list[tuple[str, str]] = []
    pos, end = 0, len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip(" \t") == "":
                break
            raise ValueError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        if len(out) > MAX_EXPR_TOKENS:
            raise ValueError(f"more than {MAX_EXPR_TOKENS} tokens")
        pos = m.end()
    return out


class _Parser:
    """Recursive descent over Python's grammar for this subset (``-x**2`` is ``-(x**2)``, ``**`` is right
    associative and takes a signed operand, ``*``/``/`` and ``+``/``-`` are left associative)."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.toks = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok != ("op", value)):
            raise ValueError(f"expected {value or 'more'} at token {self.i}")
        self.i += 1
        return tok

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            raise ValueError(f"an expression nested more than {MAX_EXPR_DEPTH} levels deep")

    def parse(self) -> tuple[Any, ...]:
        if not self.toks:
            raise ValueError("an empty expression")
        node = self.sum()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()[1]!r} at token {self.i}")
        return node

    def sum(self) -> tuple[Any, ...]:
        node = self.term()
        while (tok := self.peek()) in (("op", "+"), ("op", "-")):
            self.i += 1
            node = ("bin", tok[1], node, self.term())
        return node

    def term(self) -> tuple[Any, ...]:
        node = self.factor()
        while (tok := self.peek()) in (("op", "*"), ("op", "/")):
            self.i += 1
            node = ("bin", tok[1], node, self.factor())
        return node

    def factor(self) -> tuple[Any, ...]:
        tok = self.peek()
        if tok in (("op", "+"), ("op", "-")):
            self.i += 1
            self.nest()
            node = ("neg" if tok[1] == "-" else "pos", self.factor())
            self.depth -= 1
            return node
        return self.power()

    def power(self) -> tuple[Any, ...]:
        node = self.primary()
        if self.peek() == ("op", "**"):
            self.i += 1
            self.nest()
            node = ("bin", "**", node, self.factor())
            self.depth -= 1
        return node

    def primary(self) -> tuple[Any, ...]:
        kind, value = self.take()
        if kind == "num":
            return ("num", value)
        if kind == "name":
            if self.peek() == ("op", "("):
                self.i += 1
                self.nest()
                args = [self.sum()]
                while self.peek() == ("op", ","):
                    self.i += 1
                    if self.peek() == ("op", ")"):
                        break
                    args.append(self.sum())
                self.take(")")
                self.depth -= 1
                return ("call", value, args)
            return ("name", value)
        if value == "(":
            self.nest()
            node = self.sum()
            self.take(")")
            self.depth -= 1
            return node
        raise ValueError(f"unexpected {value!r} at token {self.i - 1}")


def _bits(v: fractions.Fraction) -> int:
    return v.numerator.bit_length() + v.denominator.bit_length()


def _constant(node: tuple[Any, ...]) -> fractions.Fraction | None:
    """The exact value of a constant (name-free) subtree, or ``None`` if it has names, floats or calls;
    ``ValueError`` if a power of constants would exceed :data:`MAX_CONSTANT_BITS` bits."""
    kind = node[0]
    if kind == "num":
        text = node[1]
        return fractions.Fraction(int(text)) if text.isdigit() else None
    if kind in ("neg", "pos"):
        v = _constant(node[1])
        return None if v is None else (-v if kind == "neg" else v)
    if kind != "bin":
        return None
    a, b = _constant(node[2]), _constant(node[3])
    if a is None or b is None:
        return None
    op = node[1]
    if op == "**":
        if b.denominator != 1:
            return None  # a root: SymPy keeps it symbolic
        if abs(a) not in (0, 1) and _bits(a) * abs(b.numerator) > MAX_CONSTANT_BITS:
            raise ValueError(f"a power of constants over {MAX_CONSTANT_BITS} bits")
        if a == 0 and b < 0:
            return None
        return a ** int(b)
    if op == "/":
        return None if b == 0 else a / b
    return a + b if op == "+" else a - b if op == "-" else a * b


def _too_big() -> ValueError:
    return ValueError(f"a constant of more than {MAX_CONSTANT_BITS} bits (a power too large to compute)")


def _estimate(node: tuple[Any, ...]) -> int | None:
    """An upper bound of the bits of a subtree without free names (``None`` when it has a free name: SymPy
    keeps it symbolic; 0 when it holds a float: SymPy computes it in floating point); ``ValueError`` when a
    subtree may exceed :data:`MAX_CONSTANT_BITS`. A power's bound is its base's times the exponent's magnitude
    whatever the base (an integer, a root, ``pi``, a call), so an irrational base is bounded too."""
    kind = node[0]
    if kind == "num":
        text = node[1]
        return max(1, int(text).bit_length()) if text.isdigit() else 0
    if kind == "name":
        return 2 if node[1] in _CONSTANTS else None
    if kind in ("neg", "pos"):
        return _estimate(node[1])
    if kind == "call":
        parts = [_estimate(a) for a in node[2]]
        if any(p is None for p in parts):
            return None
        bits = max((p for p in parts if p is not None), default=1) + 1
        if node[1] == "exp" and parts and parts[0]:  # exp(c) has about 1.45 c bits, and c < 2**bits(c)
            bits = 2 * 2 ** parts[0] if parts[0] < 20 else MAX_CONSTANT_BITS + 1
        if bits > MAX_CONSTANT_BITS:
            raise _too_big()
        return bits
    a, b = _estimate(node[2]), _estimate(node[3])
    if a is None or b is None:
        return None
    op = node[1]
    if op != "**":
        bits = a + b if op in ("*", "/") else max(a, b) + 1
    elif a == 0 or b == 0:
        return 0  # a float base or exponent: computed in floating point
    else:
        base = _constant(node[2])
        exponent = _constant(node[3])
        if base is not None and abs(base) in (0, 1):
            return 1
        if exponent is not None:
            bits = a * -(-abs(exponent.numerator) // exponent.denominator)
        else:  # an irrational exponent: its magnitude is below 2**b
            bits = a * 2 ** b if b < 20 else MAX_CONSTANT_BITS + 1
    if bits > MAX_CONSTANT_BITS:
        raise _too_big()
    return bits


def safe_parse_expr(s: str, local_dict: Mapping[str, Any] | None = None, transformations: Any = None,
                    global_dict: Any = None, evaluate: bool = True) -> Any:
    """What a scorer's ``sympy.parse_expr(s, local_dict=...)`` becomes: the same SymPy expression for the
    grammar in the module doc, built without ``eval``; ``ValueError`` for anything else.

    Numbers become ``Integer``/``Float`` as ``auto_number`` makes them (``Float`` from the literal's text);
    a name is ``local_dict``'s value, an allowed function or constant, or else a new ``Symbol`` (a
    ``Function`` before ``(``) as ``auto_symbol`` makes it; a name that ``parse_expr`` would resolve to
    another SymPy or Python object (``S``, ``N``, ``Symbol``, ``eval``, keywords) is refused."""
    import sympy

    if transformations is not None or global_dict is not None or not evaluate:
        raise ValueError("safe_parse_expr takes only the text and local names")
    if not isinstance(s, str):
        raise ValueError(f"only text is parsed, not {type(s).__name__}")
    text = s.strip()
    tree = _Parser(_tokens(text)).parse()
    _constant(tree)  # refuse a power of rationals too large to compute ...
    _estimate(tree)  # ... and any other constant power, whatever its base
    allowed, reserved = _names()
    local = dict(local_dict or {})

    def name(value: str, called: bool) -> Any:
        if len(value) > _MAX_NAME or value.startswith("_") or "__" in value:
            raise ValueError(f"the name {value[:40]!r} is not allowed")
        if value in local:
            return local[value]
        if value in allowed:
            return allowed[value]
        if value in reserved:
            raise ValueError(f"the name {value!r} is not allowed")
        return sympy.Function(value) if called else sympy.Symbol(value)

    def build(node: tuple[Any, ...]) -> Any:
        kind = node[0]
        if kind == "num":
            text_ = node[1]
            digits = sum(ch.isdigit() for ch in text_)
            if digits > MAX_NUMBER_DIGITS:
                raise ValueError(f"a number of {digits} digits, more than {MAX_NUMBER_DIGITS}")
            if "." in text_ or "e" in text_ or "E" in text_:
                return sympy.Float(text_)
            if len(text_) > 1 and text_[0] == "0" and text_.strip("0"):
                raise ValueError("leading zeros in an integer")
            return sympy.Integer(int(text_))
        if kind == "name":
            return name(node[1], called=False)
        if kind == "call":
            fn = name(node[1], called=True)
            if not (node[1] in allowed or isinstance(fn, sympy.core.function.FunctionClass)):
                raise ValueError(f"{node[1]!r} cannot be called")
            return fn(*[build(a) for a in node[2]])
        if kind == "neg":
            return -build(node[1])
        if kind == "pos":
            return +build(node[1])
        op, left, right = node[1], build(node[2]), build(node[3])
        if op == "**":
            return left ** right
        if op == "*":
            return left * right
        if op == "/":
            return left / right
        return left + right if op == "+" else left - right

    return build(tree)
