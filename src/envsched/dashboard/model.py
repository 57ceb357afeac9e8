"""The run as columns: every drawn group, update and discard of a store (and, when given, every explanation
record of its run file), indexed incrementally and aggregated with numpy.

A *step* is one ``sample`` event of the log (one batch), counted from 1 as ``envsched run`` and
``envsched explain`` count them. Each update (or discard) is attributed to the draw it answers: the one that
issued its lease when it names one, otherwise the oldest outstanding draw of the same task (first in, first
out), which is what the sampler's own bookkeeping releases. An update is *late* when at least one later batch
was drawn before it arrived (an off-policy group in an asynchronous trainer).
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from envsched.dashboard.reader import EventBatch, StoreReader
from envsched.method.run_file import (
    EXPLAIN_FORMAT,
    RunFileLimitError,
    open_run_file,
    parse_run_line,
    read_run_line,
)
from envsched.validation import is_int, is_number

__all__ = ["RunFileTail", "RunIndex"]

_KIND_UPDATE, _KIND_DISCARD, _KIND_RECLAIM = 0, 1, 2
#: the most records kept from a run file (the newest); older picks lose their explanation, not their outcome
MAX_RUN_RECORDS = 2_000_000
#: the largest step a run-file record may name (run files count steps from 0)
MAX_RUN_STEP = 2**31 - 2
#: bytes of the run file one read takes in at most (the rest is read by the next ones)
RUN_FILE_CHUNK_BYTES = 16 * 2**20


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


class _Columns:
    """Append-only numpy columns (appended in chunks, concatenated on read and cached)."""

    def __init__(self, **dtypes: Any) -> None:
        self.dtypes = dtypes
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in dtypes}
        self._cache: dict[str, np.ndarray] = {}

    def append(self, **cols: np.ndarray) -> None:
        for k, dtype in self.dtypes.items():
            self.parts[k].append(np.asarray(cols[k], dtype=dtype))
        self._cache.clear()

    def __getitem__(self, k: str) -> np.ndarray:
        if k not in self._cache:
            arr = _cat(self.parts[k], self.dtypes[k])
            self.parts[k] = [arr] if arr.size else []
            self._cache[k] = arr
        return self._cache[k]


def _obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a record's field of the wrong type reads as absent)."""
    return value if isinstance(value, dict) else {}


def _real(value: Any) -> float | None:
    """``value`` as a float if it is a finite number (not a bool), else ``None``."""
    return float(value) if is_number(value, numpy=False) and math.isfinite(value) else None


def _text(value: Any, limit: int) -> str:
    """``value`` as text of at most ``limit`` characters (a run file's strings are data, shown as text)."""
    text = value if isinstance(value, str) else repr(value) if isinstance(value, dict | list) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def reasons_of(rec: dict[str, Any]) -> list[str]:
    """Short, plain-text reasons an explanation record gives for a pick (what ``envsched explain`` shows). A
    field of the wrong type reads as absent: run files are data."""
    out = []
    cov = _obj(rec.get("coverage"))
    novelty = _real(rec.get("novelty"))
    if rec.get("phase") == "cold_start" and novelty is not None:
        out.append(f"cold start: novelty {novelty:.3f}")
    q = _real(rec.get("q"))
    if q is not None:
        out.append(f"q {q:.3f}, informativeness {_real(rec.get('informativeness')) or 0:.3f}")
    for rel in ("within", "cross"):
        r = _obj(_obj(rec.get("relations")).get(rel))
        variance = _real(_obj(r.get("estimate")).get("variance"))
        if r.get("used") is True and variance is not None:
            tag = "" if r.get("has_observed_neighbors") else " (global reference)"
            out.append(f"{rel}-env estimate: variance {variance:.4f}{tag}")
    own = _obj(rec.get("own_history"))
    if own.get("groups"):
        out.append(f"own history: {_text(own['groups'], 20)} groups")
    if cov:
        out.append(f"env picked {_text(cov.get('env_selections_before', 0), 20)} times before, "
                   f"{_text(cov.get('env_batch_count', 0), 20)} in this batch")
    for name, cap in list(_obj(rec.get("caps")).items())[:20]:
        if isinstance(cap, dict) and cap.get("reached"):
            out.append(f"cap {_text(name, 60)} reached ({_text(cap.get('count'), 20)}/{_text(cap.get('limit'), 20)})")
    relaxed = rec.get("relaxed")
    if relaxed:
        items = relaxed if isinstance(relaxed, list) else [relaxed]
        out.append("relaxed to fill the batch: " + ", ".join(_text(x, 60) for x in items[:20]))
    filters = _obj(rec.get("filters"))
    if _obj(filters.get("progress")).get("filtered"):
        out.append("progress filter: no progress")
    ident = _obj(filters.get("identifier"))
    if ident.get("flagged"):
        out.append(f"identifier filter: {_text(ident.get('reason'), 200)}")
    similarity = _real(_obj(rec.get("similarity")).get("max_similarity"))
    if similarity:
        out.append(f"similarity to the batch {similarity:.3f}")
    return out


