# Over 700 lines: every hyperparameter with its docstring and its declaration (check, reader, tuning), in one place.
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
neighbour weight ``w_ij`` (B)          ``exp(-d_ij^2 / (2 sigma_i^2))``,        --
                                       normalised over the row
"shares nothing" cut                   ``GraphConfig.min_similarity``: a pair   0.0 (strictly positive
                                       with S <= it is never an edge            similarity needed)
exact vs approximate neighbours        ``GraphConfig.exact_max_nodes``          20,000
(not in the paper)                     ``GraphConfig.ann_*`` (hnswlib)          see the fields
=====================================  =======================================  ==========================

Scheduler (``SchedulerConfig``; paper sections 2.3, 2.4, 3.1, B, B.1, C)
=====================================  =======================================  ==========================
paper symbol / wording                 parameter                                default
=====================================  =======================================  ==========================
``B`` batch of pairs (3.1, D)          ``SchedulerConfig.batch_size``           64
coverage / exploitation split (3.1)    ``SchedulerConfig.coverage_share``       0.5: ``round(0.5 n)`` of a batch
                                                                                of ``n`` (32 of 64); at least one
                                                                                exploitation slot
``K`` rollouts per pair (B.1, D)       ``SchedulerConfig.rollouts_per_task``    8
``C1`` (C)                             ``SchedulerConfig.max_per_env_coverage`` 4 tasks of one env in the
                                                                                coverage phase of a batch of
                                                                                ``batch_size`` (scaled by
                                                                                ``n / batch_size``)
``C3`` (C)                             ``SchedulerConfig.env_quota_per_batch``  11 tasks of one env in a
                                                                                batch (env quota; scaled
                                                                                like ``C1``)
``C_task`` (C)                         ``SchedulerConfig.max_consecutive_``     2 consecutive batches
                                       ``selections``
long / short half-life (B.1)           ``SchedulerConfig.long_half_life`` /     8 / 2 steps (values not
                                       ``short_half_life``                      in the summary)
equal-weight relation fusion (F)       ``SchedulerConfig.within_fusion_weight`` 0.5
fusion with own history (2.3)          ``SchedulerConfig.prior_strength``       0.5 (pseudo-groups)
second variance ``d m (1 - m)`` (B.1)  ``SchedulerConfig.reconstruction_``      0.5
                                       ``weight``
recent decline (2.3, B.1)              ``SchedulerConfig.decline_penalty``      0.25 (paper preset; default 0)
batch-similarity penalty (2.4, C)      ``SchedulerConfig.similarity_penalty``   0.2
exposure discounting (2.4)             ``SchedulerConfig.exposure_power``       0.1
progress filter: >= 3 scorable         ``SchedulerConfig.progress_min_``        3
transitions (C)                        ``transitions``
progress filter: residual <= 0 (C)     ``SchedulerConfig.progress_residual_``   0.0
                                       ``threshold``
clip of centered v / m / d (B)         ``SchedulerConfig.variance_clip`` ...    [0, 0.25], [0, 1], [0, 1]
step-level reference (B)               ``SchedulerConfig.reference_min_``       0.5 of the step's groups
                                       ``fraction``
cold start: <= 2 per env (C)           ``SchedulerConfig.cold_start_max_``      2
                                       ``per_env``
cold start novelty mix (C)             ``SchedulerConfig.cold_start_within_``   0.5
                                       ``novelty_weight``
identifier filter "high reward" (C)    ``SchedulerConfig.identifier_min_``      1.0 (full marks)
                                       ``reward``
ablations (3.4.1)                      ``mode`` (``coverage_only`` /            ``"full"``, True, True
                                       ``exploitation_only``),
                                       ``use_within_edges``, ``use_cross_edges``
neighbour without history counts       ``SchedulerConfig.unobserved_``          ``"environment"`` (ours; the
with the reference (B.1)               ``neighbours``                           paper preset
                                                                                ``"reference"``)
=====================================  =======================================  ==========================

Adaptive rules (not in the paper: "ours"). ``SchedulerConfig()`` keeps the paper's fixed split and coverage
ranking (``adaptive_share`` and ``adaptive_coverage`` off) and the caps on declining tasks only;
``SchedulerConfig.paper()`` switches every one of these off, see :data:`PAPER_PRESET`.

=====================================  =======================================  ==========================
rule                                   parameter                                default (search ranges:
                                                                                :data:`ADAPTIVE_TUNING_SPACE`)
=====================================  =======================================  ==========================
coverage share sized online from the   ``adaptive_share``; the share is         False (on: cap 0.5)
phases' realised signal yield          ``y_cov / (y_cov + y_exp)`` clipped to
                                       [``coverage_share_floor``,
                                       ``coverage_share``]
