"""The checks of values that come from outside: the one home of what "an integer", "a number" and "a field of a
saved state" admit, for every part of the package.

**Options and arguments** (configs, constructors, CLI parsers, loaders): :func:`is_int` and :func:`is_number`
say what "an integer" (an ``int`` or numpy integer, never a ``bool``) and "a number" (an ``int`` or ``float``
or numpy number, never a ``bool``) mean; :func:`check_int`, :func:`check_number` and :func:`check_bool` refuse
anything else with :class:`~envsched.errors.InvalidValueError` (both a ``ValueError`` and a ``TypeError``: a wrong
type and a wrong range are both "this value is not admissible"), with a message that starts with the value's
name: ``k_within must be an integer >= 1, got '6'``.

**Saved states** (every ``load_state_dict``): a state read back from a checkpoint or a store is untrusted data.
A loader parses each field into a new object with :func:`mapping`, :func:`sequence`, :func:`whole`,
:func:`finite`, :func:`text`, :func:`choice`, the arrays and grids and :func:`rng_from_state`, which refuse
anything the sampler could not have written (a wrong type, NaN, an infinity, ``None``, a bool where a number
belongs, a value outside what the sampler can reach, a list of the wrong length), and assigns only after the
whole state passed. Every refusal is a :class:`~envsched.errors.StateError` (a ``ValueError``) whose message
starts with the field's dotted name, e.g. ``extra.alpha[3] must be a finite number in [1.0, 9007199254740993.0],
got nan``; :meth:`BaseSampler.load_state_dict <envsched.samplers.base.BaseSampler.load_state_dict>` prefixes
it with ``malformed <Sampler> state:``. Numbers are checked with plain Python over the lists a JSON state holds
(``numpy.asarray`` would turn ``None`` into NaN, ``"1"`` into 1.0 and ``True`` into 1), then converted with
numpy in one call.

A long array of numbers may be written **packed** (:func:`pack`): ``{"packed": "<f8", "base64": ...}``, its
little-endian float64 or int64 bytes in base64, which JSON writes and reads some 30 times faster than a list of
decimal numbers and in half the space (a checkpoint of a 100,000-task pool). :func:`float_array` and
:func:`int_array` read either form and check a packed one just as strictly (its dtype, its length, every value).

**Arrays read from files** (the graph file's arrays): :func:`array_problem` says what is wrong with an array of
numbers (NaN, an infinity, a value below a bound), for the reader to raise in its own error naming the file.

Every message shows the admissible interval in one notation (:func:`interval_text`).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from envsched.errors import InvalidValueError, StateError

__all__ = [
    "MAX_COUNT",
    "PACK_MIN_ENTRIES",
    "array_problem",
    "bool_array",
    "bool_grid",
    "check_bool",
    "check_int",
    "check_number",
    "choice",
    "finite",
    "float_array",
    "float_grid",
    "int_array",
    "int_grid",
    "interval_text",
    "is_int",
    "is_number",
    "mapping",
    "pack",
    "rng_from_state",
    "sequence",
    "text",
    "whole",
]


# ---------------------------------------------------------------------------------------------- options


def is_int(value: Any, *, numpy: bool = True) -> bool:
    """Whether ``value`` is an integer: a Python or numpy integer, never a ``bool``. With ``numpy=False`` only
    a Python ``int`` counts (a value that goes into JSON as it is, e.g. a task spec's field)."""
    if not numpy:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_number(value: Any, *, numpy: bool = True) -> bool:
    """Whether ``value`` is a real number: a Python or numpy integer or float, never a ``bool``. NaN and the
    infinities are numbers here; :func:`check_number` refuses them unless asked not to. With ``numpy=False``
    only a Python ``int`` or ``float`` (or a subclass, such as ``numpy.float64``) counts, as JSON writes it."""
    if not numpy:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


def interval_text(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """The admissible interval in interval notation, ``[0, 1)`` or ``(0, inf)`` (a missing bound is an open
    infinity); the messages of the option checks and of the state readers use it."""
    lo = "(" if low_open or low is None else "["
    hi = ")" if high_open or high is None else "]"
    return f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The bounds for a message: ``in [low, high]`` with both, ``>= low`` or ``<= high`` with one."""
    if low is not None and high is not None:
        return f"in {interval_text(low, high, low_open, high_open)}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


def _in_range(v: float, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    if low is not None and (v <= low if low_open else v < low):
        return False
    return not (high is not None and (v >= high if high_open else v > high))


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` if it is an integer in ``[low, high]`` (each bound optional); otherwise
    :class:`~envsched.errors.InvalidValueError` naming ``name``."""
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        where = _bounds(low, high, False, False)
        raise InvalidValueError(f"{name} must be an integer{' ' + where if where else ''}, got {value!r}",
                                name=name, value=value)
    return int(value)


def check_number(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """``value`` as a ``float`` if it is a number within the bounds (``low_open``/``high_open`` exclude the
    bound itself) and, unless ``finite=False``, neither NaN nor infinite; otherwise
    :class:`~envsched.errors.InvalidValueError` naming ``name``. NaN is never admitted, and neither is an
    integer beyond the float range (it has no ``float`` to return)."""
    ok = is_number(value)
    if ok:
        try:
            v = float(value)
        except OverflowError:
            ok = False
        else:
            ok = not (math.isnan(v) or (finite and math.isinf(v))) and _in_range(v, low, high, low_open, high_open)
    if not ok:
        where = _bounds(low, high, low_open, high_open)
        kind = "a finite number" if finite else "a number"
        raise InvalidValueError(f"{name} must be {kind}{' ' + where if where else ''}, got {value!r}",
                                name=name, value=value)
    return v


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is a ``bool`` (or numpy bool); otherwise :class:`~envsched.errors.InvalidValueError`
    naming ``name`` (``1`` and ``"true"`` are refused: a switch is ``True`` or ``False``)."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidValueError(f"{name} must be True or False, got {value!r}", name=name, value=value)
    return bool(value)


# ---------------------------------------------------------------------------------------------- arrays in files


def array_problem(values: np.ndarray, *, low: float | None = None) -> str | None:
    """What is wrong with an array of numbers read from a file, or ``None``: ``"holds NaN or infinite values"``,
    or ``"holds -0.5, below 0.0"`` for the smallest value under ``low``. Vectorised (a graph file's feature
    matrix holds millions of values); the reader raises its own error naming the file and the array."""
    if not values.size:
        return None
    if not np.isfinite(values).all():
        return "holds NaN or infinite values"
    if low is not None and float(values.min()) < low:
        return f"holds {float(values.min())!r}, below {low}"
    return None


# ---------------------------------------------------------------------------------------------- saved states
#: Largest value a counter may hold in a loaded state (integers above it lose precision as floats).
MAX_COUNT = 2**53

#: Arrays of at least this many entries are written packed by :func:`pack` (shorter ones stay readable lists).
PACK_MIN_ENTRIES = 1024
_PACKED_DTYPES = {"<f8": np.dtype("<f8"), "<i8": np.dtype("<i8")}


def pack(values: np.ndarray) -> list[Any] | dict[str, str]:
    """A 1-D float or integer array as a JSON value: a list below :data:`PACK_MIN_ENTRIES` entries, else
    ``{"packed": "<f8" or "<i8", "base64": <its little-endian bytes>}`` (exact: the same float64 bits)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"pack takes a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"pack takes integers or floats, got dtype {arr.dtype}")
    if arr.size < PACK_MIN_ENTRIES:
        return arr.tolist()
    code = "<i8" if arr.dtype.kind in "iu" else "<f8"
    return {"packed": code, "base64": base64.b64encode(np.ascontiguousarray(arr, dtype=code).tobytes()).decode("ascii")}


def _is_packed(value: Any) -> bool:
    return isinstance(value, Mapping) and "packed" in value


def _unpack(value: Mapping[str, Any], field: str, code: str, length: int | None,
            max_length: int | None) -> np.ndarray:
    """The array of a packed value, checked for its form (keys, dtype ``code``, base64, whole entries, length)."""
    extra = sorted(map(str, set(value) - {"packed", "base64"}))
    if extra:
        raise StateError(field, f"is a packed array with unknown keys {extra[:5]}")
    if value["packed"] != code:
        raise StateError(field, f"must be a packed array of dtype {code!r}, got {_show(value['packed'])}")
    data = value.get("base64")
    if not isinstance(data, str):
        raise StateError(f"{field}.base64", f"must be a base64 string, got {type(data).__name__}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise StateError(f"{field}.base64", "is not valid base64") from None
    dtype = _PACKED_DTYPES[code]
    if len(raw) % dtype.itemsize:
        raise StateError(f"{field}.base64", f"holds {len(raw)} bytes, not a whole number of {code} entries")
    arr = np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))  # a writable native copy
    _check_length(arr.size, field, length, max_length)
    return arr


def _show(value: Any) -> str:
    """``repr`` of an offending value, cut short (a hostile state may hold a huge one)."""
    text_ = repr(value)
    return text_ if len(text_) <= 60 else text_[:57] + "..."


def mapping(value: Any, field: str, *, keys: tuple[str, ...] | None = None) -> Mapping[str, Any]:
    """``value`` as a mapping; with ``keys``, each of them must be present."""
    if not isinstance(value, Mapping):
        raise StateError(field, f"must be an object, got {type(value).__name__}")
    for k in keys or ():
        if k not in value:
            raise StateError(f"{field}.{k}" if field else k, "is missing")
    return value


def sequence(value: Any, field: str, *, length: int | None = None, max_length: int | None = None) -> list[Any]:
    """``value`` as a list (a JSON array: list or tuple), of exactly ``length`` or at most ``max_length`` items."""
    if not isinstance(value, list | tuple):
        raise StateError(field, f"must be a list, got {type(value).__name__}")
    _check_length(len(value), field, length, max_length)
    return list(value)


def _check_length(count: int, field: str, length: int | None, max_length: int | None) -> None:
    """Refuse ``count`` entries unless exactly ``length`` / at most ``max_length`` (a list's or a packed array's)."""
    if length is not None and count != length:
        raise StateError(field, f"must have {length} entries, got {count}")
    if max_length is not None and count > max_length:
        raise StateError(field, f"must have at most {max_length} entries, got {count}")


def whole(value: Any, field: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer in ``[low, high]``. A float with an integral value is accepted (JSON writers may emit
    ``3.0``); bools, NaN, infinities and other types are not."""
    ok = is_int(value) or (is_number(value) and math.isfinite(value) and float(value).is_integer())
    if not ok or not low <= value <= high:
        raise StateError(field, f"must be a whole number in [{low}, {high}], got {_show(value)}")
    return int(value)


def finite(value: Any, field: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite number in the interval (closed unless ``low_open`` / ``high_open``; ``None``: unbounded)."""
    ok = is_number(value)
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond the float range
            ok = False
        else:
            ok = math.isfinite(v) and _in_range(v, low, high, low_open, high_open)
    if not ok:
        raise StateError(field, f"must be a finite number in {interval_text(low, high, low_open, high_open)}, "
                                f"got {_show(value)}")
    return v


def text(value: Any, field: str, *, allow_empty: bool = False) -> str:
    """A string (non-empty unless ``allow_empty``)."""
    if not isinstance(value, str) or (not value and not allow_empty):
        raise StateError(field, f"must be a {'' if allow_empty else 'non-empty '}string, got {_show(value)}")
    return value


def choice(value: Any, field: str, options: tuple[Any, ...]) -> Any:
    """One of ``options`` (compared by type and value: ``True`` is not ``1``)."""
    if not any(type(value) is type(o) and value == o for o in options):
        raise StateError(field, f"must be one of {list(options)}, got {_show(value)}")
    return value


def _elements(value: Any, field: str, length: int | None, max_length: int | None) -> list[Any]:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise StateError(field, f"must be a flat list, got an array of shape {value.shape}")
        value = value.tolist()
    return sequence(value, field, length=length, max_length=max_length)


def float_array(value: Any, field: str, *, length: int | None = None, max_length: int | None = None,
                low: float | None = None, high: float | None = None, low_open: bool = False,
                high_open: bool = False, allow_nan: np.ndarray | None = None) -> np.ndarray:
    """A list of finite numbers in the interval as a float64 array. ``allow_nan``: a boolean mask of the
    entries that may (and then must) be NaN -- e.g. the statistics of a group without a scored reward. A
    packed value (:func:`pack`) must be float64."""
    if _is_packed(value):
        arr = _unpack(value, field, "<f8", length, max_length)
        return _check_floats(arr, arr, _flat_names(field), low, high, low_open, high_open, allow_nan)
    items = _elements(value, field, length, max_length)
    return _floats(items, _flat_names(field), low, high, low_open, high_open, allow_nan)


def _floats(items: list[Any], at: Callable[[int], str], low: float | None, high: float | None, low_open: bool,
            high_open: bool, allow_nan: np.ndarray | None = None) -> np.ndarray:
    kinds = set(map(type, items))
    if not kinds <= {float, int} and not all(is_number(x) for x in items):
        i = next(i for i, x in enumerate(items) if not is_number(x))
        raise StateError(at(i), f"must be a finite number in {interval_text(low, high, low_open, high_open)}, "
                                f"got {_show(items[i])}")
    try:
        arr = np.asarray(items, dtype=np.float64)
    except OverflowError:  # an int beyond the float range
        i = next(i for i, x in enumerate(items) if isinstance(x, int) and abs(x) > 2**1023)
        raise StateError(at(i), f"must be a finite number, got {_show(items[i])}") from None
    return _check_floats(arr, items, at, low, high, low_open, high_open, allow_nan)


def _check_floats(arr: np.ndarray, items: Any, at: Callable[[int], str], low: float | None, high: float | None,
                  low_open: bool, high_open: bool, allow_nan: np.ndarray | None) -> np.ndarray:
    """``arr`` (float64) when every entry is finite and in the interval, NaN exactly where ``allow_nan``."""
    ok = np.isfinite(arr)
    if low is not None:
        ok &= (arr > low) if low_open else (arr >= low)
    if high is not None:
        ok &= (arr < high) if high_open else (arr <= high)
    if allow_nan is not None:
        nan = np.isnan(arr)
        ok = np.where(allow_nan, nan, ok)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        want = "NaN" if allow_nan is not None and allow_nan[i] else \
            f"a finite number in {interval_text(low, high, low_open, high_open)}"
        shown = float(items[i]) if isinstance(items, np.ndarray) else items[i]
        raise StateError(at(i), f"must be {want}, got {_show(shown)}")
    return arr


def int_array(value: Any, field: str, *, length: int | None = None, max_length: int | None = None,
              low: int = 0, high: int = MAX_COUNT, dtype: Any = np.int64) -> np.ndarray:
    """A list of integers in ``[low, high]`` as an array of ``dtype`` (no floats, bools or ``None``). A packed
    value (:func:`pack`) must be int64."""
    if _is_packed(value):
        arr = _unpack(value, field, "<i8", length, max_length)
        bad = np.flatnonzero((arr < low) | (arr > high))
        if bad.size:
            raise StateError(f"{field}[{int(bad[0])}]", f"must be a whole number in [{low}, {high}], "
                                                        f"got {_show(int(arr[bad[0]]))}")
        return arr.astype(dtype, copy=False)
    items = _elements(value, field, length, max_length)
    return _ints(items, _flat_names(field), low, high, dtype)


def _ints(items: list[Any], at: Callable[[int], str], low: int, high: int, dtype: Any) -> np.ndarray:
    if set(map(type, items)) - {int}:
        for i, x in enumerate(items):
            if not is_int(x):
                raise StateError(at(i), f"must be a whole number in [{low}, {high}], got {_show(x)}")
    for i, x in enumerate(items) if items and not low <= min(items) <= max(items) <= high else ():
        if not low <= x <= high:
            raise StateError(at(i), f"must be a whole number in [{low}, {high}], got {_show(x)}")
    return np.asarray(items, dtype=dtype).reshape(len(items))


def bool_array(value: Any, field: str, *, length: int | None = None) -> np.ndarray:
    """A list of ``true``/``false`` as a bool array (``0``/``1`` and other types are refused)."""
    items = _elements(value, field, length, None)
    return _bools(items, _flat_names(field))


def _bools(items: list[Any], at: Callable[[int], str]) -> np.ndarray:
    if set(map(type, items)) - {bool}:
        i = next(i for i, x in enumerate(items) if not isinstance(x, bool | np.bool_))
        raise StateError(at(i), f"must be true or false, got {_show(items[i])}")
    return np.asarray(items, dtype=bool).reshape(len(items))


def _flat_names(field: str) -> Callable[[int], str]:
    return lambda i: f"{field}[{i}]"


def _grid(value: Any, field: str, shape: tuple[int, ...]) -> tuple[list[Any], Callable[[int], str]]:
    """The entries of a nested list of exactly ``shape`` (every level a list of the right length), flattened
    in row-major order, and the dotted name of the entry at a flat position (``alpha[2][0][1]``)."""
    if not shape:
        raise ValueError("a grid has at least one dimension")
    flat: list[Any] = []
    level = [(value, field)]
    for depth, size in enumerate(shape):
        last = depth == len(shape) - 1
        nxt = []
        for rows, name in level:
            got = _elements(rows, name, size, None) if last else sequence(rows, name, length=size)
            if last:
                flat.extend(got)
            else:
                nxt.extend((row, f"{name}[{i}]") for i, row in enumerate(got))
        level = nxt

    def at(i: int) -> str:
        return field + "".join(f"[{int(j)}]" for j in np.unravel_index(i, shape))

    return flat, at


def float_grid(value: Any, field: str, shape: tuple[int, ...], *, low: float | None = None,
               high: float | None = None) -> np.ndarray:
    """A nested list of finite numbers in ``[low, high]`` (each bound optional) of exactly ``shape``, as a
    float64 array of that shape (:func:`float_array` for more than one dimension)."""
    items, at = _grid(value, field, shape)
    return _floats(items, at, low, high, False, False).reshape(shape)


def int_grid(value: Any, field: str, shape: tuple[int, ...], *, low: int = 0, high: int = MAX_COUNT,
             dtype: Any = np.int64) -> np.ndarray:
    """A nested list of integers in ``[low, high]`` of exactly ``shape``, as an array of ``dtype``."""
    items, at = _grid(value, field, shape)
    return _ints(items, at, low, high, dtype).reshape(shape)


def bool_grid(value: Any, field: str, shape: tuple[int, ...]) -> np.ndarray:
    """A nested list of ``true``/``false`` of exactly ``shape``, as a bool array of that shape."""
    items, at = _grid(value, field, shape)
    return _bools(items, at).reshape(shape)


_RNG_KEYS = ("bit_generator", "state", "has_uint32", "uinteger")


def rng_from_state(value: Any, field: str = "rng", *, bit_generator: str = "PCG64") -> np.random.Generator:
    """A new ``numpy.random.Generator`` set to a saved ``bit_generator.state``: the exact PCG64 layout numpy
    writes (128-bit ``state``, odd 128-bit ``inc``, the buffered 32-bit half), nothing else."""
    if bit_generator != "PCG64":
        raise ValueError(f"only PCG64 states are checked here, not {bit_generator!r}")
    try:
        return _rng_from_state(value, field, bit_generator)
    except StateError as exc:
        raise StateError(exc.field, f"{exc.problem} (a random generator state)", exc.owner) from None


def _rng_from_state(value: Any, field: str, bit_generator: str) -> np.random.Generator:
    st = mapping(value, field, keys=_RNG_KEYS)
    extra = sorted(set(st) - set(_RNG_KEYS))
    if extra:
        raise StateError(field, f"has unknown keys {extra}")
    choice(st["bit_generator"], f"{field}.bit_generator", (bit_generator,))
    inner = mapping(st["state"], f"{field}.state", keys=("state", "inc"))
    if sorted(inner) != ["inc", "state"]:
        raise StateError(f"{field}.state", f"must hold exactly 'state' and 'inc', got {sorted(map(str, inner))}")
    whole(inner["state"], f"{field}.state.state", high=2**128 - 1)
    inc = whole(inner["inc"], f"{field}.state.inc", high=2**128 - 1)
    if inc % 2 == 0:
        raise StateError(f"{field}.state.inc", f"must be odd (PCG64's stream increment), got {inc}")
    has = choice(st["has_uint32"], f"{field}.has_uint32", (0, 1))
    whole(st["uinteger"], f"{field}.uinteger", high=2**32 - 1)
    if not isinstance(inner["state"], int) or not isinstance(inc, int):
        raise StateError(f"{field}.state", "must hold integers")
    rng = np.random.default_rng()
    rng.bit_generator.state = {"bit_generator": bit_generator,
                               "state": {"state": int(inner["state"]), "inc": inc},
                               "has_uint32": int(has), "uinteger": int(st["uinteger"])}
    return rng