class RunFileTail:
    """Reads an explanation run file (``envsched run --explain FILE``) as it grows: only complete new lines,
    from where the last read stopped, under the run-file rules of :mod:`envsched.method.run_file` (a regular
    file only; a line longer than ``MAX_RUN_LINE_BYTES`` or nested deeper than ``MAX_RUN_JSON_DEPTH`` stops the
    reading with :attr:`error`, which names the line). A line that is not an explanation record is counted
    and skipped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        open_run_file(self.path).close()  # a missing path, a directory, a pipe or a device: refused now
        self.offset = 0
        self.line = 0  # complete lines read so far
        self.bad_lines = 0
        self.header: dict[str, Any] | None = None
        self.at_end = False
        #: why reading stopped (a line over the caps); cleared when the file is replaced
        self.error: str | None = None

    def read_new(self, max_bytes: int | None = RUN_FILE_CHUNK_BYTES) -> list[dict[str, Any]]:
        """The pick records appended since the last call, reading at most about ``max_bytes`` of the file
        (``None``: up to its end); :attr:`at_end` says whether the end was reached. Stops at a line over the
        caps and sets :attr:`error` (the records before it are returned)."""
        out: list[dict[str, Any]] = []
        self.at_end = False
        try:
            fh = open_run_file(self.path)
        except (OSError, ValueError) as exc:  # the file is gone or was replaced by something else
            self.error = str(exc)
            return out
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self.offset:  # the file was replaced: start over
                self.offset, self.line, self.error = 0, 0, None
            if self.error is not None:
                return out
            fh.seek(self.offset)
            read = 0
            while max_bytes is None or read < max_bytes:
                try:
                    line = read_run_line(fh, f"run file {self.path}, line {self.line + 1}")
                except RunFileLimitError as exc:
                    self.error = str(exc)
                    return out
                if not line.endswith(b"\n"):  # the end, or a line still being written
                    self.at_end = True
                    break
                where = f"run file {self.path}, line {self.line + 1}"
                self.offset += len(line)
                self.line += 1
                read += len(line)
                if not line.strip():
                    continue
                try:
                    rec = parse_run_line(line, where)
                except RunFileLimitError as exc:
                    self.error = str(exc)
                    return out
                except ValueError:
                    self.bad_lines += 1
                    continue
                if not isinstance(rec, dict) or rec.get("format") != EXPLAIN_FORMAT:
                    self.bad_lines += 1
                elif rec.get("kind") == "header":
                    self.header = rec
                elif (rec.get("kind") == "pick" and is_int(rec.get("step"), numpy=False)
                      and 0 <= rec["step"] <= MAX_RUN_STEP and isinstance(rec.get("task_id"), str)):
                    out.append(rec)
                else:
                    self.bad_lines += 1
        return out


class RunIndex:
    """Everything the views need, kept up to date by :meth:`refresh` (thread-safe).

    Args:
        reader: the store, opened read-only.
        run_file: the run's explanation file (optional).
    """

    def __init__(self, reader: StoreReader, run_file: str | os.PathLike[str] | None = None) -> None:
        self.reader = reader
        self.header = reader.header
        tasks = reader.tasks()
        self.keys = tasks.keys
        self.instructions = tasks.instructions
        self.key_index = {k: i for i, k in enumerate(self.keys)}
        self.envs = sorted(set(tasks.envs))
        code = {e: i for i, e in enumerate(self.envs)}
        self.env_of_task = np.array([code[e] for e in tasks.envs], dtype=np.int32)
        self.pool_env_sizes = np.bincount(self.env_of_task, minlength=len(self.envs))
        lo, hi = (self.header.get("reward_range") or [0.0, 1.0])[:2]
        self.reward_lo, self.reward_span = float(lo), float(hi) - float(lo) or 1.0
        self.run_file = RunFileTail(run_file) if run_file is not None else None
        self.seq = 0
        self.last_event_time: float | None = None
        self.unknown_keys = 0
        self.run_file_unknown = 0  # run-file picks of tasks the store does not have (a run file of another run)
        self._lock = threading.RLock()
        self._steps = _Columns(seq=np.int64, created=np.float64, n=np.int32)
        self._picks = _Columns(seq=np.int64, step=np.int32, rank=np.int32, task=np.int32, leased=np.bool_)
        self._closes = _Columns(seq=np.int64, created=np.float64, task=np.int32, kind=np.int8, issued=np.int64,
                                n=np.int32, scored=np.int32, signal=np.bool_, mean=np.float64, var=np.float64,
                                cost=np.float64, match=np.int64, step=np.int64, lag=np.int64)
        # the matching of closes to draws, kept as events arrive: (task, rank among its draws without a lease)
        # -> draw, (issuing sample seq, task) -> draw for leased draws, counts per task, and the inverse
        self._free_draws: dict[int, int] = {}
        self._leased_draws: dict[int, int] = {}
        self._draw_count = np.zeros(len(self.keys) + 1, dtype=np.int64)
        self._close_count = np.zeros(len(self.keys) + 1, dtype=np.int64)
        self._closed_by = np.zeros(0, dtype=np.int64)
        self.discard_reasons: dict[str, int] = {}
        # run-file picks: (step, task) -> record summary
        self.explained: dict[tuple[int, int], dict[str, Any]] = {}
        self.version = 0
        self.head = 0
        self.caught_up = False

    # ------------------------------------------------------------------ ingestion
    def refresh(self, *, max_events: int | None = None, chunk: int = 50_000,
                max_run_bytes: int | None = None) -> bool:
        """Read what was committed (and appended to the run file) since the last call, at most
        ``max_events`` events and about ``max_run_bytes`` of the run file (all when ``None``); ``True`` if
        anything was read. :attr:`caught_up` says whether the index reached the end of the log and of the run
        file. A store that cannot be read raises :class:`~envsched.dashboard.reader.DashboardError`, a run-file
        line over the caps ``ValueError``, each naming the event or line; what was read before it stays
        indexed, and the next call starts from there."""
        with self._lock:
            changed = False
            try:
                budget = math.inf if max_events is None else max_events
                self.caught_up = False
                events_done = False
                while budget > 0:
                    batch = self.reader.events(self.seq, limit=int(min(chunk, budget)))
                    self.head = max(self.head, batch.head)
                    if batch.upto <= self.seq:
                        events_done = True
                        break
                    budget -= batch.upto - self.seq
                    self._ingest(batch)
                    changed = True
                if self.run_file is None or not events_done:
                    self.caught_up = events_done
                    return changed
                left = math.inf if max_run_bytes is None else max_run_bytes
                tail = self.run_file
                while left > 0:
                    before = tail.offset
                    recs = tail.read_new(int(min(RUN_FILE_CHUNK_BYTES, left)))
                    left -= max(tail.offset - before, 1)
                    if recs:
                        self._ingest_records(recs)
                        changed = True
                    if tail.error is not None or tail.at_end:
                        break
                self.caught_up = tail.at_end or tail.error is not None
                if tail.error is not None:
                    raise ValueError(tail.error)
                return changed
            finally:
                if changed:
                    self.version += 1

    def _task_ids(self, keys: list[Any]) -> np.ndarray:
        get = self.key_index.get
        ids = np.fromiter((get(k, -1) if isinstance(k, str) else -1 for k in keys), dtype=np.int32, count=len(keys))
        self.unknown_keys += int((ids < 0).sum())
        return ids

    def _ingest(self, b: EventBatch) -> None:
        if b.samples:
            seq = np.array([r[0] for r in b.samples], dtype=np.int64)
            created = np.array([r[1] for r in b.samples], dtype=np.float64)
            uniq, first, inverse, counts = np.unique(seq, return_index=True, return_inverse=True, return_counts=True)
            base = len(self._steps["seq"])
            start = len(self._picks["seq"])
            task = self._task_ids([r[3] for r in b.samples])
            leased = np.array([bool(r[4]) for r in b.samples])
            self._steps.append(seq=uniq, created=created[first], n=counts)
            self._picks.append(seq=seq, step=base + 1 + inverse, rank=np.array([r[2] for r in b.samples]) + 1,
                               task=task, leased=leased)
            self._register_draws(start, seq, task, leased)
        if b.updates or b.discards:
            u = list(zip(*b.updates, strict=True)) if b.updates else [()] * 11
            for r in b.discards:
                reason = "reclaimed (lease expired)" if r[5] else str(r[4] if r[4] is not None else "(no reason)")[:80]
                self.discard_reasons[reason] = self.discard_reasons.get(reason, 0) + 1
            nd = len(b.discards)
            dz = list(zip(*b.discards, strict=True)) if nd else [()] * 6
            seq = np.array(list(u[0]) + list(dz[0]), dtype=np.int64)
            order = np.argsort(seq, kind="stable")
            kind = np.r_[np.full(len(b.updates), _KIND_UPDATE),
                         np.where(np.array(dz[5], dtype=bool), _KIND_RECLAIM, _KIND_DISCARD)].astype(np.int8)
            scored = np.r_[np.array(u[5], dtype=np.int32), np.zeros(nd, dtype=np.int32)]
            lo = np.r_[np.array(u[6], dtype=np.float64), np.full(nd, math.nan)]
            hi = np.r_[np.array(u[7], dtype=np.float64), np.full(nd, math.nan)]
            total = np.r_[np.array(u[8], dtype=np.float64), np.zeros(nd)]
            squares = np.r_[np.array(u[9], dtype=np.float64), np.zeros(nd)]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(scored > 0, total / np.maximum(scored, 1), math.nan)
                var = np.where(scored > 0, np.maximum(squares / np.maximum(scored, 1) - mean * mean, 0.0), math.nan)
            var[(scored > 0) & (hi == lo)] = 0.0  # exact where every scored reward is equal
            get = b.leases.get
            issued = np.fromiter((get(x, -1) if isinstance(x, str) else -1 for x in list(u[3]) + list(dz[3])),
                                 dtype=np.int64, count=seq.size)
            cols = {"seq": seq, "created": np.array(list(u[1]) + list(dz[1]), dtype=np.float64),
                    "task": self._task_ids(list(u[2]) + list(dz[2])), "kind": kind, "issued": issued,
                    "n": np.r_[np.array(u[4], dtype=np.int32), np.zeros(nd, dtype=np.int32)], "scored": scored,
                    "signal": (scored >= 2) & (hi > lo), "mean": (mean - self.reward_lo) / self.reward_span,
                    "var": var / self.reward_span ** 2,
                    "cost": np.r_[np.array(u[10], dtype=np.float64), np.zeros(nd)]}
            cols = {k: v[order] for k, v in cols.items()}
            self._closes.append(**cols, **self._match_closes(cols))
        created_all = [r[1] for r in b.samples[-1:]] + [r[1] for r in b.updates[-1:]] + [r[1] for r in b.discards[-1:]]
        if created_all:
            self.last_event_time = max(created_all)
        self.seq = b.upto

    def _ingest_records(self, recs: list[dict[str, Any]]) -> None:
        """Keep a summary of each pick record (``RunFileTail`` checked its step and task id); values of the wrong
        type are kept as absent, text is cut short."""
        for rec in recs:
            task = self.key_index.get(rec["task_id"], -1)
            if task < 0:
                self.run_file_unknown += 1
            pred = _obj(rec.get("predicted"))
            entry = {"phase": _text(rec.get("phase"), 40), "env": _text(rec.get("env"), 200),
                     "task_id": rec["task_id"], "q": _real(rec.get("q")), "score": _real(rec.get("score")),
                     "pred_var": _real(pred.get("variance")), "pred_mean": _real(pred.get("mean")),
                     "reasons": reasons_of(rec)}
            rank = rec.get("rank")
            if is_int(rank, numpy=False) and 0 <= rank <= MAX_RUN_STEP:  # else the table shows the draw's own rank
                entry["rank"] = rank
            self.explained[(rec["step"] + 1, task)] = entry
        if len(self.explained) > MAX_RUN_RECORDS:
            for k in sorted(self.explained)[:len(self.explained) - MAX_RUN_RECORDS]:
                del self.explained[k]

    # ------------------------------------------------------------------ matching closes to draws
    def _register_draws(self, start: int, seq: np.ndarray, task: np.ndarray, leased: np.ndarray) -> None:
        """Index the new draws (picks ``start``...): by (task, rank) when drawn without a lease, by (issuing
        seq, task) when with one."""
        T = len(self.keys) + 1
        idx = np.arange(start, start + seq.size, dtype=np.int64)
        free = ~leased & (task >= 0)
        if free.any():
            order, rank = _rank_within(task[free], seq[free])
            t = task[free][order].astype(np.int64)
            codes = (t << 32) + self._draw_count[t] + rank
            self._free_draws.update(zip(codes.tolist(), idx[free][order].tolist(), strict=True))
            self._draw_count += np.bincount(t, minlength=T)
        if leased.any():
            codes = seq[leased] * T + task[leased] + 1
            self._leased_draws.update(zip(codes.tolist(), idx[leased].tolist(), strict=True))
        grown = np.full(start + seq.size, -1, dtype=np.int64)
        grown[:self._closed_by.size] = self._closed_by
        self._closed_by = grown

    def _match_closes(self, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """For new closes (in log order): the draw each answers (``match``, -1 if none), the step of that draw
        (else the step it arrived in) and how many later batches were drawn before it arrived (``lag``)."""
        T = len(self.keys) + 1
        task, issued = c["task"].astype(np.int64), c["issued"]
        match = np.full(task.size, -1, dtype=np.int64)
        leased = (issued >= 0) & (task >= 0)
        if leased.any():
            pop = self._leased_draws.pop  # a draw is answered once: only outstanding draws stay indexed
            match[leased] = [pop(k, -1) for k in (issued[leased] * T + task[leased] + 1).tolist()]
        free = ~leased & (task >= 0) & (issued < 0)
        if free.any():
            order, rank = _rank_within(task[free], c["seq"][free])
            t = task[free][order]
            codes = (t << 32) + self._close_count[t] + rank
            pop = self._free_draws.pop
            where = np.flatnonzero(free)[order]
            match[where] = [pop(k, -1) for k in codes.tolist()]
            self._close_count += np.bincount(t, minlength=T)
        steps_seq, pick_step = self._steps["seq"], self._picks["step"]
        arrival = np.searchsorted(steps_seq, c["seq"])  # batches drawn before the close
        ok = match >= 0
        step = np.where(ok, pick_step[np.maximum(match, 0)] if pick_step.size else 0, np.maximum(arrival, 1))
        base = len(self._closes["seq"])
        self._closed_by[match[ok]] = base + np.flatnonzero(ok)
        return {"match": match, "step": step, "lag": np.where(ok, arrival - step, 0)}

    # ------------------------------------------------------------------ views as numbers
    @property
    def num_steps(self) -> int:
        return len(self._steps["seq"])

    def snapshot(self) -> dict[str, Any]:
        """A consistent set of columns for the views (copies are not needed: columns only grow)."""
        with self._lock:
            c = self._closes
            return {"steps": {k: self._steps[k] for k in ("seq", "created", "n")},
                    "picks": {k: self._picks[k] for k in ("seq", "step", "rank", "task", "leased")},
                    "closes": {k: c[k] for k in c.dtypes}, "match": c["match"], "c_step": c["step"],
                    "c_lag": c["lag"], "closed_by": self._closed_by.copy(),
                    "seq": self.seq, "version": self.version, "explained": dict(self.explained),
                    "discard_reasons": dict(self.discard_reasons), "last_event_time": self.last_event_time,
                    "unknown_keys": self.unknown_keys}

    def warnings(self) -> list[str]:
        """What does not add up: a run file written for another pool, events naming unknown tasks."""
        out = []
        header = self.run_file.header if self.run_file is not None else None
        if header and isinstance(header.get("num_tasks"), int) and header["num_tasks"] != len(self.keys):
            out.append(f"the run file was written for a pool of {header['num_tasks']} tasks, the store has "
                       f"{len(self.keys)}: is it the same run?")
        if self.run_file_unknown:
            out.append(f"{self.run_file_unknown} run-file picks name tasks the store does not have")
        if self.run_file is not None and self.run_file.bad_lines:
            out.append(f"{self.run_file.bad_lines} lines of the run file are not explanation records (skipped)")
        if self.unknown_keys:
            out.append(f"{self.unknown_keys} events name tasks that are not in the store's task list")
        return out

    def state(self) -> dict[str, Any]:
        """The small summary the page polls: where the log stands."""
        with self._lock:
            c = self._closes
            updates = int((c["kind"] == _KIND_UPDATE).sum())
            return {"seq": self.seq, "head": max(self.head, self.seq), "caught_up": self.caught_up,
                    "version": self.version, "steps": self.num_steps, "updates": updates,
                    "last_event_time": self.last_event_time, "now": time.time(),
                    "explained": len(self.explained),
                    "run_file_bad_lines": self.run_file.bad_lines if self.run_file is not None else 0}


def _rank_within(group: np.ndarray, order_by: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts the elements by (``group``, ``order_by``), and each sorted element's rank (0, 1, ...)
    within its group."""
    idx = np.lexsort((order_by, group))
    g = group[idx]
    starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    counts = np.diff(np.r_[starts, g.size])
    return idx, np.arange(g.size) - np.repeat(starts, counts)
