"""Static features of tasks (EnvSched appendix D): six concrete TF-IDF views and the abstract views.

Concrete (``S_full``): each task yields six texts -- task text, verifier checks, verifier code, initial
context, operation names, complete operation description. Each view is vectorised with scikit-learn's
``TfidfVectorizer`` and L2-normalised; the views are scaled by ``sqrt(weight)``, concatenated and
L2-normalised again, so that for two tasks with all views present

    S_full(a, b) = sum_v w_v * cos_v(a, b)        (weights summing to 1)

and a task missing a view is compared on the views it has (its weights are renormalised). A missing
field contributes nothing and is *reported* (``report["missing"]``), never an error.

Abstract (``S_abs``): the token views of :func:`envsched.method.graph.abstraction.abstract_tokens` (operation
families, gates, dependencies, check groups, conflicts, literal categories) go through the same
TF-IDF / weight / normalise pipeline.

A :class:`FeatureSpace` remembers the fitted vocabularies and IDF weights so new tasks can be mapped
into the same space (incremental growth) and so the space can be saved with the graph.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from envsched.method.config import ABSTRACT_VIEWS, FULL_VIEWS, GraphConfig

if TYPE_CHECKING:  # scikit-learn is imported where a view is vectorised: reading a saved graph does not need it
    from sklearn.feature_extraction.text import CountVectorizer

__all__ = ["FeatureSpace", "Features", "build_features", "task_views"]

_TOKEN_PATTERN = r"(?u)\b\w\w+\b"


def _split(doc: str) -> list[str]:
    return doc.split()


def _joined(tokens: str | Sequence[str]) -> str:
    return tokens if isinstance(tokens, str) else " ".join(tokens)


def _json_text(value: Any, limit: int) -> str:
    if value is None or value in ("", [], {}):
        return ""
    if isinstance(value, str):
        return value[:limit]
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)[:limit]
    except (TypeError, ValueError):
        return str(value)[:limit]


def _tool_description(tool: Mapping[str, Any], limit: int) -> str:
    parts = [str(tool.get("name", "")), str(tool.get("description") or "")]
    rest = {k: v for k, v in tool.items() if k not in ("name", "description")}
    if rest:
        parts.append(_json_text(rest, limit))
    return " ".join(parts)


def task_views(spec: Mapping[str, Any], *, max_chars: int = 4000,
               tool_cache: dict[int, tuple[str, str]] | None = None) -> dict[str, str]:
    """The six concrete view texts of one task spec (empty string for a missing field).

    ``tool_cache``: a dict kept by the caller while the specs stay alive; a tool list shared by several
    tasks (one environment's) is then rendered once.
    """
    verifier = spec.get("verifier") or {}
    checks = verifier.get("checks") if isinstance(verifier, Mapping) else None
    code = verifier.get("code") if isinstance(verifier, Mapping) else None
    raw_tools = spec.get("tools") or []
    ops = tool_cache.get(id(raw_tools)) if tool_cache is not None else None
    if ops is None:
        tools = [t for t in raw_tools if isinstance(t, Mapping)]
        ops = (" ".join(str(t.get("name", "")) for t in tools),
               "\n".join(_tool_description(t, max_chars) for t in tools)[: max_chars * 8])
        if tool_cache is not None:
            tool_cache[id(raw_tools)] = ops
    return {
        "task_text": (spec.get("instruction") or "")[: max_chars * 4],
        "verifier_checks": "\n".join(c for c in (checks or []) if isinstance(c, str))[: max_chars * 4],
        "verifier_code": (code or "")[: max_chars * 4],
        "initial_context": _json_text(spec.get("initial_state"), max_chars),
        "operation_names": ops[0],
        "operation_description": ops[1],
    }


@dataclass
class _View:
    name: str
    weight: float
    vocabulary: list[str] | None = None  # terms in column order
    idf: np.ndarray | None = None

    def counter(self, config: GraphConfig, *, abstract: bool) -> CountVectorizer:
        from sklearn.feature_extraction.text import CountVectorizer

        kw: dict[str, Any] = {"dtype": np.float32}
        if abstract:
            kw.update(analyzer=_split, lowercase=False)
        else:
            kw.update(token_pattern=_TOKEN_PATTERN)
        if self.vocabulary is not None:
            kw["vocabulary"] = {t: i for i, t in enumerate(self.vocabulary)}
        return CountVectorizer(**kw)

    def vectorise(self, docs: list[Any], config: GraphConfig, *, abstract: bool, fit: bool) -> sp.csr_matrix | None:
        """TF-IDF rows of ``docs`` (fitting vocabulary and IDF first when ``fit``); ``None`` = unused view.

        Identical documents are tokenised once (the operation views repeat across an environment's
        tasks); the result equals scikit-learn's ``TfidfVectorizer`` on the full list.
        """
        from sklearn.feature_extraction.text import TfidfTransformer

        uniq: dict[Any, int] = {}
        inverse = np.empty(len(docs), dtype=np.int64)
        for i, d in enumerate(docs):
            inverse[i] = uniq.setdefault(d, len(uniq))
        udocs = list(uniq)
        counter = self.counter(config, abstract=abstract)
        if fit:
            if not any(udocs):
                self.vocabulary, self.idf = None, None
                return None
            try:
                xu = counter.fit_transform(udocs)
            except ValueError:  # empty vocabulary (only 1-character tokens...)
                self.vocabulary, self.idf = None, None
                return None
            x = sp.csr_matrix(xu[inverse], dtype=np.float32)
            terms = counter.get_feature_names_out()
            keep = np.ones(len(terms), dtype=bool)
            if not abstract:
                df = np.bincount(x.indices, minlength=len(terms))
                keep &= df >= config.min_df
                cap = config.max_features_per_view
                if cap is not None and keep.sum() > cap:
                    totals = np.asarray(x.sum(axis=0)).ravel()
                    totals[~keep] = -1
                    top = np.argsort(-totals, kind="stable")[:cap]
                    keep = np.zeros(len(terms), dtype=bool)
                    keep[top] = True
            if not keep.all():
                x = x[:, np.flatnonzero(keep)].tocsr()
                terms = terms[keep]
            if x.shape[1] == 0:
                self.vocabulary, self.idf = None, None
                return None
            tfidf = TfidfTransformer(norm="l2", sublinear_tf=config.sublinear_tf)
            x = tfidf.fit_transform(x)
            self.vocabulary, self.idf = [str(t) for t in terms], tfidf.idf_.astype(np.float64)
            return sp.csr_matrix(x, dtype=np.float32)
        if self.vocabulary is None:
            return None
        x = sp.csr_matrix(counter.transform(udocs)[inverse], dtype=np.float32)
        tfidf = TfidfTransformer(norm="l2", sublinear_tf=config.sublinear_tf)
        tfidf.idf_ = self.idf
        return sp.csr_matrix(tfidf.transform(x), dtype=np.float32)


@dataclass
class FeatureSpace:
    """Fitted vocabularies and IDF weights of every view (concrete and abstract).

    Attributes:
        full_views, abstract_views: per view its weight and, once fitted, vocabulary and IDF; a view
            with no content in the pool it was fitted on has ``vocabulary=None`` and contributes nothing.
    """

    full_views: list[_View] = field(default_factory=list)
    abstract_views: list[_View] = field(default_factory=list)

    @classmethod
    def empty(cls, config: GraphConfig) -> FeatureSpace:
        return cls([_View(v, config.full_weight(v)) for v in FULL_VIEWS if config.full_weight(v) > 0],
                   [_View(v, config.abstract_weight(v)) for v in ABSTRACT_VIEWS if config.abstract_weight(v) > 0])

    @property
    def fitted(self) -> bool:
        return any(v.vocabulary is not None for v in self.full_views + self.abstract_views)

    def _run(self, views: list[_View], docs: dict[str, list[Any]], n: int, config: GraphConfig, *,
             abstract: bool, fit: bool) -> tuple[sp.csr_matrix, dict[str, tuple[int, int]]]:
        blocks = []
        spans: dict[str, tuple[int, int]] = {}
        col = 0
        for view in views:
            x = view.vectorise(docs[view.name], config, abstract=abstract, fit=fit)
            docs[view.name] = []  # free the texts as we go
            if x is None:
                continue
            x.data *= np.float32(np.sqrt(view.weight))
            blocks.append(x)
            spans[view.name] = (col, col + x.shape[1])
            col += x.shape[1]
        if not blocks:
            return sp.csr_matrix((n, 0), dtype=np.float32), spans
        from sklearn.preprocessing import normalize

        mat = sp.hstack(blocks, format="csr", dtype=np.float32)
        del blocks
        mat = normalize(mat, norm="l2", copy=False)
        mat.indices = mat.indices.astype(np.int32, copy=False)
        mat.indptr = mat.indptr.astype(np.int64 if mat.nnz >= 2**31 else np.int32, copy=False)
        return mat, spans

    def column_names(self, which: str) -> list[str]:
        """Feature names (``view:term``) of the concrete (``"full"``) or ``"abstract"`` matrix columns."""
        views = self.full_views if which == "full" else self.abstract_views
        out: list[str] = []
        for v in views:
            if v.vocabulary is not None:
                out += [f"{v.name}:{t}" for t in v.vocabulary]
        return out

    def to_state(self) -> dict[str, Any]:
        """JSON-able description plus arrays (for :mod:`envsched.method.graph.io`)."""
        meta, arrays = [], {}
        for kind, views in (("full", self.full_views), ("abstract", self.abstract_views)):
            for v in views:
                meta.append({"kind": kind, "name": v.name, "weight": v.weight, "fitted": v.vocabulary is not None})
                if v.vocabulary is not None:
                    arrays[f"vocab/{kind}/{v.name}"] = np.array(v.vocabulary, dtype=np.str_)
                    arrays[f"idf/{kind}/{v.name}"] = np.asarray(v.idf, dtype=np.float64)
        return {"meta": meta, "arrays": arrays}

    @classmethod
    def from_state(cls, meta: list[dict[str, Any]], arrays: Mapping[str, np.ndarray]) -> FeatureSpace:
        space = cls()
        for m in meta:
            view = _View(m["name"], float(m["weight"]))
            if m["fitted"]:
                view.vocabulary = [str(t) for t in arrays[f"vocab/{m['kind']}/{m['name']}"].tolist()]
                view.idf = np.asarray(arrays[f"idf/{m['kind']}/{m['name']}"], dtype=np.float64)
            (space.full_views if m["kind"] == "full" else space.abstract_views).append(view)
        return space


@dataclass
class Features:
    """Both feature matrices of a pool (rows in pool order), the space they live in and a report."""

    full: sp.csr_matrix
    abstract: sp.csr_matrix
    space: FeatureSpace
    report: dict[str, Any]


def build_features(specs: Sequence[Mapping[str, Any]],
                   abstract_tokens_list: Sequence[Mapping[str, str | Sequence[str]]],
                   config: GraphConfig, *, space: FeatureSpace | None = None,
                   progress: Callable[[str], None] | None = None) -> Features:
    """Vectorise ``specs`` (concrete views) and their abstract token views.

    Args:
        specs: task specs, in pool order.
        abstract_tokens_list: for each spec, :func:`~envsched.method.graph.abstraction.abstract_tokens` of its
            abstract representation (per view a token list, or the tokens joined by spaces, which
            large pools use: equal strings are stored once).
        config: weights and TF-IDF settings.
        space: a fitted space to transform into (incremental growth); ``None`` fits a new one.
        progress: called with a short label before each stage.

    Returns:
        :class:`Features`; ``report["missing"]`` counts, per concrete view, the tasks lacking it and
        ``report["missing_examples"]`` names up to five of them.
    """
    if len(specs) != len(abstract_tokens_list):
        raise ValueError(f"{len(specs)} specs but {len(abstract_tokens_list)} abstract representations")
    fit = space is None
    space = FeatureSpace.empty(config) if space is None else space
    n = len(specs)
    max_chars = config.initial_context_max_chars
    full_docs: dict[str, list[str]] = {v: [] for v in FULL_VIEWS}
    missing = {v: 0 for v in FULL_VIEWS}
    examples: dict[str, list[str]] = {v: [] for v in FULL_VIEWS}
    if progress:
        progress("concrete views")
    tool_cache: dict[int, tuple[str, str]] = {}
    for spec in specs:
        views = task_views(spec, max_chars=max_chars, tool_cache=tool_cache)
        for v in FULL_VIEWS:
            text = views[v]
            full_docs[v].append(text)
            if not text.strip():
                missing[v] += 1
                if len(examples[v]) < 5:
                    examples[v].append(str(spec.get("id")))
    abs_docs: dict[str, list[str]] = {v: [_joined(t.get(v, "")) for t in abstract_tokens_list]
                                            for v in ABSTRACT_VIEWS}
    if progress:
        progress("tf-idf (concrete)")
    full, full_spans = space._run(space.full_views, full_docs, n, config, abstract=False, fit=fit)
    del full_docs
    if progress:
        progress("tf-idf (abstract)")
    abstract, abs_spans = space._run(space.abstract_views, abs_docs, n, config, abstract=True, fit=fit)
    no_full = int(n - np.count_nonzero(np.diff(full.indptr))) if n else 0
    no_abs = int(n - np.count_nonzero(np.diff(abstract.indptr))) if n else 0
    report = {
        "tasks": n,
        "missing": missing,
        "missing_examples": {v: e for v, e in examples.items() if e},
        "tasks_without_concrete_features": no_full,
        "tasks_without_abstract_features": no_abs,
        "views_unused": [v.name for v in space.full_views + space.abstract_views if v.vocabulary is None],
        "full_dim": int(full.shape[1]),
        "abstract_dim": int(abstract.shape[1]),
        "full_view_columns": {k: list(s) for k, s in full_spans.items()},
        "abstract_view_columns": {k: list(s) for k, s in abs_spans.items()},
        "sparse_bytes": int(sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in (full, abstract))),
    }
    return Features(full, abstract, space, report)
