"""Trainer integrations (import the submodule you need; each pulls its trainer's dependencies).

- :mod:`envsched.integrations.trl`: ``EnvSchedGRPOTrainer`` / ``EnvSchedGRPOMixin`` for TRL's ``GRPOTrainer``
  (extra ``trl``).
- :mod:`envsched.integrations.prime_rl`: ``PrimeRLTaskSampler``, prime-rl's curriculum ``TaskSampler`` shape over
  verifiers tasks (extra ``prime-rl``).
- :mod:`envsched.integrations.verl`: ``EnvSchedVerlSampler``, verl's ``train_sampler`` with ``update(batch)``
  (extra ``verl``).

See ``docs/trainers.md``.
"""
