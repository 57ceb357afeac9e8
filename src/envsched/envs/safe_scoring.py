"""Scoring reasoning-gym answers without ever evaluating a model's output as code.

Eleven reasoning-gym 0.1.25 scorers evaluate text (found by reading the package and by scoring marker-file
payloads on every dataset under an audit hook, see docs/scorers.md):

- ``eval`` of the model's answer: ``spiral_matrix``, ``string_insertion``, ``binary_matrix``, ``n_queens``;
- ``sympy.parse_expr`` of the model's answer (``parse_expr`` runs ``eval`` on the tokenized text):
  ``simple_integration``, ``intermediate_integration``, ``polynomial_multiplication``, ``countdown``,
  ``puzzle24``;
- ``eval`` of the dataset's own generated text, never of the answer: ``number_sorting`` (its reference
  answer when that is not JSON) and ``bitwise_arithmetic`` (the problem, on every call).

envsched scores these without evaluating anything:

- ``bitwise_arithmetic`` in process: the reference answer is ``hex(eval(problem))``, so the answer is compared
  with ``int(reference, 0)`` exactly as reasoning-gym's ``verify_solution`` compares it with ``eval(problem)``.
- the ten others in a **bounded worker process** (:class:`_ScorerWorker`: forked, its address space capped at
  ``ENVSCHED_SCORER_MEMORY_MB`` MiB above its start size, killed after ``ENVSCHED_SCORER_TIMEOUT_S`` seconds)
  that runs the dataset's own ``score_answer`` with the module's ``eval`` replaced by
  :func:`literal_eval_compat` (``ast.literal_eval`` after a length and nesting check: Python literals only)
  and ``parse_expr`` replaced by :func:`safe_parse_expr` (in :mod:`envsched.envs.safe_expr`), a strict
  tokenizer and recursive-descent parser that builds the same SymPy expression as ``parse_expr``'s standard
  transformations for the grammar of numbers, ``+ - * / **``, parentheses, calls of an allow-list of
  functions, and plain names (local names, an allow-list of constants, other names as ``Symbol``/``Function``
  as ``auto_symbol`` does), with no attributes, strings, subscripts, keywords, dunders or non-ASCII text.
  Nothing is ``eval``-ed: the expression is built with SymPy's operators from the parsed tree. So every answer
  a dataset accepted as a literal or an expression of that grammar scores as it did; an answer that only
  scored through evaluation (``[1]*3``, ``range(4)``, ``S(1)/2``) now scores as a malformed answer. An answer
  over its time or memory budget scores 0.0 and the worker is replaced.

Every other audited dataset parses its answer (``int``, ``float``, ``json.loads``, regular expressions,
string comparison) and is scored in process by its own ``score_answer`` under a **guard**: an audit hook
(:func:`sys.addaudithook`) that, while a score is being computed on the thread, aborts ``exec`` of code
compiled from a string (``eval``/``exec``/``compile`` input; imports are allowed), process creation,
sockets, ``ctypes``, ``pickle`` class lookups and opening files for writing. The same guard is always on in
the worker. So a future reasoning-gym release that starts evaluating answers in an audited dataset is
stopped rather than trusted.

A dataset that was not audited (not in :data:`AUDITED_DATASETS`, e.g. one a newer reasoning-gym adds or one
registered at run time) has no safe scorer: :func:`check_scorer_allowed` refuses it, so it is left out of
pools built from ``"all"`` and refused by ``score_task_answer``, ``ReasoningGymEnvironment`` and the OpenEnv
server, unless the operator sets ``ENVSCHED_ALLOW_EVALUATING_SCORERS=1`` (or passes
``allow_evaluating_scorers=True``): then its own scorer runs in process without the guard.

An answer longer than :data:`MAX_ANSWER_CHARS` characters scores 0.0 without being scored.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import decimal
import functools
import json
import os
import pickle
import resource
import sys
import threading
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from envsched.envs._settings import env_number
from envsched.envs._worker_pool import PooledWorker, limit_address_space
from envsched.envs.safe_expr import MAX_EXPR_CHARS, _names, safe_parse_expr
from envsched.errors import EnvSchedError

__all__ = [
    "ALLOW_EVALUATING_ENV",
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
    "bitwise_arithmetic": "eval(metadata['problem']) (generated, not the answer) -> int(reference, 0), in process",
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
_IN_PROCESS_SAFE = frozenset({"bitwise_arithmetic"})
_WORKER_SAFE = frozenset(EVALUATING_DATASETS) - _IN_PROCESS_SAFE

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


class EvaluationBlocked(EnvSchedError, RuntimeError):
    """The guard stopped a scorer from running code, starting a process or writing a file."""


@dataclasses.dataclass(frozen=True)
class Score:
    """A reward and, when the answer was not scored normally, why (too long, over its budget)."""

    reward: float
    note: str | None = None


# ---------------------------------------------------------------------------------------------- policy
def evaluating_scorers_allowed() -> bool:
    """Whether ``ENVSCHED_ALLOW_EVALUATING_SCORERS`` is set to ``1``/``true``/``yes``."""
    return os.environ.get(ALLOW_EVALUATING_ENV, "").strip().lower() in {"1", "true", "yes"}


def scoring_kind(name: str) -> str:
    """How envsched scores a dataset: ``"worker"`` (its evaluating scorer replaced, in the bounded worker),
    ``"safe"`` (envsched's own formula, in process), ``"guarded"`` (its own scorer, which only parses, under
    the guard) or ``"unaudited"`` (no safe scorer)."""
    if name in _WORKER_SAFE:
        return "worker"
    if name in _IN_PROCESS_SAFE:
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


# ---------------------------------------------------------------------------------------------- the guard
_GUARD = threading.local()
_HOOK_INSTALLED = False
_HOOK_LOCK = threading.Lock()
_BLOCKED_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "socket.connect", "socket.bind", "socket.sendto", "ctypes.dlopen",
    "ctypes.dlsym", "ctypes.cdata", "pickle.find_class", "os.remove", "os.rmdir", "os.rename", "os.chmod",
    "os.symlink", "os.link", "shutil.rmtree", "webbrowser.open", "urllib.Request",
})


def _in_import() -> bool:
    """Whether the current ``exec`` runs a module being imported (import machinery on the stack)."""
    try:
        frame: Any = sys._getframe(2)
    except ValueError:  # pragma: no cover
        return False
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not getattr(_GUARD, "on", 0):
        return
    if event == "exec":
        code = args[0] if args else None
        if isinstance(code, types.CodeType) and code.co_filename.startswith("<") and not _in_import():
            raise EvaluationBlocked("a scorer tried to run code compiled from text")
    elif event == "open":
        mode = args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 else 0
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)):
            raise EvaluationBlocked(f"a scorer tried to open {args[0]!r} for writing")
    elif event in _BLOCKED_EVENTS:
        raise EvaluationBlocked(f"a scorer tried {event}")


def _install_hook() -> None:
    global _HOOK_INSTALLED
    with _HOOK_LOCK:
        if not _HOOK_INSTALLED:
            sys.addaudithook(_audit)
            _HOOK_INSTALLED = True


@contextlib.contextmanager
def _guarded() -> Any:
    _install_hook()
    _GUARD.on = getattr(_GUARD, "on", 0) + 1
    try:
        yield
    finally:
        _GUARD.on -= 1


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


@functools.lru_cache(maxsize=64)
def _worker_dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    from reasoning_gym import factory

    with decimal.localcontext(decimal.Context()):
        return factory.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def _worker_main(conn: Any, memory_bytes: int) -> None:
    """The scorer worker: caps its address space, makes the evaluating scorers safe, then scores
    ``(name, config_json, seed, size, entry, answer)`` requests under the guard; replies are JSON bytes
    (the parent never unpickles what this process sends)."""
    limit_address_space(memory_bytes)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _make_scorers_safe()
    _names()
    _install_hook()
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())  # from the trusted caller only
        except (EOFError, OSError):
            return
        try:
            name, config_json, seed, size, entry, answer = msg
            ds = _worker_dataset(name, config_json, seed, size)
            with _guarded(), decimal.localcontext(decimal.Context()):
                reward = float(ds.score_answer(answer, entry=entry))
            reply: dict[str, Any] = {"reward": reward}
        except MemoryError:
            reply = {"budget": "the answer exceeded the scorer's memory budget"}
        except Exception as exc:  # the dataset's own scorer raised: reported, the worker goes on
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        try:
            conn.send_bytes(json.dumps(reply).encode())
        except MemoryError:  # pragma: no cover
            conn.send_bytes(b'{"budget": "the scorer ran out of memory"}')


_REPLY_BYTES = 1 << 16


class _ScorerWorker(PooledWorker):
    """One scorer worker process and the pipe to it."""

    target = _worker_main
    process_name = "envsched-scorer"
    idle: ClassVar[list[_ScorerWorker]] = []
    idle_lock = threading.Lock()
    max_idle = 4

    def __init__(self, memory_bytes: int) -> None:
        _names()  # computed here, so the forked child imports nothing (another thread may hold an import lock)
        super().__init__(memory_bytes)
        if not self.conn.poll(120.0):
            self.kill()
            raise RuntimeError("the scorer worker process did not start within 120 s")
        try:
            self.conn.recv_bytes(_REPLY_BYTES)
        except (EOFError, OSError) as exc:
            self.kill()
            raise RuntimeError(f"the scorer worker process failed to start (exit code {self.proc.exitcode})") from exc

    def score(self, msg: tuple[Any, ...], timeout_s: float) -> dict[str, Any]:
        """The worker's JSON reply; ``{"budget": why}`` when it ran out of time or memory or died (then the
        worker is gone)."""
        try:
            payload = pickle.dumps(msg)
        except (TypeError, ValueError, pickle.PicklingError) as exc:
            raise ValueError(f"cannot send this item to the scorer worker: {exc}") from exc
        try:
            self.conn.send_bytes(payload)
            if self.conn.poll(timeout_s):
                reply = json.loads(self.conn.recv_bytes(_REPLY_BYTES))
                if not isinstance(reply, dict):
                    raise ValueError("a reply that is not an object")
                if "budget" in reply:
                    self.kill()
                return reply
        except (EOFError, OSError, ValueError) as exc:
            self.kill()
            return {"budget": f"the scorer worker died ({type(exc).__name__}, exit code {self.proc.exitcode})"}
        self.kill()
        return {"budget": f"the answer took longer than {timeout_s:g}s to score"}


def scorer_budget() -> tuple[float, int]:
    """(seconds, bytes) one answer may use in the scorer worker, from the environment or the defaults."""
    timeout = env_number(SCORER_TIMEOUT_ENV, DEFAULT_SCORER_TIMEOUT_S)
    memory = env_number(SCORER_MEMORY_ENV, DEFAULT_SCORER_MEMORY_MB)
    return timeout, int(memory * 2**20)


# ---------------------------------------------------------------------------------------------- scoring
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


def score_answer(name: str, dataset: Any, entry: Mapping[str, Any], answer: Any, *, config: Mapping[str, Any],
                 seed: int, size: int, allow_evaluating: bool | None = None) -> Score:
    """Score ``answer`` for a reasoning-gym item without evaluating it (see the module doc).

    ``dataset`` is the dataset object (used in process); ``config``, ``seed`` and ``size`` rebuild it in the
    worker. Raises :class:`UnsafeScorerError` for a dataset without a safe scorer (unless allowed), and
    whatever an in-process scorer raises.
    """
    check_scorer_allowed(name, allow_evaluating)
    if isinstance(answer, str) and len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, f"an answer of {len(answer)} characters, more than {MAX_ANSWER_CHARS}: not scored")
    kind = scoring_kind(name)
    if kind == "safe":
        return Score(_bitwise(answer, entry))
    if kind == "unaudited":  # the operator accepted evaluating scorers
        with decimal.localcontext(decimal.Context()):
            return Score(float(dataset.score_answer(answer, entry=entry)))
    if kind == "guarded":
        with _guarded(), decimal.localcontext(decimal.Context()):
            return Score(float(dataset.score_answer(answer, entry=entry)))
    timeout, memory = scorer_budget()
    try:
        msg = (name, json.dumps(dict(config), sort_keys=True), int(seed), int(size), dict(entry), answer)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot send this item to the scorer worker: {exc}") from exc
    worker = _ScorerWorker.get(memory)
    try:
        reply = worker.score(msg, timeout)
    finally:
        worker.release()
    if "reward" in reply and isinstance(reply["reward"], int | float):
        return Score(float(reply["reward"]))
    if "budget" in reply:
        return Score(0.0, f"{reply['budget']}: scored 0")
    raise RuntimeError(f"the {name} scorer failed: {reply.get('error', reply)}")
