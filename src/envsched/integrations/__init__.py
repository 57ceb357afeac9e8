"""Trainer integrations (import the submodule you need; each pulls its trainer's dependencies).

- :mod:`envsched.integrations.trl`: ``EnvSchedGRPOTrainer`` / ``EnvSchedGRPOMixin`` for TRL's ``GRPOTrainer``
  (extra ``trl``).
- :mod:`envsched.integrations.trl_async`: ``EnvSchedAsyncGRPOTrainer`` for TRL's asynchronous ``AsyncGRPOTrainer``
  (extra ``trl``; CPU stand-in server in :mod:`envsched.integrations.standin`).
- :mod:`envsched.integrations.prime_rl`: ``PrimeRLTaskSampler``, prime-rl's curriculum ``TaskSampler`` shape over
  verifiers tasks, and ``orchestrator_main``, a custom orchestrator entrypoint that installs it (extra
  ``prime-rl``).
- :mod:`envsched.integrations.verl`: verl 0.9.1's v1 trainer: ``EnvSchedPPOTrainer`` and ``envsched_task_runner``
  for a Python entrypoint, ``EnvSchedReplayBuffer`` for verl's command line; the legacy v0
  ``EnvSchedRayPPOTrainer`` (extra ``verl``).

Every integration accepts rewards of any scale (:class:`envsched.integrations._rewards.RewardScale`).

See ``docs/trainers.md``.
"""
