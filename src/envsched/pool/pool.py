"""``TaskPool``: a validated, indexed collection of task specs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envsched.errors import EnvSchedError, InvalidValueError
from envsched.pool.spec import OPTIONAL_STATIC_FIELDS, TaskSpecError, normalized_id, validate_task_spec
from envsched.validation import is_int, is_number

__all__ = ["DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_JSON_BYTES", "DEFAULT_MAX_LINE_BYTES", "TaskPool"]

#: A JSONL line longer than this is refused (a corrupt or hostile file, not a task spec). Environment
#: variable ``ENVSCHED_POOL_MAX_LINE_BYTES`` or ``from_file(max_line_bytes=)`` changes it.
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
#: A pool file larger than this is refused before it is read (JSONL is read line by line up to it). A
#: pool in memory takes about 2.5 times its JSONL size (the 1,000,000-task benchmark pool: 2.7 GiB), so
#: 4 GiB of file stays within a 24 GiB machine. ``ENVSCHED_POOL_MAX_BYTES`` or ``from_file(max_file_bytes=)``.
DEFAULT_MAX_FILE_BYTES = 4 * 2**30
#: A ``.json`` pool is one JSON document, parsed whole (text and objects in memory at once), so it has a
#: smaller bound; larger pools belong in JSONL. ``ENVSCHED_POOL_MAX_JSON_BYTES`` or ``max_json_bytes=``.
DEFAULT_MAX_JSON_BYTES = 256 * 2**20

_LIMIT_ENV = {"max_line_bytes": "ENVSCHED_POOL_MAX_LINE_BYTES", "max_file_bytes": "ENVSCHED_POOL_MAX_BYTES",
              "max_json_bytes": "ENVSCHED_POOL_MAX_JSON_BYTES"}
_LIMIT_DEFAULT = {"max_line_bytes": DEFAULT_MAX_LINE_BYTES, "max_file_bytes": DEFAULT_MAX_FILE_BYTES,
                  "max_json_bytes": DEFAULT_MAX_JSON_BYTES}
#: Pseudo-file systems whose files claim to be regular but are generated on reading (sizes are lies).
_PSEUDO_ROOTS = ("/proc/", "/sys/")


def _limit(name: str, value: int | None) -> int:
    """A byte limit: ``value``, else its environment variable, else its default; positive integers only."""
    if value is None:
        raw = os.environ.get(_LIMIT_ENV[name], "").strip()
        if not raw:
            return _LIMIT_DEFAULT[name]
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            raise ValueError(f"{_LIMIT_ENV[name]}={raw[:40]!r} is not a whole number of bytes") from None
    if not is_int(value, numpy=False) or value < 1:
        raise InvalidValueError(f"{name} must be a positive whole number of bytes, got {value!r}", name=name,
                                value=value)
    return value


def _reward_range(rr: Any, source: str) -> tuple[float, float]:
    if (isinstance(rr, str | bytes | Mapping) or not isinstance(rr, Sequence) or len(rr) != 2
            or not all(map(is_number, rr))
            or not (np.isfinite(float(rr[0])) and np.isfinite(float(rr[1])) and float(rr[0]) < float(rr[1]))):
        raise TaskSpecError(f"reward_range must be two finite numbers [low, high] with low < high, got {rr!r:.200}",
                            source=source, field="reward_range")
    return (float(rr[0]), float(rr[1]))


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _open_regular(path: Path) -> Any:
    """``path`` opened for reading in binary, refused unless it is a regular file outside /proc and /sys.
    Opened without blocking (a FIFO swapped in after a check cannot hang the open) and checked on
    the open descriptor."""
    source = str(path)
    real = os.path.realpath(path)
    if real.startswith(_PSEUDO_ROOTS):
        raise TaskSpecError(f"is a special file under /{real.split('/')[1]} ({real[:200]}), not a pool file on disk",
                            source=source)
    try:
        mode = os.stat(path).st_mode  # a socket cannot even be opened: say what it is first
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise TaskSpecError(f"is {_file_kind(mode)}, not a regular file: a pool is a .json or .jsonl file on "
                                "disk", source=source)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"task pool file not found: {source}") from None
    except IsADirectoryError:
        raise TaskSpecError("is a directory, expected a .json or .jsonl file", source=source) from None
    except OSError as exc:
        raise TaskSpecError(f"cannot be opened ({exc.strerror or exc})", source=source) from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise TaskSpecError("is a directory, expected a .json or .jsonl file", source=source)
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise TaskSpecError(f"is {_file_kind(mode)}, not a regular file: a pool is a .json or .jsonl file on "
                            "disk", source=source)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


class _DuplicateKey(EnvSchedError, ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return obj


_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _parse_json(text: str, *, source: str, line: int | None) -> Any:
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        # json's messages end in " at" ("Unterminated string starting at"); the column completes them
        raise TaskSpecError(f"invalid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})", source=source,
                            line=line if line is not None else exc.lineno) from None
    except RecursionError:
        raise TaskSpecError("JSON nested too deeply", source=source, line=line) from None
    except _DuplicateKey as exc:
        raise TaskSpecError(f"duplicate key {exc.args[0]!r} in one JSON object (which one counts is ambiguous)",
                            source=source, line=line) from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's int conversion limit
        raise TaskSpecError(f"invalid JSON ({exc})", source=source, line=line) from None
    if _LONE_SURROGATE.search(text):  # escaped surrogates: valid JSON text, but not valid Unicode strings
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise TaskSpecError("a string holds an unpaired UTF-16 surrogate escape (not valid Unicode)",
                                source=source, line=line) from None
        except (ValueError, RecursionError):
            pass
    return obj


def _decode(raw: bytes, *, source: str, line: int | None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskSpecError(f"not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})",
                            source=source, line=line) from None


class TaskPool(Sequence[dict[str, Any]]):
    """An immutable, validated pool of task specs, indexed by id and by environment.

    Construct it from an iterable of dicts or load it with :meth:`from_file`. Validation is all or
    nothing: a bad spec raises :class:`~envsched.pool.spec.TaskSpecError` naming the source, the line
    (or position) and the field, and no pool is created.

    Args:
        tasks: task specs (mappings); each needs a unique string ``id`` and an ``env``.
        reward_range: the declared reward scale ``(low, high)``; samplers refuse rewards outside it.
        name: a label for messages and summaries.
        source: where the tasks came from, used in error messages.
    """

    def __init__(self, tasks: Iterable[Mapping[str, Any]], *, reward_range: tuple[float, float] = (0.0, 1.0),
                 name: str | None = None, source: str = "<iterable>") -> None:
        low, high = (float(reward_range[0]), float(reward_range[1]))
        if not (np.isfinite(low) and np.isfinite(high) and low < high):
            raise ValueError(f"reward_range must be two finite numbers with low < high, got {reward_range!r}")
        specs: list[dict[str, Any]] = []
        index: dict[str, int] = {}
        normal: dict[str, int] = {}
        lines: list[int] = []
        for position, obj in enumerate(tasks, start=1):
            line = getattr(obj, "lineno", position)
            unit = "line" if hasattr(obj, "lineno") else "item"
            spec = validate_task_spec(obj, source=source, line=line, unit=unit)
            if spec["id"] in index:
                raise TaskSpecError(f"duplicate task id {spec['id']!r} (first at {unit} "
                                    f"{lines[index[spec['id']]]})", source=source, line=line, field="id",
                                    unit=unit)
            norm = normalized_id(spec["id"])
            if norm in normal:
                first = normal[norm]
                raise TaskSpecError(f"task id {spec['id']!r} looks like {specs[first]['id']!r} (at {unit} "
                                    f"{lines[first]}): equal after Unicode NFKC normalisation and folding of "
                                    "confusable characters (UTS #39); look-alike ids are refused",
                                    source=source, line=line, field="id", unit=unit)
            normal[norm] = len(specs)
            index[spec["id"]] = len(specs)
            specs.append(spec)
            lines.append(line)
        self._init(specs, index, (low, high), name)

    def _init(self, specs: list[dict[str, Any]], index: dict[str, int], reward_range: tuple[float, float],
              name: str | None) -> None:
        self._specs = specs
        self._index = index
        self.reward_range: tuple[float, float] = reward_range
        self.name = name
        self._envs: list[str] = sorted({s["env"] for s in specs})
        env_pos = {e: i for i, e in enumerate(self._envs)}
        self._env_codes = np.fromiter((env_pos[s["env"]] for s in specs), dtype=np.int32, count=len(specs))
        self._by_env: dict[str, list[int]] = {e: [] for e in self._envs}
        for i, s in enumerate(specs):
            self._by_env[s["env"]].append(i)
        self._fingerprint: str | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, reward_range: tuple[float, float] | None = None,
                  max_line_bytes: int | None = None, max_file_bytes: int | None = None,
                  max_json_bytes: int | None = None) -> TaskPool:
        """Load a pool from a ``.jsonl`` file (one spec per line) or a ``.json`` file.

        A JSON file holds either a list of specs or an object ``{"tasks": [...], "reward_range": [lo, hi],
        "name": ...}``. Blank lines in JSONL are skipped. Errors name the file, line and field.

        The file is untrusted input: only a regular file is read (a FIFO, a device such as ``/dev/zero``,
        a socket or anything under ``/proc`` or ``/sys`` is refused), JSONL is streamed line by
        line, and three byte limits apply (``None``: the environment variable, else the default):

        * ``max_file_bytes``: the whole file (``ENVSCHED_POOL_MAX_BYTES``, default 4 GiB);
        * ``max_line_bytes``: one JSONL line (``ENVSCHED_POOL_MAX_LINE_BYTES``, default 16 MiB);
        * ``max_json_bytes``: a ``.json`` file, which is parsed whole (``ENVSCHED_POOL_MAX_JSON_BYTES``,
          default 256 MiB; convert larger pools to JSONL).
        """
        path = Path(path)
        source = str(path)
        max_line_bytes = _limit("max_line_bytes", max_line_bytes)
        max_file_bytes = _limit("max_file_bytes", max_file_bytes)
        max_json_bytes = _limit("max_json_bytes", max_json_bytes)
        meta: dict[str, Any] = {}
        with _open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            jsonl = path.suffix.lower() == ".jsonl"
            cap = max_file_bytes if jsonl else min(max_file_bytes, max_json_bytes)
            if size > cap:
                raise TaskSpecError(cls._too_big(size, cap, jsonl), source=source)
            if jsonl:  # streamed: each line is validated as it is read, no list of raw objects is kept
                rr = _reward_range(reward_range if reward_range is not None else (0.0, 1.0), source)
                return cls(cls._read_jsonl(fh, source, max_line_bytes, max_file_bytes), reward_range=rr,
                           name=path.stem, source=source)
            raw = fh.read(cap + 1)
            if len(raw) > cap:
                raise TaskSpecError(cls._too_big(len(raw), cap, jsonl), source=source)
        if raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        text = _decode(raw, source=source, line=None)
        del raw
        data = _parse_json(text, source=source, line=None)
        del text
        if isinstance(data, list):
            tasks = data
        elif isinstance(data, Mapping) and isinstance(data.get("tasks"), list):
            tasks = data["tasks"]
            meta = {k: v for k, v in data.items() if k in ("reward_range", "name")}
        else:
            raise TaskSpecError("a .json pool must be a list of task specs or an object with a 'tasks' list",
                                source=source)
        rr = _reward_range(reward_range if reward_range is not None else meta.get("reward_range", (0.0, 1.0)),
                           source)
        name = meta.get("name", path.stem)
        if name is not None and not isinstance(name, str):
            raise TaskSpecError(f"name must be a string, got {type(name).__name__}", source=source, field="name")
        return cls(tasks, reward_range=rr, name=name, source=source)

    @staticmethod
    def _too_big(size: int, cap: int, jsonl: bool) -> str:
        if jsonl:
            return (f"is {size} bytes, more than the {cap}-byte limit of a pool file; raise it with "
                    "ENVSCHED_POOL_MAX_BYTES or from_file(max_file_bytes=)")
        return (f"is {size} bytes, more than the {cap}-byte limit of a .json pool (parsed whole); convert "
                "it to JSONL (one spec per line) or raise ENVSCHED_POOL_MAX_JSON_BYTES / from_file(max_json_bytes=)")

    @staticmethod
    def _read_jsonl(fh: Any, source: str, max_line_bytes: int, max_file_bytes: int) -> Iterator[Any]:
        lineno = 0
        total = 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                break
            lineno += 1
            total += len(raw)
            if len(raw) > max_line_bytes:
                raise TaskSpecError(f"line longer than {max_line_bytes} bytes (raise it with "
                                    "ENVSCHED_POOL_MAX_LINE_BYTES or from_file(max_line_bytes=))",
                                    source=source, line=lineno)
            if total > max_file_bytes:  # a file that grew, or lied about its size, while being read
                raise TaskSpecError(f"holds more than {max_file_bytes} bytes, above the pool file limit; raise "
                                    "it with ENVSCHED_POOL_MAX_BYTES or from_file(max_file_bytes=)",
                                    source=source, line=lineno)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            text = _decode(raw, source=source, line=lineno).strip()
            if not text:
                continue
            obj = _parse_json(text, source=source, line=lineno)
            if not isinstance(obj, Mapping):
                raise TaskSpecError(f"each line must be a JSON object, got {type(obj).__name__}",
                                    source=source, line=lineno)
            yield _Located(obj, lineno)

    # ------------------------------------------------------------------ sequence API
    def __len__(self) -> int:
        return len(self._specs)

    def __getitem__(self, item: int | slice) -> Any:  # type: ignore[override]
        return self._specs[item]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._specs)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return item in self._index
        return isinstance(item, Mapping) and item.get("id") in self._index

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<TaskPool{label}: {len(self)} tasks in {len(self._envs)} environments>"

    # ------------------------------------------------------------------ lookups
    @property
    def ids(self) -> list[str]:
        """Task ids in pool order."""
        return [s["id"] for s in self._specs]

    @property
    def envs(self) -> list[str]:
        """Environment names, sorted."""
        return list(self._envs)

    @property
    def env_codes(self) -> np.ndarray:
        """For each task (pool order) the position of its environment in :attr:`envs`."""
        return self._env_codes

    def get(self, task_id: str) -> dict[str, Any]:
        """The spec with this id; ``KeyError`` naming the id if it is not in the pool."""
        try:
            return self._specs[self._index[task_id]]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r} (not in this pool of {len(self)} tasks)") from None

    def index_of(self, task_id: str) -> int:
        """Position of a task id in the pool."""
        try:
            return self._index[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r} (not in this pool of {len(self)} tasks)") from None

    def by_env(self, env: str) -> list[dict[str, Any]]:
        """The specs of one environment, in pool order."""
        if env not in self._by_env:
            raise KeyError(f"unknown environment {env!r}; the pool has {len(self._envs)}: "
                           f"{', '.join(self._envs[:10])}{'...' if len(self._envs) > 10 else ''}")
        return [self._specs[i] for i in self._by_env[env]]

    def env_indices(self, env: str) -> list[int]:
        """Positions of one environment's tasks in the pool."""
        self.by_env(env)
        return list(self._by_env[env])

    # ------------------------------------------------------------------ reporting
    def missing_fields(self) -> dict[str, int]:
        """For each static field EnvSched reads, how many tasks lack it (absent, null or empty)."""
        counts = {f: 0 for f in OPTIONAL_STATIC_FIELDS}
        counts["verifier.checks"] = 0
        counts["verifier.code"] = 0
        for s in self._specs:
            for f in OPTIONAL_STATIC_FIELDS:
                if s.get(f) in (None, "", [], {}):
                    counts[f] += 1
            verifier = s.get("verifier") or {}
            if not verifier.get("checks"):
                counts["verifier.checks"] += 1
            if not verifier.get("code"):
                counts["verifier.code"] += 1
        return counts

    def summary(self) -> dict[str, Any]:
        """Counts by environment and split, the declared reward range and the missing static fields."""
        return {
            "name": self.name,
            "tasks": len(self),
            "environments": len(self._envs),
            "reward_range": list(self.reward_range),
            "by_env": {e: len(ix) for e, ix in self._by_env.items()},
            "by_split": dict(Counter(s.get("split") or "(none)" for s in self._specs)),
            "missing": self.missing_fields(),
            "fingerprint": self.fingerprint(),
        }

    def fingerprint(self) -> str:
        """SHA-256 of the pool's canonical JSON (specs in order plus the reward range)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(json.dumps(list(self.reward_range)).encode())
            for s in self._specs:
                h.update(json.dumps(s, sort_keys=True, separators=(",", ":"), default=str).encode())
                h.update(b"\n")
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------ derived pools
    def extend(self, tasks: Iterable[Mapping[str, Any]], *, source: str = "<iterable>") -> TaskPool:
        """A new pool with ``tasks`` appended (validated as a whole; this pool is unchanged)."""
        return TaskPool([*self._specs, *tasks], reward_range=self.reward_range, name=self.name, source=source)

    def filter(self, *, split: str | None = None, envs: Iterable[str] | None = None) -> TaskPool:
        """A new pool with the tasks of one split and/or of some environments."""
        wanted = set(envs) if envs is not None else None
        if wanted is not None and (unknown := wanted - set(self._envs)):
            raise KeyError(f"unknown environment(s): {sorted(unknown)}")
        kept = [s for s in self._specs
                if (split is None or s.get("split") == split) and (wanted is None or s["env"] in wanted)]
        return TaskPool(kept, reward_range=self.reward_range, name=self.name)

    def to_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write the specs as JSONL atomically (a temporary file renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                for s in self._specs:
                    fh.write(json.dumps(s, ensure_ascii=False, default=str))
                    fh.write("\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


class _Located(dict):
    """A spec read from line ``lineno`` of a JSONL file (so errors can name the real line)."""

    def __init__(self, obj: Mapping[str, Any], lineno: int) -> None:
        super().__init__(obj)
        self.lineno = lineno
