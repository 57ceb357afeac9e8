"""The neural benchmark learner: a small character-level transformer trained by GRPO on CPU.

``model`` holds the tokenizer and the network, ``grpo`` the sampling, the clipped policy-gradient update and
the supervised warm-up, ``learner`` the :class:`NeuralLearner` the benchmark runner calls
(``envsched bench --learner neural``; docs/benchmark.md, "The neural learner")."""

from envsched_lab.neural.learner import NeuralConfig, NeuralLearner

__all__ = ["NeuralConfig", "NeuralLearner"]
