"""Accuracies of variants that answered the same examples: every interval from one paired bootstrap.

A variant is the full model or a pruned (and healed) one; every variant answered the same
examples of the same tasks, so one paired bootstrap over examples
(``zones.measure.bootstrap.paired_bootstrap``, the project's one) gives every interval at once:
each strategy's accuracy (a seeded strategy's median over seeds, inside every resample too), its
difference from the full model, and the difference of every two strategies, with the exact
McNemar test (``zones.analysis.paired``) beside each difference of two variants that ran once.

* :func:`accuracy_intervals`: those three tables;
* :func:`power_rate`, :func:`power_table`: the discordance the rule's power is computed at, and
  that power at other numbers of examples (``zones.analysis.paired.mcnemar_power``).
"""
from __future__ import annotations

from itertools import combinations
from typing import Sequence

import numpy as np
import pandas as pd

from zones.analysis.paired import mcnemar_exact, mcnemar_power
from zones.measure.bootstrap import paired_bootstrap

FULL = "full"                    # the unpruned model's row in every table
ALL = "all"                      # every example of the tasks, pooled
ACCURACY_COLUMNS = ["strategy", "task", "accuracy", "accuracy_low", "accuracy_high", "n", "n_seeds"]
DIFFERENCE_COLUMNS = ["strategy", "reference", "task", "difference", "difference_low", "difference_high", "n", "b",
                      "c", "p_exact"]


def accuracy_intervals(examples: pd.DataFrame, arms: pd.DataFrame, tasks: Sequence[str], *,
                       metric: str = "acc", **bootstrap) -> dict[str, pd.DataFrame]:
    """Every interval of the variants from one paired bootstrap over examples.

    ``examples``: ``removed, task, example, <metric>`` (``removed`` ``""`` for the full model, else
    the removal set); ``arms``: ``strategy, seed, k, removed`` (each ``removed`` written as in
    ``examples``: ``zones.pruning.canonical_removed``). Units are the
    (task, example) pairs every variant answered. Returns

    * ``accuracy``: :data:`ACCURACY_COLUMNS`, one row per strategy (and :data:`FULL`) and task (and
      :data:`ALL`, every example pooled); a seeded strategy's accuracy is the median over seeds;
    * ``versus_full``: :data:`DIFFERENCE_COLUMNS`, accuracy(strategy) − accuracy(full);
    * ``between``: :data:`DIFFERENCE_COLUMNS`, accuracy(strategy) − accuracy(reference) for every
      two strategies (in ``arms`` order: the earlier one is ``strategy``).

    In both difference tables ``b``, ``c`` and ``p_exact`` are the exact McNemar test of the
    pair (:func:`zones.analysis.paired.mcnemar_exact`: ``b`` examples only ``strategy`` answers
    right, ``c`` only ``reference``); NaN where either side is the median over several seeds.
    """
    wide = examples.pivot_table(index="removed", columns=["task", "example"], values=metric, aggfunc="first")
    wide = wide.dropna(axis=1)
    sets = {s: i for i, s in enumerate(wide.index)}
    task_of = np.array([t for t, _ in wide.columns])
    scopes = [ALL, *[t for t in tasks if t in set(task_of)]]
    masks = np.vstack([np.ones(len(task_of))] + [(task_of == t).astype(float) for t in scopes[1:]])
    strategies = [FULL, *dict.fromkeys(arms["strategy"])]
    groups = [[sets[""]]] + [[sets[r] for r in arms.loc[arms["strategy"] == s, "removed"]]
                             for s in strategies[1:]]
    versus = [(i, 0) for i in range(1, len(strategies))]
    between = list(combinations(range(1, len(strategies)), 2))
    n_variants = len(wide)

    def statistic(data):
        x, m = data[:n_variants], data[n_variants:]                 # (variants, [resamples,] units)
        acc = np.stack([(x * mask).sum(-1) / mask.sum(-1) for mask in m], axis=1)  # (variants, scopes, ...)
        per = np.stack([np.median(acc[g], axis=0) for g in groups])  # (strategies, scopes, ...)
        diffs = [per[a] - per[b] for a, b in versus + between]
        return np.concatenate([per.reshape(-1, *per.shape[2:]), np.stack(diffs).reshape(-1, *per.shape[2:])])

    data = np.vstack([wide.to_numpy(dtype=np.float64), masks])
    interval = paired_bootstrap(statistic, (data,), **bootstrap)
    est, low, high = interval.estimate, interval.low, interval.high
    n_scope = {scope: int(mask.sum()) for scope, mask in zip(scopes, masks)}
    accuracy = [dict(strategy=s, task=scope, accuracy=est[i * len(scopes) + j], accuracy_low=low[i * len(scopes) + j],
                     accuracy_high=high[i * len(scopes) + j], n=n_scope[scope], n_seeds=len(groups[i]))
                for i, s in enumerate(strategies) for j, scope in enumerate(scopes)]
    offset = len(strategies) * len(scopes)
    answers = wide.to_numpy(dtype=np.float64)
    rows = {"versus_full": [], "between": []}
    for p, (a, b) in enumerate(versus + between):
        for j, scope in enumerate(scopes):
            i = offset + p * len(scopes) + j
            exact = dict(b=np.nan, c=np.nan, p_exact=np.nan)
            if len(groups[a]) == 1 and len(groups[b]) == 1:
                shown = masks[j] > 0
                test = mcnemar_exact(answers[groups[a][0], shown], answers[groups[b][0], shown])
                exact = dict(b=test.b, c=test.c, p_exact=test.p_exact)
            rows["versus_full" if p < len(versus) else "between"].append(dict(
                strategy=strategies[a], reference=strategies[b], task=scope, difference=est[i],
                difference_low=low[i], difference_high=high[i], n=n_scope[scope], **exact))
    return dict(accuracy=pd.DataFrame(accuracy, columns=ACCURACY_COLUMNS),
                versus_full=pd.DataFrame(rows["versus_full"], columns=DIFFERENCE_COLUMNS),
                between=pd.DataFrame(rows["between"], columns=DIFFERENCE_COLUMNS))


def power_rate(b: float, c: float, n: int, effect: float) -> float:
    """The discordance rate the chapter's power is computed at: the observed (b + c) / n, or
    ``effect`` where fewer examples were discordant (a true difference of ``effect`` needs at
    least that share of discordant examples)."""
    return max((b + c) / n, effect)


def power_table(discordance: float, sizes: Sequence[int], effect: float) -> pd.DataFrame:
    """``n_examples, power``: the probability that the rule "d > 0 and exact McNemar p < 0.05"
    (``zones.report.verdicts.score_task_accuracy``) says holds at each number of examples in ``sizes`` (sorted, each once), for a true difference of
    ``effect`` at ``discordance`` (``zones.analysis.paired.mcnemar_power``)."""
    sizes = sorted({int(n) for n in sizes})
    return pd.DataFrame(dict(n_examples=sizes, power=[mcnemar_power(effect, discordance, n) for n in sizes]))
