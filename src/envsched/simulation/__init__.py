"""A scheduling loop without a trainer: a seeded simulation of a policy's rollouts
(:class:`~envsched.simulation.rewards.StochasticRewardSource`) and the loop that drives a sampler with it
(:func:`~envsched.simulation.loop.run_schedule`), which ``envsched run`` uses. Not a benchmark: the benchmark
lab (``envsched_lab``, ``envsched bench``) is apart from the library."""