yield smoothing                        ``yield_half_life`` (steps)              8.0
floor of the coverage share            ``coverage_share_floor``                 0.0625 (4 of 64)
coverage env by UCB x size, task by    ``adaptive_coverage``                    False
the posterior's upper quantile
quantile of both upper bounds          ``ucb_quantile``                         0.9
env size weight                        ``env_size_power``                       0.5
exploitation score                     ``exploitation_score``                   ``"variance"`` (the paper's)
                                       (``"signal_probability"`` = ours,
                                       the Beta-posterior score)
how the posterior is turned into a     ``exploitation_rule`` (``"mean"`` /      ``"mean"``
score                                  ``"thompson"`` / ``"upper_quantile"``)
graph prior's weight in rollouts       ``signal_prior_ess``                     4.0
task cap and exposure discount only    ``caps_on_decline_only``                 True
for tasks whose signal declines
=====================================  =======================================  ==========================

Long runs (not in the paper; both presets)

=====================================  =======================================  ==========================
rule                                   parameter                                default
=====================================  =======================================  ==========================
bounded history: observations whose    ``history_tolerance``; the horizon is    1e-9 (268 steps at the
weight is below this share of their    ``SchedulerConfig.history_horizon``      default half-lives)
task's newest leave the log for the
decayed statistics (paper preset)
=====================================  =======================================  ==========================

The paper gives the view weights and the two neighbour counts; it does not publish the bandwidth rule.
The rule used here is a per-node Gaussian bandwidth in the spirit of local scaling (Zelnik-Manor &
Perona, 2004): each node's bandwidth is its distance to a middle-ranked neighbour, so dense and sparse
regions of the pool both get informative weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envsched.errors import InvalidValueError, UnreadKnobError
from envsched.validation import check_int, check_number, interval_text, is_int, is_number

__all__ = [
    "ABSTRACT_VIEWS",
    "ADAPTIVE_TUNING_SPACE",
    "DEFAULT_ABSTRACT_VIEW_WEIGHTS",
    "DEFAULT_VIEW_WEIGHTS",
    "EXPLOITATION_RULES",
    "EXPLOITATION_SCORES",
    "FORMER_FIELDS",
    "FORMER_PIPELINE_DEFAULTS",
    "FULL_VIEWS",
    "INFORMATIVENESS_FIELDS",
    "KNOBS",
    "KNOB_READERS",
    "PAPER_PRESET",
    "PAPER_RULES",
    "SCHEDULER_MODES",
    "UNOBSERVED_NEIGHBOURS",
    "WITHIN_RELATIONS",
    "GraphConfig",
    "Knob",
    "SchedulerConfig",
    "UnreadKnobError",
    "field_defaults",
    "knob_table",
    "scheduler_tuning_space",
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


#: Upper bounds of GraphConfig's integer fields, sized for a 24 GiB machine (docs/limits.md): the
#: neighbour arrays take N x (k_within + k_cross) x 20 bytes, exact search holds exact_block_rows x N
#: scores and is O(N^2) up to exact_max_nodes tasks, the HNSW index N x ann_dense_dim x 4 bytes plus
#: N x ann_m links. The CLI's options use the same bounds.
GRAPH_INT_BOUNDS: dict[str, int] = {
    "k_within": 1_024, "k_cross": 1_024, "bandwidth_rank": 1_024, "min_df": 1_000_000_000,
    "max_features_per_view": 10_000_000, "initial_context_max_chars": 10_000_000, "exact_max_nodes": 200_000,
    "exact_block_rows": 65_536, "ann_dense_dim": 4_096, "ann_m": 256, "ann_ef_construction": 4_096,
    "ann_ef_search": 4_096, "ann_oversample": 64, "ann_threads": 256, "recall_sample": 100_000, "workers": 64,
    "parallel_min_tasks": 1_000_000_000, "seed": 2**63 - 1,
}


class _Problems:
    """The problems of one config, raised together as one :class:`~envsched.errors.InvalidValueError` that names
    the first offending field (``name`` and ``value``) and lists them all in its message."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.messages: list[str] = []
        self.names: list[str] = []
        self.first: str | None = None

    def add(self, name: str, message: str) -> None:
        self.messages.append(message)
        self.names.append(name)
        if self.first is None:
            self.first = name

    def __bool__(self) -> bool:
        return bool(self.messages)

    def check(self, config: Any, name: str, check: Callable[..., Any], **bounds: Any) -> None:
        """Check field ``name`` of ``config`` with ``check`` (:func:`~envsched.validation.check_int` or
        :func:`~envsched.validation.check_number` and their bounds), adding its refusal to the problems. A
        numpy value that passes is stored as the Python number it equals (a config is written to JSON); a
        Python ``int`` stays an ``int``."""
        value = getattr(config, name)
        try:
            check(value, name, **bounds)
        except InvalidValueError as exc:
            self.add(name, str(exc))
        else:
            if is_number(value) and not isinstance(value, int | float):
                object.__setattr__(config, name, value.item())

    def raise_if_any(self, config: Any) -> None:
        if self.messages:
            raise InvalidValueError(f"invalid {self.kind}: " + "; ".join(self.messages), name=self.first or "",
                                    value=getattr(config, self.first or "", None))


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
            :mod:`envsched.method.graph.llm_abstraction`; needs ``llm_endpoint`` and ``llm_model``).
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
        ann_backend: ``"hnswlib"`` (default, chosen by measurement: see ``docs/graph.md``) or
            ``"pynndescent"``.
        ann_dense_dim: abstract features are densified for the approximate index; when their vocabulary is
            larger than this they are first reduced with truncated SVD to this many dimensions.
        ann_m, ann_ef_construction, ann_ef_search: hnswlib graph degree and search breadths.
        ann_oversample: the first approximate query asks for ``ann_oversample * K`` candidates; nodes whose
            own environment fills them are asked again with twice as many, and so on.
        ann_threads: threads for the approximate index (``0``: all cores).
        recall_sample: number of nodes on which recall@K of the approximate search is measured against
            exact search (``0``: not measured).
        workers: processes for the static abstraction of large pools (``0``: all cores; ``1``: serial).
        parallel_min_tasks: pools smaller than this are abstracted serially.
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
    ann_backend: str = "hnswlib"
    ann_dense_dim: int = 256
    ann_m: int = 12
    ann_ef_construction: int = 64
    ann_ef_search: int = 64
    ann_oversample: int = 4
    ann_threads: int = 0
    recall_sample: int = 500
    workers: int = 0
    parallel_min_tasks: int = 20_000
    seed: int = 0
    llm_endpoint: str | None = None
    llm_model: str | None = None
    llm_cache_dir: str | None = None

    def __post_init__(self) -> None:
        problems = _Problems("GraphConfig")
        for name, high in GRAPH_INT_BOUNDS.items():
            value = getattr(self, name)
            if value is None and name == "max_features_per_view":
                continue
            if not is_int(value):
                problems.add(name, f"{name} must be an integer, got {type(value).__name__}")
            elif value > high:
                problems.add(name, f"{name} must be <= {high:,}, got {value:,}")
            else:
                object.__setattr__(self, name, int(value))  # a numpy integer is stored as an int (JSON)
        for name in ("min_bandwidth", "min_similarity"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value):
                problems.add(name, f"{name} must be a finite number, got {value!r}")
        problems.raise_if_any(self)  # wrong types or sizes: stop before comparisons that would fail on them
        if self.k_within < 1:
            problems.add("k_within", f"k_within must be >= 1, got {self.k_within}")
        if self.k_cross < 1:
            problems.add("k_cross", f"k_cross must be >= 1, got {self.k_cross}")
        for name, weights, views in (("view_weights", self.view_weights, FULL_VIEWS),
                                     ("abstract_view_weights", self.abstract_view_weights, ABSTRACT_VIEWS)):
            unknown = set(weights) - set(views)
            if unknown:
                problems.add(name, f"{name} has unknown view(s) {sorted(unknown)}; known: {list(views)}")
            bad = {k: v for k, v in weights.items() if not (isinstance(v, int | float) and v >= 0)}
            if bad:
                problems.add(name, f"{name} must be non-negative numbers, got {bad}")
            if not any(float(v) > 0 for v in weights.values() if isinstance(v, int | float)):
                problems.add(name, f"{name} needs at least one positive weight")
        if self.abstraction not in ("static", "llm"):
            problems.add("abstraction", f"abstraction must be 'static' or 'llm', got {self.abstraction!r}")
        if self.abstraction == "llm" and not (self.llm_endpoint and self.llm_model):
            problems.add("abstraction", "abstraction='llm' needs llm_endpoint and llm_model")
        if self.ann_backend not in ("hnswlib", "pynndescent"):
            problems.add("ann_backend", f"ann_backend must be 'hnswlib' or 'pynndescent', got {self.ann_backend!r}")
        if self.bandwidth_rank < 0:
            problems.add("bandwidth_rank", f"bandwidth_rank must be >= 0, got {self.bandwidth_rank}")
        if not self.min_bandwidth > 0:
            problems.add("min_bandwidth", f"min_bandwidth must be > 0, got {self.min_bandwidth}")
        for name in ("exact_max_nodes", "exact_block_rows", "ann_dense_dim", "ann_m", "ann_ef_construction",
                     "ann_ef_search", "ann_oversample", "min_df", "initial_context_max_chars"):
            if getattr(self, name) < 1:
                problems.add(name, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("recall_sample", "ann_threads", "workers", "parallel_min_tasks"):
            if getattr(self, name) < 0:
                problems.add(name, "recall_sample, ann_threads, workers and parallel_min_tasks must be >= 0")
                break
        problems.raise_if_any(self)

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
        for k in ("ann_threads", "llm_cache_dir", "recall_sample", "workers", "parallel_min_tasks"):
            d.pop(k, None)
        return d


# --- scheduler configuration (SchedulerConfig) below ---

#: Scheduler modes: the full method and the two component ablations of section 3.4.1.
SCHEDULER_MODES: tuple[str, ...] = ("full", "coverage_only", "exploitation_only")

#: What exploitation ranks by: the paper's calibrated variance prediction, or the probability that a group has
#: signal (adaptive mode).
EXPLOITATION_SCORES: tuple[str, ...] = ("variance", "signal_probability")

#: How the Beta posterior becomes the exploitation score (``exploitation_score="signal_probability"``).
EXPLOITATION_RULES: tuple[str, ...] = ("mean", "thompson", "upper_quantile")
#: What the within-environment relation averages (``SchedulerConfig.within_relation``): the graph's ``K_within``
#: nearest same-environment neighbours (the paper), or every other task of the environment with equal weight.
WITHIN_RELATIONS: tuple[str, ...] = ("neighbours", "environment")
#: What a neighbour without history counts with in the graph prior (``SchedulerConfig.unobserved_neighbours``):
#: the global reference (the paper, B.1), or its environment's estimate, the propagation over the other tasks of
#: its environment in which the environment's unobserved tasks count with the global reference (ours).
UNOBSERVED_NEIGHBOURS: tuple[str, ...] = ("reference", "environment")

#: The paper's prediction pipeline as an earlier default ran it: the graph prior of both relations with the global
#: reference for a neighbour without history, the calibration and the recent-decline term. The paper preset keeps
#: all of it; the default keeps the graph prior with the environment estimate as the substitute
#: (``unobserved_neighbours="environment"``) and leaves the calibration and the decline term out. A state or run
#: file of an earlier version carries its own values of them (:mod:`envsched.method.migrations` reads it).
FORMER_PIPELINE_DEFAULTS: dict[str, Any] = {"use_within_edges": True, "use_cross_edges": True,
                                            "unobserved_neighbours": "reference", "use_calibration": True,
                                            "decline_penalty": 0.25}

#: The field values that make :class:`SchedulerConfig` the faithful paper preset (every adaptive rule off, the
#: 50/50 split). ``SchedulerConfig.paper(**overrides)`` is ``SchedulerConfig(**{**PAPER_PRESET, **overrides})``;
#: the benchmark's ``envsched-paper`` variants merge this dict into their options.
PAPER_PRESET: dict[str, Any] = {
    "coverage_share": 0.5,
    "adaptive_share": False,
    "adaptive_coverage": False,
    "exploitation_score": "variance",
    "caps_on_decline_only": False,
    # the paper's prediction pipeline (the default leaves out its calibration and decline term, and substitutes
    # the environment's estimate for a neighbour without history: docs/envsched-sampler.md)
    **FORMER_PIPELINE_DEFAULTS,
}

#: The switches of the default's own rules (:attr:`SchedulerConfig.is_paper` is true when all four have their
#: :data:`PAPER_PRESET` value); the rest of the preset is the paper's prediction pipeline, which either policy
#: runs as configured.
PAPER_RULES: tuple[str, ...] = ("adaptive_share", "adaptive_coverage", "exploitation_score", "caps_on_decline_only")


# ---------------------------------------------------------------------------------------------- knob declarations
class _Check:
    """The admissible values of one knob: called with ``(value, name)`` it raises
    :class:`~envsched.errors.InvalidValueError` for any other; :meth:`describe` says which, for the docs."""

    def __call__(self, value: Any, name: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class _Int(_Check):
    low: int

    def __call__(self, value: Any, name: str) -> None:
        check_int(value, name, low=self.low)

    def describe(self) -> str:
        return f"integer >= {self.low}"


@dataclass(frozen=True)
class _OptionalInt(_Int):
    def __call__(self, value: Any, name: str) -> None:
        if value is not None:
            check_int(value, name, low=self.low)

    def describe(self) -> str:
        return f"None or integer >= {self.low}"


@dataclass(frozen=True)
class _Number(_Check):
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    #: the sentence that refuses the open upper bound itself, where it needs one
    high_reason: str = ""

    def __call__(self, value: Any, name: str) -> None:
        if self.high_reason and is_number(value) and value == self.high:
            raise InvalidValueError(f"{name} must be < {self.high:g} ({self.high_reason})", name=name, value=value)
        check_number(value, name, low=self.low, high=self.high, low_open=self.low_open, high_open=self.high_open,
                     finite=False)

    def describe(self) -> str:
        return interval_text(self.low, self.high, self.low_open, self.high_open)


@dataclass(frozen=True)
class _Choice(_Check):
    values: tuple[Any, ...]

    def __call__(self, value: Any, name: str) -> None:
        if value not in self.values or isinstance(value, bool) != isinstance(self.values[0], bool):
            raise InvalidValueError(f"{name} must be one of {list(self.values)}, got {value!r}", name=name,
                                    value=value)

    def describe(self) -> str:
        return ", ".join(repr(v) if isinstance(v, str) else str(v) for v in self.values)


@dataclass(frozen=True)
class _Flag(_Check):
    def __call__(self, value: Any, name: str) -> None:
        if not isinstance(value, bool):
            raise InvalidValueError(f"{name} must be True or False, got {value!r}", name=name, value=value)

    def describe(self) -> str:
        return "True, False"


@dataclass(frozen=True)
class _Clip(_Check):
    high: float

    def __call__(self, value: Any, name: str) -> None:
        if not (isinstance(value, tuple | list) and len(value) == 2 and all(is_number(x) for x in value)
                and 0.0 <= value[0] <= value[1] <= self.high):
            raise InvalidValueError(f"{name} must be (low, high) with 0 <= low <= high <= {self.high}, "
                                    f"got {value!r}", name=name, value=value)

    def describe(self) -> str:
        return f"(low, high), 0 <= low <= high <= {self.high:g}"


_INF = math.inf
_UNIT = _Number(0.0, 1.0)
_POSITIVE = _Number(0.0, _INF, low_open=True)
_NON_NEGATIVE = _Number(0.0, _INF)
_FLAG = _Flag()


@dataclass(frozen=True)
class Knob:
    """Everything the configuration says about one :class:`SchedulerConfig` field, declared once in the field's
    metadata: its admissible values, when it is read, and how the tuning protocol searches it.

    Attributes:
        check: the admissible values (the config refuses any other, naming the field).
        read_when: ``None`` when every configuration reads the knob; otherwise the switches under which some
            batch reads it, a predicate of the config. A knob that is unread under a config's switches must keep
            its default (:class:`UnreadKnobError`).
        reader: the mechanism that reads it and how to turn it on (the refusal's words; :data:`KNOB_READERS`).
        tuning: its search range for the symmetric tuning protocol, ``("float", low, high, log)`` or
            ``("choice", [values])``; ``None``: not tuned.
        tuned_in: the presets whose tuning searches it (``"paper"``, ``"default"``).
        tuning_order: its place in a tuning draw (draws take the knobs in this order, so that a committed
            tuning run draws the same trials).
        note: a rule across fields that also bounds it (the docs' table shows it with the values).
    """

    check: _Check
    read_when: Callable[[Any], bool] | None = None
    reader: str = ""
    tuning: tuple[Any, ...] | None = None
    tuned_in: tuple[str, ...] = ()
    tuning_order: int = 0
    note: str = ""


def _knob(default: Any, check: _Check, **knob: Any) -> Any:
    return field(default=default, metadata={"knob": Knob(check, **knob)})


def _informativeness_read(c: Any) -> bool:
    return c.exploitation_score == "variance" or not c.adaptive_coverage


def _signal_score(c: Any) -> bool:
    return c.exploitation_score == "signal_probability"


_INFO = {"read_when": _informativeness_read,
         "reader": "the calibrated informativeness of the paper's pipeline, which decides batches only with "
                   "exploitation_score='variance' or adaptive_coverage=False"}
_SHARE = {"read_when": lambda c: c.adaptive_share,
          "reader": "the online coverage share (adaptive_share=True; off in both presets)"}
_BOTH = ("paper", "default")
_DEFAULT_ONLY = ("default",)


def _tuned(spec: tuple[Any, ...], order: int, presets: tuple[str, ...] = _DEFAULT_ONLY) -> dict[str, Any]:
    return {"tuning": spec, "tuning_order": order, "tuned_in": presets}


@dataclass(frozen=True)
class SchedulerConfig:
    """Every hyperparameter of the EnvSched scheduler (sections 2.3, 2.4, B, B.1, C), with the paper's
    defaults where the paper gives one. The symbol table in this module's docstring maps each paper
    symbol to its field; fields marked "not in the paper" are this implementation's choices.

    ``SchedulerConfig()`` is the default of :class:`EnvSchedSampler`: the paper's batches (the fixed 50/50
    split, coverage of the least observed environments first, quotas, caps, filters, similarity penalty) with
    exploitation ranked by each task's predicted variance, and one rule of ours that acts through those
    mechanisms: the caps on declining tasks only. Two more rules of ours are options, off in both presets: the
    online coverage share (``adaptive_share``) and the UCB coverage ranking (``adaptive_coverage``); they raise
    batch variance but cover fewer environments per batch than uniform (docs/envsched-sampler.md). Its prediction is the
    paper's graph prior (propagation along both relations, equal-weight fusion, fusion with the task's own
    history), with one rule of ours: a neighbour without history counts with its environment's estimate instead
    of the global reference (``unobserved_neighbours="environment"``). It leaves out the paper's calibration
    (``use_calibration=False``) and recent-decline term (``decline_penalty=0``).
    ``SchedulerConfig.paper()`` is the faithful paper preset (:data:`PAPER_PRESET`).

    Each field is declared once, with its :class:`Knob` in the field's metadata (:data:`KNOBS`): its admissible
    values, when it is read and its tuning range. Validation, the unread-knob refusal, the tuning space
    (:func:`scheduler_tuning_space`) and the knob table of the docs (:func:`knob_table`) are generated from them;
    the rule that spans fields (the share against the batch) is checked after them.

    No inert knob: a field that the configuration's switches leave unread (:meth:`unread_fields`,
    :data:`KNOB_READERS`) must keep its default; any other value is refused with a ``ValueError`` naming the
    mechanism that reads it (:class:`UnreadKnobError`, an ``InvalidValueError``). The default leaves unread
    ``exploitation_rule`` (read only by the signal-probability score) and the knobs of the online share
    (``yield_half_life``, ``coverage_share_floor``) and of the UCB coverage (``ucb_quantile``,
    ``env_size_power``, ``signal_prior_ess``); the paper preset reads none of the adaptive rules' knobs.

    Attributes:
        batch_size: ``B``, pairs per batch (64): the batch the caps ``C1`` / ``C3`` are stated for.
            ``sample(n)`` with another ``n`` scales them by ``n / batch_size`` (at least 1).
        coverage_share: share of a batch given to coverage: ``round(coverage_share * n)`` slots of a batch of
            ``n`` (0.5: 32 of 64, the paper's split). It must leave at least one exploitation slot: a config
            with ``round(coverage_share * batch_size) >= batch_size`` is refused, and so is a ``sample(n)``
            with ``round(coverage_share * n) >= n``. In the adaptive mode it is the largest share.
        rollouts_per_task: rollouts per selected pair (8). The trainer decides; the benchmark and
            ``envsched run`` use it, and the adaptive exploitation score uses it as the group size ``G``
            (set it to your trainer's group size; the registry factory does, from ``group_size``).
        max_per_env_coverage: ``C1`` (4): at most this many tasks of one environment in the coverage
            phase of one batch.
        env_quota_per_batch: ``C3`` (11): at most this many tasks of one environment in one batch
            (coverage and exploitation picks together); the environment quota of exploitation.
        max_consecutive_selections: ``C_task`` (2): a task selected in this many consecutive batches is
            not eligible in the next one (both phases).
        long_half_life, short_half_life: half-lives, in scheduler steps, of the two recency-weighted task
            histories (B.1). The summary of the paper does not give their values: 8 and 2 (our choice).
        within_fusion_weight: weight of the within-environment estimate when it is fused with the
            cross-environment estimate (0.5: equal weight, as in F.1-F.3).
        prior_strength: pseudo-count of the graph prior when it is fused with a task's own history: the
            posterior is ``(prior_strength * prior + W * own) / (prior_strength + W)`` with ``W`` the
            task's recency-weighted number of observed groups (not in the paper: 0.5, so one observed
            group of the task itself counts twice the graph prior; see docs/envsched-sampler.md).
        reconstruction_weight: weight of the variance reconstructed from predicted mean and dispersion
            (``d * m * (1 - m)``) against the direct variance prediction, as a share of the percentile
            rank that is mapped through the quantile function (0.5; not in the paper).
        decline_penalty: how much a recent decline (short half-life score below the long one) lowers the
            priority: ``priority = mean(long, short) - decline_penalty * max(0, long - short)``. With 0.5 a
            declining task would get its short-term score; the paper preset's 0.25 (not in the paper) goes a
            quarter of the way, as the short-half-life score rests on about one group of 8 rollouts. The
            default is 0: the term earned nothing on either benchmark learner.
        similarity_penalty: batch-similarity penalty ``lambda``: a candidate's score is multiplied by
            ``1 - lambda * max_sim`` where ``max_sim`` is its largest similarity to the tasks already in
            the batch (``S_full`` within an environment, ``S_abs`` across) (0.2; not in the paper: tasks of
            one environment typically have ``S_full`` around 0.8, so 0.5 turned the penalty into a
            second environment quota that overrode the predictions; see docs/envsched-sampler.md).
        exposure_power: exposure discounting in exploitation: the score is multiplied by
            ``(1 + exposure) ** -exposure_power``, exposure being the long-half-life-weighted number of
            past selections of the task (0.1; not in the paper: 0.5 halved the score of a task drawn in 3
            of the last 4 batches, so exploitation avoided exactly the tasks known to be informative; the
            hard limit on repetition is ``max_consecutive_selections``; see docs/envsched-sampler.md).
        progress_min_transitions: the progress filter needs at least this many scorable transitions
            (consecutive pairs of scorable observations of the task) (3, appendix C).
        progress_residual_threshold: a task whose estimated residual is ``<=`` this leaves exploitation
            (0.0: "non-positive", appendix C).
        min_scored_rollouts: an observation is scorable (counts for transitions) when it has at least this
            many scored rollouts (2: a variance needs two).
        reference_min_fraction: a scheduler step has its own step-level reference once this share of its
            dispatched groups has been observed; before any step has one, the first observed batch is
            the reference (B) (0.5; not in the paper).
        variance_clip, mean_clip, dispersion_clip: clipping ranges of centered observations, on the
            pool's reward scale mapped to [0, 1]: [0, 0.25], [0, 1], [0, 1] (B).
        cold_start_max_per_env: at most this many tasks per environment in the first batch (2, C).
        cold_start_within_novelty_weight: weight of within-environment novelty against global novelty
            when cold start fills the slots after one representative per environment (0.5; not in the
            paper).
        identifier_min_reward: saved trajectories with a reward (scaled to [0, 1]) at least this high are
            checked by the identifier filter (1.0: full marks; "high-reward", appendix C).
        mode: ``"full"``, ``"coverage_only"`` or ``"exploitation_only"`` (ablations of 3.4.1).
        use_within_edges, use_cross_edges: the graph prior's two relations (3.4.1's ablations switch them off).
            With both off the prior is the global reference, and a task without history of its own is predicted
            at it.
        unobserved_neighbours: what a neighbour without history counts with when a relation averages a task's
            neighbours: ``"reference"``, the global reference (B.1, the paper preset), or ``"environment"`` (the
            default, ours), its environment's estimate: the mean over the other tasks of its environment in which
            the environment's unobserved tasks count with the global reference (the same substitution one level
            up). A task with no observed neighbour is then predicted at its environment's estimate, which moves from
            the global reference to the environment's observed mean as the environment's tasks are observed. Within
            a task's own environment its estimate leaves the task out, so the prior never holds the task's own
            history (that enters once, in the fusion with ``prior_strength``). Read with either relation on.
        within_relation: what the within relation averages: ``"neighbours"``, the graph's ``K_within``
            nearest same-environment tasks with their weights (the paper), or ``"environment"``, every other
            task of the environment with weight 1 (ours, tried and not adopted as the default; read only with
            ``use_within_edges``).
        use_progress_filter, use_identifier_filter: switch the two candidate filters off.
        use_calibration: the paper's calibration (B.1): percentile ranks over all N pairs and the quantile
            mapping. Off (the default), each half-life's score is the blend
            ``(1 - a) v + a d m (1 - m)`` of the two variance estimates themselves.
        explain_max_neighbors: neighbours listed per relation in an explanation record (``None``: all).

    Rules of ours (all off in :data:`PAPER_PRESET`; ``adaptive_share`` and ``adaptive_coverage`` also in the default):
        adaptive_share: size coverage online. Each phase's realised yield (signal groups per scored group:
            at least 2 scored rewards, not all equal) is a Beta(1, 1) posterior over its recency-weighted
            groups (``yield_half_life``); the share is ``y_cov / (y_cov + y_exp)`` (posterior means), clipped
            to ``[coverage_share_floor, coverage_share]``. Probability matching: a phase whose picks yield
            twice the signal gets twice the slots, and neither is abandoned on a few groups' evidence. With
            no evidence both means are 0.5, so a run starts at the cap (the paper's split). Environments
            never selected so far raise the coverage slots up to the cap (one slot each), so the floor never
            stops coverage from reaching them.
        yield_half_life: half-life, in steps, of the yield counts (8.0 = ``long_half_life``: the share
            tracks the horizon the task histories use).
        coverage_share_floor: smallest share (0.0625: 4 slots of 64; a floor above ``coverage_share`` acts as
            ``coverage_share``). Coverage also feeds the graph
            prediction with observations of other environments, which its own yield does not measure; a
            sixteenth keeps each of the default pool's 51 environments visited about every 13 steps.
        adaptive_coverage: coverage picks its environment by an upper confidence bound on the environment's
            realised signal rate (Beta(1, 1) posterior of its tasks' recency-weighted groups, upper quantile
            ``ucb_quantile``) times ``(tasks in env / mean tasks per env) ** env_size_power``; environments
            never selected come first; the paper's "lower current-step coverage first" still orders before
            that. Inside the environment the task with the highest optimistic signal probability (the
            ``ucb_quantile`` upper bound of the graph-propagated Beta posterior, see below) wins, instead
            of fewest observations.
        ucb_quantile: the quantile of both upper bounds (0.9: the upper end of an 80 % credible interval, the
            usual Bayes-UCB level; higher is more optimistic about little-observed environments and tasks).
        env_size_power: weight of an environment's size in coverage (0.5: the geometric mean of "every
            environment alike" (0, the paper) and "every task alike" (1, uniform sampling)).
        exploitation_score: ``"variance"`` (the default: the variance prediction) or
            ``"signal_probability"``: the probability that a group of ``rollouts_per_task`` rollouts has
            signal (not all rewards equal), ``1 - p^G - (1-p)^G`` for a per-rollout mean ``p``, under a
            Beta posterior per task on its mean reward mapped to [0, 1]. Prior ``Beta(ess * mu, ess *
            (1 - mu))`` with ``mu`` the prior mean (graph-propagated where the relations are on, else the
            global reference) and ``ess = signal_prior_ess``; the task's own scored rollouts add their
            recency-weighted (``long_half_life``) reward sums and complements as counts; ``None`` rewards are
            ignored. Binary and graded rewards and tasks with few observations go through one rule.
        exploitation_rule: ``"mean"`` (the posterior predictive probability of a mixed group, exact
            beta-binomial: what maximises this batch's expected signal groups), ``"thompson"`` (one posterior
            draw of ``p`` per task) or ``"upper_quantile"`` (the largest group-signal probability over the
            ``ucb_quantile`` credible interval of ``p``). Default ``"mean"``: exploration is the coverage
            phase's job, and an optimistic rule would rank every unobserved task of a large pool next to the
            tasks whose groups were mixed.
        signal_prior_ess: equivalent sample size of the graph prior, in rollouts (4.0 = ``prior_strength *
            rollouts_per_task`` at the defaults: the graph prior weighs half a group, as in the paper mode).
        caps_on_decline_only: apply ``max_consecutive_selections`` and the exposure discount only to tasks
            whose signal declines (their short-half-life signal rate is below the long-half-life one); a
            task whose groups keep being mixed may be re-picked every batch. The paper applies both always.

    Long runs (ours; both presets):
        history_tolerance: how far the paper preset's estimates may move to keep the history bounded (1e-9).
            Observations more than :attr:`history_horizon` steps older than their task's newest one together
            weigh less than this share of it; they leave the log for per-task decayed statistics, where they
            are clipped as one block. The default keeps a live window of 16-20 steps in the log and absorbs
            everything older, whatever the tolerance above 0 (see :mod:`envsched.method.history.statistics`).
            0 keeps every observation in the log, in either preset (memory and step time then grow with the
            run).
    """

    # in the order to_dict writes them; each field's metadata is its Knob (check, when it is read, tuning range)
    batch_size: int = _knob(64, _Int(1))
    coverage_share: float = _knob(0.5, _UNIT, note="in mode 'full', below 1 - 0.5 / batch_size",
                                  **_tuned(("float", 0.125, 0.5, False), 10))
    rollouts_per_task: int = _knob(8, _Int(1))
    max_per_env_coverage: int = _knob(4, _Int(1))
    env_quota_per_batch: int = _knob(11, _Int(1))
    max_consecutive_selections: int = _knob(2, _Int(1))
    long_half_life: float = _knob(8.0, _POSITIVE)
    short_half_life: float = _knob(
        2.0, _POSITIVE, read_when=lambda c: _informativeness_read(c) or c.caps_on_decline_only,
        reader="the short-half-life score of the informativeness and the decline test of caps_on_decline_only=True "
               "(both presets read it; off only when neither is on)")
    within_fusion_weight: float = _knob(
        0.5, _UNIT, read_when=lambda c: c.use_within_edges and c.use_cross_edges,
        reader="the fusion of the two graph relations (use_within_edges=True and use_cross_edges=True, both presets)")
    within_relation: str = _knob(
        "neighbours", _Choice(WITHIN_RELATIONS), read_when=lambda c: c.use_within_edges,
        reader="the within-environment relation of the graph prior (use_within_edges=True, both presets)")
    prior_strength: float = _knob(0.5, _POSITIVE, **_INFO, **_tuned(("float", 0.25, 4.0, True), 3, _BOTH))
    reconstruction_weight: float = _knob(0.5, _UNIT, **_INFO)
    decline_penalty: float = _knob(0.0, _NON_NEGATIVE, **_INFO, **_tuned(("float", 0.0, 0.5, False), 2, _BOTH))
    similarity_penalty: float = _knob(0.2, _UNIT, **_tuned(("float", 0.0, 0.5, False), 1, _BOTH))
    exposure_power: float = _knob(0.1, _NON_NEGATIVE, **_tuned(("float", 0.0, 0.5, False), 0, _BOTH))
    progress_min_transitions: int = _knob(3, _Int(1))
    progress_residual_threshold: float = _knob(0.0, _Number(-_INF, _INF))
    min_scored_rollouts: int = _knob(2, _Int(1))
    reference_min_fraction: float = _knob(0.5, _UNIT)
    variance_clip: tuple[float, float] = _knob((0.0, 0.25), _Clip(0.25), **_INFO)
    mean_clip: tuple[float, float] = _knob((0.0, 1.0), _Clip(1.0))
    dispersion_clip: tuple[float, float] = _knob((0.0, 1.0), _Clip(1.0), **_INFO)
    cold_start_max_per_env: int = _knob(2, _Int(1))
    cold_start_within_novelty_weight: float = _knob(0.5, _UNIT)
    identifier_min_reward: float = _knob(1.0, _UNIT)
    mode: str = _knob("full", _Choice(SCHEDULER_MODES))
    use_within_edges: bool = _knob(True, _FLAG)
    use_cross_edges: bool = _knob(True, _FLAG)
    unobserved_neighbours: str = _knob(
        "environment", _Choice(UNOBSERVED_NEIGHBOURS), read_when=lambda c: c.use_within_edges or c.use_cross_edges,
        reader="the graph prior's propagation (use_within_edges=True or use_cross_edges=True, both presets)")
    use_progress_filter: bool = _knob(True, _FLAG)
    use_identifier_filter: bool = _knob(True, _FLAG)
    use_calibration: bool = _knob(False, _FLAG, **_INFO)
    explain_max_neighbors: int | None = _knob(None, _OptionalInt(0))
    adaptive_share: bool = _knob(False, _FLAG, **_tuned(("choice", [True, False]), 18))
    yield_half_life: float = _knob(8.0, _POSITIVE, **_SHARE, **_tuned(("float", 2.0, 32.0, True), 12))
    coverage_share_floor: float = _knob(0.0625, _UNIT, **_SHARE, **_tuned(("float", 0.0, 0.5, False), 11))
    adaptive_coverage: bool = _knob(False, _FLAG, **_tuned(("choice", [True, False]), 19))
    ucb_quantile: float = _knob(
        0.9, _Number(0.5, 1.0, high_open=True, high_reason="the 1-quantile of a Beta posterior is 1 for every task"),
        read_when=lambda c: c.adaptive_coverage or (_signal_score(c) and c.exploitation_rule == "upper_quantile"),
        reader="adaptive coverage (adaptive_coverage=True; off in both presets) or "
               "exploitation_rule='upper_quantile' with exploitation_score='signal_probability'",
        **_tuned(("float", 0.6, 0.99, False), 13))
    env_size_power: float = _knob(
        0.5, _Number(0.0, 4.0), read_when=lambda c: c.adaptive_coverage,
        reader="adaptive coverage (adaptive_coverage=True; off in both presets)",
        **_tuned(("float", 0.0, 1.0, False), 14))
    exploitation_score: str = _knob("variance", _Choice(EXPLOITATION_SCORES))
    exploitation_rule: str = _knob(
        "mean", _Choice(EXPLOITATION_RULES), read_when=_signal_score,
        reader="the signal-probability exploitation score (exploitation_score='signal_probability')",
        **_tuned(("choice", list(EXPLOITATION_RULES)), 16))
    signal_prior_ess: float = _knob(
        4.0, _POSITIVE, read_when=lambda c: _signal_score(c) or c.adaptive_coverage,
        reader="the signal posterior (adaptive_coverage=True, off in both presets, or "
               "exploitation_score='signal_probability')",
        **_tuned(("float", 1.0, 16.0, True), 15))
    caps_on_decline_only: bool = _knob(True, _FLAG, **_tuned(("choice", [True, False]), 17))
    history_tolerance: float = _knob(1e-9, _Number(0.0, 0.5))

    @classmethod
    def paper(cls, **overrides: Any) -> SchedulerConfig:
        """The faithful paper preset (:data:`PAPER_PRESET`: every adaptive rule off, the 50/50 split);
        ``overrides`` are other fields (``batch_size``, ``mode``, ablation switches...). A preset value that the
        overrides' switches leave unread is left out (``paper(use_within_edges=False, use_cross_edges=False)``
        reads no substitute of a neighbour without history); an unread value given in ``overrides`` is refused."""
        return cls(**cls.paper_fields(overrides))

    @classmethod
    def paper_fields(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """:data:`PAPER_PRESET` with ``overrides``, less the preset's values that the result leaves unread."""
        d = {**PAPER_PRESET, **overrides}
        unread = cls.unread_fields_of(d)
        return {k: v for k, v in d.items() if k in overrides or k not in unread}

    @property
    def is_paper(self) -> bool:
        """Whether every adaptive rule is off (the paper's rules; the other fields may differ)."""
        return all(getattr(self, k) == PAPER_PRESET[k] for k in PAPER_RULES)

    def unread_fields(self) -> dict[str, str]:
        """Fields that no batch reads under this configuration's switches, each with the mechanism that reads
        it and the switch that turns that mechanism on (each field's :class:`Knob`: ``read_when`` and
        ``reader``). Setting one of them to anything but its default is refused (:class:`UnreadKnobError`): it
        would change nothing, silently."""
        return {name: knob.reader for name, knob in KNOBS.items()
                if knob.read_when is not None and not knob.read_when(self)}

    def __post_init__(self) -> None:
        problems = _Problems("SchedulerConfig")
        for name, knob in KNOBS.items():
            problems.check(self, name, knob.check)
        share_valid = not {"batch_size", "coverage_share", "mode"} & set(problems.names)
        if share_valid and self.mode == "full" and round(self.coverage_share * self.batch_size) >= self.batch_size:
            k = round(self.coverage_share * self.batch_size)
            problems.add("coverage_share", f"coverage_share={self.coverage_share} leaves no exploitation slot in a "
                         f"batch of batch_size={self.batch_size} (round(share * B) = {k}); use a share below "
                         "1 - 0.5 / batch_size, or mode='coverage_only'")
        problems.raise_if_any(self)
        for name in ("variance_clip", "mean_clip", "dispersion_clip"):
            object.__setattr__(self, name, (float(getattr(self, name)[0]), float(getattr(self, name)[1])))
        unread = {name: reader for name, reader in self.unread_fields().items()
                  if getattr(self, name) != _DEFAULTS[name]}
        if unread:
            first = next(iter(unread))
            raise UnreadKnobError(
                "invalid SchedulerConfig: " + "; ".join(
                    f"{name}={getattr(self, name)!r} changes no batch here: it is read only by {reader}; leave it "
                    f"at its default {_DEFAULTS[name]!r}" for name, reader in unread.items()),
                name=first, value=getattr(self, first), unread=unread)

    @property
    def history_horizon(self) -> int | None:
        """``H``, in steps: the smallest horizon whose tail ``sum_{k >= H} 0.5 ** (k / h)`` is at most
        ``history_tolerance`` for the longest half-life the scheduler reads (``long_half_life``,
        ``short_half_life``, and ``yield_half_life`` when ``adaptive_share`` is on); ``None`` when the
        tolerance is 0 (nothing is folded). 268 steps at the defaults."""
        if self.history_tolerance == 0:
            return None
        halves = [self.long_half_life, self.short_half_life] + ([self.yield_half_life] if self.adaptive_share else [])
        h = max(halves)
        return max(1, math.ceil(h * math.log2(1.0 / (self.history_tolerance * (1.0 - 2.0 ** (-1.0 / h))))))

    def coverage_slots_for(self, n: int) -> int:
        """Coverage slots of a batch of ``n`` under the configured share: ``round(coverage_share * n)`` (the
        adaptive share never exceeds it), or all / none in the ``coverage_only`` / ``exploitation_only``
        ablations. Raises ``ValueError`` when the share would leave the batch no exploitation slot."""
        if self.mode == "coverage_only":
            return n
        if self.mode == "exploitation_only":
            return 0
        k = round(self.coverage_share * n)
        if k >= n:
            raise ValueError(f"a batch of n={n} with coverage_share={self.coverage_share} would have "
                             f"{k} coverage slots and no exploitation slot; draw more tasks or lower "
                             "coverage_share")
        return k

    def caps_for(self, n: int) -> tuple[int, int]:
        """``(C1, C3)`` for a batch of ``n``: the configured caps (stated for ``batch_size``) scaled by
        ``n / batch_size``, rounded, at least 1. Unchanged when ``n == batch_size``."""
        if n == self.batch_size:
            return self.max_per_env_coverage, self.env_quota_per_batch
        f = n / self.batch_size
        return max(1, round(self.max_per_env_coverage * f)), max(1, round(self.env_quota_per_batch * f))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (saved in the sampler state and run files)."""
        d = dataclasses.asdict(self)
        for name in ("variance_clip", "mean_clip", "dispersion_clip"):
            d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerConfig:
        """Inverse of :meth:`to_dict` (a missing field takes its default); unknown keys are an error naming them.
        A config stored by an earlier version is read with :func:`envsched.method.migrations.read_config`,
        which gives its fields the meaning they had when it was written."""
        unknown = set(data) - set(_DEFAULTS)
        if unknown:
            former = unknown & FORMER_FIELDS and "coverage_share" not in data
            hint = ("; a config stored by an earlier version is read with "
                    "envsched.method.migrations.read_config") if former else ""
            raise ValueError(f"unknown SchedulerConfig field(s): {sorted(unknown)}{hint}")
        d = dict(data)
        for name in ("variance_clip", "mean_clip", "dispersion_clip"):
            if name in d and isinstance(d[name], list):
                d[name] = tuple(d[name])
        return cls(**d)

    @classmethod
    def unread_fields_of(cls, d: dict[str, Any]) -> dict[str, str]:
        """:meth:`unread_fields` of the configuration ``d`` (missing fields: defaults), without validating it:
        which knobs are unread depends on the switches alone."""
        probe = object.__new__(cls)
        for name, default in _DEFAULTS.items():
            object.__setattr__(probe, name, d.get(name, default))
        return probe.unread_fields()

    @classmethod
    def without_unread(cls, data: dict[str, Any]) -> SchedulerConfig:
        """:meth:`from_dict` after resetting the knobs that ``data``'s switches leave unread to their defaults.

        For callers that set knobs jointly without knowing the switches, such as a tuning draw over the whole
        search space: the values reset here would have changed no batch. Anywhere else, build the config
        directly, so that an unread knob is refused."""
        d = dict(data)
        try:
            return cls.from_dict(d)
        except UnreadKnobError:  # invalid values are refused before unread ones: only the latter are reset
            pass
        return cls.from_dict({**d, **{k: _DEFAULTS[k] for k in cls.unread_fields_of(d) if k in d}})


#: Each :class:`SchedulerConfig` field's :class:`Knob`, in field order: the one declaration of its admissible
#: values, when it is read and its tuning range.
KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in dataclasses.fields(SchedulerConfig)}

#: Field defaults of :class:`SchedulerConfig` (the default preset's values).
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}


def field_defaults() -> dict[str, Any]:
    """Every :class:`SchedulerConfig` field's default (the default preset's values), a new dict."""
    return dict(_DEFAULTS)

#: Fields that earlier versions stored and this one no longer has: the migrations of
#: :mod:`envsched.method.migrations` that remove them say so (``ConfigMigration.removes``; a test compares).
FORMER_FIELDS = frozenset({"coverage_slots"})

#: For each knob that some switch can make unread: the mechanism that reads it and how to turn it on
#: (:meth:`SchedulerConfig.unread_fields`; from each knob's declaration). Every other field is read by both presets.
KNOB_READERS: dict[str, str] = {name: k.reader for name, k in KNOBS.items() if k.read_when is not None}

#: Knobs read only by the calibrated informativeness of the paper's pipeline (fusion with the task's history,
#: the reconstructed variance, the recent-decline term, the calibration, the clips of ``v`` and ``d``). They act
#: with ``exploitation_score="variance"`` (both presets) or ``adaptive_coverage=False`` (the paper preset).
INFORMATIVENESS_FIELDS: tuple[str, ...] = tuple(name for name, k in KNOBS.items()
                                                if k.read_when is _informativeness_read)


def scheduler_tuning_space(config: SchedulerConfig) -> dict[str, tuple[Any, ...]]:
    """The knobs the symmetric tuning protocol searches for ``config``'s preset, in draw order: each knob's
    ``("float", low, high, log)`` or ``("choice", [values])``. The paper preset (:attr:`SchedulerConfig.is_paper`)
    tunes the four knobs the paper leaves open; the default adds its own rules' knobs; a knob that ``config``'s
    switches leave unread is left out (it would change no batch)."""
    preset = "paper" if config.is_paper else "default"
    unread = config.unread_fields()
    knobs = sorted((k.tuning_order, name) for name, k in KNOBS.items()
                   if k.tuning is not None and preset in k.tuned_in and name not in unread)
    return {name: _copy_spec(KNOBS[name].tuning) for _, name in knobs}


def _copy_spec(spec: Any) -> tuple[Any, ...]:
    return (spec[0], list(spec[1])) if spec[0] == "choice" else tuple(spec)


#: Search ranges of the adaptive mode's own knobs (``(low, high)`` for a number, a list for a choice), from their
#: declarations. The defaults (:class:`SchedulerConfig`) are set from first principles, not tuned; see
#: docs/envsched-sampler.md ("Adaptive mode").
ADAPTIVE_TUNING_SPACE: dict[str, tuple[float, float] | list[Any]] = {
    name: (list(k.tuning[1]) if k.tuning[0] == "choice" else (k.tuning[1], k.tuning[2]))
    for _, name, k in sorted((k.tuning_order, name, k) for name, k in KNOBS.items()
                             if k.tuning is not None and k.tuned_in == _DEFAULT_ONLY)
}


def _cell(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(f"{x:g}" for x in value) + ")"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def knob_table() -> str:
    """Every :class:`SchedulerConfig` knob as a Markdown table generated from the declarations: default, the
    paper preset's value, admissible values, when it is read, and its tuning range per preset. The table in
    docs/envsched-sampler.md is this text (a test compares them)."""
    paper = SchedulerConfig.paper()
    spaces = {"default": scheduler_tuning_space(SchedulerConfig()), "paper": scheduler_tuning_space(paper)}
    rows = ["| knob | default | paper preset | values | read | tuned (default / paper preset) |",
            "|---|---|---|---|---|---|"]
    for name, k in KNOBS.items():
        tuned = []
        for preset in ("default", "paper"):
            spec = spaces[preset].get(name)
            if spec is None:
                tuned.append("-")
            elif spec[0] == "choice":
                tuned.append(", ".join(map(str, spec[1])))
            else:
                tuned.append(f"{spec[1]:g}-{spec[2]:g}{' (log)' if spec[3] else ''}")
        read = "always" if k.read_when is None else f"by {k.reader}"
        values = k.check.describe() + (f"; {k.note}" if k.note else "")
        rows.append(f"| `{name}` | {_cell(_DEFAULTS[name])} | {_cell(getattr(paper, name))} | {values} "
                    f"| {read} | {tuned[0]} / {tuned[1]} |")
    return "\n".join(rows) + "\n"
