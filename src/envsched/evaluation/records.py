"""Episode records: one JSON line per finished episode, and resumption from that file.

The JSONL file is the evaluation's source of truth. Each line is written (and flushed to disk) as
soon as an episode finishes, so an interrupted evaluation resumes from it: episodes already recorded
are not run again. Every episode has a key ``task_id#seed=S#sample=J``; when a key appears more than
once (an infrastructure failure re-run on resume), the last line wins, so nothing is counted twice.
A truncated last line (a crash mid-write) is ignored and rewritten.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["OUTCOMES", "RECORD_FORMAT", "SCORED_OUTCOMES", "EpisodeLog", "EpisodeRecord", "episode_key"]

RECORD_FORMAT = "envsched.eval.episode/1"

#: Outcome classes. ``success``/``failure``: the environment scored the episode (against the success
#: threshold). ``limit``: the policy hit the turn limit (the environment's score, else 0).
#: ``policy_error``: a malformed answer (not solved, reward 0). ``unscored``: the environment could not
#: score it (reward None). ``infra_error``: the infrastructure failed after all retries. ``error``: the
#: harness or the environment raised.
OUTCOMES = ("success", "failure", "limit", "policy_error", "unscored", "infra_error", "error")
SCORED_OUTCOMES = frozenset({"success", "failure", "limit", "policy_error"})


def episode_key(task_id: str, seed: int | None, sample: int) -> str:
    """The key that identifies one episode of an evaluation."""
    return f"{task_id}#seed={seed}#sample={sample}"


@dataclass
class EpisodeRecord:
    """One episode: what ran, what came out, what it cost."""

    task_id: str
    seed: int | None
    sample: int
    outcome: str
    reward: float | None = None
    env: str | None = None
    group: str | None = None
    difficulty: float | int | None = None
    split: str | None = None
    index: int | None = None
    turns: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    started_at: float = 0.0
    duration_s: float = 0.0
    policy_s: float = 0.0
    env_s: float = 0.0
    attempts: int = 1
    error: str | None = None
    format: str = field(default=RECORD_FORMAT)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}; expected one of {OUTCOMES}")
        if self.outcome in SCORED_OUTCOMES and self.reward is None:
            raise ValueError(f"outcome {self.outcome!r} needs a reward (task {self.task_id!r})")
        if self.outcome not in SCORED_OUTCOMES and self.reward is not None:
            raise ValueError(f"outcome {self.outcome!r} must have reward None (task {self.task_id!r})")

    @property
    def key(self) -> str:
        return episode_key(self.task_id, self.seed, self.sample)

    @property
    def scored(self) -> bool:
        return self.outcome in SCORED_OUTCOMES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeRecord:
        if data.get("format", RECORD_FORMAT) != RECORD_FORMAT:
            raise ValueError(f"unsupported episode record format {data.get('format')!r}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class EpisodeLog:
    """The append-only JSONL file of an evaluation (thread-safe appends, each flushed and fsynced)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.dropped_lines = 0

    def load(self) -> dict[str, EpisodeRecord]:
        """Records by key (last line wins). A truncated final line is cut off the file; a malformed
        line elsewhere raises ``ValueError`` naming the line."""
        records: dict[str, EpisodeRecord] = {}
        if not self.path.exists():
            return records
        raw = self.path.read_bytes()
        offset, cut = 0, None
        chunks = raw.split(b"\n")
        for lineno, line in enumerate(chunks, 1):
            start, offset = offset, offset + len(line) + 1
            if not line.strip():
                continue
            try:
                rec = EpisodeRecord.from_dict(json.loads(line))
            except (ValueError, TypeError) as exc:
                if all(not rest.strip() for rest in chunks[lineno:]):
                    cut = start  # the last record was cut short by a crash: drop it, the episode reruns
                    self.dropped_lines += 1
                    break
                raise ValueError(f"{self.path}: line {lineno} is not an episode record: {exc}") from None
            records[rec.key] = rec
        if cut is not None:
            with self._lock, open(self.path, "r+b") as fh:
                fh.truncate(cut)
        elif raw and not raw.endswith(b"\n"):
            with self._lock, open(self.path, "ab") as fh:
                fh.write(b"\n")
        return records

    def append(self, record: EpisodeRecord) -> None:
        line = json.dumps(record.to_dict(), sort_keys=True, default=_json_default)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def extend(self, records: Iterable[EpisodeRecord]) -> None:
        for r in records:
            self.append(r)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
