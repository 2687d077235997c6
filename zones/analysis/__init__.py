"""Statistics over measured tables: importance against α, other predictors, the lifecycle of spectra.

* ``importance``: Spearman ρ of ΔLoss against α, with a bootstrap interval and permutation p;
* ``predictors``: is α special? ρ for every registered predictor (``register_predictor``): every spectral
  column and simple baselines;
* ``lifecycle``: the compression wave and Δα against depth, from spectral snapshots.
* ``paired``: two variants answering the same examples: the exact McNemar test and its power.
"""
