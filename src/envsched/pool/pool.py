"""``TaskPool``: a validated, indexed collection of task specs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envsched.pool.spec import OPTIONAL_STATIC_FIELDS, TaskSpecError, normalized_id, validate_task_spec

__all__ = ["DEFAULT_MAX_LINE_BYTES", "TaskPool"]

#: A JSONL line longer than this is refused (a corrupt or hostile file, not a task spec).
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024


class _DuplicateKey(ValueError):
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
                raise TaskSpecError(f"task id {spec['id']!r} equals {specs[first]['id']!r} (at {unit} "
                                    f"{lines[first]}) after Unicode NFKC normalisation: look-alike ids are "
                                    "refused", source=source, line=line, field="id", unit=unit)
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
                  max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> TaskPool:
        """Load a pool from a ``.jsonl`` file (one spec per line) or a ``.json`` file.

        A JSON file holds either a list of specs or an object ``{"tasks": [...], "reward_range": [lo, hi],
        "name": ...}``. Blank lines in JSONL are skipped. Errors name the file, line and field.
        """
        path = Path(path)
        source = str(path)
        if not path.exists():
            raise FileNotFoundError(f"task pool file not found: {source}")
        if path.is_dir():
            raise TaskSpecError("is a directory, expected a .json or .jsonl file", source=source)
        meta: dict[str, Any] = {}
        if path.suffix.lower() == ".jsonl":
            tasks = list(cls._read_jsonl(path, max_line_bytes))
        else:
            raw = path.read_bytes()
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            text = _decode(raw, source=source, line=None)
            data = _parse_json(text, source=source, line=None)
            if isinstance(data, list):
                tasks = data
            elif isinstance(data, Mapping) and isinstance(data.get("tasks"), list):
                tasks = data["tasks"]
                meta = {k: v for k, v in data.items() if k in ("reward_range", "name")}
            else:
                raise TaskSpecError("a .json pool must be a list of task specs or an object with a 'tasks' list",
                                    source=source)
        rr = reward_range if reward_range is not None else meta.get("reward_range", (0.0, 1.0))
        if (isinstance(rr, str | bytes | Mapping) or not isinstance(rr, Sequence) or len(rr) != 2
                or not all(isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)
                           for x in rr)
                or not (np.isfinite(float(rr[0])) and np.isfinite(float(rr[1])) and float(rr[0]) < float(rr[1]))):
            raise TaskSpecError(f"reward_range must be two finite numbers [low, high] with low < high, got {rr!r}",
                                source=source, field="reward_range")
        name = meta.get("name", path.stem)
        if name is not None and not isinstance(name, str):
            raise TaskSpecError(f"name must be a string, got {type(name).__name__}", source=source, field="name")
        return cls(tasks, reward_range=tuple(rr), name=name, source=source)  # type: ignore[arg-type]

    @staticmethod
    def _read_jsonl(path: Path, max_line_bytes: int) -> Iterator[Any]:
        source = str(path)
        with path.open("rb") as fh:
            lineno = 0
            while True:
                raw = fh.readline(max_line_bytes + 1)
                if not raw:
                    break
                lineno += 1
                if len(raw) > max_line_bytes:
                    raise TaskSpecError(f"line longer than {max_line_bytes} bytes", source=source, line=lineno)
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
