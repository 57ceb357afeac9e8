"""EnvSched, the paper's scheduler, in its three stages.

``sampler.py`` (:class:`EnvSchedSampler`) and ``config.py`` (:class:`SchedulerConfig`, :class:`GraphConfig`, and
the table mapping the paper's numbered symbols to named parameters) sit on top; below them:

1. ``graph/``: features and the dual-relation graph;
2. ``history/``: rollout history and the propagated prediction of within-task reward variance;
3. ``scheduling/``: the batch split between coverage and exploitation, caps, penalties and filters.

``explain.py`` turns a batch's picks into explanation records.
"""
