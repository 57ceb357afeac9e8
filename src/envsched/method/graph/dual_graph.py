"""The dual-relation graph over environment-task pairs (EnvSched, section 2.2 and appendix B).

This module holds the graph as data: :class:`DualRelationGraph`. How it is built (static features,
abstraction, nearest neighbours, adaptive bandwidths) lives in the sibling modules; the scheduler only
reads this container.

Each node is one task of a :class:`~envsched.pool.TaskPool`, in pool order. Two neighbour relations:

* **within** -- the ``K_within`` nearest tasks in the *same* environment under ``S_full`` (concrete features);
* **cross** -- the ``K_cross`` nearest tasks in *other* environments under ``S_abs`` (abstract features).

Neighbour lists are fixed-width arrays padded with ``-1`` (index) and ``0`` (weight, similarity). Weights
of a row sum to 1 over its valid entries (all 0 when the row has none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["DualRelationGraph"]


@dataclass
class DualRelationGraph:
    """Neighbour lists of both relations, plus the features they came from.

    Attributes:
        task_ids: task ids in pool order (node ``i`` is ``task_ids[i]``).
        envs: environment names; ``env_codes[i]`` indexes it.
        env_codes: ``int32 (N,)`` environment of each node.
        within_index, within_weight, within_similarity: ``(N, K_within)`` same-environment neighbours.
        cross_index, cross_weight, cross_similarity: ``(N, K_cross)`` other-environment neighbours.
        full_features: ``csr (N, D_full)`` L2-normalised concrete features (``S_full`` is their dot product).
        abstract_features: ``csr (N, D_abs)`` L2-normalised abstract features (``S_abs``).
        pool_fingerprint: :meth:`TaskPool.fingerprint` of the pool the graph was built from.
        config: the parameters used to build it.
        report: build diagnostics (missing fields, timings, neighbour search method, recall...).
        within_bandwidth, cross_bandwidth: ``float32 (N,)`` adaptive per-node bandwidths (or ``None``).
        feature_space: the fitted :class:`~envsched.method.graph.features.FeatureSpace` (vocabularies, IDF), so
            new tasks can be added (:func:`~envsched.method.graph.build.extend_graph`) and shared
            features named (:meth:`shared_features`); ``None`` when unknown.
    """

    task_ids: list[str]
    envs: list[str]
    env_codes: np.ndarray
    within_index: np.ndarray
    within_weight: np.ndarray
    within_similarity: np.ndarray
    cross_index: np.ndarray
    cross_weight: np.ndarray
    cross_similarity: np.ndarray
    full_features: sp.csr_matrix
    abstract_features: sp.csr_matrix
    pool_fingerprint: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    within_bandwidth: np.ndarray | None = None
    cross_bandwidth: np.ndarray | None = None
    feature_space: Any = None

    @property
    def num_nodes(self) -> int:
        return len(self.task_ids)

    def neighbors(self, node: int, relation: str) -> tuple[np.ndarray, np.ndarray]:
        """Valid neighbour indices and weights of ``node`` in ``relation`` (``"within"`` or ``"cross"``)."""
        if relation == "within":
            idx, w = self.within_index[node], self.within_weight[node]
        elif relation == "cross":
            idx, w = self.cross_index[node], self.cross_weight[node]
        else:
            raise ValueError(f"relation must be 'within' or 'cross', got {relation!r}")
        valid = idx >= 0
        return idx[valid], w[valid]

    def pair_similarity(self, node: int, others: np.ndarray) -> np.ndarray:
        """Similarity of ``node`` to each of ``others``: ``S_full`` within an environment, ``S_abs`` across.

        Used by the scheduler's batch-similarity penalty.
        """
        others = np.asarray(others, dtype=np.int64)
        if others.size == 0:
            return np.zeros(0)
        full = np.asarray((self.full_features[others] @ self.full_features[node].T).todense()).ravel()
        abstract = np.asarray((self.abstract_features[others] @ self.abstract_features[node].T).todense()).ravel()
        same_env = self.env_codes[others] == self.env_codes[node]
        return np.where(same_env, full, abstract)

    def shared_features(self, node: int, other: int, relation: str, top: int = 8) -> list[tuple[str, float]]:
        """The features ``node`` and ``other`` share, by contribution to their similarity (largest first).

        ``relation`` picks the matrix: ``"within"`` (concrete, ``S_full``) or ``"cross"`` (abstract,
        ``S_abs``). Names are ``view:term`` when the feature space is known, else ``column:<j>``.
        """
        if relation not in ("within", "cross"):
            raise ValueError(f"relation must be 'within' or 'cross', got {relation!r}")
        mat = self.full_features if relation == "within" else self.abstract_features
        prod = mat[node].multiply(mat[other]).tocoo()
        order = np.argsort(-prod.data, kind="stable")[:top]
        names = None
        if self.feature_space is not None:
            names = self.feature_space.column_names("full" if relation == "within" else "abstract")
        return [(names[c] if names is not None else f"column:{c}", float(v))
                for c, v in zip(prod.col[order], prod.data[order], strict=True)]

