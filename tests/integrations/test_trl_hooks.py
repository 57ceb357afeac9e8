"""The one check of TRL's private code (``envsched.integrations._trl_hooks.check_hooks``) and the three
integrations that state what they rely on through it: ``trl`` (``GRPOTrainer``), ``trl_async``
(``AsyncGRPOTrainer`` and its rollout worker) and ``openenv_harness`` (TRL's OpenEnv harness)."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

pytest.importorskip("trl")
import transformers
import trl

from envsched.integrations._trl_hooks import SUPPORTED_VERSIONS, check_hooks


class Base:
    shared = 1

    def inherited(self, a, b):
        """A method a subclass inherits."""
        return a + b


class Hooked(Base):
    def hook(self, x, y=0):
        return self.inherited(x, y) + 1  # the call a fragment points at

    def other(self, z):
        return z


def test_what_is_as_relied_on_passes():
    check_hooks("pkg.integration", {Hooked: {"hook": ("x", "y"), "inherited": ("a", "b"), "shared": None}},
                [(Hooked, "hook", "self.inherited(x, y)", "the call"), (Hooked, "inherited", "return a + b", "sum")])


def test_every_difference_is_named_in_one_error_with_the_versions():
    with pytest.raises(RuntimeError) as info:
        check_hooks("pkg.integration",
                    {Hooked: {"hook": ("x",), "gone": ("a",), "attribute": None, "shared": ("v",), "other": ("z",)},
                     Base: {"inherited": ("a", "b")}},
                    [(Hooked, "hook", "self.inherited(y, x)", "the argument order"),
                     (Hooked, "missing", "anything", "a method that is gone"),
                     (Hooked, "shared", "1", "an attribute has no source")],
                    subject="'s harness")
    trl_v, tf_v = SUPPORTED_VERSIONS["trl"], SUPPORTED_VERSIONS["transformers"]
    assert str(info.value) == (
        f"pkg.integration supports TRL {trl_v}'s harness with transformers {tf_v}; installed: TRL {trl.__version__}, "
        f"transformers {transformers.__version__}, where: "
        "Hooked.hook('x', 'y') (expected ('x',)); "
        "Hooked.gone is missing; "
        "Hooked.attribute is missing; "
        "Hooked.shared is missing; "  # an attribute where a method is relied on
        "Hooked.hook no longer contains 'self.inherited(y, x)' (the argument order); "
        "Hooked.missing no longer contains 'anything' (a method that is gone); "
        "Hooked.shared no longer contains '1' (an attribute has no source). "
        f"Install trl=={trl_v} transformers=={tf_v}.")


def test_a_signature_that_cannot_be_read_is_a_difference():
    class Builtin:
        hook = staticmethod(min)  # a builtin without a signature Python can read

    with pytest.raises(RuntimeError, match=re.escape("where: Builtin.hook has no inspectable signature. Install")):
        check_hooks("pkg.integration", {Builtin: {"hook": ("x",)}})


def test_grpo_trainer_hooks():
    from trl import GRPOTrainer

    from envsched.integrations.trl import check_trl_hooks

    check_trl_hooks(GRPOTrainer)  # the installed (pinned) TRL passes

    class ChangedTRL(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions):  # a future TRL dropping an argument
            raise AssertionError("never reached")

        def _generate_and_score_completions(self, inputs):  # ... and no longer calling it there
            raise AssertionError("never reached")

    with pytest.raises(RuntimeError) as info:
        check_trl_hooks(ChangedTRL)
    message = str(info.value)
    assert message.startswith(f"envsched.integrations.trl supports TRL {SUPPORTED_VERSIONS['trl']} with transformers "
                              f"{SUPPORTED_VERSIONS['transformers']}; installed:")
    assert "ChangedTRL._calculate_rewards('inputs', 'prompts', 'completions') (expected ('inputs', 'prompts', " \
           "'completions', 'completion_ids_list'))" in message
    assert "ChangedTRL._generate_and_score_completions no longer contains 'self._calculate_rewards(' (where the " \
           "feedback hook runs)" in message
    assert "_get_train_sampler" not in message  # only what differs


def test_async_trainer_hooks_include_what_rebuilding_the_worker_relies_on(monkeypatch):
    pytest.importorskip("aiohttp")
    from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    from envsched.integrations.trl_async import check_async_trl_hooks

    check_async_trl_hooks()

    def init(self, *, queue_maxsize=0, **loop_kwargs):  # a TRL whose worker keeps its arguments elsewhere
        self.loop_kwargs = loop_kwargs

    monkeypatch.setattr(AsyncRolloutWorker, "__init__", init)
    monkeypatch.setattr(AsyncGRPOTrainer, "__init__", lambda self, *a, **k: None)
    with pytest.raises(RuntimeError) as info:
        check_async_trl_hooks()
    message = str(info.value)
    assert message.startswith(f"envsched.integrations.trl_async supports TRL {SUPPORTED_VERSIONS['trl']} with "
                              "transformers")
    assert "AsyncRolloutWorker.__init__('queue_maxsize', 'loop_kwargs') (expected ('queue_maxsize', " \
           "'child_ready_timeout', 'loop_kwargs'))" in message
    assert "AsyncRolloutWorker.__init__ no longer contains 'self._loop_kwargs = loop_kwargs'" in message
    assert "AsyncGRPOTrainer.__init__ no longer contains 'self.rollout_worker = AsyncRolloutWorker('" in message


def test_harness_hooks(monkeypatch):
    pytest.importorskip("aiohttp")
    pytest.importorskip("openenv.core.harness")
    from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop

    from envsched.integrations.openenv_harness import check_harness_hooks

    check_harness_hooks()

    async def generate_one(self, prompt, tool_dict, tools):  # a TRL that no longer passes the group id
        return None

    monkeypatch.setattr(_HarnessRolloutLoop, "_generate_one", generate_one)
    with pytest.raises(RuntimeError) as info:
        check_harness_hooks()
    message = str(info.value)
    assert message.startswith(f"envsched.integrations.openenv_harness supports TRL {SUPPORTED_VERSIONS['trl']}'s "
                              "OpenEnv harness with transformers")
    assert "_HarnessRolloutLoop._generate_one('prompt', 'tool_dict', 'tools') (expected ('prompt', 'tool_dict', " \
           "'tools', 'group_id'))" in message
    assert "_HarnessRolloutLoop._generate_one no longer contains 'self._run_session, prompt, group_id'" in message
