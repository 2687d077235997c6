"""Depth pruning: which k decoder blocks to remove, and what removing them costs.

* ``zones.pruning.strategies``: the strategies and their registry (``register_strategy``,
  ``PruningContext``, the 1-D zone segmentation);
* ``zones.pruning.sweep``: ``pruning_sweep`` plans every strategy and scores every distinct
  removal set on the same eval windows (prefix-shared, journaled);
* ``zones.pruning.compare``: the readings with paired intervals (``summarize_pruning``,
  ``pairwise_differences``, ``best_sets``, ``compare_strategies``, ``pair_at_k`` (two strategies
  from their sweep to those numbers), and the stacked tables the chapters read:
  ``reference_comparisons``, ``worst_best_gaps``, ``healing_intervals``);
* ``zones.pruning.sublayer_pruning``: the sublayer strategies (registered in the same registry, kind
  ``sublayer``), their plans at equal parameters and their scores.

The public names of the first three are importable from ``zones.pruning``; importing it
registers every strategy, block and sublayer.
"""
from __future__ import annotations

from zones.pruning import sublayer_pruning  # noqa: E402,F401  registers the sublayer strategies
from zones.pruning.compare import (
                      COLLAPSE_RATIO,
                      best_by_k,
                      best_sets,
                      compare_strategies,
                      crossover_k,
                      pair_at_k,
                      pairwise_differences,
                      read_crossover,
                      summarize_pruning,
)
from zones.pruning.strategies import (
                      BLOCK,
                      KINDS,
                      MIN_REMAINING,
                      STRATEGIES,
                      PruningContext,
                      Strategy,
                      StrategyError,
                      alpha_zones,
                      available_strategies,
                      bic_segment_count,
                      check_plans,
                      get_strategy,
                      greedy_order,
                      prefixes,
                      register_strategy,
                      segment_profile,
                      segmentation_cost,
                      strategy_names,
                      zone_aware_order,
)
from zones.pruning.sweep import (
                      COLUMNS,
                      DEFAULT_CALIBRATION_TOKENS,
                      DEFAULT_DTYPE,
                      DEFAULT_EVAL_TOKENS,
                      DEFAULT_SEEDS,
                      DEFAULT_STRATEGIES,
                      RECIPE_ABLATIONS,
                      WINDOW_COLUMNS,
                      PruningResult,
                      canonical_removed,
                      check_strategy_names,
                      format_removed,
                      parse_removed,
                      plan_arms,
                      plan_strategies,
                      pruning_sweep,
                      pruning_table,
)

__all__ = [
    "COLLAPSE_RATIO", "best_by_k", "best_sets", "compare_strategies", "crossover_k", "pair_at_k", "pairwise_differences",
    "read_crossover", "summarize_pruning",
    "BLOCK", "KINDS", "MIN_REMAINING", "STRATEGIES", "PruningContext", "Strategy", "StrategyError", "alpha_zones",
    "available_strategies", "bic_segment_count", "check_plans", "get_strategy", "greedy_order", "prefixes",
    "register_strategy", "segment_profile", "segmentation_cost", "strategy_names", "zone_aware_order",
    "COLUMNS", "DEFAULT_CALIBRATION_TOKENS", "DEFAULT_DTYPE", "DEFAULT_EVAL_TOKENS", "DEFAULT_SEEDS",
    "DEFAULT_STRATEGIES", "RECIPE_ABLATIONS", "WINDOW_COLUMNS", "PruningResult", "canonical_removed",
    "check_strategy_names", "format_removed", "parse_removed", "plan_arms", "plan_strategies", "pruning_sweep", "pruning_table",
]
