"""Configuration of the EnvSched method: every hyperparameter, with a descriptive name and the paper's default.

The paper (EnvSched, arXiv 2610.37609; the summary in ``shared/seeds``) names its hyperparameters with
symbols. The code never uses those symbols; this table maps each one to the named parameter that holds it.
One table for the whole method: the graph part (``GraphConfig``) is written first, the scheduler part
(``SchedulerConfig``) below it.

Graph (``GraphConfig``; paper sections 2.2, B, D, E)
=====================================  =======================================  ==========================
paper symbol / wording                 parameter                                default
=====================================  =======================================  ==========================
``K_within`` (section 3.4.3)           ``GraphConfig.k_within``                 6
``K_cross`` (section 3.4.3)            ``GraphConfig.k_cross``                  12
six TF-IDF view weights (app. D)       ``GraphConfig.view_weights``             task text 0.28, verifier
                                                                                checks 0.08, verifier code
                                                                                0.16, initial context 0.12,
                                                                                operation names 0.16,
                                                                                complete operation
                                                                                description 0.20
``S_full`` (within-env similarity)     cosine of the weighted concatenation of  --
                                       the six L2-normalised views
``S_abs`` (cross-env similarity)       cosine of the weighted abstract views    --
                                       (``GraphConfig.abstract_view_weights``)
abstract representation (app. E.1)     ``GraphConfig.abstraction``              ``"static"`` (``"llm"``
                                                                                optional)
relation distance ``d = 1 - S``        fixed                                    --
adaptive bandwidth ``sigma_i`` (B)     ``GraphConfig.bandwidth_rank``: sigma_i  ``0`` = ceil(K/2), i.e. 3
                                       is node i's distance to its r-th         (within) and 6 (cross)
                                       nearest neighbour of the relation
bandwidth floor                        ``GraphConfig.min_bandwidth``            1e-3
neighbour weight ``w_ij`` (B)          ``exp(-d_ij^2 / (sigma_i sigma_j))``,    --
                                       normalised over the row
"shares nothing" cut                   ``GraphConfig.min_similarity``: a pair   0.0 (strictly positive
                                       with S <= it is never an edge            similarity needed)
exact vs approximate neighbours        ``GraphConfig.exact_max_nodes``          20,000
(not in the paper)                     ``GraphConfig.ann_*`` (hnswlib)          see the fields
=====================================  =======================================  ==========================

The paper gives the view weights and the two neighbour counts; it does not publish the bandwidth rule.
The rule used here is local scaling (Zelnik-Manor & Perona, 2004): each node's bandwidth is its distance
to a middle-ranked neighbour, so dense and sparse regions of the pool both get informative weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ABSTRACT_VIEWS",
    "DEFAULT_ABSTRACT_VIEW_WEIGHTS",
    "DEFAULT_VIEW_WEIGHTS",
    "FULL_VIEWS",
    "GraphConfig",
]

#: The six concrete views of appendix D, in the paper's order.
FULL_VIEWS: tuple[str, ...] = (
    "task_text",
    "verifier_checks",
    "verifier_code",
    "initial_context",
    "operation_names",
    "operation_description",
)

#: Appendix D view weights (0.28, 0.08, 0.16, 0.12, 0.16, 0.20).
DEFAULT_VIEW_WEIGHTS: dict[str, float] = {
    "task_text": 0.28,
    "verifier_checks": 0.08,
    "verifier_code": 0.16,
    "initial_context": 0.12,
    "operation_names": 0.16,
    "operation_description": 0.20,
}

#: Views of the abstract representation (appendix E.1), one per kind of extracted structure.
ABSTRACT_VIEWS: tuple[str, ...] = (
    "operations",
    "gates",
    "dependencies",
    "check_groups",
    "conflicts",
    "literals",
)

#: Not given by the paper (it uses one LLM-produced abstraction); chosen so that execution structure
#: (operations, gates, dependencies) dominates and literal categories only break ties.
DEFAULT_ABSTRACT_VIEW_WEIGHTS: dict[str, float] = {
    "operations": 0.25,
    "gates": 0.20,
    "dependencies": 0.20,
    "check_groups": 0.15,
    "conflicts": 0.15,
    "literals": 0.05,
}


@dataclass(frozen=True)
class GraphConfig:
    """Every hyperparameter of the dual-relation graph, with the paper's defaults.

    Attributes:
        k_within: ``K_within``, same-environment neighbours per task under ``S_full``.
        k_cross: ``K_cross``, other-environment neighbours per task under ``S_abs``.
        view_weights: weight of each concrete TF-IDF view (keys: :data:`FULL_VIEWS`). A view with weight 0
            is not computed. Weights need not sum to 1 (the rows are re-normalised).
        abstract_view_weights: weight of each abstract view (keys: :data:`ABSTRACT_VIEWS`).
        abstraction: ``"static"`` (deterministic extractor, offline) or ``"llm"`` (see
            :mod:`envsched.method.llm_abstraction`; needs ``llm_endpoint`` and ``llm_model``).
        bandwidth_rank: the rank ``r`` of the neighbour whose distance is a node's bandwidth; ``0`` means
            ``ceil(K / 2)`` of the relation.
        min_bandwidth: floor of a bandwidth (identical neighbours would otherwise give 0).
        min_similarity: pairs with similarity ``<=`` this are never neighbours (they share no feature).
        min_df: TF-IDF ``min_df`` of the concrete views (1 keeps every term).
        max_features_per_view: cap on each concrete view's vocabulary (``None``: no cap). Bounds memory on
            huge pools; the most frequent terms are kept.
        sublinear_tf: TF-IDF ``sublinear_tf`` (``1 + log tf``), so long texts do not dominate.
        initial_context_max_chars: the initial state is serialised to text and cut to this many characters
            (a multi-megabyte database dump would swamp the task otherwise).
        exact_max_nodes: pools (or environments, for the within relation) of at most this many tasks use
            exact search; larger ones use the approximate index.
        exact_block_rows: rows per block of the exact search (bounds its memory).
        ann_dense_dim: abstract features are densified for the approximate index; when their vocabulary is
            larger than this they are first reduced with truncated SVD to this many dimensions.
        ann_m, ann_ef_construction, ann_ef_search: hnswlib graph degree and search breadths.
        ann_oversample: the first approximate query asks for ``ann_oversample * K`` candidates; nodes whose
            own environment fills them are asked again with twice as many, and so on.
        ann_threads: threads for the approximate index (``0``: all cores).
        recall_sample: number of nodes on which recall@K of the approximate search is measured against
            exact search (``0``: not measured).
        seed: random seed (SVD, index construction, recall sample).
        llm_endpoint, llm_model: OpenAI-compatible endpoint and model for ``abstraction="llm"``.
        llm_cache_dir: where LLM abstractions are cached (``None``: ``~/.cache/envsched/abstractions``).
    """

    k_within: int = 6
    k_cross: int = 12
    view_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_VIEW_WEIGHTS))
    abstract_view_weights: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_ABSTRACT_VIEW_WEIGHTS))
    abstraction: str = "static"
    bandwidth_rank: int = 0
    min_bandwidth: float = 1e-3
    min_similarity: float = 0.0
    min_df: int = 1
    max_features_per_view: int | None = 200_000
    sublinear_tf: bool = True
    initial_context_max_chars: int = 4000
    exact_max_nodes: int = 20_000
    exact_block_rows: int = 1024
    ann_dense_dim: int = 128
    ann_m: int = 16
    ann_ef_construction: int = 100
    ann_ef_search: int = 64
    ann_oversample: int = 4
    ann_threads: int = 0
    recall_sample: int = 500
    seed: int = 0
    llm_endpoint: str | None = None
    llm_model: str | None = None
    llm_cache_dir: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.k_within < 1:
            problems.append(f"k_within must be >= 1, got {self.k_within}")
        if self.k_cross < 1:
            problems.append(f"k_cross must be >= 1, got {self.k_cross}")
        for name, weights, views in (("view_weights", self.view_weights, FULL_VIEWS),
                                     ("abstract_view_weights", self.abstract_view_weights, ABSTRACT_VIEWS)):
            unknown = set(weights) - set(views)
            if unknown:
                problems.append(f"{name} has unknown view(s) {sorted(unknown)}; known: {list(views)}")
            bad = {k: v for k, v in weights.items() if not (isinstance(v, int | float) and v >= 0)}
            if bad:
                problems.append(f"{name} must be non-negative numbers, got {bad}")
            if not any(float(v) > 0 for v in weights.values() if isinstance(v, int | float)):
                problems.append(f"{name} needs at least one positive weight")
        if self.abstraction not in ("static", "llm"):
            problems.append(f"abstraction must be 'static' or 'llm', got {self.abstraction!r}")
        if self.abstraction == "llm" and not (self.llm_endpoint and self.llm_model):
            problems.append("abstraction='llm' needs llm_endpoint and llm_model")
        if self.bandwidth_rank < 0:
            problems.append(f"bandwidth_rank must be >= 0, got {self.bandwidth_rank}")
        if not self.min_bandwidth > 0:
            problems.append(f"min_bandwidth must be > 0, got {self.min_bandwidth}")
        for name in ("exact_max_nodes", "exact_block_rows", "ann_dense_dim", "ann_m", "ann_ef_construction",
                     "ann_ef_search", "ann_oversample", "min_df", "initial_context_max_chars"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.recall_sample < 0 or self.ann_threads < 0:
            problems.append("recall_sample and ann_threads must be >= 0")
        if problems:
            raise ValueError("invalid GraphConfig: " + "; ".join(problems))

    def full_weight(self, view: str) -> float:
        return float(self.view_weights.get(view, 0.0))

    def abstract_weight(self, view: str) -> float:
        return float(self.abstract_view_weights.get(view, 0.0))

    def bandwidth_rank_for(self, k: int) -> int:
        """The neighbour rank (1-based) whose distance is the bandwidth, for a relation with ``k`` neighbours."""
        return min(k, self.bandwidth_rank) if self.bandwidth_rank else max(1, -(-k // 2))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (saved with the graph)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown GraphConfig field(s): {sorted(unknown)}")
        return cls(**data)

    def graph_key(self) -> dict[str, Any]:
        """The fields that change the graph (the LLM cache location and thread count do not)."""
        d = self.to_dict()
        for k in ("ann_threads", "llm_cache_dir", "recall_sample"):
            d.pop(k, None)
        return d


# --- scheduler configuration (SchedulerConfig) below ---
