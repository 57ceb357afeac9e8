"""Scoring reasoning-gym answers without ever evaluating a model's output as code, each answer bounded in time
and memory, and with rewards a degenerate answer cannot game.

**Process isolation.** Every answer is scored in a **scorer worker** (:class:`_ScorerWorker`), a process
forked from the caller and reused between answers: its address space is capped ``ENVSCHED_SCORER_MEMORY_MB``
MiB above its start size, and the caller waits at most ``ENVSCHED_SCORER_TIMEOUT_S`` seconds for each answer
(one deadline per answer), then kills it. The caller's process runs no scorer code: a scorer that loops, holds
the GIL (``Fraction("1e99999999")`` held it for 197 s in process), recurses or allocates gigabytes stalls
only its worker. An answer that exceeds a bound scores 0.0, with the reason in :attr:`Score.note`, and a
fresh worker serves the next answer; a worker whose address space grew past half its budget (a scorer that
keeps memory) is replaced after its answer. Items are generated in another worker
(:mod:`envsched.envs._rg_items`).

**Nothing is evaluated.** Eleven reasoning-gym 0.1.25 scorers evaluate text (found by reading the package and
by scoring marker-file payloads on every dataset under an audit hook, see docs/scorers.md):

- ``eval`` of the model's answer: ``spiral_matrix``, ``string_insertion``, ``binary_matrix``, ``n_queens``;
- ``sympy.parse_expr`` of the model's answer (``parse_expr`` runs ``eval`` on the tokenized text):
  ``simple_integration``, ``intermediate_integration``, ``polynomial_multiplication``, ``countdown``,
  ``puzzle24``;
- ``eval`` of the dataset's own generated text, never of the answer: ``number_sorting`` (its reference
  answer when that is not JSON) and ``bitwise_arithmetic`` (the problem, on every call).

In the worker these are made safe: ``bitwise_arithmetic``'s reference answer is ``hex(eval(problem))``, so the
answer is compared with ``int(reference, 0)`` exactly as reasoning-gym's ``verify_solution`` compares it with
``eval(problem)``; the ten others run their own ``score_answer`` with the module's ``eval`` replaced by
:func:`literal_eval_compat` (``ast.literal_eval`` after a length and nesting check: Python literals only) and
``parse_expr`` replaced by :func:`safe_parse_expr` (in :mod:`envsched.envs.safe_expr`), a strict tokenizer and
recursive-descent parser that builds the same SymPy expression as ``parse_expr``'s standard transformations
for the grammar of numbers, ``+ - * / **``, parentheses, calls of an allow-list of functions, and plain names,
with no attributes, strings, subscripts, keywords, dunders or non-ASCII text. So every answer a dataset
accepted as a literal or an expression of that grammar scores as it did; an answer that only scored through
evaluation (``[1]*3``, ``range(4)``, ``S(1)/2``) now scores as a malformed answer. Every other audited dataset
parses its answer (``int``, ``float``, ``json.loads``, regular expressions, string comparison) with its own
``score_answer``. In the worker an audit hook (:mod:`envsched.envs._guard`) is armed for good as a second
line: it stops running code that was not imported, processes, sockets, ``ctypes``, unpickling and writes.

**Reward integrity** (:mod:`envsched.envs._answer_checks`): before any scorer sees it, a blank answer
(whitespace and control characters only) and a NaN or infinite number (``nan``, ``nanj``, ``inf``,
``1e999``...) score 0.0 unless the reference answer is one too; :data:`ANSWER_RULES` holds the dataset-specific
rules the integrity sweep needed (``complex_arithmetic`` gave ``"nan"`` 1.0, ``coin_flip`` gave ``"0"`` 1.0,
``game_of_life_halting`` gave every non-empty answer 1.0); a reward that is not a finite
number in [0, 1] becomes 0.0 (or is clipped), with the reason recorded. A scorer that raises on an answer
(``"1e999"``: ``OverflowError``) scores it 0.0 with the exception recorded, never ``None``: a failure the
answer caused is the answer's. Only a failure of the infrastructure (the dataset cannot be rebuilt) raises.

A dataset that was not audited (not in :data:`AUDITED_DATASETS`, e.g. one a newer reasoning-gym adds or one
registered at run time) has no safe scorer: :func:`check_scorer_allowed` refuses it, so it is left out of
pools built from ``"all"`` and refused by ``score_task_answer``, ``ReasoningGymEnvironment`` and the OpenEnv
server, unless the operator sets ``ENVSCHED_ALLOW_EVALUATING_SCORERS=1`` (or passes
``allow_evaluating_scorers=True``): then its own scorer runs in a worker of its own, under the same time and
memory bounds, whose guard allows evaluation (and still blocks processes, sockets and writes).

An answer longer than :data:`MAX_ANSWER_CHARS` characters scores 0.0 without being scored.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import decimal
import fractions
import functools
import json
import math
import os
import pickle
import resource
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from envsched.envs._answer_checks import clean_reward, degenerate_reason
from envsched.envs._guard import EvaluationBlocked, arm
from envsched.envs._settings import env_number
from envsched.envs._worker_pool import PooledWorker, address_space, limit_address_space, wait_for_request
from envsched.envs.safe_expr import MAX_EXPR_CHARS, _names, safe_parse_expr
from envsched.errors import EnvSchedError

__all__ = [
    "ALLOW_EVALUATING_ENV",
    "ANSWER_RULES",
    "AUDITED_DATASETS",
    "AUDITED_RG_VERSION",
    "EVALUATING_DATASETS",
    "MAX_ANSWER_CHARS",
    "MAX_EXPR_CHARS",
    "MAX_LITERAL_CHARS",
    "SCORER_MEMORY_ENV",
    "SCORER_TIMEOUT_ENV",
    "EvaluationBlocked",
    "Score",
    "UnsafeScorerError",
    "check_scorer_allowed",
    "evaluating_scorers_allowed",
    "literal_eval_compat",
    "safe_parse_expr",
    "score_answer",
    "scoring_kind",
]

#: Set to ``1`` to let datasets without a safe scorer be scored by their own (possibly evaluating) scorer.
ALLOW_EVALUATING_ENV = "ENVSCHED_ALLOW_EVALUATING_SCORERS"
#: Seconds one answer may take in the scorer worker (default 10).
SCORER_TIMEOUT_ENV = "ENVSCHED_SCORER_TIMEOUT_S"
#: MiB of address space the scorer worker may add to its start size (default 1024).
SCORER_MEMORY_ENV = "ENVSCHED_SCORER_MEMORY_MB"
DEFAULT_SCORER_TIMEOUT_S = 10.0
DEFAULT_SCORER_MEMORY_MB = 1024

#: An answer longer than this scores 0.0 without being scored (the longest reference answer of the
#: audited datasets' tiers is about 50 kB: ``spiral_matrix`` at 100 x 100).
MAX_ANSWER_CHARS = 1_000_000
#: Longest text :func:`literal_eval_compat` parses, and its deepest bracket nesting.
MAX_LITERAL_CHARS = 400_000
MAX_LITERAL_DEPTH = 64

AUDITED_RG_VERSION = "0.1.25"

#: reasoning-gym datasets whose ``score_answer`` evaluates text: what it evaluates, and how envsched scores it.
EVALUATING_DATASETS: dict[str, str] = {
    "binary_matrix": "eval(answer) -> literal parser, in the scorer worker",
    "bitwise_arithmetic": "eval(metadata['problem']) (generated, not the answer) -> int(reference, 0), in the "
                          "scorer worker",
    "countdown": "sympy parse_expr(answer) -> strict expression parser, in the scorer worker",
    "intermediate_integration": "sympy.parse_expr(answer) -> strict expression parser, in the scorer worker",
    "n_queens": "eval(answer) -> literal parser, in the scorer worker",
    "number_sorting": "eval(reference) when not JSON (not the answer) -> literal parser, in the scorer worker",
    "polynomial_multiplication": "sympy.parse_expr(answer) -> strict expression parser, in the scorer worker",
    "puzzle24": "sympy parse_expr(answer) -> strict expression parser, in the scorer worker",
    "simple_integration": "sympy.parse_expr(answer) -> strict expression parser, in the scorer worker",
    "spiral_matrix": "eval(answer) -> literal parser, in the scorer worker",
    "string_insertion": "eval(answer) -> literal parser, in the scorer worker",
}
_OWN_FORMULA = frozenset({"bitwise_arithmetic"})
_WORKER_SAFE = frozenset(EVALUATING_DATASETS) - _OWN_FORMULA

#: Every dataset of reasoning-gym 0.1.25 (all but ``composite``), audited: the eleven of
#: :data:`EVALUATING_DATASETS` get envsched's scorers, the others parse their answers and run under the guard.
AUDITED_DATASETS: frozenset[str] = frozenset((
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "binary_matrix", "bitwise_arithmetic", "boxnet", "caesar_cipher", "calendar_arithmetic",
    "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation", "complex_arithmetic", "count_bits",
    "count_primes", "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum", "dice",
    "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification", "futoshiki", "game_of_life",
    "game_of_life_halting", "gcd", "graph_color", "group_anagrams", "gsm_symbolic", "intermediate_integration",
    "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves", "largest_island", "lcm",
    "leg_counting", "letter_counting", "letter_jumble", "list_functions", "mahjong_puzzle", "manipulate_matrix",
    "maze", "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering", "number_format",
    "number_sequence", "number_sorting", "palindrome_generation", "palindrome_partitioning", "path_star",
    "polynomial_equations", "polynomial_multiplication", "pool_matrix", "power_function", "prime_factorization",
    "products", "propositional_logic", "puzzle24", "quantum_lock", "ransom_note", "rearc", "rectangle_count",
    "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference", "sentence_reordering",
    "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban", "spell_backward",
    "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting", "string_synthesis", "sudoku",
    "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal",
    "word_sorting", "zebra_puzzles",
))


class UnsafeScorerError(EnvSchedError, ValueError):
    """A dataset has no safe scorer and the operator has not accepted evaluating scorers."""


@dataclasses.dataclass(frozen=True)
class Score:
    """A reward and, when the answer was not scored normally, why (too long, blank or non-finite, over its
    time or memory budget, the scorer raised on it, the scorer's reward was not a number in [0, 1])."""

    reward: float
    note: str | None = None


# ---------------------------------------------------------------------------------------------- policy
def evaluating_scorers_allowed() -> bool:
    """Whether ``ENVSCHED_ALLOW_EVALUATING_SCORERS`` is set to ``1``/``true``/``yes``."""
    return os.environ.get(ALLOW_EVALUATING_ENV, "").strip().lower() in {"1", "true", "yes"}


def scoring_kind(name: str) -> str:
    """How envsched scores a dataset (every kind in a scorer worker): ``"worker"`` (its evaluating scorer with
    ``eval``/``parse_expr`` replaced), ``"safe"`` (envsched's own formula), ``"guarded"`` (its own scorer,
    which only parses) or ``"unaudited"`` (no safe scorer: refused unless the operator accepts evaluation)."""
    if name in _WORKER_SAFE:
        return "worker"
    if name in _OWN_FORMULA:
        return "safe"
    if name in AUDITED_DATASETS:
        return "guarded"
    return "unaudited"


@functools.cache
def _version_note() -> None:
    try:
        from importlib.metadata import version
        installed = version("reasoning-gym")
    except Exception:  # pragma: no cover
        return
    if installed != AUDITED_RG_VERSION:
        warnings.warn(f"reasoning-gym {installed} is installed; envsched audited its scorers for "
                      f"{AUDITED_RG_VERSION} (the guard still stops a scorer that evaluates text)",
                      RuntimeWarning, stacklevel=3)


def check_scorer_allowed(name: str, allow_evaluating: bool | None = None) -> None:
    """Raise :class:`UnsafeScorerError` when ``name`` has no safe scorer and evaluating scorers are not allowed
    (``allow_evaluating``, or ``ENVSCHED_ALLOW_EVALUATING_SCORERS=1`` when it is ``None``)."""
    _version_note()
    if scoring_kind(name) != "unaudited":
        return
    if allow_evaluating is None:
        allow_evaluating = evaluating_scorers_allowed()
    if not allow_evaluating:
        raise UnsafeScorerError(
            f"reasoning-gym dataset {name!r} has no safe scorer in envsched (its score_answer was not audited and "
            f"may evaluate the model's answer as code); set {ALLOW_EVALUATING_ENV}=1 (or pass "
            "allow_evaluating_scorers=True) to accept that")


# ---------------------------------------------------------------------------------------------- literals
def _max_depth(text: str) -> int:
    depth = best = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth -= 1
    return best


def literal_eval_compat(source: Any, globals: Any = None, locals: Any = None) -> Any:
    """What a scorer's ``eval(answer)`` becomes: ``ast.literal_eval`` of at most :data:`MAX_LITERAL_CHARS`
    characters nested at most :data:`MAX_LITERAL_DEPTH` deep (``ValueError`` otherwise). Python literals
    (numbers, strings, lists, tuples, sets, dicts, ``True``/``False``/``None``) give the value ``eval``
    gives; anything else (names, calls, operators but signs and complex sums) is refused."""
    if not isinstance(source, str):
        raise ValueError(f"only text is parsed, not {type(source).__name__}")
    if len(source) > MAX_LITERAL_CHARS:
        raise ValueError(f"a literal of {len(source)} characters, more than {MAX_LITERAL_CHARS}")
    if _max_depth(source) > MAX_LITERAL_DEPTH:
        raise ValueError(f"a literal nested more than {MAX_LITERAL_DEPTH} levels deep")
    return ast.literal_eval(source)


# ---------------------------------------------------------------------------------------------- answer rules
Rule = Callable[[Any, str, Mapping[str, Any]], "tuple[float, str] | None"]


def _complex_arithmetic(dataset: Any, answer: str, entry: Mapping[str, Any]) -> tuple[float, str] | None:
    """``complex_arithmetic`` scores ``min(1.0, exp(-|answer - result|))``: 1.0 for any answer its parser reads
    as a NaN (``exp(-nan)`` is NaN and ``min(1.0, nan)`` is 1.0)."""
    value = dataset.parse_string_to_complex(answer)
    if isinstance(value, complex | float | int) and not (math.isfinite(value.real) and math.isfinite(value.imag)):
        return 0.0, "complex_arithmetic read the answer as a NaN or infinite number"
    return None


def _coin_flip(dataset: Any, answer: str, entry: Mapping[str, Any]) -> tuple[float, str] | None:
    """``coin_flip`` gives an answer off by more than its tolerance the share of its leading characters that
    match the reference's (as ``%.10g``), over the *shorter* of the two: ``"0"`` scored 1.0 for every
    probability below 1 and ``"0.12"`` for 0.125. The share is taken over the longer of the two instead."""
    reward = float(dataset.score_answer(answer, entry=entry))
    if reward <= 0.0:
        return None
    try:
        got = float(fractions.Fraction(answer.replace(",", "")))
        want = float(fractions.Fraction(str(entry["answer"]).replace(",", "")))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if abs(got - want) <= 1e-4:  # within reasoning-gym's tolerance: its 1.0 stands
        return None
    a, b = f"{got:.10g}", f"{want:.10g}"
    match = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    fixed = match / max(len(a), len(b))
    return (fixed, "coin_flip's prefix credit over the longer number") if fixed != reward else None


def _game_of_life_halting(dataset: Any, answer: str, entry: Mapping[str, Any]) -> tuple[float, str] | None:
    """``game_of_life_halting`` compares ``bool(answer)`` with ``bool(reference)``: every non-empty answer
    scored 1.0 (the reference is ``"True"`` or ``"False"``). Only the reference's word (any case) may score."""
    if answer.strip().casefold() != str(entry["answer"]).strip().casefold():
        return 0.0, "game_of_life_halting: the answer is not the reference's True or False"
    return None


#: Dataset-specific reward-integrity rules, run in the scorer worker instead of the dataset's scorer: each
#: returns ``(reward, why)`` to replace the dataset's reward, or ``None`` to keep it (docs/scorers.md,
#: "Reward integrity"). Found by the integrity sweep of every dataset envsched can schedule.
ANSWER_RULES: dict[str, Rule] = {
    "coin_flip": _coin_flip,
    "complex_arithmetic": _complex_arithmetic,
    "game_of_life_halting": _game_of_life_halting,
}


def _bitwise(answer: Any, entry: Mapping[str, Any]) -> float:
    """``bitwise_arithmetic``: reasoning-gym compares ``int(str(answer), 0)`` with ``eval(problem)``, whose
    hexadecimal form is the reference answer."""
    if isinstance(answer, str):
        try:
            if int(str(answer), 0) == int(str(entry["answer"]), 0):
                return 1.0
        except Exception:  # as reasoning-gym: a malformed answer scores 0
            pass
    return 0.0


# ---------------------------------------------------------------------------------------------- the worker
def _safe_sympy_module() -> types.ModuleType:
    """A copy of the ``sympy`` module namespace whose ``parse_expr`` is :func:`safe_parse_expr` and whose
    ``sympify``/``S`` refuse text (for the scorer modules that call ``sympy.parse_expr``)."""
    import sympy

    proxy = types.ModuleType("sympy")
    proxy.__dict__.update(vars(sympy))

    def no_text(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(a: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(a, str | bytes):
                raise ValueError("text is not converted to an expression")
            return fn(a, *args, **kwargs)
        return call

    proxy.parse_expr = safe_parse_expr  # type: ignore[attr-defined]
    proxy.sympify = no_text(sympy.sympify)  # type: ignore[attr-defined]
    return proxy


def _make_scorers_safe() -> None:
    """In the worker only: replace ``eval`` and ``parse_expr`` in the evaluating scorers' modules."""
    from reasoning_gym import factory

    proxy = _safe_sympy_module()
    for name in sorted(_WORKER_SAFE):
        module = sys.modules[factory.DATASETS[name][0].__module__]
        module.eval = literal_eval_compat  # type: ignore[attr-defined]  # shadows the builtin in that module
        if "parse_expr" in vars(module):
            module.parse_expr = safe_parse_expr  # type: ignore[attr-defined]
        for alias, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType) and value.__name__ == "sympy":
                setattr(module, alias, proxy)


@functools.lru_cache(maxsize=512)
def _worker_dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    from reasoning_gym import factory

    with decimal.localcontext(decimal.Context()):
        return factory.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def _receive(conn: Any) -> Any:
    """The next request, unpickled (from the trusted caller only; the guard allows class lookups here)."""
    return pickle.loads(conn.recv_bytes())


def _score_request(msg: tuple[Any, ...]) -> dict[str, Any]:
    """Score one ``(name, config_json, seed, size, entry, answer)`` request: the JSON reply."""
    name, config_json, seed, size, entry, answer = msg
    try:
        dataset = _worker_dataset(name, config_json, seed, size)
    except Exception as exc:  # the dataset cannot be rebuilt: not the answer's doing
        from reasoning_gym import factory

        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "unregistered": name not in factory.DATASETS}
    try:
        with decimal.localcontext(decimal.Context()):
            if scoring_kind(name) == "safe":
                return {"reward": _bitwise(answer, entry)}
            rule = ANSWER_RULES.get(name)
            fixed = rule(dataset, answer, entry) if rule is not None and isinstance(answer, str) else None
            if fixed is not None:
                return {"reward": float(fixed[0]), "rule": fixed[1]}
            reward = dataset.score_answer(answer, entry=entry)
        return {"reward": float(reward)}
    except MemoryError:
        return {"budget": "the answer exceeded the scorer's memory budget"}
    except EvaluationBlocked as exc:
        return {"raised": f"the guard stopped the scorer: {exc}"}
    except Exception as exc:  # the dataset's scorer raised on this answer (RecursionError included)
        return {"raised": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _serve(conn: Any, memory_bytes: int, allow_evaluation: bool) -> None:
    """A scorer worker: caps its address space, makes the evaluating scorers safe, arms the guard for good,
    then answers requests; replies are JSON bytes (the parent never unpickles what this process sends), with
    ``grown``: how far its address space has grown since it started."""
    parent = os.getppid()
    limit_address_space(memory_bytes)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _make_scorers_safe()
    _names()
    start = address_space()
    arm(allow_evaluation=allow_evaluation, unpicklers=(_receive,))
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            wait_for_request(conn, parent)
            msg = _receive(conn)
        except (EOFError, OSError):
            return
        try:
            reply = _score_request(msg)
            reply["grown"] = address_space() - start
            data = json.dumps(reply).encode()
        except MemoryError:  # pragma: no cover - the reply itself did not fit
            data = b'{"budget": "the scorer ran out of memory"}'
        conn.send_bytes(data)


def _worker_main(conn: Any, memory_bytes: int) -> None:
    _serve(conn, memory_bytes, allow_evaluation=False)


def _evaluating_worker_main(conn: Any, memory_bytes: int) -> None:
    _serve(conn, memory_bytes, allow_evaluation=True)


_REPLY_BYTES = 1 << 16


class _ScorerWorker(PooledWorker):
    """One scorer worker process (guard armed, evaluation blocked) and the pipe to it."""

    target = _worker_main
    process_name = "envsched-scorer"
    idle: ClassVar[list[_ScorerWorker]] = []
    idle_lock = threading.Lock()
    max_idle = 8

    def __init__(self, memory_bytes: int) -> None:
        import reasoning_gym.factory  # noqa: F401  # imported here, so the forked child imports nothing (another
        _names()  # thread may hold an import lock at the fork)
        super().__init__(memory_bytes)
        if not self.conn.poll(120.0):
            self.kill()
            raise RuntimeError("the scorer worker process did not start within 120 s")
        try:
            self.conn.recv_bytes(_REPLY_BYTES)
        except (EOFError, OSError) as exc:
            self.kill()
            raise RuntimeError(f"the scorer worker process failed to start (exit code {self.proc.exitcode})") from exc

    def score(self, msg: tuple[Any, ...], timeout_s: float, deadline: float | None = None) -> dict[str, Any]:
        """The worker's JSON reply; ``{"budget": why}`` when it ran out of time or memory or died (then the
        worker is gone). The reply is awaited until ``deadline`` (``time.monotonic()``; default: ``timeout_s``
        from now). A worker that grew past half its memory budget is stopped after its reply."""
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        try:
            payload = pickle.dumps(msg)
        except (TypeError, ValueError, AttributeError, pickle.PicklingError) as exc:
            raise ValueError(f"cannot send this item to the scorer worker: {exc}") from exc
        try:
            self.conn.send_bytes(payload)
            if self.conn.poll(max(0.0, deadline - time.monotonic())):
                reply = json.loads(self.conn.recv_bytes(_REPLY_BYTES))
                if not isinstance(reply, dict):
                    raise ValueError("a reply that is not an object")
                grown = reply.get("grown")
                if "budget" in reply or not isinstance(grown, int) or grown > self.memory_bytes // 2:
                    self.kill(wait=False)
                return reply
        except (EOFError, OSError, ValueError) as exc:
            self.kill(wait=False)
            return {"budget": f"the scorer worker died ({type(exc).__name__}, exit code {self.proc.exitcode})"}
        self.kill(wait=False)  # the answer's deadline: the caller goes on while the worker exits
        return {"budget": f"the answer took longer than {timeout_s:g}s to score"}


class _EvaluatingScorerWorker(_ScorerWorker):
    """A scorer worker for datasets the operator accepted without a safe scorer: same bounds, and a guard
    that allows evaluation (processes, sockets and writes stay blocked)."""

    target = _evaluating_worker_main
    process_name = "envsched-scorer-evaluating"
    idle: ClassVar[list[_ScorerWorker]] = []
    idle_lock = threading.Lock()
    max_idle = 2


def scorer_budget() -> tuple[float, int]:
    """(seconds, bytes) one answer may use in the scorer worker, from the environment or the defaults."""
    timeout = env_number(SCORER_TIMEOUT_ENV, DEFAULT_SCORER_TIMEOUT_S)
    memory = env_number(SCORER_MEMORY_ENV, DEFAULT_SCORER_MEMORY_MB)
    return timeout, int(memory * 2**20)


# ---------------------------------------------------------------------------------------------- scoring
def _ask_worker(worker_class: type[_ScorerWorker], msg: tuple[Any, ...]) -> dict[str, Any]:
    """The reply for ``msg``, within one deadline counted from now (a worker's start included)."""
    timeout, memory = scorer_budget()
    deadline = time.monotonic() + timeout
    for attempt in range(2):
        worker = worker_class.get(memory)
        try:
            reply = worker.score(msg, timeout, deadline)
        finally:
            worker.release()
        if reply.get("unregistered") and attempt == 0:  # registered after the idle workers were forked
            worker_class.clear_idle()
            continue
        return reply
    return reply  # pragma: no cover - the loop returns


def score_answer(name: str, entry: Mapping[str, Any], answer: str | None, *, config: Mapping[str, Any],
                 seed: int, size: int, allow_evaluating: bool | None = None) -> Score:
    """Score ``answer`` for the reasoning-gym item ``entry`` in a scorer worker (see the module doc).

    ``config``, ``seed`` and ``size`` rebuild the item's dataset in the worker. Returns the reward and, when
    the answer was not scored normally, why (:class:`Score`): an answer over a bound, blank, non-finite, or
    one the scorer raised on scores 0.0. Raises :class:`UnsafeScorerError` for a dataset without a safe
    scorer (unless allowed), ``TypeError`` for an answer that is not text or ``None``, and ``RuntimeError``
    when the dataset cannot be rebuilt in the worker (not the answer's doing).
    """
    check_scorer_allowed(name, allow_evaluating)
    if answer is None:
        return Score(0.0, "no answer: scored 0")
    if not isinstance(answer, str):
        raise TypeError(f"an answer is text (str) or None, got {type(answer).__name__}")
    if len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, f"an answer of {len(answer)} characters, more than {MAX_ANSWER_CHARS}: not scored")
    why = degenerate_reason(answer, entry.get("answer", ""))
    if why is not None:
        return Score(0.0, f"{why}: scored 0")
    try:
        msg = (name, json.dumps(dict(config), sort_keys=True), int(seed), int(size), dict(entry), answer)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot send this item to the scorer worker: {exc}") from exc
    worker_class = _EvaluatingScorerWorker if scoring_kind(name) == "unaudited" else _ScorerWorker
    reply = _ask_worker(worker_class, msg)
    if "reward" in reply:
        reward, note = clean_reward(reply["reward"])
        if note is None and isinstance(reply.get("rule"), str):
            note = f"{reply['rule']}: scored {reward:g}"
        return Score(reward, note)
    for key, what in (("budget", "{}: scored 0"), ("raised", "the scorer raised on this answer ({}): scored 0")):
        if key in reply:
            return Score(0.0, what.format(reply[key]))
    raise RuntimeError(f"the {name} scorer could not run: {reply.get('error', reply)}")
