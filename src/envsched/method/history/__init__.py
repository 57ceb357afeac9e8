"""Stage 2 of EnvSched, history and prediction: what the rollouts so far say about each task.

- ``statistics``: dispatch and observation logs, per-group statistics, half-life-weighted task histories;
- ``prediction``: propagation over both relations, fusion, variance reconstruction, ranks and quantiles.
"""

from envsched.method.history.prediction import Prediction, predict, relation_operators
from envsched.method.history.statistics import History, TaskHistory

__all__ = ["History", "Prediction", "TaskHistory", "predict", "relation_operators"]
