"""envsched's benchmark lab: the learners, task families, splits, protocol, statistics, tuning, matrix,
negative controls and EnvSched's ablation variants behind ``envsched bench``.

It is apart from the library: ``import envsched`` never imports it (nor torch), and the library's sampler
registry lists only samplers a user would choose. Install its dependencies with the ``lab`` extra
(``python -m pip install 'envsched[lab]'``). The scripts under ``benchmarks/`` and the committed runs under
``results/`` belong to the lab too.
"""
