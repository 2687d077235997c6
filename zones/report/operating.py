"""The operating characteristics of the scorecard's rules, as Methods prints them.

For each rule, simulated data sets of the book's sizes (``zones.analysis.power``) with a known
truth: the share of them the rule calls "holds", "does not hold" and "inconclusive". A rule
that can say "holds" only 10% of the time when the paper's effect is true is a rule whose
"inconclusive" says little; Methods prints these shares so that a reader can weigh each verdict.

``python -m zones.report.operating`` prints the table as Markdown (``book/methods/verdicts.md``
holds that output; ``tests/test_operating.py`` checks that the page and the code agree).
"""
from __future__ import annotations


import pandas as pd

from zones.analysis.bootstrap import interval_side
from zones.analysis.power import N_DRAWS as POWER_DRAWS
from zones.analysis.power import mean_draws, operating, rho_draws
from zones.report.verdicts import (
    PAPER_RHO,
    PAPER_RHO_MID,
    rho_rule,
    rho_strict_rule,
    score_partial_rho,
    side_verdict,
)

COLUMNS = ["rule", "truth", "size", "holds", "does not hold", "inconclusive"]
BLOCKS = (8, 12, 16, 30)        # the trained runs' depths and SmolLM2's
WINDOWS = (8, 12, 64)           # the pruning and healing chapters' eval windows (cpu), the ablation's, the gpu budget
N_DRAWS = POWER_DRAWS             # per cell (the scorecard quotes the same cells)


def _above_zero(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    """Every "interval against 0" rule (direction, healing, the shape's rank trend, ρ beyond depth)."""
    return str(side_verdict(interval_side(low, high, 0.0), "above"))


def _partial(rho: float, low: float, high: float, p: float, n: int) -> str:  # noqa: ARG001
    return str(score_partial_rho(low, high, n_blocks=n))


def operating_table(n_draws: int = N_DRAWS, seed: int = 0) -> pd.DataFrame:
    """One row per (rule, truth, size): the shares of :data:`COLUMNS`, rounded to 2 decimals."""
    rows = []

    def add(rule_name: str, truth: str, size: str, shares: dict) -> None:
        rows.append(dict(rule=rule_name, truth=truth, size=size, **{k: round(v, 2) for k, v in shares.items()}))

    rho_cells = ((0.84, "ρ = 0.84 (the paper's top)"), (PAPER_RHO_MID, f"ρ = {PAPER_RHO_MID} (the band's middle)"),
                 (PAPER_RHO[0], f"ρ = {PAPER_RHO[0]} (the band's bottom)"), (0.5, "ρ = 0.5 (below the band)"),
                 (0.0, "ρ = 0 (no effect)"))
    for name, rule in ((f"ρ claim, as the paper reads it (point ρ ≥ {PAPER_RHO[0]}, p < 0.02)", rho_rule),
                       (f"ρ claim, strict (whole interval ≥ {PAPER_RHO[0]}, p < 0.02)", rho_strict_rule)):
        for rho, truth in rho_cells:
            for n in BLOCKS:
                add(name, truth, f"{n} blocks", operating(rule, rho_draws(rho, n, n_draws=n_draws, seed=seed)))
    for rho, truth in ((0.5, "ρ = 0.5"), (0.0, "ρ = 0 (no effect)")):
        for n in BLOCKS:
            add("ρ beyond depth, rank trend of the α profile (interval above 0; simulated as a plain rank "
                "correlation)", truth, f"{n} blocks",
                operating(_partial, rho_draws(rho, n, n_draws=n_draws, seed=seed)))
    for effect, truth in ((1.0, "mean = 1 sd of a window's difference"), (0.5, "mean = 0.5 sd"),
                          (0.0, "mean = 0 (no effect)")):
        for n in WINDOWS:
            add("paired difference above 0 (direction, after healing)", truth, f"{n} windows",
                operating(_above_zero, mean_draws(effect, 1.0, n, n_draws=n_draws, seed=seed)))
    return pd.DataFrame(rows, columns=COLUMNS)


def operating_markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, one row per cell."""
    head = "| " + " | ".join(COLUMNS) + " |\n| " + " | ".join("---" for _ in COLUMNS) + " |\n"
    return head + "".join("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r) + " |\n"
                          for r in table.itertuples(index=False))


__all__ = ["BLOCKS", "COLUMNS", "WINDOWS", "operating_markdown", "operating_table"]

if __name__ == "__main__":
    print(operating_markdown(operating_table()), end="")
