"""Readers of what earlier versions of EnvSched stored: one numbered migration per change of a stored format.

A sampler state and a run file carry the :class:`~envsched.method.config.SchedulerConfig` they ran
(``SchedulerConfig.to_dict``). When a field is added or a default changes, a config stored before means what that
version ran, not what the new defaults say; :meth:`SchedulerConfig.from_dict` reads the current format only, and
:func:`read_config` is the reader of every stored config: it applies, in order, each migration of
:data:`CONFIG_MIGRATIONS` whose test recognises the format it converts (stored configs carry no version number, so
each migration recognises its format by the fields it lacks), then ``from_dict``. A migration never touches a
value someone set: it fills in what the stored format could not say, and resets only former defaults that the
stored switches leave unread.

The saved rollout history converts its own earlier forms where it is loaded
(:meth:`envsched.method.history.statistics.History.from_state`: logs without the reference columns or the
folding fields of the bounded history, and the exact logs read into the decayed form), since those conversions
need the history's own computations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envsched.method.config import FORMER_PIPELINE_DEFAULTS, SchedulerConfig, field_defaults

__all__ = ["CONFIG_MIGRATIONS", "ConfigMigration", "migrate_config", "read_config"]

_DEFAULTS: dict[str, Any] = field_defaults()


@dataclass(frozen=True)
class ConfigMigration:
    """One change of the stored config format.

    Attributes:
        version: the format it produces (the formats are numbered in the order the changes were made).
        change: what changed, in a sentence.
        applies: whether a stored config dict is of the format before the change.
        apply: the stored dict in the format after it (a new dict; the argument is never modified).
        removes: the fields of the earlier format that the current one no longer has
            (:data:`envsched.method.config.FORMER_FIELDS` lists them all).
    """

    version: int
    change: str
    applies: Callable[[dict[str, Any]], bool]
    apply: Callable[[dict[str, Any]], dict[str, Any]]
    removes: tuple[str, ...] = ()


def _coverage_share(d: dict[str, Any]) -> dict[str, Any]:
    try:
        out = SchedulerConfig.paper_fields({k: v for k, v in d.items() if k != "coverage_slots"})
        out["coverage_share"] = int(d["coverage_slots"]) / int(d.get("batch_size", _DEFAULTS["batch_size"]))
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"coverage_slots of an old SchedulerConfig: {exc}") from None
    return out


def _unobserved_neighbours_read(d: dict[str, Any]) -> bool:
    return bool(d.get("use_within_edges", True) or d.get("use_cross_edges", True))


def _former_defaults_reset(d: dict[str, Any]) -> dict[str, Any]:
    former = [k for k, v in FORMER_PIPELINE_DEFAULTS.items() if d.get(k) == v]
    unread = SchedulerConfig.unread_fields_of(d) if former else {}
    return {**d, **{k: _DEFAULTS[k] for k in former if k in unread}}


#: Every change of the stored config format, oldest first.
CONFIG_MIGRATIONS: tuple[ConfigMigration, ...] = (
    ConfigMigration(
        2, "the coverage phase's fixed slot count (coverage_slots) became a share of the batch (coverage_share); "
           "a config of the slot count ran the paper's rules, and its share is coverage_slots / batch_size",
        lambda d: "coverage_slots" in d and "coverage_share" not in d, _coverage_share, removes=("coverage_slots",)),
    ConfigMigration(
        3, "the calibration got a switch (use_calibration); every config stored before it ran the calibration",
        lambda d: "use_within_edges" in d and "use_calibration" not in d,
        lambda d: {**d, "use_calibration": True}),
    ConfigMigration(
        4, "unobserved_neighbours was added; before it a neighbour without history counted with the global "
           "reference (where a relation is on: with both off it is unread, and keeps its default)",
        lambda d: "use_within_edges" in d and "unobserved_neighbours" not in d and _unobserved_neighbours_read(d),
        lambda d: {**d, "unobserved_neighbours": "reference"}),
    ConfigMigration(
        5, "the default left the calibration, the decline term and the reference substitute "
           "(FORMER_PIPELINE_DEFAULTS); a config of an earlier default stored them whether or not its switches "
           "read them: those it leaves unread, still at their former default, take today's default (they changed "
           "no batch then and change none now; stored, they would be refused as unread knobs)",
        lambda d: any(d.get(k) == v for k, v in FORMER_PIPELINE_DEFAULTS.items()), _former_defaults_reset),
)


def migrate_config(data: dict[str, Any]) -> dict[str, Any]:
    """``data``, a stored :meth:`SchedulerConfig.to_dict`, in the current format (:data:`CONFIG_MIGRATIONS`
    applied in order where they apply). ``data`` itself is not modified."""
    d = dict(data)
    for migration in CONFIG_MIGRATIONS:
        if migration.applies(d):
            d = migration.apply(d)
    return d


def read_config(data: dict[str, Any]) -> SchedulerConfig:
    """The :class:`SchedulerConfig` a stored config dict of any version ran: :func:`migrate_config`, then
    :meth:`SchedulerConfig.from_dict` (which refuses unknown fields, invalid values and unread knobs by name)."""
    return SchedulerConfig.from_dict(migrate_config(data))
