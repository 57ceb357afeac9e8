"""The TRL release envsched's TRL integrations are written for, and the one check that TRL's private code they
hook into is still what they were written for.

Each integration states what it relies on -- the private members it overrides, calls or reads (with the parameter
names of the methods) and the source fragments that place its hooks (a call it wraps, a rule it mirrors) -- and
passes that to :func:`check_hooks` at construction: :mod:`envsched.integrations.trl` for ``GRPOTrainer``,
:mod:`envsched.integrations.trl_async` for ``AsyncGRPOTrainer`` and its rollout worker,
:mod:`envsched.integrations.openenv_harness` for TRL's OpenEnv harness. A TRL that differs is refused up front
with one ``RuntimeError`` listing every difference and naming the installed and the supported versions, instead
of failing mid-training or, worse, training with a hook that no longer runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import transformers
import trl

__all__ = ["SUPPORTED_VERSIONS", "Fragment", "Signatures", "check_hooks", "hook_problem"]

#: The TRL / transformers releases the TRL integrations are tested against (CI pins them).
SUPPORTED_VERSIONS = {"trl": "1.16.0", "transformers": "5.24.0"}

#: class -> {member name: the parameter names (after ``self``) the method must take, or ``None`` when only the
#: member's presence is relied on (an attribute)}.
Signatures = Mapping[type, Mapping[str, tuple[str, ...] | None]]
#: ``(class, method, text, why)``: the method's source must contain ``text``; ``why`` says what depends on it.
Fragment = tuple[type, str, str, str]


def hook_problem(label: str, member: Any, params: tuple[str, ...] | None) -> str | None:
    """What is wrong with a private TRL member ``member`` named ``label``: missing, without an inspectable
    signature, or with parameters (``self`` aside) other than ``params``; ``None`` when it is as expected
    (``params=None``: only its presence is checked)."""
    if params is None:
        return f"{label} is missing" if member is None else None
    if not callable(member):
        return f"{label} is missing"
    try:
        got = tuple(p for p in inspect.signature(member).parameters if p != "self")
    except (TypeError, ValueError):
        return f"{label} has no inspectable signature"
    return None if got == params else f"{label}{got} (expected {params})"


def _fragment_problem(cls: type, method: str, text: str, why: str) -> str | None:
    try:
        found = text in inspect.getsource(getattr(cls, method))
    except (AttributeError, OSError, TypeError):  # no such method, or no source to read
        found = False
    return None if found else f"{cls.__name__}.{method} no longer contains {text!r} ({why})"


def check_hooks(integration: str, signatures: Signatures, fragments: Iterable[Fragment] = (), *,
                subject: str = "") -> None:
    """Refuse a TRL whose private code differs from what ``integration`` relies on.

    Args:
        integration: the module that relies on it, named in the error.
        signatures: the members it relies on (see :data:`Signatures`); looked up with ``getattr``, so a member a
            class inherits counts, and named ``Class.member`` in the error.
        fragments: the source fragments it relies on (see :data:`Fragment`).
        subject: what of TRL it hooks into, said after TRL's version (``"'s OpenEnv harness"``).

    Raises:
        RuntimeError: ``"<integration> supports TRL 1.16.0<subject> with transformers 5.24.0; installed: TRL ...,
            transformers ..., where: <every difference, '; '-separated>. Install trl==... transformers==..."``.
    """
    problems = [p for cls, members in signatures.items() for name, params in members.items()
                if (p := hook_problem(f"{cls.__name__}.{name}", getattr(cls, name, None), params)) is not None]
    problems += [p for fragment in fragments if (p := _fragment_problem(*fragment)) is not None]
    if problems:
        trl_v, tf_v = SUPPORTED_VERSIONS["trl"], SUPPORTED_VERSIONS["transformers"]
        raise RuntimeError(
            f"{integration} supports TRL {trl_v}{subject} with transformers {tf_v}; installed: TRL "
            f"{trl.__version__}, transformers {transformers.__version__}, where: " + "; ".join(problems)
            + f". Install trl=={trl_v} transformers=={tf_v}.")
